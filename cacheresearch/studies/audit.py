"""Who may share a cached block, and what a shared cache leaks: the isolation and timing-audit studies.

Both run the exact engine (:func:`~cacheresearch.core.run.simulate_cells`, per-request outputs) on the
routing experiments' tenant scenario (:func:`~cacheresearch.workload.synthetic.tenant_workload`) with a
system prompt shared by every organisation, under vLLM ``cache_salt`` semantics
(:data:`~cacheresearch.workload.keys.SALT_MODES`: the salt enters the first block's extra keys, so a
salted chain shares nothing with any other salt). ``python -m cacheresearch.sweep experiment=isolation``
and ``experiment=audit`` reach them through ``kind:``.

``isolation``
    The cost of isolation: a shared cache (``salt=none``), per-organisation salts (``per_tenant``) and
    per-user salts (``per_user``), by router and load: token hit rate, TTFT and dollars per day under
    a pricing preset (hit tokens at the read price, missed tokens at the write price: every missed
    prefix token is written to the cache; :mod:`cacheresearch.analysis.pricing`).

``audit``
    The procedure of Gu et al., "Auditing Prompt Caching in Language Model APIs" (ICML 2025), run
    against the simulated fleet with its real queueing noise (background traffic of other tenants
    through the same replicas and router). A *trial* is one probe by the attacker:

    * cache-hit procedure: the victim sends its prompt ``V`` (``prompt_tokens`` fresh tokens)
      ``victim_requests`` times, ``victim_gap_ms`` apart; ``probe_delay_ms`` after the last one the
      attacker sends ``V[: prefix_fraction * prompt_tokens]`` followed by its own fresh tokens
      (``prompt_tokens + 16`` tokens in all);
    * cache-miss procedure: the same, except that the victim sends an unrelated prompt ``W`` of the
      same length (so the fleet's load is the same in law) and ``V`` is never sent.

    Trials start ``trial_gap_s`` apart (plus a uniform jitter of half a gap), hit and miss procedures
    in random order, ``trials`` of each per experiment and ``experiments`` experiments per cell
    (pooled; more seeds pool more). The attacker observes the probe's TTFT. Reported per cell:

    * ``audit_ks_p``: the two-sample Kolmogorov-Smirnov test (``scipy.stats.ks_2samp``, asymptotic p) of hit vs miss
      TTFTs over all pooled trials; ``audit_power``: the share of experiments of ``trials`` + ``trials``
      probes (Gu et al. use 250 + 250) whose KS test rejects at ``alpha`` (0.05); experiments are
      ``resamples`` draws without replacement from the pooled trials (each draw is a real 250 + 250
      experiment; draws overlap, so the power's own noise is that of the pooled count of trials);
    * ``audit_auc``: the area under the ROC curve of the attacker's best single-probe rule "slower
      means miss": ``P(TTFT_miss > TTFT_hit) + P(=) / 2`` (the Mann-Whitney statistic, ``scipy``),
      with a 95% interval (Hanley and McNeil's standard error);
    * the probes' hit rates under each procedure (``probe_hit_share_*``) and median TTFTs.

    With ``salt=per_user`` the victim's and the attacker's chains never meet, so the probe's hit
    tokens are 0 under both procedures and the two TTFT samples have the same law: the AUC is 0.5 up
    to sampling noise and the KS test rejects at most at about the rate ``alpha`` (less: TTFTs are
    integer milliseconds with many ties, and the KS test is conservative on discrete data).

Shell-side (xarray, scipy, matplotlib); the engine and the workload generators do the simulation.
"""

from __future__ import annotations

import json
import math
import time

import numpy as np
import xarray as xr
from scipy import stats

from cacheresearch.analysis.pricing import preset
from cacheresearch.engine import compile_stream, make_params
from cacheresearch.studies import base as SB
from cacheresearch.studies.base import Cells, Study, StudyError, common_attrs, seeds, study_cfg
from cacheresearch.workload import Workload
from cacheresearch.workload.keys import SALT_MODES, block_keys_jit, salt_values, to_uint64
from cacheresearch.workload.synthetic import tenant_workload

__all__ = ["ISOLATION_DEFAULTS", "AUDIT_DEFAULTS", "isolation_study", "audit_study", "audit_statistics",
           "merge_workloads", "probe_workload", "STUDIES"]

