"""gpt-oss-120b in the hardware and roofline models (cacheresearch.replica.hardware, .roofline): MXFP4 expert
weights, sliding-window KV capacity with and without vLLM's hybrid KV cache manager, and the step
coefficients of window layers, each checked against a hand computation from the published config.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cacheresearch.replica import hardware as hw
from cacheresearch.replica import roofline as rf
from cacheresearch.replica.kv_layout import layout_from_config, pool_blocks

CFG = Path(__file__).resolve().parent / "fixtures" / "hf_configs"
OSS = str(CFG / "hybrid" / "gpt-oss-120b.json")

# gpt-oss-120b's config.json: 36 layers, hidden H 2880, 64 query / 8 KV heads of 64, 128 experts (4 active) of
# intermediate FFN 2880, vocabulary 201,088, untied embeddings, attention biases, MXFP4 experts
H, FFN, E, L, V = 2880, 2880, 128, 36, 201_088
ATTN = H * 64 * 64 + 2 * H * 8 * 64 + 64 * 64 * H + (64 * 64 + 2 * 8 * 64 + H) + 64  # + biases + sinks
ROUTER = H * E + E
EXPERT = 3 * H * FFN  # gate, up, down
EXPERT_BIAS = 2 * FFN + H
EMB = 2 * V * H


def test_gpt_oss_120b_parameters_and_mxfp4_weights_by_hand():
    m = hw.model_from_config(OSS)
    assert ATTN == 26_542_080 + 8_000 + 64 == 26_550_144 and ROUTER == 368_768 and EXPERT == 24_883_200
    total = L * (ATTN + ROUTER + E * (EXPERT + EXPERT_BIAS)) + EMB
    assert m.params == total == 116_828_946_432  # model card (arXiv 2508.10925): 116.83 B
    active = L * (ATTN + ROUTER + 4 * (EXPERT + EXPERT_BIAS)) + EMB
    assert m.active_params == active
    # the card's 5.13 B active leaves out the input embedding (a lookup); the roofline's FLOPs keep it
    assert (active - V * H) / 1e9 == pytest.approx(5.13, abs=0.005)
    # MXFP4 experts: 4-bit values, two per byte, and one e8m0 scale byte per 32 values; FFN is a multiple of 64
    # (no padding on vLLM's Triton backend): w13 2 FFN x (H / 2 + H / 32), w2 H x (FFN / 2 + FFN / 32)
    per_expert = 2 * FFN * (H // 2 + H // 32) + H * (FFN // 2 + FFN // 32)
    assert per_expert == 13_219_200 and per_expert * 8 / EXPERT == 4.25
    experts = L * E * per_expert
    assert experts == 60_914_073_600
    bf16 = 2 * (total - L * E * EXPERT)  # attention, router, expert biases, embeddings, LM head
    assert bf16 == 4_334_321_664
    assert m.weight_bytes == experts + bf16 == 65_248_395_264
    # published: checkpoint 60.8 GiB (model card Table 1), about 65 GB on disk
    assert m.weight_bytes / 2**30 == pytest.approx(60.8, rel=1e-3)
    assert 63e9 < m.weight_bytes < 66e9
    # held after loading on vLLM's Triton backend: the scales twice (one byte per 32 expert weights) and the
    # expert biases in FP32; vLLM logs "Model loading took 64.38 GiB memory" on one H100 (vLLM issue 33155)
    assert m.resident_extra_bytes == L * E * EXPERT // 32 + L * E * EXPERT_BIAS * 2 == 3_583_180_800 + 79_626_240
    assert (m.weight_bytes + m.resident_extra_bytes) / 2**30 == pytest.approx(64.38, rel=5e-3)
    assert m.kv_types == (("sliding_window", 18, 128), ("full", 18, 0))
    assert (m.window_layers, m.full_layers, m.sliding_window) == (18, 18, 128)
    assert "mxfp4 experts" in m.source and "18 sliding_window (window 128)" in m.source
    # the config's modules_to_not_convert are the weights vLLM's Mxfp4Config leaves in BF16
    q = json.loads(Path(OSS).read_text())["quantization_config"]
    assert q["quant_method"] == "mxfp4" and not any("experts" in x for x in q["modules_to_not_convert"])


def test_gpt_oss_120b_kv_bytes_per_token_per_layer_type():
    # one layer: 2 (K, V) x 8 KV heads x 64 x 2 bytes = 2,048 bytes per token; 18 layers of each type
    assert hw.kv_bytes_per_token(OSS, kind="full") == hw.kv_bytes_per_token(OSS, kind="sliding_window") == 18 * 2048
    assert hw.kv_bytes_per_token(OSS) == 36 * 2048 == 73_728
    assert hw.kv_bytes_per_token(OSS, tp=2, kind="full") == 18 * 2 * 4 * 64 * 2
    assert hw.kv_bytes_per_token(OSS, kv_dtype="fp8", kind="sliding_window") == 18 * 1024
    assert hw.kv_bytes_per_token("llama3_8b", kind="full") == hw.kv_bytes_per_token("llama3_8b")
    assert hw.kv_bytes_per_token("llama3_8b", kind="sliding_window") == 0
    with pytest.raises(ValueError, match="kind must be"):
        hw.kv_bytes_per_token(OSS, kind="mla")
    # the hardware model's layout is the one kv_layout reads from the config
    assert hw.kv_layout_of(OSS).types == layout_from_config(OSS).types


def test_gpt_oss_120b_blocks_on_one_h100_by_hand():
    """llm-d's gpt-oss-120b benchmark: TP=1, --gpu-memory-utilization=0.95, --block-size=128."""
    held = 65_248_395_264 + 3_662_807_040  # weights + the Triton backend's extra (test above)
    budget = int(81_559 * 2**20 * 0.95) - held
    assert budget == 81_244_769_484 - 68_911_202_304 == 12_333_567_180
    page = 128 * 2048  # one block of one layer
    # hybrid manager: two groups of 18 layers (18 window, 18 full); a block id is one group's block
    u = hw.kv_cache_layout(OSS, block_tokens=128)
    assert (u.page_bytes, u.group_size, u.block_bytes) == (page, 18, 18 * page) == (262_144, 18, 4_718_592)
    assert [(g.kind, g.layers, g.sliding_window) for g in u.groups] == [("sliding_window", 18, 128), ("full", 18, 0)]
    kw = dict(gpu_memory_utilization=0.95, block_tokens=128)
    assert hw.kv_blocks(OSS, "h100_80gb", **kw) == budget // 4_718_592 == 2_613
    assert pool_blocks(u, "h100_80gb", weight_bytes=held, gpu_memory_utilization=0.95) == 2_613
    # without it (a KV connector that is not SupportsHMA): every layer full attention, one block of 36 layers
    d = hw.kv_cache_layout(OSS, block_tokens=128, hybrid_manager=False)
    assert (d.group_size, d.block_bytes, len(d.groups)) == (36, 36 * page, 1)
    assert d.block_bytes == hw.block_bytes(OSS, block_tokens=128) == 9_437_184
    assert hw.kv_blocks(OSS, "h100_80gb", hybrid_manager=False, **kw) == budget // 9_437_184 == 1_306
    assert hw.kv_tokens(OSS, "h100_80gb", hybrid_manager=False, **kw) == 1_306 * 128
    # a model of full attention only: the same either way
    for m in ("llama3_8b", str(CFG / "qwen3_30b_a3b.json")):
        assert hw.kv_blocks(m, "h100_80gb", hybrid_manager=False) == hw.kv_blocks(m, "h100_80gb")
        dense = hw.kv_cache_layout(m, hybrid_manager=False)
        assert hw.kv_cache_layout(m).block_bytes == dense.block_bytes == hw.block_bytes(m)
    with pytest.raises(ValueError, match="hybrid_manager"):
        hw.kv_blocks(OSS, "h100_80gb", hybrid_manager=1)
    with pytest.raises(ValueError, match="does not fit"):
        hw.kv_blocks(OSS, "l4_24gb")


