"""The hybrid-vs-dense study (cacheresearch.studies.hybrid_kv) on small settings, against hand computations."""

from __future__ import annotations

import pytest

from cacheresearch.studies.hybrid_kv import capacity_rows, main, mamba_rows


def test_capacity_rows_by_hand():
    rows = {(r["model"], r["tp"]): r for r in capacity_rows()}
    g = rows[("gpt-oss-120b", 1)]
    budget = int(81_559 * 2**20 * 0.95) - int(60.8 * 2**30)
    assert g["blocks"] == budget // (18 * 16 * 2 * 8 * 64 * 2)
    assert g["dense_blocks"] == budget // (36 * 16 * 2 * 8 * 64 * 2)
    # 8192 slots: 512 full blocks + the window's 8 (128 / 16) against 512 dense blocks, the null block aside
    assert g["seqs_8192"] == (g["blocks"] - 1) // 520 and g["dense_seqs_8192"] == (g["dense_blocks"] - 1) // 512
    q = rows[("qwen3-next-80b-a3b", 2)]
    assert q["block_tokens"] == 544 and "544" in q["forced"]
    assert q["seqs_8192"] == (q["blocks"] - 1) // (16 + 3)  # 16 blocks of 544 + one state block per linear group
    assert rows[("llama-3.1-8b", 1)]["blocks"] == 29_043  # experiments/capacity.md's hand computation


def test_mamba_hit_needs_the_checkpoint_inside_the_shared_prefix():
    rows = {(r["prefix_tokens"], r["model"]): r["hit_rate"] for r in mamba_rows([(240, 40), (544, 1)], 30, 2.0)}
    assert rows[(240, "qwen3-next-80b-a3b")] == 0.0 < rows[(240, "dense counterpart")]
    assert rows[(544, "qwen3-next-80b-a3b")] > 0.5


def test_main_quick_prints_and_writes(tmp_path, capsys):
    out = main(["--quick", "--json", str(tmp_path / "o.json")])
    assert (tmp_path / "o.json").is_file() and "## Capacity" in capsys.readouterr().out
    assert {r["model"] for r in out["gpt_oss"]} == {"gpt-oss-120b", "dense counterpart"}


def test_vllm_rows_hybrid_and_unified():
    """The vllm replica's table: gpt-oss-120b with the hybrid manager (2 groups, 27,061 block ids) and unified behind
    a connector that is not SupportsHMA (1 group, half the ids: each stands for 36 layers' pages, not 18)."""
    pytest.importorskip("numba")
    from cacheresearch.studies.hybrid_kv import vllm_rows

    rows = vllm_rows([5.0], 20.0)
    assert [(r["model"], r["groups"], r["blocks"]) for r in rows] == [("hybrid manager", 2, 27_061),
                                                                       ("unified (connector, no HMA)", 1, 13_530)]
    assert all(0.0 <= r["hit_rate"] <= 1.0 and r["peak_blocks"] < r["blocks"] for r in rows)
