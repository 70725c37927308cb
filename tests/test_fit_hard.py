"""The fit never fails on a well-formed trace (issue 18, point 1), and the agent structure is read
off the prefix tree (point 2): hard cases built here, each fitted, sampled and validated.

Hard cases: no repeated roots; one session; only single-request sessions; 16 / 32 / 64 / 512-token
blocks; timestamps spanning days; per-block content hashes (detected, chained, reported). Recovery:
a generator with known compaction rate, subagent share and growth law (fit/agent.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from cacheresearch.fit import fit_workload, sample_workload
from cacheresearch.fit.agent import agent_structure, generate_agent_sessions
from cacheresearch.fit.model import COMPONENTS, ablate
from cacheresearch.fit.structure import chain_content_hashes, request_structure, session_hit_rates
from cacheresearch.fit.validate import capacity_grid, capacity_hit_rates
from cacheresearch.workload import Workload


def _check(w: Workload, model: dict):
    """The model samples a well-formed workload and validates (a hit-rate curve on its grid)."""
    assert model["components"]
    for seed in (0, 1):
        x = sample_workload(model, seed)
        assert x.n_requests >= 1 and np.all(np.diff(x.arrival_ms) >= 0)
        assert np.array_equal(x.n_blocks, -(-x.input_tokens // w.block_tokens))
        caps = capacity_grid(w, 4)
        h = capacity_hit_rates(x, caps)
        assert np.all((h >= 0) & (h <= 1))
    for c in COMPONENTS:  # every ablated model samples too
        assert sample_workload(ablate(model, c), 0).n_requests >= 1


def _chains(n_req, rng, bt, span_s, share_root=False, single=False):
    keys, t, nxt = [], [], 1
    root = np.arange(10**6, 10**6 + 3, dtype=np.uint64)
    for i in range(n_req):
        k = int(rng.integers(1, 6))
        own = np.arange(nxt, nxt + k, dtype=np.uint64)
        nxt += k
        keys.append(np.concatenate([root, own]) if share_root else own)
        t.append(rng.uniform(0, span_s))
    t = np.sort(np.round(np.asarray(t) * 1000).astype(np.int64))
    return Workload.from_lists(keys, block_tokens=bt, arrival_ms=t)


@pytest.mark.parametrize("bt", [16, 32, 64, 512])
def test_no_repeated_roots_every_block_size(bt):
    """Every request its own root (single-request sessions, nothing shared): the fit falls back and samples."""
    rng = np.random.default_rng(bt)
    w = _chains(60, rng, bt, 3600.0)
    m = fit_workload(w)
    g = m["goodness_of_fit"]["all"]
    assert g["session"]["used"] == "empirical" or g["session"]["used"] == "parametric"
    assert m["components"]["all"]["step"] is None  # no request has a parent
    _check(w, m)


def test_one_session_spanning_days():
    """One growing context over three days (timestamps spanning days), fewer than 10 requests."""
    ks, keys, t = list(range(1, 6)), [], []
    for i in range(8):
        ks = ks + list(range(100 * (i + 1), 100 * (i + 1) + 3))
        keys.append(np.asarray(ks, dtype=np.uint64))
        t.append(i * 9 * 3600 * 1000)
    w = Workload.from_lists(keys, block_tokens=32, arrival_ms=np.asarray(t))
    m = fit_workload(w)
    assert m["components"]["all"]["sessions"] == 1
    assert any("empirical" in n for n in m["notes"])  # the fallbacks are named
    x = sample_workload(m, 0)
    assert x.n_requests == 8  # the one session, whole
    assert x.arrival_ms[-1] > 2 * 86_400_000
    _check(w, m)


def test_shared_root_single_requests_and_a_single_request():
    rng = np.random.default_rng(3)
    w = _chains(40, rng, 64, 600.0, share_root=True)
    m = fit_workload(w)
    _check(w, m)
    w1 = Workload.from_lists([np.arange(1, 4, dtype=np.uint64)], block_tokens=16, arrival_ms=np.array([0]))
    m1 = fit_workload(w1)
    assert sample_workload(m1, 0).n_requests == 1


def test_content_hashes_detected_and_chained():
    """Ids that hash each block's content alone (a repeated block content after different prefixes):
    detected, chained into prefix ids (a trie of the raw ids), and reported in the model's notes."""
    rng = np.random.default_rng(4)
    common = np.arange(500, 520, dtype=np.uint64)  # a boilerplate block run that follows many prefixes
    keys = []
    for i in range(80):
        head = np.array([1 + i % 5], dtype=np.uint64)  # five system prompts
        keys.append(np.concatenate([head, common[: rng.integers(2, 20)],
                                    np.array([10_000 + i], dtype=np.uint64)]))
    w = Workload.from_lists(keys, block_tokens=64, arrival_ms=np.sort(rng.integers(0, 10**6, 80)))
    c, info = chain_content_hashes(w)
    assert info["chained"] and info["inconsistent_ids"] > 0
    # chained: every id has one predecessor; requests under the same head share exactly their common run
    pred = {}
    for i in range(c.n_requests):
        ks = c.request_keys(i).tolist()
        for j, k in enumerate(ks):
            assert pred.setdefault(k, ks[j - 1] if j else None) == (ks[j - 1] if j else None)
    a, b = c.request_keys(0), c.request_keys(5)  # same head (0 % 5 == 5 % 5)
    n = min(int(w.n_blocks[0]), int(w.n_blocks[5])) - 1
    assert np.array_equal(a[:n], b[:n]) and not np.array_equal(c.request_keys(0)[:1], c.request_keys(1)[:1])
    again, info2 = chain_content_hashes(c)  # a chained trace is left alone
    assert not info2["chained"] and np.array_equal(again.keys, c.keys)
    m = fit_workload(w)
    assert m["source"]["key_chaining"]["chained"] and "content hashes" in m["notes"][0]
    _check(c, m)


