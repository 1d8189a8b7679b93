"""Loading Hugging Face ``config.json`` files through ``wse_emu.model.load_model``.

The fixtures under ``tests/data/hf/`` hold the field values of the public Hugging Face configs
(one folder per model, as a downloaded snapshot has them).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from wse_emu.errors import ConfigError, UserError
from wse_emu.model import HF_ARCHITECTURES, ModelSpec, load_model

HF_DIR = Path(__file__).parent / "data" / "hf"
SUPPORTED = ["llama-3.2-1b", "qwen2.5-7b", "mistral-7b-v0.3"]


def config_path(name: str) -> Path:
    return HF_DIR / name / "config.json"


def shape_fields(spec: ModelSpec) -> dict:
    """Every field except where it came from."""
    data = spec.to_dict()
    data.pop("source")
    return data


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

@pytest.mark.parametrize("name", ["llama-3.2-1b", "qwen2.5-7b"])
def test_hf_config_matches_preset(name):
    hf = load_model(HF_DIR / name)
    preset = load_model(name)
    assert hf.params() == preset.params()
    assert hf.weight_bytes() == preset.weight_bytes()
    assert hf.kv_bytes_per_token() == preset.kv_bytes_per_token()
    assert shape_fields(hf) == shape_fields(preset)


def test_llama_3_2_1b_fields():
    m = load_model(config_path("llama-3.2-1b"))
    assert m.family == "llama"
    assert m.tie_embeddings is True
    assert m.attention_bias is False
    assert (m.hidden_size, m.intermediate_size, m.num_layers) == (2048, 8192, 16)
    assert (m.num_heads, m.num_kv_heads, m.head_dim) == (32, 8, 64)
    assert m.vocab_size == 128256
    assert m.rope_theta == 500000.0
    assert m.rms_norm_eps == 1e-5
    assert m.max_position_embeddings == 131072
    assert m.sliding_window is None
    assert m.dtype_bytes == 2
    # Tied: no separate LM head matrix.
    assert m.head_params() == m.hidden_size
    assert round(m.params() / 1e9, 2) == 1.24


def test_qwen2_5_7b_fields():
    m = load_model(HF_DIR / "qwen2.5-7b")
    assert m.family == "qwen2"
    # Qwen2 has q/k/v biases although its config.json has no 'attention_bias' key.
    assert m.attention_bias is True
    assert "q_bias" in m.layer_vectors()
    assert m.tie_embeddings is False
    assert (m.hidden_size, m.intermediate_size, m.num_layers) == (3584, 18944, 28)
    assert (m.num_heads, m.num_kv_heads, m.head_dim) == (28, 4, 128)
    assert m.vocab_size == 152064
    assert m.rms_norm_eps == 1e-6
    assert m.rope_theta == 1000000.0
    assert m.max_position_embeddings == 32768
    # 'sliding_window' is set but 'use_sliding_window' is false: full attention.
    assert m.sliding_window is None
    assert round(m.params() / 1e9, 2) == 7.62


def test_qwen2_with_sliding_window_enabled_keeps_the_window(tmp_path):
    config = json.loads(config_path("qwen2.5-7b").read_text())
    config["use_sliding_window"] = True
    config["sliding_window"] = 4096
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_model(tmp_path).sliding_window == 4096


def test_mistral_7b_v0_3_fields():
    m = load_model(HF_DIR / "mistral-7b-v0.3")
    assert m.family == "mistral"
    assert m.sliding_window is None
    assert m.attention_bias is False
    assert m.tie_embeddings is False
    assert (m.hidden_size, m.intermediate_size, m.num_layers) == (4096, 14336, 32)
    assert (m.num_heads, m.num_kv_heads, m.head_dim) == (32, 8, 128)
    assert m.vocab_size == 32768
    assert m.rope_theta == 1000000.0
    assert m.max_position_embeddings == 32768
    assert shape_fields(m) == shape_fields(load_model("mistral-7b-v0.3"))


# --- refusals -------------------------------------------------------------------------------

def test_unsupported_architecture_names_it_and_lists_supported():
    with pytest.raises(ConfigError) as info:
        load_model(config_path("gpt2"))
    message = str(info.value)
    assert "GPT2LMHeadModel" in message
    assert "unsupported architecture" in message
    for arch in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"):
        assert arch in message
    assert set(HF_ARCHITECTURES) == {"LlamaForCausalLM", "MistralForCausalLM",
                                     "Qwen2ForCausalLM"}
    assert "\n" not in message


def test_unsupported_architecture_from_directory():
    with pytest.raises(ConfigError, match="GPT2LMHeadModel"):
        load_model(HF_DIR / "gpt2")


def test_mixture_of_experts_is_refused():
    with pytest.raises(ConfigError) as info:
        load_model(HF_DIR / "mixtral-like")
    message = str(info.value)
    assert "mixture-of-experts" in message
    assert "num_local_experts" in message


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
    proc = subprocess.run(
        [sys.executable, "-m", "wse_emu.cli.main", "inspect", str(config_path("gpt2"))],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("wse-emu: error:")
    assert "GPT2LMHeadModel" in lines[0]
    assert proc.stdout == ""


def test_cli_inspect_supported_config_succeeds():
    proc = subprocess.run(
        [sys.executable, "-m", "wse_emu.cli.main", "inspect", str(HF_DIR / "llama-3.2-1b"),
         "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["model"] == "llama-3.2-1b"


def test_rope_scaling_is_read_from_the_config():
    m = load_model(HF_DIR / "llama-3.2-1b")
    assert (m.rope_scaling, m.rope_scaling_factor, m.rope_low_freq_factor,
            m.rope_high_freq_factor, m.rope_original_max_positions) == ("llama3", 32.0, 1.0,
                                                                        4.0, 8192)
    preset = load_model("llama-3.2-1b")
    assert preset.rope_scaling == "llama3" and preset.rope_scaling_factor == 32.0


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 8192.5, "8192"])
def test_bad_rope_scaling_original_positions_are_refused(tmp_path, value):
    config = json.loads((HF_DIR / "llama-3.2-1b" / "config.json").read_text())
    config["rope_scaling"]["original_max_position_embeddings"] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="original_max_position_embeddings"):
        load_model(tmp_path / "config.json")
