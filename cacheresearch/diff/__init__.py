"""``python -m cacheresearch.diff``: why does request B not hit request A's cache?

* :mod:`.cli`       the command line (its docstring is the usage)
* :mod:`.requests`  two chat requests on real tokens: first differing token, block, part, cause, hit lost
* :mod:`.causes`    the cause classifier
* :mod:`.tokens`    token ids, texts (bundled tokenizer) and a trace's block keys; the change-point report
"""

from cacheresearch.diff.causes import CAUSES, classify, classify_text
from cacheresearch.diff.cli import main
from cacheresearch.diff.requests import diff_encoded, diff_requests
from cacheresearch.diff.tokens import diff_keys, diff_tokens, tokenize

__all__ = ["tokenize", "diff_tokens", "diff_keys", "diff_requests", "diff_encoded", "classify", "classify_text",
           "CAUSES", "main"]