DAY = 86_400.0

# ------------------------------------------------------------------------------ helpers


def _err(msg: str):
    return StudyError(msg)


def _cfg(cfg, defaults: dict) -> dict:
    return study_cfg(cfg, defaults)


def _list(name, v, options=None, *, positive=False, integer=False, unit=False) -> list:
    if not isinstance(v, (list, tuple)) or not v:
        raise _err(f"study.{name} must be a non-empty list")
    out = []
    for x in v:
        if options is not None:
            if x not in options:
                raise _err(f"study.{name}: unknown value {x!r}; choose from {list(options)}")
        else:
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
                raise _err(f"study.{name}: elements must be numbers, got {x!r}")
            if positive and x <= 0:
                raise _err(f"study.{name}: elements must be > 0, got {x!r}")
            if unit and not 0 < x <= 1:
                raise _err(f"study.{name}: elements must be in (0, 1], got {x!r}")
            if integer and int(x) != x:
                raise _err(f"study.{name}: elements must be integers, got {x!r}")
            x = int(x) if integer else float(x)
        out.append(x)
    if len(set(out)) != len(out):
        raise _err(f"study.{name} has repeated values: {v}")
    return out


def merge_workloads(parts: list[Workload], name: str = "") -> tuple[Workload, list[np.ndarray]]:
    """One workload of all requests of ``parts`` in arrival order (stable: ties keep part order).

    Returns it and, per part, the positions its requests took in the merged workload.
    """
    bt = {w.block_tokens for w in parts}
    if len(bt) != 1:
        raise ValueError(f"merge_workloads: parts use different block sizes {sorted(bt)}")
    arr = np.concatenate([w.arrival_ms for w in parts])
    order = np.argsort(arr, kind="stable")
    where = np.empty_like(order)
    where[order] = np.arange(order.shape[0])
    n_blocks = np.concatenate([w.n_blocks for w in parts])
    starts = np.concatenate([w.offsets[:-1] + off for w, off in
                             zip(parts, np.cumsum([0] + [w.total_blocks for w in parts[:-1]]))])
    keys_all = np.concatenate([w.keys for w in parts])
    nb = n_blocks[order]
    offsets = np.concatenate([[0], np.cumsum(nb)]).astype(np.int64)
    idx = np.repeat(starts[order] - offsets[:-1], nb) + np.arange(offsets[-1])
    w = Workload(
        arrival_ms=arr[order].astype(np.int64),
        input_tokens=np.concatenate([w.input_tokens for w in parts])[order],
        output_tokens=np.concatenate([w.output_tokens for w in parts])[order],
        tenant=np.concatenate([w.tenant for w in parts])[order].astype(np.int32),
        keys=keys_all[idx], offsets=offsets, block_tokens=parts[0].block_tokens,
        name=name or "+".join(w.name for w in parts), meta={"parts": [w.name for w in parts]},
    )
    pos, a = [], 0
    for p in parts:
        pos.append(where[a: a + p.n_requests])
        a += p.n_requests
    return w, pos