def test_gpt_oss_120b_step_coefficients_by_hand():
    eff_bw, eff_fl = rf.EFF["eff_bw"], rf.EFF["eff_flops"]
    bw, fl = rf.GPU_PEAK["h100_80gb"].bandwidth * eff_bw, rf.GPU_PEAK["h100_80gb"].flops * eff_fl
    m = hw.model_from_config(OSS)
    s = rf.step_coefficients(OSS, "h100_80gb", 1)
    assert s["step_base_ns"] == round(65_248_395_264 / bw * 1e9)  # every expert read each step
    # decode: the 18 full layers read the whole context; the 18 window layers W = 128 tokens per request
    assert s["step_ctx_ps"] == round(18 * 2048 / bw * 1e12)
    assert s["step_decode_ns"] == round(128 * 18 * 2048 / bw * 1e9)
    # prefill: matmuls of the active parameters + the window layers' attention at a full window
    att_w = 4.0 * 18 * 64 * 64 * 128
    assert s["step_prefill_ns"] == round((2 * m.active_params + att_w) / fl * 1e9)
    assert s["step_prefill_ctx_fs"] == round(4.0 * 18 * 64 * 64 / fl * 1e15)
    assert "18 sliding-window layers (W 128)" in s["source"] and "every expert" in s["source"]
    # a window layer attends to min(ctx, W) tokens, a full layer to ctx
    r = rf.roofline(OSS, "h100_80gb", 1)
    for ctx in (0, 100, 128, 5000):
        want = (2 * m.active_params + 4.0 * 64 * 64 * (18 * ctx + 18 * min(ctx, 128))) / fl
        assert r.prefill_token_s(ctx) == pytest.approx(want, rel=1e-12)
    # a dense model has no window terms
    d = rf.step_coefficients("llama3_8b", "h100_80gb", 1)
    assert d["step_decode_ns"] == 0 and d["step_ctx_ps"] == round(131_072 / bw * 1e12)


