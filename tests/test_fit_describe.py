"""The fit says what it is (issue 47): per component of a fitted model, parametric (which law, its parameters with
units) or resampled from the trace (and why), what a sample can extrapolate, one session count, and no raw list or
dict dumps in ``experiment=fit``'s summary.

A trace drawn from a known law keeps its laws parametric; an irregular trace (the bundled Mooncake fixture, whose
reuse gaps no candidate law passes) falls back to whole trace sessions, and the summary says that a sample then
reproduces the trace's own requests.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from cacheresearch.fit import fit_workload, sample_workload
from cacheresearch.fit import laws as L
from cacheresearch.fit.describe import STATUSES, component_rows, describe_model, law_words
from cacheresearch.workload.trace import load_mooncake

FIX = Path(__file__).resolve().parent / "fixtures"
RESAMPLED = "THIS MODEL IS THE TRACE RESAMPLED"


def known_model(D: float = 1500.0) -> dict:
    """Poisson session starts (0.5 a second), geometric requests per session (mean 1 / 0.35), exponential reuse
    gaps (mean 40 s), lognormal first lengths (median e^7 tokens), gamma output lengths (mean 160 tokens)."""
    law = lambda f, **p: L.Law(f, p, 0.0, 0, {}).to_dict()  # noqa: E731
    sess = {"count": law("geom", p=0.35), "gap": law("expon", scale=40.0), "candidates": {}}
    return {
        "version": 1, "kind": "session_model", "block_tokens": 64, "duration_s": D,
        "components": {"all": {
            "arrivals": L.Arrivals([0.5], D, L.Law("expon", {"scale": 1.0}, 0, 0, {}), {}).to_dict(),
            "session": sess, "session_by_kind": [sess],
            "first_input_tokens": L.Law("lognorm_mix", {"w0": 1.0, "mu0": 7.0, "sigma0": 0.4}, 0, 0, {}).to_dict(),
            "roots": {"private_share": 1.0, "n_shared": 0, "popularity": None, "trunk_blocks": []},
            "step": {"lag_pmf": [1.0], "class_p": [0.1, 0.5, 0.3, 0.1],
                     "branch_dropped": law("geom", p=0.5),
                     "branch_length_change": {"p0": 0.0, "p_positive": 1.0, "abs": law("geom", p=0.5)},
                     "extend_appended": law("geom", p=0.3), "truncate_dropped": law("geom", p=0.5)},
            "output_tokens": law("gamma", shape=2.0, scale=80.0),
        }},
    }


@pytest.fixture(scope="module")
def known_trace():
    return sample_workload(known_model(), seed=3)


@pytest.fixture(scope="module")
def known_fit(known_trace):
    return fit_workload(known_trace, max_kinds=1)


@pytest.fixture(scope="module")
def irregular_fit():
    return fit_workload(load_mooncake(FIX / "mini_mooncake.jsonl", block_tokens=512), max_kinds=2)


def test_a_trace_from_a_known_law_is_reported_parametric_with_its_laws_in_words(known_fit):
    rows = component_rows(known_fit)["all"]
    assert {r["status"] for r in rows.values()} <= set(STATUSES)
    for k in ("arrivals", "session", "first", "output"):
        assert rows[k]["status"] == "parametric", (k, rows[k])
        assert not rows[k]["why"]
    assert "sessions/s" in rows["arrivals"]["law"] and "Poisson" in rows["arrivals"]["law"]
    m = re.search(r"mean ([\d.]+) requests", rows["session"]["law"])
    assert m and float(m.group(1)) == pytest.approx(1 / 0.35, rel=0.12), rows["session"]["law"]
    m = re.search(r"reuse time\) [^;]*?mean ([\d.]+) s", rows["session"]["law"])
    assert m and float(m.group(1)) == pytest.approx(40.0, rel=0.12), rows["session"]["law"]
    m = re.search(r"median ([\d,]+) tokens", rows["first"]["law"])
    assert m and float(m.group(1).replace(",", "")) == pytest.approx(np.exp(7.0), rel=0.08), rows["first"]["law"]
    assert rows["output"]["law"].endswith("tokens") and "mean" in rows["output"]["law"]
    assert rows["roots"]["status"] == "none"
    assert rows["step"]["status"] in ("parametric", "partly") and "extends it" in rows["step"]["law"]
    text = "\n".join(describe_model(known_fit))
    assert RESAMPLED not in text
    assert "parametric session starts continue the fitted rate profile" in text
    assert "rates_per_s" in text and "draw session sizes, gaps and lengths the trace never showed" in text
    assert "(checked: KS distance" in text


def test_an_irregular_component_is_reported_resampled_with_its_reason(known_trace):
    """The same trace with bimodal output lengths (10 or 5,000 tokens): only the output law falls back."""
    rng = np.random.default_rng(0)
    out = np.where(rng.random(known_trace.n_requests) < 0.5, 10, 5000).astype(np.int64)
    rows = component_rows(fit_workload(dataclasses.replace(known_trace, output_tokens=out), max_kinds=1))["all"]
    assert rows["output"]["status"] == "resampled" and "resampled" in rows["output"]["law"]
    assert "KS distance" in rows["output"]["why"] or "mean off" in rows["output"]["why"], rows["output"]
    assert rows["session"]["status"] == "parametric" and rows["arrivals"]["status"] == "parametric"


def test_an_irregular_trace_is_reported_as_the_trace_resampled(irregular_fit):
    rows = component_rows(irregular_fit)["all"]
    assert rows["session"]["status"] == "resampled" and rows["session"]["why"], rows["session"]
    assert rows["arrivals"]["status"] == "resampled"
    assert all(rows[k]["status"] == "not used" for k in ("first", "step", "roots"))
    text = "\n".join(describe_model(irregular_fit))
    assert RESAMPLED in text and "reproduces the trace's own requests" in text
    assert "values beyond the trace's: no" in text and "resampled starts cannot be scaled" in text


@pytest.mark.parametrize("law, unit, words", [
    ({"family": "expon", "params": {"scale": 2400.0}}, "s", "exponential, mean 2,400 s (40 min)"),
    ({"family": "geom", "params": {"p": 0.25}}, "requests", "geometric, mean 4 requests"),
    ({"family": "zeta", "params": {"a": 1.8}}, "blocks", "no finite mean"),
    ({"family": "lognorm_mix", "params": {"w0": 0.25, "mu0": np.log(500.0), "sigma0": 0.5, "w1": 0.75,
                                          "mu1": np.log(8000.0), "sigma1": 0.3}}, "tokens",
     "mixture of 2 lognormals (session kinds): 25% with median 500 tokens, 75% with median 8,000 tokens"),
    ({"family": "empirical", "values": [1, 2, 3], "n": 3}, "tokens",
     "the trace's 3 values resampled (median 2 tokens)"),
])
def test_law_words(law, unit, words):
    assert words in law_words(law, unit)


def test_the_fit_summary_has_no_raw_dumps_and_one_session_count(tmp_path):
    from cacheresearch.shell.sweep import run_experiment

    run_experiment(["experiment=fit", f"trace.path={FIX / 'mini_mooncake.jsonl'}", "seeds=1",
                    "study.capacity_points=3", "study.ablation=false", "study.baseline=false"], tmp_path)
    text = (tmp_path / "summary.txt").read_text()
    assert not re.search(r"\[\s*-?\d+(\.\d+)?(e-?\d+)?\s*,", text), "a list of numbers dumped"
    assert not re.search(r"\{\s*['\"]", text) and "': " not in text, "a dict dumped"
    assert not re.search(r"\d\.\d{6,}", text), "a float printed at full precision"
    counts = {m.replace(",", "") for m in re.findall(r"(?<![\d.,])(\d[\d,]*) sessions\b(?!/| an hour)", text)}
    assert len(counts) == 1, counts
    assert RESAMPLED in text and "session starts: resampled" in text