def _keys_of(tokens: np.ndarray, bs: int, salt: np.ndarray | None) -> np.ndarray:
    """uint64 keys ``[N, L // bs]`` of full-length prompts (chunked), with an optional salt per prompt."""
    n, L = tokens.shape
    out = np.empty((n, L // bs), dtype=np.uint64)
    for a in range(0, n, 4096):
        b = min(n, a + 4096)
        hi, lo, _ = block_keys_jit(tokens[a:b], np.full(b - a, L, np.int32), block_size=bs,
                                   cache_salt=None if salt is None else salt[a:b])
        out[a:b] = to_uint64(hi, lo)
    return out


def _csr(keys_2d: np.ndarray, arrival_ms, input_tokens, output_tokens, tenant, bs, name) -> Workload:
    n, nb = keys_2d.shape
    return Workload(arrival_ms=np.asarray(arrival_ms, np.int64), input_tokens=np.full(n, input_tokens, np.int64),
                    output_tokens=np.full(n, output_tokens, np.int64), tenant=np.full(n, tenant, np.int32),
                    keys=keys_2d.reshape(-1), offsets=np.arange(n + 1, dtype=np.int64) * nb, block_tokens=bs,
                    name=name)


def probe_workload(*, n_trials: int, prompt_tokens: int, prefix_fraction: float, victim_requests: int,
                   salt: str, start_ms: int, trial_gap_ms: int, victim_gap_ms: int, probe_delay_ms: int,
                   output_tokens: int, block_tokens: int, seed: int, tenant: int = -1, vocab_size: int = 128_256):
    """The victim's and the attacker's requests of ``n_trials`` hit and ``n_trials`` miss trials.

    Returns ``(victim workload, probe workload, is_hit [2 n_trials] of each probe in time order)``
    (module docstring). The victim and the attacker are users ``2**31`` and ``2**31 + 1`` (never a
    background user); with ``salt=per_user`` (or ``per_tenant``: they are different organisations)
    each carries its own salt, with ``none`` neither does.
    """
    if salt not in SALT_MODES:
        raise ValueError(f"salt must be one of {SALT_MODES}, got {salt!r}")
    if victim_requests < 1 or n_trials < 1:
        raise ValueError("victim_requests and n_trials must be >= 1")
    if (victim_requests - 1) * victim_gap_ms + probe_delay_ms >= trial_gap_ms // 2:
        raise ValueError("a trial (victim requests and probe) must fit in half a trial gap")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xA0D17]))
    T = 2 * n_trials
    is_hit = np.zeros(T, dtype=bool)
    is_hit[rng.permutation(T)[:n_trials]] = True
    start = start_ms + np.arange(T, dtype=np.int64) * trial_gap_ms + rng.integers(0, trial_gap_ms // 2, size=T)
    L, f = int(prompt_tokens), int(round(prefix_fraction * prompt_tokens))
    V = rng.integers(0, vocab_size, size=(T, L), dtype=np.int32)  # the secret prompt of each trial
    W = rng.integers(0, vocab_size, size=(T, L), dtype=np.int32)  # the unrelated prompt of a miss trial
    own = rng.integers(0, vocab_size, size=(T, L - f + 16), dtype=np.int32)
    sent = np.where(is_hit[:, None], V, W)
    probe = np.concatenate([V[:, :f], own], axis=1)
    sv = sa = None
    if salt != "none":
        sv = np.full(T, salt_values("user", [2**31])[0], np.uint32)
        sa = np.full(T, salt_values("user", [2**31 + 1])[0], np.uint32)
    kv = _keys_of(sent, block_tokens, sv)
    kp = _keys_of(probe, block_tokens, sa)
    t_v = (start[:, None] + np.arange(victim_requests)[None, :] * victim_gap_ms).reshape(-1)
    victim = _csr(np.repeat(kv, victim_requests, axis=0), t_v, L, output_tokens, tenant, block_tokens, "victim")
    t_p = start + (victim_requests - 1) * victim_gap_ms + probe_delay_ms
    attacker = _csr(kp, t_p, L + 16, output_tokens, tenant, block_tokens, "attacker")
    return victim, attacker, is_hit


def _auc(hit: np.ndarray, miss: np.ndarray) -> float:
    """``P(miss > hit) + P(miss == hit) / 2`` (Mann-Whitney U / (n1 n2))."""
    u = stats.mannwhitneyu(miss, hit, alternative="two-sided", method="asymptotic").statistic
    return float(u) / (len(hit) * len(miss))


def audit_statistics(ttft_hit, ttft_miss, *, trials: int = 250, alpha: float = 0.05, resamples: int = 200,
                     seed: int = 0) -> dict:
    """AUC (with a 95% interval), pooled KS test, and the KS test's power at ``trials`` + ``trials`` probes."""
    h, m = np.asarray(ttft_hit, np.float64), np.asarray(ttft_miss, np.float64)
    n1, n2 = len(h), len(m)
    if min(n1, n2) < trials:
        raise ValueError(f"need at least {trials} probes of each procedure, got {n1} and {n2}")
    A = _auc(h, m)
    q1, q2 = A / (2 - A), 2 * A * A / (1 + A)
    se = math.sqrt(max(A * (1 - A) + (n1 - 1) * (q1 - A * A) + (n2 - 1) * (q2 - A * A), 0.0) / (n1 * n2))
    ks = stats.ks_2samp(h, m, method="asymp")
    rng = np.random.default_rng(seed)
    rej = 0
    for _ in range(resamples):
        a = h[rng.choice(n1, trials, replace=False)]
        b = m[rng.choice(n2, trials, replace=False)]
        rej += stats.ks_2samp(a, b, method="asymp").pvalue < alpha
    return dict(audit_auc=A, audit_auc_ci_low=max(A - 1.96 * se, 0.0), audit_auc_ci_high=min(A + 1.96 * se, 1.0),
                audit_power=rej / resamples, audit_ks_p=float(ks.pvalue), audit_ks_stat=float(ks.statistic))


def _run(streams, idx, params, seeds, max_replicas: int):
    return (yield Cells(streams, idx, params, seeds, max_replicas=max_replicas))


def _attrs(cfg, kind, t0, extra):
    return common_attrs(cfg, kind, t0, extra)


def _seeds(cfg):
    return seeds(cfg)


# ------------------------------------------------------------------------------ isolation
ISOLATION_DEFAULTS = dict(
    scenario=dict(n_tenants=40, system_tokens=2000, prefix_tokens=4000, users_per_tenant=5, user_tokens=1000,
                  query_tokens=200, output_tokens=200, block_tokens=16, n_requests=2500),
    salts=["none", "per_tenant", "per_user"],
    rates=[4.0, 16.0],
    routers=["random", "prefix_hash", "llmd_precise"],
    replicas=8,
    capacity_blocks=20000,
    latency="h100_8b",
    pricing="anthropic_5m",
    base_per_mtok=3.0,
)


def isolation_study(cfg) -> xr.Dataset:
    t0 = time.perf_counter()
    c = _cfg(cfg, ISOLATION_DEFAULTS)
    sc = dict(c["scenario"])
    salts = _list("salts", c["salts"], SALT_MODES)
    rates = _list("rates", c["rates"], positive=True)
    routers = list(c["routers"])
    if not routers:
        raise _err("study.routers must be a non-empty list")
    try:
        pr = preset(str(c["pricing"]), base_per_mtok=float(c["base_per_mtok"]))
    except (ValueError, TypeError) as e:
        raise _err(f"study.pricing: {e}") from None
    seeds = _seeds(cfg)
    n_req = int(sc.pop("n_requests"))
    bt = int(sc["block_tokens"])
    prefix_blocks = (int(sc["system_tokens"]) + int(sc["prefix_tokens"])) // bt
    R = int(c["replicas"])
    streams, meta = [], []
    for s in salts:
        for r in rates:
            for sd in seeds:
                try:
                    w = tenant_workload(**sc, rate_per_s=r, duration_s=n_req / r, salt=s, seed=sd)
                except (ValueError, TypeError) as e:
                    raise _err(f"study.scenario: {e}") from None
                streams.append(compile_stream(w))
                meta.append(dict(n=w.n_requests, inp=int(w.input_tokens.sum()), dur=n_req / r))
    try:
        params = [make_params("lru", capacity_blocks=int(c["capacity_blocks"]), replicas=R, router=rt,
                              prefix_blocks=prefix_blocks, latency=str(c["latency"])) for rt in routers]
    except ValueError as e:
        raise _err(f"study: {e}") from None
    cells = [(k, j) for k in range(len(streams)) for j in range(len(routers))]
    ts = time.perf_counter()
    m = yield from _run(streams, [k for k, _ in cells], [params[j] for _, j in cells],
             [seeds[k % len(seeds)] for k, _ in cells], R)
    t_sim = time.perf_counter() - ts
    shape = (len(salts), len(rates), len(seeds), len(routers))
    out = {v: np.zeros(shape) for v in ("token_hit_rate", "ttft_p50_s", "ttft_p99_s", "ttft_mean_s",
                                        "usd_per_day", "cost_multiplier", "hit_tokens", "input_tokens")}
    for g, (k, j) in enumerate(cells):
        i_s, rest = divmod(k, len(rates) * len(seeds))
        i_r, i_d = divmod(rest, len(seeds))
        n = meta[k]["n"]
        hit = float(np.asarray(m.hit_tokens[g][:n], np.int64).sum())
        inp = float(meta[k]["inp"])
        ix = (i_s, i_r, i_d, j)
        out["hit_tokens"][ix] = hit
        out["input_tokens"][ix] = inp
        out["token_hit_rate"][ix] = hit / inp
        t = np.asarray(m.ttft_ms[g][:n], np.float64) / 1000.0
        out["ttft_p50_s"][ix] = float(np.asarray(m.ttft_p50_ms[g])) / 1000.0
        out["ttft_p99_s"][ix] = float(np.asarray(m.ttft_p99_ms[g])) / 1000.0
        out["ttft_mean_s"][ix] = float(t.mean())
        usd = pr.base_per_mtok / 1e6 * (hit * pr.read_multiplier + (inp - hit) * pr.write_multiplier)
        out["usd_per_day"][ix] = usd * DAY / meta[k]["dur"]
        out["cost_multiplier"][ix] = usd / (pr.base_per_mtok / 1e6 * inp)
    dims = ("salt", "rate_per_s", "seed", "router")
    ds = xr.Dataset({v: (dims, a) for v, a in out.items()},
                    coords={"salt": salts, "rate_per_s": rates, "seed": seeds, "router": routers})
    ds["usd_per_day_uncached"] = (("salt", "rate_per_s", "seed", "router"),
                                  out["input_tokens"] * pr.base_per_mtok / 1e6 * DAY
                                  / np.asarray([n_req / r for r in rates])[None, :, None, None])
    docs = {
        "token_hit_rate": ("token hit rate: hit tokens / input tokens", "1"),
        "ttft_p50_s": ("time to first token, median", "s"),
        "ttft_p99_s": ("time to first token, 99th percentile (nearest rank)", "s"),
        "ttft_mean_s": ("time to first token, mean", "s"),
        "usd_per_day": (f"input cost per day under {pr.name}: hit tokens at the read price, missed tokens at the "
                        "write price (each missed token is written to the cache)", "USD/day"),
        "usd_per_day_uncached": ("input cost per day with no cache at the base price", "USD/day"),
        "cost_multiplier": ("input cost relative to uncached: h r + (1 - h) w", "1"),
        "hit_tokens": ("input tokens served from cache", "tokens"),
        "input_tokens": ("input tokens of the workload", "tokens"),
    }
    for v, (ln, u) in docs.items():
        ds[v].attrs.update(long_name=ln, units=u)
    ds["salt"].attrs["long_name"] = "cache salt: none = one shared cache; per_tenant = per organisation; per_user"
    ds.attrs.update(_attrs(cfg, "isolation", t0, dict(
        scenario=json.dumps({**sc, "n_requests": n_req}), replicas=R, capacity_blocks=int(c["capacity_blocks"]),
        prefix_blocks=prefix_blocks, latency=str(c["latency"]), pricing=pr.name, pricing_source=pr.source,
        simulate_time_s=t_sim)))
    return ds


def summarize_isolation(ds) -> str:

    out = SB.header(ds)
    sc = json.loads(ds.attrs["scenario"])
    out.append(f"scenario: {sc['n_tenants']} organisations x {sc['users_per_tenant']} users; a {sc['system_tokens']}-"
               f"token system prompt shared by all, {sc['prefix_tokens']} tokens per organisation, "
               f"{sc['user_tokens']} per user, {sc['query_tokens']} fresh; {ds.attrs['replicas']} replicas x "
               f"{ds.attrs['capacity_blocks']} blocks; cost under {ds.attrs['pricing']}")
    m = ds.mean("seed")
    rows = [["rate/s", "router", "salt", "token hit rate", "TTFT p50", "TTFT p99", "$/day", "x uncached"]]
    for r in ds.rate_per_s.values:
        for rt in ds.router.values:
            for s in ds.salt.values:
                c = m.sel(rate_per_s=r, router=rt, salt=s)
                rows.append([f"{r:g}", str(rt), str(s), SB.pct(float(c.token_hit_rate)),
                             f"{float(c.ttft_p50_s):.3f} s", f"{float(c.ttft_p99_s):.3f} s",
                             SB.usd(float(c.usd_per_day)), f"{float(c.cost_multiplier):.3f}"])
    out += ["", SB.table(rows)]
    return "\n".join(out)


def plot_isolation(ds):

    fig = SB.fig(12, 4)
    axes = fig.subplots(1, 3)
    m = ds.mean("seed")
    xs = np.arange(ds.sizes["salt"])
    for i, (v, lab, k) in enumerate([("token_hit_rate", "token hit rate (%)", 100), ("ttft_p99_s", "TTFT p99 (s)", 1),
                                     ("usd_per_day", "$ per day", 1)]):
        ax = axes[i]
        for j, rt in enumerate(ds.router.values):
            for q, r in enumerate(ds.rate_per_s.values):
                ax.plot(xs, k * m[v].sel(router=rt, rate_per_s=r).values, marker="o", color=f"C{j}",
                        ls=("-", "--", ":")[q % 3], label=f"{rt}, {r:g}/s")
        ax.set_xticks(xs, [str(s) for s in ds.salt.values])
        ax.set_ylabel(lab)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize="x-small")
    axes[1].set_title("the cost of isolation (salt: who shares a cached block)")
    return fig


