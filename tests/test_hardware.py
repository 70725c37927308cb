"""KV capacity from hardware: presets checked against hand computation."""

import pytest

from cacheresearch.replica import hardware as hw


def test_llama3_8b_h100_by_hand():
    # 2 (K, V) x 32 layers x 8 KV heads x 128 head dim x 2 bytes = 131,072 bytes per token
    assert hw.kv_bytes_per_token("llama3_8b") == 2 * 32 * 8 * 128 * 2 == 131_072
    # 81,559 MiB x 0.9 = 76,968,728,985 bytes; minus 16.06e9 bytes of weights = 60,908,728,985 bytes;
    # / (16 x 131,072 = 2,097,152 bytes per block) = 29,043.5 -> 29,043 blocks
    assert hw.kv_blocks("llama3_8b", "h100_80gb") == 29_043
    assert hw.kv_tokens("llama3_8b", "h100_80gb") == 29_043 * 16
    # FP8 halves the bytes per element: twice the blocks (floor of the doubled quotient)
    assert hw.kv_bytes_per_token("llama3_8b", kv_dtype="fp8") == 65_536
    assert hw.kv_blocks("llama3_8b", "h100_80gb", kv_dtype="fp8") == 60_908_728_985 // 1_048_576 == 58_087


def test_llama3_70b_tp_by_hand():
    # 70.6e9 x 2 bytes = 141.2e9 of weights: too big for one 80 GB GPU
    with pytest.raises(ValueError, match="does not fit"):
        hw.kv_blocks("llama3_70b", "h100_80gb")
    # TP=4: 8 KV heads / 4 = 2 per GPU; 2 x 80 x 2 x 128 x 2 = 81,920 bytes per token per GPU
    assert hw.kv_bytes_per_token("llama3_70b", tp=4) == 81_920
    budget = int(81_559 * 2**20 * 0.9) - 141_200_000_000 // 4  # 41,668,728,985
    assert budget == 41_668_728_985
    assert hw.kv_blocks("llama3_70b", "h100_80gb", tp=4) == budget // (16 * 81_920) == 31_790
    # TP beyond the KV heads replicates heads: 16 GPUs hold 1 head each, not 0.5
    assert hw.kv_bytes_per_token("llama3_70b", tp=16) == 2 * 80 * 1 * 128 * 2


def test_block_tokens_and_utilisation():
    b16 = hw.kv_blocks("qwen3_8b", "h200_141gb", block_tokens=16)
    b512 = hw.kv_blocks("qwen3_8b", "h200_141gb", block_tokens=512)
    assert b512 == b16 * 16 // 512 or abs(b512 * 512 - b16 * 16) < 512  # same bytes, coarser blocks
    assert hw.kv_blocks("qwen3_8b", "h200_141gb", gpu_memory_utilization=0.5) < b16
    # overhead comes out of the budget
    assert hw.kv_blocks("qwen3_8b", "h200_141gb", overhead_bytes=4 * 2**30) < b16


def test_every_preset_has_a_source_and_a_row():
    assert all(m.source for m in hw.MODELS.values()) and all(g.source for g in hw.GPUS.values())
    rows = hw.capacity_table(tps=(1, 2, 4, 8))
    assert {(r["model"], r["gpu"]) for r in rows} >= {("llama3_8b", "h100_80gb"), ("llama3_70b", "h200_141gb")}
    assert all(r["blocks"] > 0 for r in rows)


@pytest.mark.parametrize("kw,msg", [
    (dict(model="gpt5"), "unknown model"), (dict(gpu="tpu"), "unknown gpu"), (dict(kv_dtype="int3"), "kv_dtype"),
    (dict(tp=0), "tp must"), (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
])
def test_bad_input(kw, msg):
    args = dict(model="llama3_8b", gpu="h100_80gb")
    args.update(kw)
    with pytest.raises(ValueError, match=msg):
        hw.kv_blocks(args.pop("model"), args.pop("gpu"), **args)


def test_sweep_takes_capacity_from_hardware():
    from cacheresearch.shell.sweep import SweepError, compose_config, make_plan

    cfg = compose_config(["experiment=seed_fleet", "replica.gpu=h100_80gb", "replica.model=llama3_8b",
                          "replica.kv_dtype=fp8"])
    if cfg.grid.get("capacity_blocks") is not None:
        cfg = compose_config(["experiment=seed_fleet", "replica.gpu=h100_80gb", "replica.model=llama3_8b",
                              "replica.kv_dtype=fp8", "grid.capacity_blocks=null"])
    plan = make_plan(cfg)
    assert plan.base["capacity_blocks"] == hw.kv_blocks("llama3_8b", "h100_80gb", kv_dtype="fp8",
                                                        block_tokens=int(cfg.workload.fleet.block_tokens))
    with pytest.raises(SweepError, match="go together"):
        make_plan(compose_config(["experiment=seed_fleet", "replica.gpu=h100_80gb"]))
    with pytest.raises(SweepError, match="replica: unknown model"):
        make_plan(compose_config(["experiment=seed_fleet", "replica.gpu=h100_80gb", "replica.model=nope",
                                  "grid.capacity_blocks=null"]))


def test_capacity_study_table(tmp_path):
    import math

    from cacheresearch.shell.sweep import run_experiment

    ds = run_experiment(["experiment=capacity", "output.figure=false"], tmp_path)
    assert int(ds.kv_blocks.sel(model="llama3_8b", gpu="h100_80gb", tp=1, kv_dtype="bf16")) == 29_043
    assert int(ds.kv_blocks.sel(model="llama3_70b", gpu="h100_80gb", tp=4, kv_dtype="bf16")) == 31_790
    assert math.isnan(float(ds.kv_blocks.sel(model="llama3_70b", gpu="h100_80gb", tp=1, kv_dtype="fp8")))
    # cross-check: BLIS (inference-sim defaults.yaml) lists 29,205 KV blocks for Llama-3.1-8B on an 80 GB GPU;
    # the A100-80GB's 81,920 MiB give exactly that here
    assert int(ds.kv_blocks.sel(model="llama3_8b", gpu="a100_80gb", tp=1, kv_dtype="bf16")) == 29_205
    assert "29,043" in (tmp_path / "summary.txt").read_text()
