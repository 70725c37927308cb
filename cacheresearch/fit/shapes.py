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

__all__ = ["generate_chat_service", "generate_api_day", "generate_conversation_service", "generate_tool_agent",
           "generate_bailian_service", "BAILIAN_SHAPES"]


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


def _lognormal_blocks(rng, median_tokens: float, sigma: float, bt: int, size=None):
    return np.maximum(np.ceil(np.exp(np.log(median_tokens) + sigma * rng.standard_normal(size)) / bt), 1).astype(
        np.int64)


def _with_partial(ctx: np.ndarray, cnt: list) -> np.ndarray:
    """A request's ids: the context's full blocks, then a partial last block of its own (its content
    is completed by the next turn, so its id is not seen again: the next turn drops it, as in real
    traces where a request's last block is partial)."""
    return np.concatenate([ctx, _ids(cnt, 1)])


def _conversations(rng, cnt, *, n_conv, D, bt, heads, pop, head_share, first_median, first_sigma, turns_mean,
                   turn_blocks_mean, think_median_s, think_sigma, label=None):
    """Rows (time, ids) and conversation labels of ``n_conv`` conversations started uniformly in
    ``[0, D)``: each opens with a shared head (share ``head_share``, Zipf popularity ``pop``) or
    nothing, then a lognormal first message; each later turn extends the whole context after a
    lognormal think time; requests after ``D`` are dropped."""
    rows, conv = [], []
    starts = np.sort(rng.uniform(0.0, D, n_conv))
    for c, t in enumerate(starts):
        shared = heads and rng.random() < head_share
        head = heads[int(rng.choice(len(heads), p=pop))] if shared else np.zeros(0, np.uint64)
        ctx = np.concatenate([head, _ids(cnt, int(_lognormal_blocks(rng, first_median, first_sigma, bt)))])
        for j in range(int(rng.geometric(1.0 / max(turns_mean, 1.0)))):
            if j:
                t += float(np.exp(np.log(think_median_s) + think_sigma * rng.standard_normal()))
                ctx = np.concatenate([ctx, _ids(cnt, int(rng.geometric(1.0 / max(turn_blocks_mean, 1.0))))])
            if t >= D:
                break
            rows.append((t, _with_partial(ctx, cnt)))
            conv.append(c if label is None else label(c))
    return rows, conv


