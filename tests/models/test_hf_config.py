"""Reading Hugging Face ``config.json`` files through ``wse_emu.models.load.load_model``;
writing them (``wse_emu.models.hf_config``).

One fixture folder, ``tests/fixtures/hf_configs/``, one model per folder as a downloaded
snapshot has it. JSON has no comments, so their provenance is here:

* verbatim: llama-3.1-8b (meta-llama/Llama-3.1-8B), qwen2.5-7b (Qwen/Qwen2.5-7B), qwen3-8b
  (Qwen/Qwen3-8B) and qwen3-30b-a3b (Qwen/Qwen3-30B-A3B), all four as the public repository
  citsjtu2020/LLM-Prof copies them in sglang/Model_Config.md (Qwen3-8B also agrees with
  several other public copies); gemma-3-1b-it (google/gemma-3-1b-it, the revision with
  transformers_version 4.52.4), as Liwink/gemma-jax quotes it in models/README.md;
  mixtral-8x7b-v0.1 (mistralai/Mixtral-8x7B-v0.1), as several public copies agree.
* the field values of the public configs of Llama-3.2-1B (llama-3.2-1b),
  Qwen2.5-7B-Instruct (qwen2.5-7b-instruct: the base model's architecture, a shorter
  context) and Mistral-7B-v0.3 (mistral-7b-v0.3); a GPT-2 config (gpt2) and a Mixtral-like
  one (mixtral-like), for refusals.
* transcribed from public copies that quote the published file as a Python literal (key order
  and values kept, true/false/null restored): gemma-2-9b (google/gemma-2-9b),
  phi-3-mini-4k-instruct (microsoft/Phi-3-mini-4k-instruct), and phi-3.5-mini-instruct
  (microsoft/Phi-3.5-mini-instruct; the copy leaves out transformers_version, so the fixture
  does too).
* reconstructed: gemma-3-4b-it (google/gemma-3-4b-it, the vision-language model), written from
  the published values: the text_config and vision_config keys that differ from transformers'
  defaults, as public copies of the Gemma-3 4B and 27B configs show them. Only its refusal is
  tested.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from helpers import assert_one_line_error, run_cli

from wse_emu.errors import ConfigError, UserError
from wse_emu.models.hf_config import HF_ARCHITECTURES, hf_config, hf_config_v5, model_from_hf_config
from wse_emu.models.layer import ops_by_name
from wse_emu.models.load import load_model
from wse_emu.models.spec import ModelSpec

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf_configs"
HF_DIR = FIXTURES  # the configs read as a downloaded snapshot's folder
SUPPORTED = ["llama-3.2-1b", "qwen2.5-7b-instruct", "mistral-7b-v0.3"]
# Fixtures of every supported family, and the ones refused with what the refusal names.
LOADABLE = ["llama-3.1-8b", "mistral-7b-v0.3", "qwen2.5-7b", "qwen3-8b", "gemma-2-9b",
            "gemma-3-1b-it", "phi-3-mini-4k-instruct", "phi-3.5-mini-instruct",
            "mixtral-8x7b-v0.1", "qwen3-30b-a3b"]
REFUSED = {"gemma-3-4b-it": "Gemma3ForConditionalGeneration"}


def config_path(name: str) -> Path:
    return HF_DIR / name / "config.json"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name / "config.json").read_text())


def write(tmp_path: Path, config: dict) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def changed(tmp_path: Path, name: str, **changes) -> Path:
    """A copy of fixture ``name`` with some keys changed (None deletes nothing: it sets null)."""
    return write(tmp_path, {**fixture(name), **changes})


def shape_fields(spec: ModelSpec) -> dict:
    """Every field except where it came from."""
    data = spec.to_dict()
    data.pop("source")
    return data


def same_model(a: ModelSpec, b: ModelSpec) -> bool:
    return a.replaced(name="", source="") == b.replaced(name="", source="")


def v5_spelling(config: dict) -> dict:
    """``config`` as transformers v5 saves it: the rotary settings in rope_parameters (one
    mapping per layer type for Gemma-3, the original context copied in for Phi-3's longrope),
    the precision in dtype."""
    config = copy.deepcopy(config)
    rope = dict(config.pop("rope_scaling", None) or {})
    if "type" in rope:
        rope["rope_type"] = rope.pop("type")
    rope.setdefault("rope_type", "default")
    if "rope_theta" in config:
        rope["rope_theta"] = config.pop("rope_theta")
    if config.get("model_type") == "phi3" and rope["rope_type"] != "default":
        rope["original_max_position_embeddings"] = config["original_max_position_embeddings"]
    if config.get("model_type") == "gemma3_text":
        local = {"rope_type": "default"}
        if "rope_local_base_freq" in config:
            local["rope_theta"] = config.pop("rope_local_base_freq")
        rope = {"full_attention": rope, "sliding_attention": local}
    config["rope_parameters"] = rope
    if "torch_dtype" in config:
        config["dtype"] = config.pop("torch_dtype")
    return config


# --- file and directory ---------------------------------------------------------------------

@pytest.mark.parametrize("name", SUPPORTED)
def test_file_and_directory_give_the_same_model(name):
    from_file = load_model(config_path(name))
    from_dir = load_model(HF_DIR / name)
    assert from_file == from_dir
    # The path may also be given as a string.
    assert load_model(str(HF_DIR / name)) == from_file
    assert from_file.name == name
    assert "Hugging Face config" in from_file.source


# --- against the shipped presets ------------------------------------------------------------

@pytest.mark.parametrize("name, preset_name", [("llama-3.2-1b", "llama-3.2-1b"),
                                               ("qwen2.5-7b-instruct", "qwen2.5-7b")])
def test_hf_config_matches_preset(name, preset_name):
    hf = load_model(HF_DIR / name)
    preset = load_model(preset_name)
    assert hf.params() == preset.params()
    assert hf.weight_bytes() == preset.weight_bytes()
    assert hf.kv_bytes_per_token() == preset.kv_bytes_per_token()
    # The folder names the model; the preset may name it differently.
    assert {**shape_fields(hf), "name": preset.name} == shape_fields(preset)


def test_llama_3_2_1b_fields():
    m = load_model(config_path("llama-3.2-1b"))
    assert m.family == "llama"
    assert m.tie_embeddings is True
    assert m.attention.bias is False
    assert (m.hidden_size, m.mlp.intermediate_size, m.num_layers) == (2048, 8192, 16)
    assert (m.attention.num_heads, m.attention.num_kv_heads, m.attention.head_dim) == (32, 8, 64)
    assert m.vocab_size == 128256
    assert m.rope.theta == 500000.0
    assert m.norm.eps == 1e-5
    assert m.max_position_embeddings == 131072
    assert m.attention.sliding_window is None
    assert m.storage.dtype_bytes == 2
    # Tied: no separate LM head matrix.
    assert m.head_params() == m.hidden_size
    assert round(m.params() / 1e9, 2) == 1.24


def test_qwen2_5_7b_fields():
    m = load_model(HF_DIR / "qwen2.5-7b-instruct")
    assert m.family == "qwen2"
    # Qwen2 has q/k/v biases although its config.json has no 'attention_bias' key.
    assert m.attention.bias is True
    assert ops_by_name(m)["q_proj"].bias
    assert m.tie_embeddings is False
    assert (m.hidden_size, m.mlp.intermediate_size, m.num_layers) == (3584, 18944, 28)
    assert (m.attention.num_heads, m.attention.num_kv_heads, m.attention.head_dim) == (28, 4, 128)
    assert m.vocab_size == 152064
    assert m.norm.eps == 1e-6
    assert m.rope.theta == 1000000.0
    assert m.max_position_embeddings == 32768
    # 'sliding_window' is set but 'use_sliding_window' is false: full attention.
    assert m.attention.sliding_window is None
    assert round(m.params() / 1e9, 2) == 7.62


def test_qwen2_with_sliding_window_enabled_keeps_the_window(tmp_path):
    config = json.loads(config_path("qwen2.5-7b-instruct").read_text())
    config["use_sliding_window"] = True
    config["sliding_window"] = 4096
    (tmp_path / "config.json").write_text(json.dumps(config))
    m = load_model(tmp_path)
    assert m.attention.sliding_window == 4096
    # max_window_layers is 28 of 28 layers: transformers slides from layer 28 on, so none does.
    assert m.attention.layer_types == ("full_attention",) * 28
    assert all(m.attention.window(layer) is None for layer in range(28))


def test_mistral_7b_v0_3_fields():
    m = load_model(HF_DIR / "mistral-7b-v0.3")
    assert m.family == "mistral"
    assert m.attention.sliding_window is None
    assert m.attention.bias is False
    assert m.tie_embeddings is False
    assert (m.hidden_size, m.mlp.intermediate_size, m.num_layers) == (4096, 14336, 32)
    assert (m.attention.num_heads, m.attention.num_kv_heads, m.attention.head_dim) == (32, 8, 128)
    assert m.vocab_size == 32768
    assert m.rope.theta == 1000000.0
    assert m.max_position_embeddings == 32768
    assert shape_fields(m) == shape_fields(load_model("mistral-7b-v0.3"))


# --- the published configs of every family --------------------------------------------------

def test_llama_3_1_8b_fields():
    m = load_model(FIXTURES / "llama-3.1-8b")
    assert (m.family, m.rope.theta, m.rope.scaling, m.rope.factor) == \
        ("llama", 500000.0, "llama3", 8.0)
    assert shape_fields(m.replaced(name="llama-3.1-8b")) == \
        shape_fields(load_model("llama-3.1-8b"))


def test_qwen2_5_7b_base_fields():
    m = load_model(FIXTURES / "qwen2.5-7b")
    assert m.attention.bias is True and m.max_position_embeddings == 131072
    assert m.attention.sliding_window is None and m.attention.layer_types == ()
    assert m.params() == 7_615_616_512


def test_qwen3_8b_fields():
    m = load_model(FIXTURES / "qwen3-8b")
    assert m.family == "qwen3"
    assert m.attention.qk_norm is True and {"q_norm", "k_norm"} <= set(ops_by_name(m))
    assert m.attention.bias is False and m.tie_embeddings is False
    assert (m.hidden_size, m.mlp.intermediate_size, m.num_layers) == (4096, 12288, 36)
    assert (m.attention.num_heads, m.attention.num_kv_heads, m.attention.head_dim) == (32, 8, 128)
    assert (m.rope.theta, m.rope.scaling, m.max_position_embeddings) == (1e6, None, 40960)
    assert (m.attention.sliding_window, m.attention.layer_types, m.norm.eps) == (None, (), 1e-6)
    assert (m.mlp.activation, m.norm.sandwich, m.norm.weight_offset) == ("silu", False, 0.0)


def test_gemma_2_9b_fields():
    m = load_model(FIXTURES / "gemma-2-9b")
    assert m.family == "gemma2"
    assert (m.mlp.activation, m.norm.sandwich, m.norm.weight_offset, m.scale_embeddings) == \
        ("gelu_tanh", True, 1.0, True)
    assert m.attention.qk_norm is False and m.attention.bias is False
    assert (m.attention.logit_softcap, m.final_logit_softcap,
            m.attention.query_pre_attn_scalar) == \
        (50.0, 30.0, 256.0)
    # No tie_word_embeddings key: transformers' Gemma-2 default ties them.
    assert m.tie_embeddings is True and m.norm.eps == 1e-6
    assert (m.attention.num_heads, m.attention.num_kv_heads, m.attention.head_dim) == (16, 8, 256)
    # transformers' Gemma-2 rule: even layers slide, odd ones attend to everything.
    assert m.attention.sliding_window == 4096
    assert m.attention.layer_types == ("sliding_attention", "full_attention") * 21
    assert (m.attention.window(0), m.attention.window(1), m.attention.window(40),
            m.attention.window(41)) == (4096, None, 4096, None)
    assert m.storage.dtype_bytes == 4  # the published weights are float32
    assert m.rope.theta == 10000.0 and m.rope.local_theta is None


def test_gemma_3_1b_fields():
    m = load_model(FIXTURES / "gemma-3-1b-it")
    assert m.family == "gemma3"
    assert m.attention.qk_norm is True and m.norm.sandwich is True
    assert m.mlp.activation == "gelu_tanh"
    assert (m.attention.logit_softcap, m.final_logit_softcap,
            m.attention.query_pre_attn_scalar) == \
        (None, None, 256.0)
    assert (m.num_layers, m.attention.num_heads, m.attention.num_kv_heads,
            m.attention.head_dim) == (26, 4, 1, 256)
    # sliding_window_pattern 6: layer i slides unless (i + 1) % 6 == 0.
    full = [i for i, kind in enumerate(m.attention.layer_types) if kind == "full_attention"]
    assert full == [5, 11, 17, 23] and len(m.attention.layer_types) == 26
    assert (m.attention.sliding_window, m.attention.window(0), m.attention.window(5)) == (512, 512,
                                                                                          None)
    assert (m.rope.theta, m.rope.local_theta) == (1e6, 1e4)
    assert (m.rope_theta_of(0), m.rope_theta_of(5)) == (1e4, 1e6)
    assert m.tie_embeddings is True and m.max_position_embeddings == 32768


def test_phi_3_mini_fields():
    m = load_model(FIXTURES / "phi-3-mini-4k-instruct")
    assert m.family == "phi3" and m.name == "Phi-3-mini-4k-instruct"
    assert (m.attention.num_heads, m.attention.num_kv_heads, m.attention.head_dim) == (32, 32, 96)
    # Phi-3 reads sliding_window for every layer (no use_sliding_window flag).
    assert (m.attention.sliding_window, m.attention.layer_types) == (2047, ())
    assert m.rope.scaling is None and m.norm.eps == 1e-5
    assert m.attention.bias is False and m.tie_embeddings is False


def test_phi_3_5_mini_longrope():
    m = load_model(FIXTURES / "phi-3.5-mini-instruct")
    assert m.rope.scaling == "longrope"
    assert len(m.rope.short_factor) == len(m.rope.long_factor) == 48 == m.attention.head_dim // 2
    assert m.rope.short_factor[:2] == (1.0, 1.0199999809265137)
    assert m.rope.long_factor[-1] == 64.83999633789062
    # The top-level original_max_position_embeddings, as transformers' Phi-3 reads it.
    assert (m.rope.original_max_positions, m.max_position_embeddings) == (4096, 131072)
    assert m.rope.attention_factor is None and m.rope.factor == 1.0
    assert m.attention.sliding_window == 262144


@pytest.mark.parametrize("alias", ["su", "yarn"])
def test_phi3_older_longrope_names(tmp_path, alias):
    config = fixture("phi-3.5-mini-instruct")
    config["rope_scaling"]["type"] = alias
    assert same_model(load_model(write(tmp_path, config)),
                      load_model(FIXTURES / "phi-3.5-mini-instruct"))


# --- transformers v5 spelling -----------------------------------------------------------------

@pytest.mark.parametrize("name", LOADABLE)
def test_v5_spelling_reads_the_same_model(tmp_path, name):
    v4 = fixture(name)
    v5 = v5_spelling(v4)
    assert not {"rope_theta", "rope_scaling", "torch_dtype", "rope_local_base_freq"} & set(v5)
    from_v4 = load_model(FIXTURES / name)
    from_v5 = load_model(write(tmp_path, v5))
    assert same_model(from_v5, from_v4)
    # Both spellings at once, agreeing: the same model again.
    both = {**v4, **v5}
    assert same_model(load_model(write(tmp_path, both)), from_v4)


def test_v5_rope_settings_are_not_lost(tmp_path):
    """The silent bug this guards against: a v5 config read with rope_theta 10000, unscaled."""
    m = load_model(write(tmp_path, v5_spelling(fixture("llama-3.1-8b"))))
    assert (m.rope.theta, m.rope.scaling, m.rope.factor) == (500000.0, "llama3", 8.0)
    assert m.storage.dtype_bytes == 2


def test_v5_rope_theta_may_stay_at_top_level(tmp_path):
    config = v5_spelling(fixture("qwen3-8b"))
    config["rope_theta"] = config["rope_parameters"].pop("rope_theta")
    assert load_model(write(tmp_path, config)).rope.theta == 1e6


@pytest.mark.parametrize("name,changes,keys", [
    ("llama-3.1-8b", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0,
                                          "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 8192}},
     ["'rope_theta'", "'rope_parameters'"]),
    ("llama-3.1-8b", {"rope_parameters": {"rope_type": "llama3", "factor": 32.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 8192}},
     ["'rope_scaling'", "'rope_parameters'", "factor"]),
    ("qwen3-8b", {"rope_parameters": {"rope_type": "linear", "factor": 2.0}},
     ["'rope_scaling'", "'rope_parameters'", "rope_type"]),
    ("qwen3-8b", {"dtype": "float32"}, ["'torch_dtype'", "'dtype'"]),
    ("gemma-3-1b-it", {"rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}}},
     ["'rope_local_base_freq'", "'rope_parameters'"]),
    ("gemma-2-9b", {"hidden_act": "gelu"}, ["'hidden_act'", "'hidden_activation'"]),
    ("phi-3.5-mini-instruct", {"original_max_position_embeddings": 8192},
     ["'original_max_position_embeddings'", "rope_scaling"]),
    ("llama-3.1-8b", {"model_type": "qwen2"}, ["'architectures'", "'model_type'"]),
])
def test_two_spellings_that_disagree_are_refused_naming_both(tmp_path, name, changes, keys):
    config = fixture(name)
    if name == "phi-3.5-mini-instruct":
        config["rope_scaling"]["original_max_position_embeddings"] = 4096
    path = write(tmp_path, {**config, **changes})
    with pytest.raises(ConfigError) as info:
        load_model(path)
    message = str(info.value)
    assert message.startswith(str(path)) and "disagree" in message
    assert "\n" not in message
    for key in keys:
        assert key in message, (key, message)


# --- how sliding windows fall on the layers ---------------------------------------------------

def test_qwen2_sliding_window_applies_from_max_window_layers(tmp_path):
    m = load_model(changed(tmp_path, "qwen2.5-7b", use_sliding_window=True,
                           sliding_window=4096, max_window_layers=20))
    assert m.attention.layer_types == ("full_attention",) * 20 + ("sliding_attention",) * 8
    assert (m.attention.window(19), m.attention.window(20), m.attention.window(27)) == (None, 4096,
                                                                                        4096)


def test_qwen3_every_layer_slides_from_layer_zero(tmp_path):
    m = load_model(changed(tmp_path, "qwen3-8b", use_sliding_window=True,
                           sliding_window=4096, max_window_layers=0))
    assert (m.attention.sliding_window, m.attention.layer_types) == (4096, ())


def test_stated_layer_types_win_over_the_rules(tmp_path):
    kinds = ["sliding_attention", "full_attention", "full_attention"] * 12
    m = load_model(changed(tmp_path, "qwen3-8b", use_sliding_window=True,
                           sliding_window=1024, layer_types=kinds))
    assert m.attention.layer_types == tuple(kinds)
    # Without use_sliding_window transformers drops the window: every layer attends fully.
    m = load_model(changed(tmp_path, "qwen3-8b", layer_types=kinds))
    assert (m.attention.sliding_window, m.attention.layer_types) == (None, ())


def test_gemma3_sliding_window_pattern(tmp_path):
    config = fixture("gemma-3-1b-it")
    config["sliding_window_pattern"] = 3
    m = load_model(write(tmp_path, config))
    full = [i for i, kind in enumerate(m.attention.layer_types) if kind == "full_attention"]
    assert full == list(range(2, 26, 3))
    kinds = ["full_attention"] * 25 + ["sliding_attention"]
    assert load_model(changed(tmp_path, "gemma-3-1b-it",
                              layer_types=kinds)).attention.layer_types == \
        tuple(kinds)


# --- refusals -------------------------------------------------------------------------------

def test_unsupported_architecture_names_it_and_lists_supported():
    with pytest.raises(ConfigError) as info:
        load_model(config_path("gpt2"))
    message = str(info.value)
    assert "GPT2LMHeadModel" in message
    assert "unsupported architecture" in message
    assert set(HF_ARCHITECTURES) == {"LlamaForCausalLM", "MistralForCausalLM",
                                     "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                                     "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM",
                                     "MixtralForCausalLM", "Qwen3MoeForCausalLM",
                                     "GptOssForCausalLM"}
    for arch in HF_ARCHITECTURES:
        assert arch in message
    assert "\n" not in message


def test_unsupported_architecture_from_directory():
    with pytest.raises(ConfigError, match="GPT2LMHeadModel"):
        load_model(HF_DIR / "gpt2")


def test_expert_configs_read_their_routing():
    m = load_model(FIXTURES / "qwen3-30b-a3b")
    assert (m.family, m.experts.count, m.experts.top_k, m.experts.intermediate_size) == \
        ("qwen3_moe", 128, 8, 768)
    assert m.experts.norm_topk_prob and m.attention.qk_norm
    mixtral = load_model(FIXTURES / "mixtral-8x7b-v0.1")
    assert (mixtral.experts.count, mixtral.experts.top_k, mixtral.experts.intermediate_size) == \
        (8, 2, 14336)


def test_qwen3_moe_without_norm_topk_prob_reads_transformers_default(tmp_path):
    config = fixture("qwen3-30b-a3b")
    del config["norm_topk_prob"]
    assert load_model(write(tmp_path,
                            config)).experts.norm_topk_prob is False  # transformers' default


@pytest.mark.parametrize("key,value,why", [
    ("mlp_only_layers", [0, 47], "layers with a dense MLP"),
    ("decoder_sparse_step", 2, "dense MLP layers between the routed ones"),
])
def test_qwen3_moe_dense_layers_are_refused_by_name(tmp_path, key, value, why):
    with pytest.raises(ConfigError) as info:
        load_model(changed(tmp_path, "qwen3-30b-a3b", **{key: value}))
    assert key in str(info.value) and why in str(info.value)


# The keys of openai/gpt-oss-20b's config.json.
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True,
    "attention_dropout": 0.0, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "num_attention_heads": 64, "num_experts_per_tok": 4,
    "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32,
    "output_router_logits": False, "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
    "swiglu_limit": 7.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 201088,
    "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
        "lm_head"]}}


def test_gpt_oss_config_reads_as_the_preset(tmp_path):
    m = load_model(write(tmp_path, GPT_OSS_20B))
    assert same_model(m, load_model("gpt-oss-20b")) and m.storage.expert_weight_format == "mxfp4"
    unquantized = {k: v for k, v in GPT_OSS_20B.items() if k != "quantization_config"}
    assert load_model(write(tmp_path, unquantized)).storage.expert_weight_format == "native"


@pytest.mark.parametrize("quantization,message", [
    ({"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes' is not modelled"),
    ({"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.mlp.experts"]},
     "modules_to_not_convert"),
])
def test_gpt_oss_other_quantization_is_refused_by_name(tmp_path, quantization, message):
    with pytest.raises(ConfigError, match=message):
        load_model(write(tmp_path, {**GPT_OSS_20B, "quantization_config": quantization}))


def test_quantized_weights_of_other_families_are_refused_in_both_directions(tmp_path):
    with pytest.raises(ConfigError, match="quantization_config"):
        load_model(changed(tmp_path, "llama-3.1-8b", quantization_config={
            "quant_method": "fbgemm_fp8"}))
    fp8 = load_model("llama-3.1-8b").replaced(weight_format="fp8")
    with pytest.raises(ConfigError, match="weight_format"):
        hf_config(fp8)


@pytest.mark.parametrize("change,message", [
    ({"mscale": 1.0}, "mscale"),
    ({"factor": 16.0}, "disagree"),
    ({"truncate": "no"}, "true or false"),
])
def test_gpt_oss_yarn_details_are_checked(tmp_path, change, message):
    config = {**GPT_OSS_20B, "rope_scaling": {**GPT_OSS_20B["rope_scaling"], **change}}
    with pytest.raises(ConfigError, match=message):
        load_model(write(tmp_path, config))


@pytest.mark.parametrize("preset", ["mixtral-8x7b", "qwen3-235b-a22b", "gpt-oss-120b"])
def test_expert_presets_write_configs_that_read_back(preset, tmp_path):
    m = load_model(preset)
    for config in (hf_config(m), hf_config_v5(m)):
        assert same_model(load_model(write(tmp_path, config)), m)


def test_mixture_of_experts_is_refused():
    with pytest.raises(ConfigError) as info:
        load_model(HF_DIR / "mixtral-like")
    message = str(info.value)
    assert "mixture-of-experts" in message
    assert "num_local_experts" in message


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_published_configs_of_unmodelled_models_are_refused(name):
    with pytest.raises(ConfigError) as info:
        load_model(FIXTURES / name)
    message = str(info.value)
    assert REFUSED[name] in message and "is not modelled" in message
    assert "\n" not in message


def test_gemma3_vision_language_refusal_points_at_the_text_model():
    with pytest.raises(ConfigError) as info:
        load_model(FIXTURES / "gemma-3-4b-it")
    assert "Gemma3ForCausalLM" in str(info.value) and "gemma3_text" in str(info.value)


def test_model_type_gemma3_without_architectures_is_the_vision_language_model(tmp_path):
    config = fixture("gemma-3-4b-it")
    del config["architectures"]
    with pytest.raises(ConfigError, match="model_type 'gemma3'"):
        load_model(write(tmp_path, config))
    # The text model's model_type alone names the family.
    text = fixture("gemma-3-1b-it")
    del text["architectures"]
    assert load_model(write(tmp_path, text)).family == "gemma3"


LONGROPE = {"rope_type": "longrope", "short_factor": [1.0] * 64, "long_factor": [2.0] * 64}


@pytest.mark.parametrize("name,changes,key", [
    ("llama-3.1-8b", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ("phi-3-mini-4k-instruct", {"partial_rotary_factor": 0.75}, "partial_rotary_factor"),
    ("llama-3.1-8b", {"mlp_bias": True}, "mlp_bias"),
    ("llama-3.1-8b", {"attention_bias": True}, "attention_bias"),
    ("mistral-7b-v0.3", {"attention_bias": True}, "attention_bias"),
    ("qwen3-8b", {"attention_bias": True}, "attention_bias"),
    ("gemma-2-9b", {"attention_bias": True}, "attention_bias"),
    ("phi-3-mini-4k-instruct", {"attention_bias": True}, "attention_bias"),
    ("llama-3.1-8b", {"use_qk_norm": True}, "use_qk_norm"),
    ("qwen2.5-7b", {"use_mrope": True}, "use_mrope"),
    ("gemma-3-1b-it", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ("llama-3.1-8b", {"quantization_config": {"quant_method": "awq", "bits": 4}},
     "quantization_config"),
    ("llama-3.1-8b", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                       "original_max_position_embeddings": 8192}}, "'yarn'"),
    ("qwen2.5-7b", {"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "'dynamic'"),
    ("qwen3-8b", {"rope_scaling": {"rope_type": "ntk", "factor": 2.0}}, "'ntk'"),
    ("gemma-2-9b", {"rope_scaling": {"rope_type": "made-up", "factor": 2.0}}, "'made-up'"),
    ("llama-3.1-8b", {"rope_scaling": {**LONGROPE, "rope_type": "longrope"}}, "'longrope'"),
    ("phi-3.5-mini-instruct", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
     "'linear'"),
    ("llama-3.1-8b", {"rope_parameters": {"rope_type": "llama3", "factor": 8.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 8192,
                                          "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
    ("llama-3.1-8b", {"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ("qwen3-8b", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ("mistral-7b-v0.3", {"num_local_experts": 8}, "num_local_experts"),
    ("qwen3-8b", {"num_experts": 128}, "num_experts"),
    ("llama-3.1-8b", {"n_routed_experts": 64}, "n_routed_experts"),
    ("qwen3-8b", {"layer_types": ["linear_attention"] * 36}, "'linear_attention'"),
    ("mistral-7b-v0.3", {"sliding_window": 4096,
                         "layer_types": ["sliding_attention", "full_attention"] * 16},
     "layer_types"),
    ("llama-3.1-8b", {"hidden_act": "gelu"}, "hidden_act"),
    ("gemma-2-9b", {"hidden_act": "gelu", "hidden_activation": "gelu"}, "hidden_activation"),
    ("llama-3.1-8b", {"torch_dtype": "float64"}, "'float64'"),
    ("qwen3-8b", {"torch_dtype": None, "dtype": "int8"}, "'int8'"),
    ("phi-3.5-mini-instruct", {"head_dim": 64}, "head_dim"),
    ("gemma-3-1b-it", {"sliding_window": None}, "sliding_window"),
    ("gemma-3-1b-it", {"rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}},
     "sliding_attention"),
    ("qwen3-8b", {"rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}, "rope_parameters"),
])
def test_unmodelled_numerics_are_refused_by_name(tmp_path, name, changes, key):
    config = fixture(name)
    if "rope_parameters" in changes:
        for old in ("rope_theta", "rope_scaling", "rope_local_base_freq"):
            config.pop(old, None)
    path = write(tmp_path, {**config, **changes})
    with pytest.raises(ConfigError) as info:
        load_model(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert key in message and "is not modelled" in message, message
    assert "\n" not in message and len(message) < 300


@pytest.mark.parametrize("name,changes", [
    # Rounding only: Llama's pretraining_tp splits each product into slices.
    ("llama-3.1-8b", {"pretraining_tp": 2}),
    # Dropout is off at inference.
    ("llama-3.1-8b", {"attention_dropout": 0.1}),
    ("phi-3-mini-4k-instruct", {"resid_pdrop": 0.1, "embd_pdrop": 0.1}),
    # The neutral values of the refused keys.
    ("llama-3.1-8b", {"partial_rotary_factor": 1.0, "mlp_bias": False, "use_qk_norm": False,
                      "quantization_config": None, "final_logit_softcapping": None}),
    ("phi-3.5-mini-instruct", {"partial_rotary_factor": 1}),
    # Qwen3 and Gemma-3 always normalize q and k, whatever use_qk_norm says.
    ("qwen3-8b", {"use_qk_norm": True}),
    # Keys transformers ignores for the architecture.
    ("gemma-2-9b", {"sliding_window_size": 1024, "cache_implementation": "hybrid"}),
])
def test_inference_neutral_keys_are_read_through(tmp_path, name, changes):
    assert same_model(load_model(changed(tmp_path, name, **changes)),
                      load_model(FIXTURES / name))


def test_rope_scaling_without_its_required_keys_is_refused(tmp_path):
    path = changed(tmp_path, "llama-3.1-8b", rope_scaling={"rope_type": "llama3", "factor": 8.0})
    with pytest.raises(ConfigError, match="'low_freq_factor'"):
        load_model(path)


def test_malformed_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n  "architectures": ["LlamaForCausalLM"],\n  "hidden_size": 2048,\n')
    with pytest.raises(ConfigError, match="malformed JSON"):
        load_model(path)
    with pytest.raises(ConfigError, match="malformed JSON"):
        load_model(tmp_path)


def test_json_that_is_not_an_object(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("[1, 2, 3]")
    with pytest.raises(ConfigError, match="JSON object"):
        load_model(path)


def test_directory_without_config_json(tmp_path):
    (tmp_path / "README.md").write_text("not a model\n")
    with pytest.raises(ConfigError) as info:
        load_model(tmp_path)
    assert "config.json" in str(info.value)
    assert str(tmp_path) in str(info.value)


def test_missing_required_field(tmp_path):
    config = json.loads(config_path("llama-3.2-1b").read_text())
    del config["intermediate_size"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="intermediate_size"):
        load_model(tmp_path)


def test_config_errors_are_user_errors():
    assert issubclass(ConfigError, UserError)


# --- command line ---------------------------------------------------------------------------

def test_cli_inspect_unsupported_architecture_is_one_line_error():
    proc = run_cli("inspect", config_path("gpt2"))
    assert_one_line_error(proc, "GPT2LMHeadModel")
    assert proc.stdout == ""


@pytest.mark.parametrize("name", ["gemma-3-4b-it"])
def test_cli_inspect_refused_published_config_is_one_line_error(name):
    proc = run_cli("inspect", FIXTURES / name / "config.json")
    assert_one_line_error(proc, str(FIXTURES / name / "config.json"), REFUSED[name])
    assert proc.stdout == ""


def test_cli_inspect_supported_config_succeeds():
    proc = run_cli("inspect", HF_DIR / "llama-3.2-1b", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["model"] == "llama-3.2-1b"


def test_rope_scaling_is_read_from_the_config():
    m = load_model(HF_DIR / "llama-3.2-1b")
    assert (m.rope.scaling, m.rope.factor, m.rope.low_freq_factor,
            m.rope.high_freq_factor, m.rope.original_max_positions) == ("llama3", 32.0, 1.0,
                                                                        4.0, 8192)
    preset = load_model("llama-3.2-1b")
    assert preset.rope.scaling == "llama3" and preset.rope.factor == 32.0


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 8192.5, "8192"])
def test_bad_rope_scaling_original_positions_are_refused(tmp_path, value):
    config = json.loads((HF_DIR / "llama-3.2-1b" / "config.json").read_text())
    config["rope_scaling"]["original_max_position_embeddings"] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="original_max_position_embeddings"):
        load_model(tmp_path / "config.json")


# --- writing configs --------------------------------------------------------------------------

# Small specs of every family, with the features the writer must state: windows on some layers,
# soft-caps, a head size that is not hidden_size / heads, longrope with a given factor.
_SMALL = dict(hidden_size=64, intermediate_size=96, num_layers=4, num_heads=4, num_kv_heads=2,
              head_dim=24, vocab_size=128, max_position_embeddings=512)
_GEMMA_FIXED = dict(hidden_act="gelu_tanh", sandwich_norms=True, norm_weight_offset=1.0,
                    scale_embeddings=True, tie_embeddings=True, sliding_window=8)
SMALL_SPECS = [
    ModelSpec.from_fields(name="s-llama", family="llama", rope_scaling="llama3",
                          rope_scaling_factor=4.0,
                          rope_original_max_positions=64, **_SMALL),
    ModelSpec.from_fields(name="s-llama-linear", family="llama", rope_scaling="linear",
                          rope_scaling_factor=2.0, sliding_window=16, dtype_bytes=4, **_SMALL),
    ModelSpec.from_fields(name="s-mistral", family="mistral", sliding_window=16, rope_theta=1e6,
                          **_SMALL),
    ModelSpec.from_fields(name="s-qwen2", family="qwen2", attention_bias=True, tie_embeddings=True,
                          sliding_window=6,
                          layer_types=("full_attention",) + ("sliding_attention",) * 3, **_SMALL),
    ModelSpec.from_fields(name="s-qwen2-all", family="qwen2", sliding_window=6, **_SMALL),
    ModelSpec.from_fields(name="s-qwen3", family="qwen3", qk_norm=True, sliding_window=6,
                          layer_types=("sliding_attention", "full_attention") * 2, **_SMALL),
    ModelSpec.from_fields(name="s-gemma2", family="gemma2", attn_logit_softcap=5.0,
                          final_logit_softcap=None,
                          query_pre_attn_scalar=24.0,
                          layer_types=("sliding_attention", "full_attention") * 2,
                          **{**_SMALL, **_GEMMA_FIXED}),
    ModelSpec.from_fields(name="s-gemma3", family="gemma3", qk_norm=True,
                          query_pre_attn_scalar=32.0,
                          rope_theta=1e6, rope_local_theta=1e4, rope_scaling="linear",
                          rope_scaling_factor=4.0,
                          layer_types=("sliding_attention", "sliding_attention", "full_attention",
                                       "sliding_attention"), **{**_SMALL, **_GEMMA_FIXED}),
    ModelSpec.from_fields(name="s-phi3", family="phi3", rope_scaling="longrope",
                          rope_original_max_positions=16,
                          rope_short_factor=(1.0, 1.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0),
                          rope_long_factor=(2.0,) * 8, rope_attention_factor=1.3, sliding_window=32,
                          **{**_SMALL, "head_dim": 16}),
]
PRESETS = ["llama-3.2-1b", "llama-3.1-8b", "llama-3.1-70b", "mistral-7b-v0.3", "qwen2.5-7b",
           "qwen2.5-0.5b", "tiny", "qwen3-8b", "gemma-2-9b", "gemma-3-1b", "phi-3-mini",
           "phi-3.5-mini"]


def written_specs():
    specs = [s.validate("test") for s in SMALL_SPECS]
    specs += [load_model(FIXTURES / name) for name in LOADABLE]
    return specs + [load_model(name) for name in PRESETS]


@pytest.mark.parametrize("spec", written_specs(), ids=lambda s: s.name)
@pytest.mark.parametrize("writer", [hf_config, hf_config_v5])
def test_written_config_reads_back_as_the_same_model(tmp_path, spec, writer):
    config = writer(spec)
    # Through JSON text, as a config.json file carries it.
    back = load_model(write(tmp_path, json.loads(json.dumps(config))))
    assert back.name == spec.name
    assert same_model(back, spec)


@pytest.mark.parametrize("spec", written_specs(), ids=lambda s: s.name)
def test_writers_use_their_spelling(spec):
    v4, v5 = hf_config(spec), hf_config_v5(spec)
    assert {"rope_theta", "rope_scaling", "torch_dtype"} <= set(v4)
    assert not {"rope_parameters", "dtype"} & set(v4)
    assert {"rope_parameters", "dtype"} <= set(v5)
    assert not {"rope_theta", "rope_scaling", "torch_dtype", "rope_local_base_freq"} & set(v5)


@pytest.mark.parametrize("family,architecture,model_type", [
    ("llama", "LlamaForCausalLM", "llama"), ("mistral", "MistralForCausalLM", "mistral"),
    ("qwen2", "Qwen2ForCausalLM", "qwen2"), ("qwen3", "Qwen3ForCausalLM", "qwen3"),
    ("gemma2", "Gemma2ForCausalLM", "gemma2"), ("gemma3", "Gemma3ForCausalLM", "gemma3_text"),
    ("phi3", "Phi3ForCausalLM", "phi3"),
])
def test_written_architecture_and_model_type(family, architecture, model_type):
    spec = next(s for s in SMALL_SPECS if s.family == family)
    config = hf_config(spec)
    assert (config["architectures"], config["model_type"]) == ([architecture], model_type)


def test_writer_states_family_rules_where_it_can():
    qwen2 = next(s for s in SMALL_SPECS if s.name == "s-qwen2")
    assert hf_config(qwen2)["max_window_layers"] == 1
    assert hf_config(next(s for s in SMALL_SPECS if s.name == "s-qwen2-all"))[
        "max_window_layers"] == 0
    gemma3 = next(s for s in SMALL_SPECS if s.family == "gemma3")
    config = hf_config(gemma3)
    assert config["sliding_window_pattern"] == 3
    assert config["layer_types"] == list(gemma3.attention.layer_types)
    phi3 = hf_config(next(s for s in SMALL_SPECS if s.family == "phi3"))
    assert phi3["original_max_position_embeddings"] == 16
    assert phi3["rope_scaling"]["attention_factor"] == 1.3


@pytest.mark.parametrize("changes,field", [
    (dict(family="llama", qk_norm=True), "qk_norm"),
    (dict(family="llama", attention_bias=True), "attention_bias"),
    (dict(family="mistral", sliding_window=8,
          layer_types=("sliding_attention", "full_attention") * 2), "layer_types"),
    (dict(family="qwen3", qk_norm=False), "qk_norm"),
    (dict(family="phi3", rope_scaling="linear", rope_scaling_factor=2.0), "linear"),
    (dict(family="llama", rope_scaling="yarn", rope_scaling_factor=2.0), "yarn"),
])
def test_specs_no_config_of_their_family_can_state_are_refused(changes, field):
    spec = ModelSpec.from_fields(name="odd", family="llama", **_SMALL).replaced(**changes)
    with pytest.raises(ConfigError) as info:
        hf_config(spec)
    assert field in str(info.value) and "\n" not in str(info.value)


def test_reader_reads_what_the_writer_writes_without_the_file(tmp_path):
    spec = load_model("gemma-3-1b")
    assert same_model(model_from_hf_config(hf_config_v5(spec), "memory"), spec)


# --- presets of the new families ----------------------------------------------------------------

@pytest.mark.parametrize("preset,params", [
    # Qwen/Qwen3-8B model.safetensors.index.json total_size 16,381,470,720 bytes of bfloat16.
    ("qwen3-8b", 8_190_735_360),
    # google/gemma-2-9b: the Hub's safetensors parameter count (its float32 index totals
    # 36,966,823,936 bytes); keras-hub's gemma2_9b_en preset lists the same count.
    ("gemma-2-9b", 9_241_705_984),
    # keras-hub's gemma3_1b / gemma3_instruct_1b presets (google/gemma-3-1b).
    ("gemma-3-1b", 999_885_952),
    # microsoft/Phi-3-mini-4k-instruct: the Hub's safetensors count (BF16), and keras-hub's
    # phi3_mini_4k_instruct_en preset.
    ("phi-3-mini", 3_821_079_552),
    # microsoft/Phi-3.5-mini-instruct: the same architecture and vocabulary; the Hub lists the
    # same safetensors count.
    ("phi-3.5-mini", 3_821_079_552),
])
def test_new_presets_have_published_parameter_counts(preset, params):
    assert load_model(preset).params() == params


@pytest.mark.parametrize("preset,name", [
    ("qwen3-8b", "qwen3-8b"), ("gemma-2-9b", "gemma-2-9b"), ("gemma-3-1b", "gemma-3-1b-it"),
    ("phi-3-mini", "phi-3-mini-4k-instruct"), ("phi-3.5-mini", "phi-3.5-mini-instruct"),
    ("mixtral-8x7b", "mixtral-8x7b-v0.1"), ("qwen3-30b-a3b", "qwen3-30b-a3b"),
])
def test_new_presets_are_their_published_configs(preset, name):
    m = load_model(preset)
    assert m.name == preset and "config.json" in m.source
    published = load_model(FIXTURES / name)
    if preset == "gemma-2-9b":
        # Published in float32; the preset holds the weights at 16 bits, as deployed.
        assert published.storage.dtype_bytes == 4
        published = published.replaced(dtype_bytes=2)
    assert same_model(m, published)


@pytest.mark.parametrize("rope", [None, "absent"])
def test_gpt_oss_unstated_rope_is_transformers_yarn_default(tmp_path, rope):
    config = dict(GPT_OSS_20B)
    if rope == "absent":
        del config["rope_scaling"]
    else:
        config["rope_scaling"] = None
    assert same_model(load_model(write(tmp_path, config)), load_model("gpt-oss-20b"))
    plain = load_model("gpt-oss-20b").replaced(rope_scaling=None)
    with pytest.raises(ConfigError, match="rope_scaling"):
        hf_config(plain)  # transformers would read YaRN back


def test_expert_count_aliases_are_read_and_must_agree(tmp_path):
    config = fixture("mixtral-8x7b-v0.1")
    del config["num_local_experts"]
    config["num_experts"] = 16
    assert load_model(write(tmp_path, config)).experts.count == 16
    config["num_local_experts"] = 8
    with pytest.raises(ConfigError, match="'num_experts' 16 and 'num_local_experts' 8 disagree"):
        load_model(write(tmp_path, config))
    with pytest.raises(ConfigError, match="experts_per_token"):
        load_model(write(tmp_path, {**GPT_OSS_20B, "experts_per_token": 2}))
    # Qwen3-MoE's count under the other spelling (transformers 5 saves num_local_experts).
    qwen = fixture("qwen3-30b-a3b")
    qwen["num_local_experts"] = qwen.pop("num_experts") // 2
    assert load_model(write(tmp_path, qwen)).experts.count == 64


@pytest.mark.parametrize("name,change,key", [
    ("gpt-oss", {"swiglu_alpha": 2.0}, "swiglu_alpha"),
    ("qwen3-30b-a3b", {"use_sliding_window": True}, "use_sliding_window"),
])
def test_expert_family_numerics_not_modelled_are_refused(tmp_path, name, change, key):
    base = GPT_OSS_20B if name == "gpt-oss" else fixture(name)
    with pytest.raises(ConfigError, match=f"{key} .* is not modelled"):
        load_model(write(tmp_path, {**base, **change}))


def test_expert_config_without_architectures_reads_by_model_type(tmp_path):
    config = fixture("mixtral-8x7b-v0.1")
    del config["architectures"]
    assert load_model(write(tmp_path, config)).family == "mixtral"
