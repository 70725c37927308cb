"""The fit on service shapes unlike the shared traces (issue 18, the last target row): a conversation
service with 512-token blocks and per-block content hashes, and a day of API traffic with a diurnal
rate, one-off prompts, templates and 32-token blocks (generators: ``cacheresearch/fit/shapes.py``).
Each is fitted, sampled and replayed: the model exists, and its capacity and TTL curves are within
3 points of the trace's (mean of 2 sample seeds)."""

from __future__ import annotations

import numpy as np
import pytest

from cacheresearch.fit import fit_workload, sample_workload
from cacheresearch.fit.agent import generate_agent_sessions
from cacheresearch.fit.shapes import (
    generate_api_day,
    generate_bailian_service,
    generate_chat_service,
    generate_conversation_service,
    generate_tool_agent,
)
from cacheresearch.fit.structure import chain_content_hashes, request_structure, split_conversations
from cacheresearch.fit.validate import capacity_grid, capacity_hit_rates, ttl_hit_rates
from cacheresearch.workload.trace import read_bailian, save_bailian

TTLS = [60.0, 300.0, 900.0, 3600.0]


def _gaps(w):
    m = fit_workload(w)
    caps = capacity_grid(w, 6)
    xs = [sample_workload(m, s) for s in (0, 1)]
    cap = np.mean([capacity_hit_rates(x, caps) for x in xs], 0)
    ttl = np.mean([ttl_hit_rates(x, TTLS) for x in xs], 0)
    vol = np.mean([x.input_tokens.sum() for x in xs]) / w.input_tokens.sum()
    return (float(np.max(np.abs(cap - capacity_hit_rates(w, caps)))),
            float(np.max(np.abs(ttl - ttl_hit_rates(w, TTLS)))), float(vol))


def test_chat_service_content_hashes_detected_and_fitted():
    raw = generate_chat_service(200, seed=5, content_hashes=True)
    w, chain = chain_content_hashes(raw)
    assert chain["chained"]  # a common opener after different system prompts gives it away
    assert chain["ids"] > 0
    ref = generate_chat_service(200, seed=5)  # the same trace with prefix-chained ids
    assert np.array_equal(capacity_hit_rates(w, capacity_grid(ref, 4)), capacity_hit_rates(ref, capacity_grid(ref, 4)))
    cap, ttl, vol = _gaps(w)
    assert cap <= 0.03 and ttl <= 0.03 and abs(vol - 1) <= 0.05, (cap, ttl, vol)


def test_api_day_diurnal_one_offs_32_token_blocks():
    w = generate_api_day(600, seed=2)
    assert w.block_tokens == 32 and set(np.unique(w.tenant).tolist()) == {0, 1}
    cap, ttl, vol = _gaps(w)
    assert cap <= 0.03 and ttl <= 0.03 and abs(vol - 1) <= 0.05, (cap, ttl, vol)


# ---- realistic stand-ins at small sizes, parameters drawn at random (issue 18, helper round): a
# conversation service and a tool-and-agent service whose conversations share heads (no session ids),
# and a Bailian-format service with session ids and types
def _draw_conversation(rng):
    return dict(system_prompts=int(rng.integers(2, 20)), system_share=float(rng.uniform(0.2, 0.9)),
                first_tokens_median=float(rng.uniform(1000, 10000)), turns_mean=float(rng.uniform(1.2, 4.0)),
                think_median_s=float(rng.uniform(10, 120)), duration_s=float(rng.uniform(600, 1800)))


def _draw_tool(rng):
    return dict(tools=int(rng.integers(2, 12)), tool_share=float(rng.uniform(0.3, 0.95)),
                zipf=float(rng.uniform(0.6, 1.6)), steps_mean=float(rng.uniform(1.0, 3.0)),
                task_tokens_median=float(rng.uniform(500, 5000)), duration_s=float(rng.uniform(600, 1800)))


def _gaps3(w, **kw):
    m = fit_workload(w, **kw)
    caps = capacity_grid(w, 6)
    xs = [sample_workload(m, s) for s in (0, 1)]
    cap = np.mean([capacity_hit_rates(x, caps) for x in xs], 0)
    ttl = np.mean([ttl_hit_rates(x, TTLS) for x in xs], 0)
    return (m, float(np.max(np.abs(cap - capacity_hit_rates(w, caps)))),
            float(np.max(np.abs(ttl - ttl_hit_rates(w, TTLS)))),
            float(np.mean([x.n_requests for x in xs]) / w.n_requests),
            float(np.mean([x.input_tokens.sum() for x in xs]) / w.input_tokens.sum()))