def test_session_hit_rates_unbounded():
    keys = [np.array([1, 2, 3], np.uint64), np.array([1, 2, 3, 4], np.uint64), np.array([9], np.uint64)]
    w = Workload.from_lists(keys, block_tokens=16)
    h = session_hit_rates(w)
    assert h.tolist() == [pytest.approx(48 / 112), 0.0]  # session {0, 1}: 3 of 7 blocks hit


@pytest.fixture(scope="module")
def agents():
    w = generate_agent_sessions(120, seed=7, compaction_rate=0.04, subagent_share=0.3, growth_p=0.05)
    return w, agent_structure(w)


def test_agent_structure_recovered(agents):
    """Known laws: growth geometric(0.05) blocks per step (mean 20), compaction 4% of steps, 30% of the
    contexts subagents. Tolerances: several standard errors at this size (about 4,000 steps, 170 contexts)."""
    w, a = agents
    assert a["growth_blocks_mean"] == pytest.approx(20.0, rel=0.08)
    assert a["growth"]["family"] in ("geom", "nbinom1")
    assert a["compaction_rate"] == pytest.approx(0.04, abs=0.012)
    assert a["subagent_share"] == pytest.approx(0.3, abs=0.08)
    assert a["sessions"] == pytest.approx(120, abs=15)


def test_agent_fit_samples_whole_sessions_with_compactions(agents):
    """The fitted model keeps the agent shape: growing contexts, compactions (length-triggered), and
    volume within 5% of the trace (mean of three seeds)."""
    w, _ = agents
    m = fit_workload(w)
    xs = [sample_workload(m, s) for s in range(3)]
    assert np.mean([x.n_requests for x in xs]) == pytest.approx(w.n_requests, rel=0.05)
    # token volume: sessions drawn whole replay their own steps in order, compactions included
    assert np.mean([x.input_tokens.sum() for x in xs]) == pytest.approx(w.input_tokens.sum(), rel=0.05)
    st = request_structure(xs[0])
    later = st.parent >= 0
    assert np.mean(st.appended[later] > 0) > 0.9  # contexts grow
    assert agent_structure(xs[0])["compactions"] > 0


def test_parallel_subagents_recovered():
    """Three subagents started at once in one gap of their parent, interleaved, the parent waiting for the
    last: the rule checks the wait on the group, so it finds them (40% of contexts are subagents)."""
    w = generate_agent_sessions(60, seed=11, subagent_share=0.4, parallel=3)
    a = agent_structure(w)
    assert a["subagent_share"] == pytest.approx(0.4, abs=0.1)
    assert a["sessions"] == pytest.approx(60, abs=8)


def test_sessions_drawn_whole_replay_their_own_steps_in_order():
    """A model whose sessions are the trace's (empirical) replays each session's growth, compactions and
    branches in order: every sampled session's sequence of context lengths (blocks) and input tokens is
    a prefix of a trace session's, and the sample's token volume is the trace's within 5%."""
    w = generate_agent_sessions(12, seed=5, compaction_rate=0.1)
    m = fit_workload(w, empirical=("session", "arrivals"))
    x = sample_workload(m, 1)

    def seqs(v):
        st = request_structure(v)
        return [tuple(zip(v.n_blocks[st.session == s].tolist(), v.input_tokens[st.session == s].tolist()))
                for s in range(int(st.session.max()) + 1)]

    trace = seqs(w)
    for q in seqs(x):
        assert any(t[: len(q)] == q for t in trace)
    assert x.input_tokens.sum() == pytest.approx(w.input_tokens.sum(), rel=0.05)