def test_sliding_window_configs_now_modelled_and_what_stays_refused(tmp_path):
    base = json.loads((CFG / "llama3_8b.json").read_text())

    def spec(**change):
        c = {k: v for k, v in dict(base, **change).items() if v is not None}
        p = tmp_path / "m.json"
        p.write_text(json.dumps(c))
        return hw.model_from_config(p)

    w = spec(layer_types=["sliding_attention", "full_attention"] * 16, sliding_window=4096)
    d = spec()
    assert (w.window_layers, w.sliding_window, w.weight_bytes) == (16, 4096, d.weight_bytes)
    assert hw.kv_blocks(w, "h100_80gb", hybrid_manager=False) == hw.kv_blocks(d, "h100_80gb")
    assert spec(layer_types=["full_attention"] * 32).kv_types == ()
    for change, msg in [
        (dict(quantization_config={"quant_method": "awq"}), "only fp8 and mxfp4"),
        (dict(quantization_config={"quant_method": "mxfp4"}), "without experts"),
        (dict(layer_types=["linear_attention", "full_attention"] * 16), "linear-attention"),
        (dict(use_sliding_window=True), "'use_sliding_window'"),
        (dict(layer_types=["sliding_attention", "full_attention"] * 16), "'sliding_window'"),
        (dict(num_local_experts=8, num_experts_per_tok=2, hidden_size=4100,
              quantization_config={"quant_method": "mxfp4"}), "'hidden_size' must be a multiple of 32"),
    ]:
        with pytest.raises(ValueError, match=msg) as e:
            spec(**change)
        assert "\n" not in str(e.value) and "m.json" in str(e.value)


def test_gpt_oss_20b_from_the_same_shapes_matches_its_card(tmp_path):
    """gpt-oss-20b (model card, arXiv 2508.10925): 24 layers and 32 experts (4 active) of gpt-oss-120b's
    shapes; 20.91 B parameters, 3.61 B active (without the input embedding), checkpoint 12.8 GiB."""
    c = json.loads(Path(OSS).read_text())
    c.update(num_hidden_layers=24, num_local_experts=32, layer_types=c["layer_types"][:24])
    p = tmp_path / "gpt-oss-20b.json"
    p.write_text(json.dumps(c))
    m = hw.model_from_config(p)
    assert m.params == 24 * (ATTN + H * 32 + 32 + 32 * (EXPERT + EXPERT_BIAS)) + EMB == 20_914_616_064
    assert (m.active_params - V * H) / 1e9 == pytest.approx(3.61, abs=0.005)
    assert m.weight_bytes == 24 * 32 * 13_219_200 + 2 * (m.params - 24 * 32 * EXPERT) == 13_760_982_528
    assert m.weight_bytes / 2**30 == pytest.approx(12.8, rel=2e-3)
    assert m.kv_types == (("sliding_window", 12, 128), ("full", 12, 0))


def test_sweep_capacity_with_and_without_the_hybrid_manager():
    """``replica.hybrid_manager`` reaches kv_blocks; a dense model ignores it."""
    from cacheresearch.shell.sweep import compose_config, make_plan

    def cap(model, *extra):
        cfg = compose_config(["experiment=seed_fleet", "replica.gpu=h100_80gb", f"replica.model={model}",
                              "replica.gpu_memory_utilization=0.95", "grid.capacity_blocks=null", *extra])
        return make_plan(cfg).base["capacity_blocks"], int(cfg.workload.fleet.block_tokens)

    on, bt = cap(OSS)
    off, _ = cap(OSS, "replica.hybrid_manager=false")
    assert on == hw.kv_blocks(OSS, "h100_80gb", gpu_memory_utilization=0.95, block_tokens=bt)
    assert off == hw.kv_blocks(OSS, "h100_80gb", gpu_memory_utilization=0.95, block_tokens=bt, hybrid_manager=False)
    assert off == on // 2
    assert cap("llama3_8b", "replica.hybrid_manager=false") == cap("llama3_8b")