# ------------------------------------------------------------------------------ audit
AUDIT_DEFAULTS = dict(
    background=dict(n_tenants=50, prefix_tokens=2000, users_per_tenant=2, user_tokens=0, query_tokens=200,
                    output_tokens=200, block_tokens=16),
    salts=["none", "per_user"],
    routers=["random", "prefix_hash"],
    rates=[4.0, 12.0],  # background requests per second (the load)
    prefix_fractions=[0.5, 1.0],
    victim_requests=[1, 4],
    replicas=4,
    capacity_blocks=20000,
    latency="h100_8b",
    prompt_tokens=2048,
    trials=250,  # probes of each procedure per experiment (Gu et al.)
    experiments=4,  # experiments pooled per cell and seed
    resamples=200,
    alpha=0.05,
    trial_gap_s=1.0,
    victim_gap_ms=50,
    probe_delay_ms=200,
    probe_output_tokens=16,
)


def audit_study(cfg) -> xr.Dataset:
    t0 = time.perf_counter()
    c = _cfg(cfg, AUDIT_DEFAULTS)
    bg = dict(c["background"])
    salts = _list("salts", c["salts"], SALT_MODES)
    routers = list(c["routers"])
    if not routers:
        raise _err("study.routers must be a non-empty list")
    rates = _list("rates", c["rates"], positive=True)
    fracs = _list("prefix_fractions", c["prefix_fractions"], unit=True)
    nvs = _list("victim_requests", c["victim_requests"], positive=True, integer=True)
    seeds = _seeds(cfg)
    trials, exps = int(c["trials"]), int(c["experiments"])
    if trials < 2 or exps < 1:
        raise _err("study.trials must be >= 2 and study.experiments >= 1")
    n_trials = trials * exps
    gap = int(round(float(c["trial_gap_s"]) * 1000))
    duration = (2 * n_trials + 2) * gap / 1000.0
    bt = int(bg["block_tokens"])
    R = int(c["replicas"])
    # streams: (salt, rate, fraction, victims, seed); backgrounds shared across fraction / victims
    streams, probes = [], []
    backgrounds: dict = {}
    keys = [(s, r, f, nv, sd) for s in salts for r in rates for f in fracs for nv in nvs for sd in seeds]
    for s, r, f, nv, sd in keys:
        if (s, r, sd) not in backgrounds:
            try:
                backgrounds[(s, r, sd)] = tenant_workload(**bg, rate_per_s=r, duration_s=duration, salt=s, seed=sd)
            except (ValueError, TypeError) as e:
                raise _err(f"study.background: {e}") from None
        try:
            v, a, is_hit = probe_workload(
                n_trials=n_trials, prompt_tokens=int(c["prompt_tokens"]), prefix_fraction=f, victim_requests=nv,
                salt=s, start_ms=gap, trial_gap_ms=gap, victim_gap_ms=int(c["victim_gap_ms"]),
                probe_delay_ms=int(c["probe_delay_ms"]), output_tokens=int(c["probe_output_tokens"]),
                block_tokens=bt, seed=sd * 1000 + nvs.index(nv) * 10 + fracs.index(f))
        except ValueError as e:
            raise _err(f"study: {e}") from None
        w, pos = merge_workloads([backgrounds[(s, r, sd)], v, a], name=f"audit-{s}-{r:g}-{f:g}-{nv}")
        streams.append(compile_stream(w))
        probes.append((pos[2], is_hit))
    try:
        params = [make_params("lru", capacity_blocks=int(c["capacity_blocks"]), replicas=R, router=rt,
                              prefix_blocks=max(1, int(c["prompt_tokens"]) // bt // 8), latency=str(c["latency"]))
                  for rt in routers]
    except ValueError as e:
        raise _err(f"study: {e}") from None
    cells = [(k, j) for k in range(len(streams)) for j in range(len(routers))]
    ts = time.perf_counter()
    m = yield from _run(streams, [k for k, _ in cells], [params[j] for _, j in cells], [keys[k][4] for k, _ in cells],
                        R)
    t_sim = time.perf_counter() - ts
    # pool seeds: one cell = (salt, router, rate, fraction, victims)
    dims = ("salt", "router", "rate_per_s", "prefix_fraction", "victim_requests")
    shape = (len(salts), len(routers), len(rates), len(fracs), len(nvs))
    pooled: dict = {}
    for g, (k, j) in enumerate(cells):
        s, r, f, nv, sd = keys[k]
        pos, is_hit = probes[k]
        ttft = np.asarray(m.ttft_ms[g])[pos]
        hit = np.asarray(m.hit_tokens[g])[pos]
        ix = (salts.index(s), j, rates.index(r), fracs.index(f), nvs.index(nv))
        pooled.setdefault(ix, []).append((ttft, hit, is_hit))
    names = ("audit_auc", "audit_auc_ci_low", "audit_auc_ci_high", "audit_power", "audit_ks_p", "audit_ks_stat",
             "probe_hit_share_hit", "probe_hit_share_miss", "ttft_hit_median_s", "ttft_miss_median_s")
    out = {v: np.full(shape, np.nan) for v in names}
    for ix, lst in pooled.items():
        ttft = np.concatenate([a for a, _, _ in lst])
        hit = np.concatenate([b for _, b, _ in lst])
        ih = np.concatenate([c_ for _, _, c_ in lst])
        st = audit_statistics(ttft[ih], ttft[~ih], trials=trials, alpha=float(c["alpha"]),
                              resamples=int(c["resamples"]), seed=int(np.ravel_multi_index(ix, shape)))
        for v, x in st.items():
            out[v][ix] = x
        out["probe_hit_share_hit"][ix] = float(np.mean(hit[ih] > 0))
        out["probe_hit_share_miss"][ix] = float(np.mean(hit[~ih] > 0))
        out["ttft_hit_median_s"][ix] = float(np.median(ttft[ih])) / 1000.0
        out["ttft_miss_median_s"][ix] = float(np.median(ttft[~ih])) / 1000.0
    ds = xr.Dataset({v: (dims, a) for v, a in out.items()},
                    coords={"salt": salts, "router": routers, "rate_per_s": rates, "prefix_fraction": fracs,
                            "victim_requests": nvs})
    docs = {
        "audit_auc": ("AUC of 'a slower probe means a miss': P(TTFT_miss > TTFT_hit) + P(=)/2 (0.5 = chance)", "1"),
        "audit_auc_ci_low": ("AUC, 95% interval low (Hanley-McNeil)", "1"),
        "audit_auc_ci_high": ("AUC, 95% interval high (Hanley-McNeil)", "1"),
        "audit_power": (f"share of {trials} + {trials}-probe experiments whose two-sample KS test rejects at alpha "
                        f"{float(c['alpha']):g} (resampled from the pooled probes)", "1"),
        "audit_ks_p": ("two-sample KS test p-value, all pooled probes", "1"),
        "audit_ks_stat": ("two-sample KS statistic, all pooled probes", "1"),
        "probe_hit_share_hit": ("share of cache-hit-procedure probes with any hit block", "1"),
        "probe_hit_share_miss": ("share of cache-miss-procedure probes with any hit block", "1"),
        "ttft_hit_median_s": ("median probe TTFT, cache-hit procedure", "s"),
        "ttft_miss_median_s": ("median probe TTFT, cache-miss procedure", "s"),
    }
    for v, (ln, u) in docs.items():
        ds[v].attrs.update(long_name=ln, units=u)
    ds["rate_per_s"].attrs.update(long_name="background load", units="requests/s")
    ds["prefix_fraction"].attrs["long_name"] = "share of the victim's prompt the probe shares"
    ds["victim_requests"].attrs["long_name"] = "victim requests before each probe"
    ds.attrs.update(_attrs(cfg, "audit", t0, dict(
        background=json.dumps(bg), replicas=R, capacity_blocks=int(c["capacity_blocks"]), latency=str(c["latency"]),
        prompt_tokens=int(c["prompt_tokens"]), trials=trials, experiments=exps, seeds=len(seeds),
        probes_per_procedure=n_trials * len(seeds), alpha=float(c["alpha"]), resamples=int(c["resamples"]),
        simulate_time_s=t_sim, source="Gu et al., 'Auditing Prompt Caching in Language Model APIs', ICML 2025")))
    return ds


def summarize_audit(ds) -> str:

    a = ds.attrs
    out = SB.header(ds)
    out.append(f"Gu et al.'s audit on the simulated fleet: {a['probes_per_procedure']} probes per procedure per cell "
               f"(power: experiments of {a['trials']} + {a['trials']}), prompt {a['prompt_tokens']} tokens, "
               f"{a['replicas']} replicas; background load from other tenants")
    rows = [["salt", "router", "load/s", "prefix", "victims", "AUC", "AUC 95%", "power", "KS p",
             "probe hits (hit/miss)"]]
    for s in ds.salt.values:
        for rt in ds.router.values:
            for r in ds.rate_per_s.values:
                for f in ds.prefix_fraction.values:
                    for nv in ds.victim_requests.values:
                        c = ds.sel(salt=s, router=rt, rate_per_s=r, prefix_fraction=f, victim_requests=nv)
                        rows.append([str(s), str(rt), f"{r:g}", f"{f:g}", str(int(nv)), f"{float(c.audit_auc):.3f}",
                                     f"{float(c.audit_auc_ci_low):.3f}-{float(c.audit_auc_ci_high):.3f}",
                                     f"{float(c.audit_power):.2f}", f"{float(c.audit_ks_p):.2g}",
                                     f"{float(c.probe_hit_share_hit):.2f}/{float(c.probe_hit_share_miss):.2f}"])
    out += ["", SB.table(rows)]
    for s in ds.salt.values:
        x = ds.sel(salt=s)
        out.append(f"salt={s}: AUC {float(x.audit_auc.min()):.3f}-{float(x.audit_auc.max()):.3f}, power "
                   f"{float(x.audit_power.min()):.2f}-{float(x.audit_power.max()):.2f}")
    return "\n".join(out)


def plot_audit(ds):

    fig = SB.fig(11, 4.5)
    ax1, ax2 = fig.subplots(1, 2)
    flat = ds.stack(cell=("router", "rate_per_s", "prefix_fraction", "victim_requests"))
    xs = np.arange(flat.sizes["cell"])
    for i, s in enumerate(ds.salt.values):
        y = flat.audit_auc.sel(salt=s).values
        lo, hi = flat.audit_auc_ci_low.sel(salt=s).values, flat.audit_auc_ci_high.sel(salt=s).values
        ax1.errorbar(xs, y, yerr=[y - lo, hi - y], fmt="o", ms=4, capsize=2, color=f"C{i}", label=f"salt={s}")
        ax2.plot(xs, flat.audit_power.sel(salt=s).values, "o", color=f"C{i}", label=f"salt={s}")
    ax1.axhline(0.5, color="k", lw=0.8, ls=":")
    ax2.axhline(float(ds.attrs["alpha"]), color="k", lw=0.8, ls=":")
    labels = [f"{r},{q:g}/s,f{f:g},v{int(v)}" for r, q, f, v in flat.cell.values]
    for ax, lab in ((ax1, "AUC (0.5 = chance)"), (ax2, "KS power at alpha")):
        ax.set_xticks(xs, labels, rotation=90, fontsize=6)
        ax.set_ylabel(lab)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    ax1.set_title("timing audit (Gu et al.): can the attacker tell a hit?")
    return fig


STUDIES = [
    Study("isolation", isolation_study, summarize_isolation, plot_isolation, SB.defaults_class("IsolationDefaults",
                                                                                               ISOLATION_DEFAULTS)),
    Study("audit", audit_study, summarize_audit, plot_audit, SB.defaults_class("AuditDefaults", AUDIT_DEFAULTS)),
]