def generate_conversation_service(n_requests: int = 12000, *, seed: int = 0, block_tokens: int = 512,
                                  duration_s: float = 3600.0, system_prompts: int = 12,
                                  system_share: float = 0.5, system_tokens: tuple = (500, 4000),
                                  first_tokens_median: float = 6000.0, first_tokens_sigma: float = 0.9,
                                  turns_mean: float = 1.6, turn_tokens_mean: float = 700.0,
                                  think_median_s: float = 45.0, think_sigma: float = 1.0,
                                  content_hashes: bool = False, return_conversations: bool = False):
    """A conversation service like Mooncake's conversation trace (about ``n_requests`` requests over
    ``duration_s``, 512-token blocks): conversations start uniformly in the window; a share
    ``system_share`` open with one of ``system_prompts`` shared system prompts (Zipf popularity,
    lengths uniform in ``system_tokens``), the rest with a private context; the first user message is
    lognormal (median ``first_tokens_median`` tokens); turns per conversation geometric (mean
    ``turns_mean``); each turn appends a geometric number of blocks (mean ``turn_tokens_mean``
    tokens) after a lognormal think time and resends the whole conversation, whose last block is
    partial (its id is replaced by the next turn's). Ids are prefix-chained unless
    ``content_hashes``. With ``return_conversations`` returns ``(workload, conversation per request)``
    (the known split of the shared-prompt roots into conversations)."""
    rng = np.random.default_rng(seed)
    bt = block_tokens
    cnt = [1]
    lo, hi = system_tokens
    heads = [_ids(cnt, max(int(rng.integers(lo, hi + 1)) // bt, 1)) for _ in range(system_prompts)]
    pop = 1.0 / np.arange(1, system_prompts + 1)
    pop /= pop.sum()
    n_conv = max(int(round(n_requests / max(turns_mean, 1.0) * 1.05)), 1)
    rows, conv = _conversations(rng, cnt, n_conv=n_conv, D=duration_s, bt=bt, heads=heads, pop=pop,
                                head_share=system_share, first_median=first_tokens_median,
                                first_sigma=first_tokens_sigma, turns_mean=turns_mean,
                                turn_blocks_mean=turn_tokens_mean / bt, think_median_s=think_median_s,
                                think_sigma=think_sigma)
    if not content_hashes:
        rows = [(t, _chain(k)) for t, k in rows]
    order = np.argsort([r[0] for r in rows], kind="stable")
    w = _workload(rows, bt, rng, "conversation_service")
    return (w, np.asarray(conv, np.int64)[order]) if return_conversations else w


def generate_tool_agent(n_requests: int = 23000, *, seed: int = 0, block_tokens: int = 512,
                        duration_s: float = 3600.0, tools: int = 10, tool_tokens: tuple = (1000, 4000),
                        tool_share: float = 0.6, zipf: float = 1.1, task_tokens_median: float = 3000.0,
                        task_tokens_sigma: float = 1.0, steps_mean: float = 1.6, result_tokens_mean: float = 600.0,
                        step_gap_median_s: float = 5.0, return_conversations: bool = False):
    """A tool-and-agent service like Mooncake's tool&agent trace (about ``n_requests`` requests, 512-token
    blocks): a few long tool prompts (``tools``, lengths uniform in ``tool_tokens``, Zipf popularity
    with exponent ``zipf``) open a share ``tool_share`` of the tasks; each task adds a lognormal task
    description, then runs a geometric number of steps (mean ``steps_mean``), each appending a tool
    result (geometric, mean ``result_tokens_mean`` tokens) a lognormal few seconds later."""
    rng = np.random.default_rng(seed)
    bt = block_tokens
    cnt = [1]
    lo, hi = tool_tokens
    heads = [_ids(cnt, max(int(rng.integers(lo, hi + 1)) // bt, 1)) for _ in range(tools)]
    pop = 1.0 / np.arange(1, tools + 1) ** zipf
    pop /= pop.sum()
    n_conv = max(int(round(n_requests / max(steps_mean, 1.0) * 1.02)), 1)
    rows, conv = _conversations(rng, cnt, n_conv=n_conv, D=duration_s, bt=bt, heads=heads, pop=pop,
                                head_share=tool_share, first_median=task_tokens_median, first_sigma=task_tokens_sigma,
                                turns_mean=steps_mean, turn_blocks_mean=result_tokens_mean / bt,
                                think_median_s=step_gap_median_s, think_sigma=0.8)
    rows = [(t, _chain(k)) for t, k in rows]
    order = np.argsort([r[0] for r in rows], kind="stable")
    w = _workload(rows, bt, rng, "tool_agent")
    return (w, np.asarray(conv, np.int64)[order]) if return_conversations else w


BAILIAN_SHAPES = {  # per type: (share of conversations, shared system prompts, head share, first median tokens, turns)
    "text": (0.55, 8, 0.7, 600.0, 2.5), "search": (0.2, 3, 0.9, 1500.0, 1.5),
    "image": (0.15, 2, 0.8, 900.0, 1.8), "file": (0.1, 2, 0.5, 6000.0, 1.6)}


def generate_bailian_service(n_requests: int = 4000, *, seed: int = 0, block_tokens: int = 16,
                             duration_s: float = 3600.0, types: dict | None = None, think_median_s: float = 60.0,
                             turn_tokens_mean: float = 300.0):
    """A Qwen-Bailian-format trace (:class:`~cacheresearch.workload.trace.BailianTrace`: ``chat_id``,
    ``parent_chat_id`` = the previous turn, ``turn``, ``type``; 16-token blocks, prefix-chained ids).
    Each type (``types``: name -> (share of conversations, system prompts, share opening with one,
    first message median tokens, mean turns); default :data:`BAILIAN_SHAPES`) runs conversations as
    :func:`generate_conversation_service` does; :func:`~cacheresearch.workload.trace.save_bailian`
    writes it as JSONL."""
    from cacheresearch.workload.trace import BailianTrace  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    bt = block_tokens
    types = dict(BAILIAN_SHAPES if types is None else types)
    cnt = [1]
    rows, conv, typ = [], [], []
    base = 0
    for ti, (_name, (share, n_sys, head_share, first_med, turns)) in enumerate(types.items()):
        heads = [_ids(cnt, max(int(rng.integers(200, 2000)) // bt, 1)) for _ in range(n_sys)]
        pop = 1.0 / np.arange(1, n_sys + 1)
        pop /= pop.sum()
        n_conv = max(int(round(n_requests * share / max(turns, 1.0))), 1)
        r, c = _conversations(rng, cnt, n_conv=n_conv, D=duration_s, bt=bt, heads=heads, pop=pop,
                              head_share=head_share, first_median=first_med, first_sigma=1.0, turns_mean=turns,
                              turn_blocks_mean=turn_tokens_mean / bt, think_median_s=think_median_s, think_sigma=1.0)
        rows += r
        conv += [base + x for x in c]
        typ += [ti] * len(r)
        base += n_conv
    rows = [(t, _chain(k)) for t, k in rows]
    order = np.argsort([r[0] for r in rows], kind="stable")
    w = _workload(rows, bt, rng, "bailian_service", tenant=typ)
    conv = np.asarray(conv, np.int64)[order]
    n = w.n_requests
    chat = rng.permutation(n).astype(np.int64) * 3 + 7  # ids need not be dense
    parent = np.full(n, -1, np.int64)
    turn = np.zeros(n, np.int64)
    last: dict = {}
    for i, c in enumerate(conv.tolist()):
        if c in last:
            parent[i] = last[c]
            turn[i] = turn[last[c]] + 1
        last[c] = i
    _, session = np.unique(conv, return_inverse=True)
    first_idx = np.unique(session, return_index=True)[1]
    rank = np.empty(first_idx.size, np.int64)
    rank[np.argsort(first_idx, kind="stable")] = np.arange(first_idx.size)
    w.meta.update(format="bailian", types=",".join(types))
    return BailianTrace(w, chat, np.where(parent >= 0, chat[np.maximum(parent, 0)], -1), parent,
                        rank[session.reshape(-1)], turn, w.tenant.astype(np.int32), tuple(types))
