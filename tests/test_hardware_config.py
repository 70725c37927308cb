"""replica.model as a Hugging Face config.json (cacheresearch.replica.hardware.model_from_config): the
shapes and parameter counts of published checkpoints, the presets they match, mixtures of experts,
and clear errors for what is not modelled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cacheresearch.replica import hardware as hw
from cacheresearch.replica import roofline as rf

CFG = Path(__file__).resolve().parent / "fixtures" / "hf_configs"


@pytest.mark.parametrize("name, preset, params", [("qwen3_32b", "qwen3_32b", 32.8e9),
                                                  ("llama3_8b", "llama3_8b", 8.03e9)])
def test_dense_configs_match_their_presets(name, preset, params):
    """Layers, KV heads and head dimension equal the preset's; the parameters computed from the shapes
    are within 0.5% of the model card's; the KV capacity and step coefficients within 0.5%."""
    m = hw.model_from_config(CFG / f"{name}.json")
    p = hw.MODELS[preset]
    assert (m.layers, m.kv_heads, m.head_dim) == (p.layers, p.kv_heads, p.head_dim)
    assert m.params == pytest.approx(params, rel=5e-3)
    assert m.weight_bytes == pytest.approx(2 * m.params)
    assert m.name == name and m.active_params == 0.0
    path = str(CFG / f"{name}.json")
    assert hw.kv_bytes_per_token(path, tp=2) == hw.kv_bytes_per_token(preset, tp=2)
    assert hw.kv_blocks(path, "h100_80gb", tp=2, block_tokens=64) == pytest.approx(
        hw.kv_blocks(preset, "h100_80gb", tp=2, block_tokens=64), rel=5e-3)
    a, b = rf.step_coefficients(path, "h100_80gb", 2), rf.step_coefficients(preset, "h100_80gb", 2)
    for k in ("step_base_ns", "step_prefill_ns", "step_decode_ns", "step_ctx_ps", "step_prefill_ctx_fs"):
        assert a[k] == pytest.approx(b[k], rel=5e-3), k
    assert m.hidden == json.loads((CFG / f"{name}.json").read_text())["hidden_size"]


def test_mixture_of_experts_holds_all_and_computes_the_active():
    """Qwen3-30B-A3B: 30.5 B parameters held (the weight bytes), 3.3 B active per token (the prefill
    FLOPs); the model card's figures within 1% and 2%."""
    m = hw.model_from_config(CFG / "qwen3_30b_a3b.json")
    assert m.params == pytest.approx(30.5e9, rel=1e-2)
    assert m.active_params == pytest.approx(3.3e9, rel=2e-2)
    r = rf.roofline(str(CFG / "qwen3_30b_a3b.json"), "h100_80gb", 1)
    assert r.prefill_token_s(0.0) == pytest.approx(2 * m.active_params / (rf.GPU_PEAK["h100_80gb"].flops
                                                                          * r.eff_flops))
    assert r.base_s() == pytest.approx(m.weight_bytes / (rf.GPU_PEAK["h100_80gb"].bandwidth * r.eff_bw))


def test_config_variants(tmp_path):
    """A multimodal checkpoint's text_config is read as the language model; tied embeddings count once;
    fp8 weights take a byte each; a file named config.json takes its folder's name."""
    base = json.loads((CFG / "llama3_8b.json").read_text())
    d = tmp_path / "My-Model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["X"], "text_config": base}))
    m = hw.model_from_config(d / "config.json")
    assert m.name == "My-Model" and m.params == pytest.approx(8.03e9, rel=5e-3)
    tied = dict(base, tie_word_embeddings=True)
    (tmp_path / "tied.json").write_text(json.dumps(tied))
    assert hw.model_from_config(tmp_path / "tied.json").params == pytest.approx(
        m.params - base["vocab_size"] * base["hidden_size"])
    (tmp_path / "fp8.json").write_text(json.dumps(dict(base, quantization_config={"quant_method": "fp8"})))
    f8 = hw.model_from_config(tmp_path / "fp8.json")
    assert f8.weight_bytes == pytest.approx(f8.params, rel=1e-9)


@pytest.mark.parametrize("change, msg", [
    ({"kv_lora_rank": 512}, "multi-head latent attention"),
    ({"use_sliding_window": True}, "sliding-window"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "'layer_types' must list 32"),
    ({"quantization_config": {"quant_method": "awq"}}, "only fp8"),
    ({"torch_dtype": "int3"}, "unknown dtype"),
    ({"num_hidden_layers": None}, "missing key 'num_hidden_layers'"),
    ({"vocab_size": -3}, "'vocab_size' must be a non-negative integer"),
    ({"num_experts": 8}, "no num_experts_per_tok"),
])
def test_what_is_not_modelled_is_refused_by_file_and_key(tmp_path, change, msg):
    c = json.loads((CFG / "llama3_8b.json").read_text())
    c.update(change)
    c = {k: v for k, v in c.items() if v is not None}
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(c))
    with pytest.raises(ValueError, match=msg) as e:
        hw.model_from_config(p)
    assert "bad.json" in str(e.value)


def test_resolve_model_errors(tmp_path):
    with pytest.raises(ValueError, match="no such config.json"):
        hw.resolve_model(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="or give the path of its config.json"):
        hw.resolve_model("not_a_model")
    (tmp_path / "x.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        hw.resolve_model(str(tmp_path / "x.json"))


def test_hf_ids_name_presets():
    """Every id maps to a preset that exists; lookups ignore case; an unknown id is None."""
    assert set(hw.HF_MODEL_IDS.values()) <= set(hw.MODELS)
    assert hw.preset_for_hf_id("qwen/QWEN3-32b") == "qwen3_32b"
    assert hw.preset_for_hf_id("org/unknown-model") is None
