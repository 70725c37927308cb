"""Traces of service shapes unlike the shared ones, with known laws, to test the fit on (issue 18).

* :func:`generate_chat_service`: a conversation service. A few applications, each with its own system
  prompt (Zipf popularity); conversations start as a Poisson process; each turn resends the whole
  conversation (system prompt, then every user message and answer so far) after a think time;
  512-token blocks by default; half of the conversations open with one of 20 common first messages
  (the same content under every system prompt); ``content_hashes=True`` writes each block's id as
  its content's id (not chained), as some public traces are published, else ids are prefix-chained.
* :func:`generate_api_day`: a day of API traffic. Arrivals follow a diurnal rate (a raised cosine,
  peak to trough ``peak_ratio``); a share of requests are one-off prompts; the rest open with one of a
  Zipf set of templates (a system prompt or a few-shot header) followed by a fresh question; a few
  are short retry bursts of the same prompt; 32-token blocks; a type per request (``tenant``: 0 =
  one-off, 1 = templated).

Plain NumPy; no I/O. Each generator returns a :class:`~cacheresearch.workload.Workload` whose
``input_tokens`` fill the last block partially (a random remainder), as real traces do.
"""

from __future__ import annotations

import numpy as np

from cacheresearch.workload import Workload

__all__ = ["generate_chat_service", "generate_api_day"]


def _ids(counter: list, k: int) -> np.ndarray:
    ids = np.arange(counter[0], counter[0] + k, dtype=np.uint64)
    counter[0] += k
    return ids


def _chain(content: np.ndarray) -> np.ndarray:
    """Prefix-chained ids of a block sequence (a rolling hash: equal ids iff equal prefixes, up to
    collisions of 61-bit hashes)."""
    p = (1 << 61) - 1
    h, out = 0, np.empty(content.size, np.uint64)
    for i, c in enumerate(content.tolist()):
        h = (h * 1_000_003 + c + 1) % p
        out[i] = h
    return out


def _workload(rows, bt: int, rng, name: str, tenant=None) -> Workload:
    order = np.argsort([r[0] for r in rows], kind="stable")
    rows = [rows[i] for i in order]
    keys = [r[1] for r in rows]
    nb = np.array([k.size for k in keys], dtype=np.int64)
    inp = (nb - 1) * bt + rng.integers(1, bt + 1, size=nb.size)  # a partial last block
    ms = np.round(np.array([r[0] for r in rows]) * 1000).astype(np.int64)
    out = rng.integers(20, 800, size=nb.size)
    ten = None if tenant is None else np.asarray(tenant, np.int64)[order]
    return Workload.from_lists(keys, block_tokens=bt, arrival_ms=ms, input_tokens=inp, output_tokens=out,
                               tenant=ten, name=name)


def generate_chat_service(n_conversations: int = 600, *, seed: int = 0, block_tokens: int = 512,
                          apps: int = 5, system_blocks: int = 3, turns_mean: float = 5.0,
                          turn_blocks_mean: float = 1.5, think_s: float = 40.0, rate_per_s: float = 0.2,
                          content_hashes: bool = False) -> Workload:
    """A conversation service (module docstring). Turns per conversation: geometric, mean
    ``turns_mean``; each turn appends a geometric(``1 / turn_blocks_mean``) number of blocks (the
    user message and the answer); think times exponential, mean ``think_s``."""
    rng = np.random.default_rng(seed)
    cnt = [1]
    prompts = [_ids(cnt, system_blocks) for _ in range(apps)]
    pop = 1.0 / np.arange(1, apps + 1)
    pop /= pop.sum()
    openers = _ids(cnt, 20)  # common first user messages ("hi", "continue", ...): the same content in every app
    rows = []
    t0 = np.cumsum(rng.exponential(1.0 / rate_per_s, n_conversations))
    for c in range(n_conversations):
        first = openers[[int(rng.integers(openers.size))]] if rng.random() < 0.5 else _ids(cnt, 1)
        ctx = np.concatenate([prompts[int(rng.choice(apps, p=pop))], first, _ids(cnt, int(rng.geometric(0.6)))])
        t = t0[c]
        for j in range(int(rng.geometric(1.0 / turns_mean))):
            if j:
                t += rng.exponential(think_s)
                ctx = np.concatenate([ctx, _ids(cnt, int(rng.geometric(1.0 / turn_blocks_mean)))])
            rows.append((t, ctx.copy()))
    if not content_hashes:  # chained ids: each names its block and the whole prefix before it
        rows = [(t, _chain(k)) for t, k in rows]
    return _workload(rows, block_tokens, rng, "chat_service")


def generate_api_day(n_requests: int = 3000, *, seed: int = 0, block_tokens: int = 32, hours: float = 24.0,
                     peak_ratio: float = 6.0, one_off_share: float = 0.6, templates: int = 40,
                     template_blocks: tuple = (8, 120), question_blocks_mean: float = 10.0,
                     retry_share: float = 0.05) -> Workload:
    """A day of API traffic (module docstring). Arrivals: a Poisson process whose rate is
    ``1 + a cos(2 pi (t / hours - 0.6))`` (``a`` from ``peak_ratio``), thinned from the peak rate.
    Template lengths uniform in ``template_blocks``; questions geometric, mean ``question_blocks_mean``
    blocks; a retry repeats its request's whole prompt 1-20 s later."""
    rng = np.random.default_rng(seed)
    D = hours * 3600.0
    a = (peak_ratio - 1.0) / (peak_ratio + 1.0)
    t = []
    while len(t) < n_requests:  # thinning
        x = rng.uniform(0, D, size=4 * n_requests)
        keep = rng.random(x.size) < (1 + a * np.cos(2 * np.pi * (x / D - 0.6))) / (1 + a)
        t.extend(x[keep].tolist())
    t = np.sort(np.asarray(t[:n_requests]))
    cnt = [1]
    lo, hi = template_blocks
    tmpl = [_ids(cnt, int(rng.integers(lo, hi + 1))) for _ in range(templates)]
    pop = 1.0 / np.arange(1, templates + 1) ** 1.1
    pop /= pop.sum()
    rows, ten = [], []
    for ti in t:
        q = _ids(cnt, int(rng.geometric(1.0 / question_blocks_mean)))
        one_off = rng.random() < one_off_share
        k = q if one_off else np.concatenate([tmpl[int(rng.choice(templates, p=pop))], q])
        rows.append((ti, k))
        ten.append(0 if one_off else 1)
        if rng.random() < retry_share:
            rows.append((ti + rng.uniform(1.0, 20.0), k.copy()))
            ten.append(ten[-1])
    return _workload(rows, block_tokens, rng, "api_day", tenant=ten)