def _partition_equal(a, b) -> bool:
    """Two labellings name the same partition of the requests."""
    pairs = np.unique(np.stack([a, b], 1), axis=0)
    return pairs.shape[0] == np.unique(a).size == np.unique(b).size


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_split_recovers_known_conversations(seed):
    rng = np.random.default_rng(100 + seed)
    gen = (generate_conversation_service, generate_tool_agent)[seed % 2]
    kw = (_draw_conversation if gen is generate_conversation_service else _draw_tool)(rng)
    w, truth = gen(int(rng.integers(800, 2000)), seed=seed, return_conversations=True, **kw)
    conv, info = split_conversations(w, interleaved_min=None)  # the rule itself, every root split
    assert _partition_equal(conv, truth)
    auto, info = split_conversations(w)  # roots whose conversations interleave (the popular heads)
    assert info["split_roots"] >= 1 and info["interleaved_share"] > 0.5, info
    assert _partition_equal(np.unique(np.stack([auto, truth], 1), axis=0)[:, 1], np.unique(truth))  # truth refines it
    assert np.unique(auto).size > request_structure(w).session.max() + 1
    # roots whose pieces follow one another (an agent compacting its context) stay whole
    a = generate_agent_sessions(30, seed=seed, compaction_rate=0.1, subagent_share=0.0)
    conv_a, info_a = split_conversations(a)
    assert info_a["split_roots"] == 0, info_a
    assert _partition_equal(conv_a, request_structure(a).session)


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow)])  # a second draw under -m slow
def test_realistic_shapes_random_draws_hold(seed):
    rng = np.random.default_rng(200 + seed)
    cases = [generate_conversation_service(int(rng.integers(800, 1500)), seed=seed, **_draw_conversation(rng)),
             generate_tool_agent(int(rng.integers(800, 1500)), seed=seed, **_draw_tool(rng))]
    for w in cases:
        m, cap, ttl, req, tok = _gaps3(w)
        assert m["source"]["conversations"]["used"]  # shared heads: sessions are conversations
        assert cap <= 0.03 and ttl <= 0.03 and abs(req - 1) <= 0.05 and abs(tok - 1) <= 0.05, (w.name, cap, ttl, req,
                                                                                                tok)


def test_bailian_format_service_holds(tmp_path):
    b = generate_bailian_service(1000, seed=3, duration_s=1200)
    save_bailian(b, tmp_path / "b.jsonl")
    r = read_bailian(tmp_path / "b.jsonl")
    assert np.array_equal(r.session, b.session) and np.array_equal(r.parent, b.parent)
    assert r.workload.block_tokens == 16 and len(r.type_names) == 4
    kw = dict(session=r.session, parent=r.parent, types=r.type, type_names=r.type_names)
    m, cap, ttl, req, tok = _gaps3(r.workload, **kw)
    assert cap <= 0.03 and ttl <= 0.03 and abs(req - 1) <= 0.05 and abs(tok - 1) <= 0.05, (cap, ttl, req, tok)
    # whole sessions keep their shared system prompts: without the heads a replay of sessions drawn whole
    # would lose every hit on a prompt shared across sessions
    e = fit_workload(r.workload, empirical=("session",), check=False, **kw)
    assert e["components"]["text"]["session"].get("heads")
    x = sample_workload(e, 0)
    ws = capacity_grid(r.workload, 1)
    assert abs(capacity_hit_rates(x, ws)[-1] - capacity_hit_rates(r.workload, ws)[-1]) <= 0.02


def test_predictive_check_falls_back_and_says_why():
    b = generate_bailian_service(800, seed=5, duration_s=1200)
    m = fit_workload(b.workload, session=b.session, parent=b.parent, types=b.type, type_names=b.type_names)
    rounds = m["predictive_check"]
    assert rounds and {"capacity_gap", "ttl_gap", "types"} <= set(rounds[0])
    assert any("fallback" in v for r in rounds for v in r["types"].values())  # this trace's laws miss jointly
    for t, c in m["components"].items():
        row = m["goodness_of_fit"][t]["session"]
        if "predictive check" in row.get("why", ""):
            assert c["session"]["family"] == "empirical_sessions"
            assert any(n.startswith(f"[{t}] session: empirical law (predictive check") for n in m["notes"])
    unchecked = fit_workload(b.workload, session=b.session, parent=b.parent, types=b.type,
                             type_names=b.type_names, check=False)
    assert "predictive_check" not in unchecked


def test_nbinom_quantiles_fast_at_small_n():
    """The shifted negative binomial's quantiles by bisection: scipy's ppf agrees where it works, and a
    small ``n`` that some fits find (scipy's ppf looped for minutes inside a predictive check) is fast."""
    from scipy import stats

    from cacheresearch.fit import laws as L
    from cacheresearch.fit.model import count_ppf

    u = np.random.default_rng(0).random(500)
    law = L.Law("nbinom1", {"n": 0.5, "p": 0.2}, 0.0, 0, {})
    assert np.array_equal(count_ppf(law, u), (stats.nbinom.ppf(u, 0.5, 0.2) + 1).astype(np.int64))
    small = L.Law("nbinom1", {"n": 0.03, "p": 0.024}, 0.0, 0, {})
    q = count_ppf(small, u)
    assert q.min() >= 1 and abs(q.mean() - L.law_mean(small)) < 1.0
