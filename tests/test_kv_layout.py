"""KV layouts of today's models (cacheresearch.replica.kv_layout): groups, forced block sizes and bytes, each
checked against a hand computation from the config's numbers and vLLM's rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cacheresearch.replica.hardware import GPUS, MIB
from cacheresearch.replica.kv_layout import (
    PRESETS,
    UNIFY_ERROR,
    dense_counterpart,
    engine_knobs,
    held_blocks,
    layout_from_config,
    pool_blocks,
    preset_layout,
    runtime_layout,
    sequences_that_fit,
    unify,
)

FIX = Path(__file__).parent / "fixtures" / "hf_configs" / "hybrid"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_fixture_reads_as_its_preset(name):
    for tp in (1, 2, 4):
        a = layout_from_config(FIX / f"{name}.json", tp=tp)
        b = preset_layout(name, tp=tp)
        assert a.types == b.types


def test_gpt_oss_120b_two_groups_of_18_layers():
    u = unify(preset_layout("gpt-oss-120b"))
    # page: 16 tokens x 2 (K, V) x 8 KV heads x 64 x 2 bytes; 18 sliding + 18 full -> group size 18
    assert (u.block_tokens, u.page_bytes, u.group_size) == (16, 16 * 2 * 8 * 64 * 2, 18)
    assert [(g.kind, g.layers, g.sliding_window) for g in u.groups] == [("sliding_window", 18, 128), ("full", 18, 0)]
    assert u.block_bytes == 18 * 32768 and not u.forced and u.hybrid
    d = unify(dense_counterpart(preset_layout("gpt-oss-120b")))
    assert d.block_bytes == 36 * 32768 and not d.hybrid


def test_gemma3_groups_split_with_stride_and_padding():
    u = unify(preset_layout("gemma-3-27b"))
    # 52 window layers, 10 full: group size 10 (52 >= 1.5 x 10); 52 -> 6 groups layers[i::6] = 9,9,9,9,8,8
    assert u.group_size == 10
    assert [g.layers for g in u.groups] == [9, 9, 9, 9, 8, 8, 10]
    assert u.block_bytes == 10 * 16 * 2 * 16 * 128 * 2


def test_qwen3_next_forces_544_token_blocks():
    lay = preset_layout("qwen3-next-80b-a3b")
    # state: conv (4 - 1) x (2 x 16 x 128 + 32 x 128 = 8192) x 2 bytes + recurrent 32 x 128 x 128 x 2 bytes
    state = 3 * 8192 * 2 + 32 * 128 * 128 * 2
    assert state == 1_097_728
    u = unify(lay)
    per_tok = 2 * 2 * 256 * 2  # 2 KV heads of 256, bf16
    assert u.block_tokens == 16 * -(-state // (16 * per_tok)) == 544
    assert "544" in u.forced and u.page_bytes == 544 * per_tok >= state
    assert [g.kind for g in u.groups] == ["mamba", "mamba", "mamba", "full"] and u.group_size == 12
    # tp 4: one KV head per GPU (2 // 4 -> replicated), a quarter of the state: 16 x ceil(274432 / 16384) = 272
    assert unify(preset_layout("qwen3-next-80b-a3b", tp=4)).block_tokens == 272
    # a larger requested block is kept
    assert unify(lay, 1024).block_tokens == 1024 and not unify(lay, 1024).forced


def test_deepseek_v3_mla_latent_and_flashmla_block():
    u = unify(preset_layout("deepseek-v3", tp=8))
    assert (u.block_tokens, u.page_bytes) == (64, 64 * 576 * 2)  # one latent of 512 + 64, not split by tp
    assert "FlashMLA" in u.forced and u.block_bytes == 61 * 64 * 576 * 2
    assert unify(preset_layout("deepseek-v3"), 128).block_tokens == 128


def test_llama_block_bytes_match_hardware_module():
    from cacheresearch.replica.hardware import block_bytes
    for name, preset in (("llama-3.1-8b", "llama3_8b"), ("llama-3.1-70b", "llama3_70b")):
        for tp in (1, 2, 4):
            assert unify(preset_layout(name, tp=tp)).block_bytes == block_bytes(preset, tp=tp)


def test_pool_blocks_and_sequences_by_hand():
    u = unify(preset_layout("gpt-oss-120b"))
    budget = int(81_559 * MIB * 0.9) - 60 * 2**30
    assert pool_blocks(u, "h100_80gb", weight_bytes=60 * 2**30) == budget // (18 * 32768)
    assert pool_blocks(u, GPUS["h100_80gb"], weight_bytes=60 * 2**30) == budget // (18 * 32768)
    # a request of 8192 slots: 512 full blocks; the window keeps blocks from (8192 - 128) // 16 = 504 on: 8
    sw, full = u.groups
    assert held_blocks(full, 8192, 16) == 512 and held_blocks(sw, 8192, 16) == 512 - 504
    assert held_blocks(sw, 100, 16) == 7  # inside the window: every block
    assert sequences_that_fit(u, 1 + 520 * 3, 8192) == 3
    q = unify(preset_layout("qwen3-next-80b-a3b"))
    assert sum(held_blocks(g, 8192, q.block_tokens) for g in q.groups) == 3 + -(-8192 // 544)
    with pytest.raises(ValueError, match="no KV room"):
        pool_blocks(u, "l4_24gb", weight_bytes=60 * 2**30)
    with pytest.raises(ValueError, match="unknown gpu"):
        pool_blocks(u, "x", weight_bytes=1)


@pytest.mark.parametrize("patch, match", [
    ({"num_hidden_layers": None}, "'num_hidden_layers'"),
    ({"layer_types": ["full_attention"] * 3}, "'layer_types'"),
    ({"layer_types": ["chunked_attention", "full_attention"] * 18}, "'layer_types'"),
    ({"sliding_window": 1}, "'sliding_window'"),
    ({"num_key_value_heads": -1}, "'num_key_value_heads'"),
    ({"torch_dtype": "int3"}, "'torch_dtype'"),
    ({"hybrid_override_pattern": "M*M*"}, "'hybrid_override_pattern'"),
    ({"use_sliding_window": True}, "'use_sliding_window'"),
])
def test_bad_configs_refused_naming_the_field(patch, match):
    c = dict(PRESETS["gpt-oss-120b"])
    for k, v in patch.items():
        if v is None:
            c.pop(k)
        else:
            c[k] = v
    with pytest.raises(ValueError, match=match) as e:
        layout_from_config(c)
    assert "\n" not in str(e.value)


def test_bad_inputs_refused(tmp_path):
    q = dict(PRESETS["qwen3-next-80b-a3b"])
    with pytest.raises(ValueError, match="'linear_num_value_heads'"):
        layout_from_config(q, tp=3)
    q.pop("linear_key_head_dim")
    with pytest.raises(ValueError, match="'linear_key_head_dim'"):
        layout_from_config(q)
    p = tmp_path / "config.json"
    p.write_text("[1]")
    with pytest.raises(ValueError, match="JSON object"):
        layout_from_config(p)
    p.write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 8}))
    assert layout_from_config(p).types[0].kind == "full"
    with pytest.raises(ValueError, match="unknown model preset"):
        preset_layout("nope")
    with pytest.raises(ValueError, match="block_tokens"):
        unify(preset_layout("gpt-oss-20b"), 0)
    with pytest.raises(ValueError, match="kv_dtype"):
        layout_from_config(PRESETS["gpt-oss-20b"], kv_dtype="int4")
    assert unify(layout_from_config(PRESETS["gpt-oss-20b"], kv_dtype="fp8")).page_bytes == 16 * 2 * 8 * 64


def test_runtime_layout_with_a_connector_that_is_not_hma():
    """vLLM turns its hybrid KV cache manager off for a KV connector that is not SupportsHMA and unifies the specs:
    gpt-oss-120b runs as 36 full-attention layers in one group (a block id stands for all 36 pages: twice the
    hybrid block's bytes, so half the block ids fit); Qwen3-Next's linear layers cannot be unified (vLLM's error)."""
    lay = preset_layout("gpt-oss-120b")
    assert runtime_layout(lay, connector=True, connector_supports_hma=True) is lay
    assert runtime_layout(lay, connector=False, connector_supports_hma=False) is lay
    off = runtime_layout(lay, connector=True, connector_supports_hma=False)
    assert [(t.kind, t.layers, t.sliding_window) for t in off.types] == [("full", 36, 0)]
    u, uo = unify(lay), unify(off)
    assert uo.block_bytes == 2 * u.block_bytes == 36 * u.page_bytes
    assert runtime_layout(u, connector=True, connector_supports_hma=False) == uo  # a Unified comes back unified
    assert engine_knobs(u) == {"kv_groups": 2, "kv_window_groups": 0b01, "kv_window": 128}
    assert engine_knobs(uo) == {"kv_groups": 1, "kv_window_groups": 0, "kv_window": 0}
    g = unify(preset_layout("gemma-3-27b"))
    assert engine_knobs(g) == {"kv_groups": 7, "kv_window_groups": 0b0111111, "kv_window": 1024}
    dense = preset_layout("llama-3.1-8b")  # one type: nothing to unify
    assert runtime_layout(dense, connector=True, connector_supports_hma=False) is dense
    q = preset_layout("qwen3-next-80b-a3b")
    assert runtime_layout(q, connector=True, connector_supports_hma=True) is q
    with pytest.raises(ValueError, match=UNIFY_ERROR):
        runtime_layout(q, connector=True, connector_supports_hma=False)
    with pytest.raises(ValueError, match="Mamba.*vllm replica's engine"):
        engine_knobs(unify(q))
    with pytest.raises(ValueError, match="KVLayout or a Unified"):
        runtime_layout("gpt-oss-120b", connector=True, connector_supports_hma=False)