def test_parametric_sessions_compact_at_the_known_rate():
    """Sessions simple enough for parametric laws (one exponential gap, no subagents) whose compactions come
    at random (5% of steps, each keeping a fixed 20-block head): the fit keeps them as compactions drawn at
    random (not length-triggered, not branches), so the samples compact at the trace's rate, grow at its
    rate and carry its token volume (means of three seeds). Before, these rewrites were read as branches:
    the samples compacted 2-2.6% of steps and carried 1.35-1.54x the tokens."""
    w = generate_agent_sessions(100, seed=3, compaction_rate=0.05, subagent_share=0.0, growth_p=0.1,
                                think_share=0.0, requests_mean=30)
    a = agent_structure(w)
    m = fit_workload(w)
    c = m["components"]["all"]
    assert c["session"].get("family") != "empirical_sessions"  # the parametric session path
    assert c["step"]["compact_trigger"] is None and c["step"]["class_p"][4] > 0.02
    xs = [sample_workload(m, s) for s in range(3)]
    b = [agent_structure(x) for x in xs]
    assert np.mean([x["compaction_rate"] for x in b]) == pytest.approx(a["compaction_rate"], abs=0.01)
    assert np.mean([x["growth_blocks_mean"] for x in b]) == pytest.approx(a["growth_blocks_mean"], rel=0.05)
    assert np.mean([x.input_tokens.sum() for x in xs]) == pytest.approx(w.input_tokens.sum(), rel=0.05)
    assert np.mean([x.n_requests for x in xs]) == pytest.approx(w.n_requests, rel=0.05)


def test_every_request_at_one_instant():
    """All timestamps equal (a trace cut from a batch job): zero gaps everywhere. The count law's
    fit must stay drawable (a negative binomial fitted to it once asked numpy for p ~ 0)."""
    keys = [np.arange(i * 10, i * 10 + 5, dtype=np.uint64) if i % 3 else np.array([7, 8, 9], dtype=np.uint64)
            for i in range(60)]
    w = Workload.from_lists(keys, block_tokens=16, arrival_ms=np.zeros(60, dtype=np.int64))
    m = fit_workload(w)
    _check(w, m)


def test_count_law_parameters_stay_drawable():
    """Extreme parameters of the shifted negative binomial are clamped so numpy can draw them."""
    from cacheresearch.fit import laws as L

    for theta in ([800.0, -60.0], [-50.0, 60.0], [30.0, -30.0]):
        p = L._count_params("nbinom1", theta)
        law = L.Law("nbinom1", p, 0.0, 0, {})
        x = L.sample(law, np.random.default_rng(0), 16)
        assert np.all(x >= 1)


def test_subagent_parents_equal_the_plain_python_rule():
    """The vectorised nesting rule (time linear in candidate (gap, context) pairs) picks the same parent
    as the O(contexts^2) statement of the rule, ties of coarse timestamps included."""
    from cacheresearch.fit.agent import _subagent_parents, _subagent_parents_reference

    rng = np.random.default_rng(7)
    found = 0
    for trial in range(300):
        ctx = np.unique(rng.integers(0, int(rng.integers(1, 40)), int(rng.integers(1, 200))), return_inverse=True)[1]
        res = (1000.0, 1.0, 0.5)[trial % 3]  # ms, whole-second and half-second clocks (ties)
        t = np.round(rng.uniform(0, 100, ctx.size) * res) / res
        slack = float(rng.choice([0.0, 0.5, 2.0, 5.0, 20.0]))
        ref = _subagent_parents_reference(t, ctx, slack)
        got = _subagent_parents(t, ctx, slack, chunk_pairs=int(rng.choice([1, 7, 1000])))
        assert np.array_equal(got, ref), trial
        found += int((ref >= 0).sum())
    assert found > 500  # the cases exercise the rule, not only "no parent"
    w = generate_agent_sessions(30, seed=3, subagent_share=0.4, parallel=2)
    from cacheresearch.fit.structure import request_structure

    st = request_structure(w)
    t = w.arrival_ms / 1000.0
    assert np.array_equal(_subagent_parents(t, st.session, 2.0), _subagent_parents_reference(t, st.session, 2.0))


def test_session_law_fit_on_a_subsample_of_many_sessions(monkeypatch):
    """Above SESSION_FIT_MAX sessions the joint (count, gap) MLE runs on a fixed random subsample with
    their own gaps, says so, and recovers the laws the whole set gives."""
    from cacheresearch.fit import model as M

    rng = np.random.default_rng(5)
    n = 3000
    counts = rng.geometric(0.3, n).astype(np.float64)
    sess = np.repeat(np.arange(n), (counts - 1).astype(np.int64))
    gaps = rng.exponential(40.0, sess.size)
    window = np.full(n, 1e9)  # nothing censored
    full = M._fit_session(counts, gaps, sess, window, gap_families=("expon",))
    monkeypatch.setattr(M, "SESSION_FIT_MAX", 800)
    sub = M._fit_session(counts, gaps, sess, window, gap_families=("expon",))
    assert sub["subsample"] == {"sessions": 800, "of": n} and "subsample" not in full
    assert full["gap"]["family"] == sub["gap"]["family"] == "expon"
    assert abs(sub["gap"]["params"]["scale"] / full["gap"]["params"]["scale"] - 1) < 0.15
    assert abs(sub["gap"]["params"]["scale"] / 40.0 - 1) < 0.15
