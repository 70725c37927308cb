"""cacheresearch.fit: the fit recovers the parameters of workloads generated with known ones
(arrival law, Zipf exponents, branching, sessions), the sampler keeps the trace contract, and
experiment=fit / workload.source=fitted run end to end on the fixtures.

Tolerances are stated per test; each is several standard errors of the estimator at the sample
size used, so a correct fit passes with every seed and a wrong family or a bias of a few percent fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cacheresearch.fit import fit_workload, naive_workload, request_structure, sample_workload, tree_stats
from cacheresearch.fit import laws as L
from cacheresearch.fit.validate import analytic_hit_rates, capacity_grid, capacity_hit_rates, ttl_hit_rates
from cacheresearch.workload import Workload
from cacheresearch.workload.trace import load_mooncake, read_bailian

FIX = Path(__file__).resolve().parent / "fixtures"


# ---------------------------------------------------------------------------------- laws
@pytest.mark.parametrize("shape", [0.4, 2.5])
def test_arrivals_recover_gamma_renewal(shape):
    rng = np.random.default_rng(1)
    t = np.cumsum(rng.gamma(shape, 1.0 / shape, 4000))  # unit rate, CV 1/sqrt(shape)
    a = L.fit_arrivals(t, float(t[-1]) + 0.5)
    assert a.renewal.family in ("gamma", "weibull")
    cv = float(np.sqrt(L._frozen(a.renewal).var()) / L._frozen(a.renewal).mean())
    assert cv == pytest.approx(1 / np.sqrt(shape), rel=0.08)
    if a.renewal.family == "gamma":
        assert a.renewal.params["shape"] == pytest.approx(shape, rel=0.1)
    assert a.mean_rate == pytest.approx(1.0, rel=0.05)


def test_arrivals_poisson_and_time_varying_rate():
    rng = np.random.default_rng(2)
    # Poisson, rate 2/s for 1000 s then 0.5/s for 1000 s
    t1 = np.sort(rng.uniform(0, 1000, rng.poisson(2000)))
    t2 = np.sort(rng.uniform(1000, 2000, rng.poisson(500)))
    a = L.fit_arrivals(np.concatenate([t1, t2]), 2000.0)
    assert len(a.rates) >= 2
    r = np.asarray(a.rates)
    half = len(r) // 2
    assert r[:half].mean() == pytest.approx(2.0, rel=0.08) and r[half:].mean() == pytest.approx(0.5, rel=0.15)
    # the renewal law on the rescaled clock is (close to) exponential: CV within 10% of 1
    f = L._frozen(a.renewal)
    assert np.sqrt(f.var()) / f.mean() == pytest.approx(1.0, abs=0.1)
    # a homogeneous rate must not be cut into many pieces
    t = np.sort(rng.uniform(0, 2000, 3000))
    assert len(L.fit_arrivals(t, 2000.0).rates) <= 2


def test_count_laws_recover_zeta_and_geometric():
    rng = np.random.default_rng(3)
    z = L.fit_count(rng.zipf(2.0, 5000))
    assert z.family == "zeta" and z.params["a"] == pytest.approx(2.0, abs=0.05)
    g = L.fit_count(rng.geometric(0.4, 5000))
    assert g.family in ("geom", "nbinom1") and g.mean == pytest.approx(2.5, rel=0.05)
    assert g.aic["zeta"] > g.aic[g.family] + 10


def test_zipf_ranks_and_lengths():
    rng = np.random.default_rng(4)
    law = L.Law("zipf_ranks", {"s": 1.1, "items": 80}, 0.0, 0, {})
    counts = np.bincount(L.sample(law, rng, 20000), minlength=80)
    assert L.fit_zipf_ranks(counts).params["s"] == pytest.approx(1.1, abs=0.05)
    x = np.concatenate([rng.lognormal(3.0, 0.3, 3000), rng.lognormal(9.0, 0.5, 2000)])
    mix = L.fit_lognorm_mix(x, 4)
    w, mu, sg = L.mix_components(mix)
    assert w.size >= 2
    assert mu[0] == pytest.approx(3.0, abs=0.05) and mu[-1] == pytest.approx(9.0, abs=0.08)
    assert w[0] == pytest.approx(0.6, abs=0.03)
    y = rng.gamma(2.0, 50.0, 4000)
    fy = L.fit_positive(y)
    assert fy.family == "gamma" and fy.params["shape"] == pytest.approx(2.0, rel=0.08)


# ---------------------------------------------------------------------------------- model recovery
def _known_model(D=4000.0, class_p=(0.1, 0.2, 0.6, 0.1), branch_a=2.5, count_p=0.35, gap_scale=40.0):
    law = lambda f, **p: L.Law(f, p, 0.0, 0, {}).to_dict()  # noqa: E731
    sess = {"count": law("geom", p=count_p), "gap": law("expon", scale=gap_scale), "candidates": {}}
    return {
        "version": 1, "kind": "session_model", "block_tokens": 64, "duration_s": D,
        "components": {"all": {
            "arrivals": L.Arrivals([0.5, 0.5], D, L.Law("expon", {"scale": 1.0}, 0, 0, {}), {}).to_dict(),
            "session": sess, "session_by_kind": [sess],
            "first_input_tokens": L.Law("lognorm_mix", {"w0": 1.0, "mu0": 7.0, "sigma0": 0.4}, 0, 0, {}).to_dict(),
            "roots": {"private_share": 1.0, "n_shared": 0, "popularity": None, "trunk_blocks": []},
            "step": {"lag_pmf": [0.8, 0.2], "class_p": list(class_p),
                     "branch_dropped": law("zeta", a=branch_a),
                     "branch_length_change": {"p0": 0.7, "p_positive": 0.5, "abs": law("geom", p=0.6)},
                     "extend_appended": law("geom", p=0.3), "truncate_dropped": law("geom", p=0.5)},
            "output_tokens": law("gamma", shape=2.0, scale=80.0),
        }},
    }


@pytest.fixture(scope="module")
def known_fit():
    m = _known_model()
    w = sample_workload(m, seed=11)
    return m, w, fit_workload(w, max_kinds=1, duration_s=m["duration_s"], gap_families=("expon", "gamma"))


def test_sample_keeps_the_trace_contract(known_fit):
    m, w, _ = known_fit
    assert np.all(np.diff(w.arrival_ms) >= 0) and w.arrival_ms[-1] < m["duration_s"] * 1000
    assert np.array_equal(w.n_blocks, -(-w.input_tokens // 64))
    w.check_distinct_keys()
    pred = {}
    for i in range(w.n_requests):
        ks = w.request_keys(i).tolist()
        for j, k in enumerate(ks):
            assert pred.setdefault(k, ks[j - 1] if j else None) == (ks[j - 1] if j else None)
    w2 = sample_workload(m, seed=11)
    assert np.array_equal(w.keys, w2.keys) and np.array_equal(w.arrival_ms, w2.arrival_ms)
    assert not np.array_equal(sample_workload(m, seed=12).arrival_ms[:50], w.arrival_ms[:50])



def test_length_count_copula_recovers_rho():
    """The Gaussian copula between a session's first length (normal score) and its request count:
    rho by maximum likelihood with the margins given, within 0.06 from 3,000 sessions."""
    from scipy import special

    from cacheresearch.fit.model import count_ppf, fit_length_count_copula

    rng = np.random.default_rng(21)
    law = lambda f, **p: L.Law(f, p, 0.0, 0, {}).to_dict()  # noqa: E731
    n = 3000
    for cl in (law("geom", p=0.35), law("nbinom1", n=0.5, p=0.2)):
        for rho in (0.6, 0.0, -0.4):
            z = rng.standard_normal(n)
            u = special.ndtr(rho * z + np.sqrt(1 - rho ** 2) * rng.standard_normal(n))
            c = count_ppf(cl, u)
            f = fit_length_count_copula(z, c, np.full(n, 1e9), cl, law("expon", scale=40.0))
            assert f["rho"] == pytest.approx(rho, abs=0.06), (cl, rho, f)


def test_fit_recovers_length_count_dependence():
    """Sessions whose request count rises with their first length (copula rho 0.6, one kind), sampled
    and fitted: rho within 0.12 (the count margin is fitted too, with sessions censored at the end)."""
    m = _known_model()
    sess = dict(m["components"]["all"]["session"], length_count={"rho": 0.6})
    m["components"]["all"]["session_by_kind"] = [sess]
    w = sample_workload(m, seed=5)
    st = request_structure(w)
    first = st.position == 0
    cnt = np.bincount(st.session)[st.session[first]]
    assert np.corrcoef(np.log(w.input_tokens[first]), cnt)[0, 1] > 0.2  # the sample carries it
    f = fit_workload(w, max_kinds=1, duration_s=m["duration_s"], gap_families=("expon",))
    got = f["components"]["all"]["session_by_kind"][0]["length_count"]["rho"]
    assert got == pytest.approx(0.6, abs=0.12)

def test_fit_recovers_session_structure(known_fit):
    m, w, f = known_fit
    c = f["components"]["all"]
    # sessions: 0.5/s x 4000 s = 2000 expected; geometric(0.35) requests with exponential(40 s) gaps
    assert c["sessions"] == pytest.approx(2000, rel=0.06)
    assert c["session"]["count"]["family"] in ("geom", "nbinom1")
    assert L.Law.from_dict(c["session"]["count"]).mean == pytest.approx(1 / 0.35, rel=0.08)
    g = L.Law.from_dict(c["session"]["gap"])
    assert g.mean == pytest.approx(40.0, rel=0.08)
    assert c["arrivals"]["renewal"]["family"] == "expon" or abs(
        np.sqrt(L._frozen(L.Law.from_dict(c["arrivals"]["renewal"])).var()) - 1.0) < 0.1
    # branching: step classes within 0.03, the zeta exponent of dropped blocks within 0.25
    assert np.allclose(c["step"]["class_p"][:4], [0.1, 0.2, 0.6, 0.1], atol=0.03)
    # rewrites of the context are not at longer contexts, and the zeta tail's (keeping the root, or a
    # share that grows with the parent) are branches
    assert c["step"]["class_p"][4] == 0.0
    bd = c["step"]["branch_dropped"]
    assert bd["family"] == "zeta" and bd["params"]["a"] == pytest.approx(2.5, abs=0.25)
    # the parent is inferred (longest shared prefix, ties to the most recent), so a lag-2 parent that
    # the previous request shares as much with reads as lag 1: only the bound is identifiable
    assert sum(c["step"]["lag_pmf"]) == pytest.approx(1.0) and c["step"]["lag_pmf"][0] >= 0.8 - 0.04
    # lengths: one lognormal component near exp(7) tokens
    assert c["first_input_tokens"]["params"]["mu0"] == pytest.approx(7.0, abs=0.05)


def test_fit_recovers_shared_root_zipf():
    """Bailian-like sessions under shared system prompts chosen by Zipf(1.0) popularity."""
    rng = np.random.default_rng(5)
    law = L.Law("zipf_ranks", {"s": 1.0, "items": 40}, 0.0, 0, {})
    roots = [np.arange(100 * r, 100 * r + 8, dtype=np.uint64) for r in range(40)]
    keys, sess, par, nxt, t = [], [], [], [10_000], 0.0
    times = []
    for s, r in enumerate(L.sample(law, rng, 3000)):
        t += rng.exponential(1.0)
        ks = np.concatenate([roots[r], np.arange(nxt[0], nxt[0] + 3, dtype=np.uint64)])
        nxt[0] += 3
        keys.append(ks)
        sess.append(s)
        par.append(-1)
        times.append(t)
    w = Workload.from_lists(keys, block_tokens=16, arrival_ms=np.round(np.asarray(times) * 1000).astype(np.int64))
    f = fit_workload(w, session=np.asarray(sess), parent=np.asarray(par), max_kinds=1)
    roots_fit = f["components"]["all"]["roots"]
    assert roots_fit["private_share"] == 0.0 and roots_fit["n_shared"] == 40
    assert roots_fit["popularity"]["params"]["s"] == pytest.approx(1.0, abs=0.06)
    assert set(roots_fit["trunk_blocks"]) == {8}
    # the sampler reproduces shared roots: first blocks repeat across sessions
    g = sample_workload(f, seed=0)
    first = g.keys[g.offsets[:-1]]
    assert np.unique(first).size <= 40


# ---------------------------------------------------------------------------------- traces
def test_bailian_fixture_fit_and_structure():
    tr = read_bailian(FIX / "mini_bailian.jsonl")
    st = request_structure(tr.workload, tr.session, tr.parent)
    later = st.parent >= 0
    assert np.all(st.dropped[later] == 0) and np.all(st.appended[later] > 0)  # multi-turn growth
    seen = set()
    for i in np.nonzero(st.position == 0)[0]:  # a session starts on its type's system prompt once one exists
        assert (st.root_match[i] > 0) == (int(tr.type[i]) in seen)
        seen.add(int(tr.type[i]))
    f = fit_workload(tr.workload, session=tr.session, parent=tr.parent, types=tr.type, type_names=tr.type_names,
                     max_kinds=1, gap_families=("expon",))
    assert "text" in f["components"]
    text = f["components"]["text"]
    assert text["step"]["class_p"][1] == pytest.approx(1.0)  # every later turn extends its parent
    g = sample_workload(f, seed=1)
    assert g.meta["types"].split(",")[0] == "text" and set(np.unique(g.tenant)) <= set(range(len(f["components"])))


def test_naive_baseline_and_tree_stats():
    w = load_mooncake(FIX / "mini_mooncake.jsonl", block_tokens=512)
    nv = naive_workload(w, seed=3)
    _, inv, cnt = np.unique(w.keys, return_inverse=True, return_counts=True)
    seen_once = set(w.keys[cnt[inv.reshape(-1)] == 1].tolist())
    assert not (set(nv.keys.tolist()) & seen_once)  # leaves seen once were given fresh ids
    assert set(nv.input_tokens.tolist()) <= set(w.input_tokens.tolist())
    s = tree_stats(w)
    assert s["nodes"] == np.unique(w.keys).size and s["roots"] == np.unique(w.keys[w.offsets[:-1]]).size
    assert 0 < s["block_reuse_share_top10pct"] <= 1


def test_validation_curves_on_the_fixture():
    w = load_mooncake(FIX / "mini_mooncake.jsonl", block_tokens=512)
    caps = capacity_grid(w, 6)
    assert caps[-1] == np.unique(w.keys).size
    cap = capacity_hit_rates(w, caps)
    assert np.all(np.diff(cap) >= -1e-12)
    ttl = ttl_hit_rates(w, [2e6])
    assert ttl[0] == pytest.approx(cap[-1])  # a TTL longer than the trace is the unbounded cache
    che, an_ttl = analytic_hit_rates(w, [caps[-1] * 10], [2e6])
    # in the unbounded limit the formulas count every repeat of a block as a hit, with the block's mean
    # tokens (a partial last block varies between requests), so they match the replay to within that
    assert che[0] == pytest.approx(an_ttl[0], abs=1e-9) and che[0] == pytest.approx(cap[-1], abs=0.01)


@pytest.mark.slow  # long; see README's slow checks
def test_experiment_fit_and_fitted_source(tmp_path):
    from cacheresearch.shell.sweep import run_experiment

    ds = run_experiment(["experiment=fit", f"trace.path={FIX / 'mini_mooncake.jsonl'}", "seeds=2",
                         "study.capacity_points=5", "study.max_kinds=2",
                         f"study.write_model={tmp_path / 'model.yaml'}"], tmp_path / "fit")
    for v in ("hit_rate_trace", "hit_rate_fitted", "hit_rate_fitted_ci_low", "hit_rate_fitted_ci_high",
              "hit_rate_analytic", "hit_rate_naive", "hit_rate_trace_ttl", "hit_rate_fitted_ttl"):
        assert v in ds
    w = load_mooncake(FIX / "mini_mooncake.jsonl", block_tokens=512)
    assert np.allclose(ds.hit_rate_trace.values, capacity_hit_rates(w, ds.capacity_blocks.values))
    gap = float(np.max(np.abs(ds.hit_rate_fitted.values - ds.hit_rate_trace.values)))
    assert ds.attrs["max_abs_gap_capacity"] == pytest.approx(gap)
    assert (tmp_path / "fit" / "figure.png").exists() and (tmp_path / "model.yaml").exists()
    assert "max |fitted - trace|" in (tmp_path / "fit" / "summary.txt").read_text()
    model = json.loads(ds.attrs["fitted_model"])
    rep = run_experiment(["experiment=replay", "workload.source=fitted",
                          f"workload.fitted.path={tmp_path / 'fit' / 'results.nc'}", "cache.capacity_blocks=100",
                          "seeds=2"], tmp_path / "rep")
    assert rep.sizes["seed"] == 2
    direct = sample_workload(model, seed=0)
    assert int(rep.attrs.get("n_requests", direct.n_requests)) >= 1
    from cacheresearch.shell.sweep import SweepError

    with pytest.raises(SweepError, match="workload.fitted.path"):
        run_experiment(["experiment=replay", "workload.source=fitted", "cache.capacity_blocks=100"], tmp_path / "x")


@pytest.mark.slow  # about 20 s: compiles the engine with the priority policies and 4 replicas
def test_mooncake_figure_studies_on_the_fixture(tmp_path):
    from cacheresearch.analysis.mrc import hit_curve
    from cacheresearch.shell.sweep import run_experiment

    trace = f"trace.path={FIX / 'mini_mooncake.jsonl'}"
    w = load_mooncake(FIX / "mini_mooncake.jsonl", block_tokens=512)
    hc = hit_curve(w)
    f9 = run_experiment(["experiment=mooncake_fig9", trace, "study.mark_tokens=51200"], tmp_path / "f9")
    assert f9.attrs["hit_rate_at_mark"] == pytest.approx(hc.token_hit_rate[100])
    c99 = f9.attrs["capacity_99pct_blocks"]
    assert hc.token_hit_rate[c99] >= 0.99 * hc.token_hit_rate[-1] > hc.token_hit_rate[c99 - 1]
    f10 = run_experiment(["experiment=mooncake_fig10", trace, "study.nodes=4", "study.node_tokens=[10240]"],
                         tmp_path / "f10")
    assert float(f10.hit_rate_global[0]) == pytest.approx(hc.token_hit_rate[80])
    rr = hit_curve(w, replicas=4, router="round_robin").token_hit_rate
    assert float(f10.hit_rate_local.sel(router="round_robin")[0]) == pytest.approx(rr[min(20, rr.size - 1)])
    t1 = run_experiment(["experiment=mooncake_table1", trace, "study.capacities=[inf,40]",
                         "study.policies=[lru,lfu]"], tmp_path / "t1")
    assert float(t1.hit_rate.sel(policy="lru", capacity="40")) == pytest.approx(hc.token_hit_rate[40])
    assert float(t1.hit_rate.sel(policy="lfu", capacity="inf")) == pytest.approx(hc.token_hit_rate[-1])
