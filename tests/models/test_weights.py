"""Model weights by Hugging Face name: shapes, seeded random sets, checkpoints on disk."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from wse_emu.errors import ConfigError, UserError
from wse_emu.models.load import load_model
from wse_emu.models.spec import ModelSpec
from wse_emu.models.weights import (
    check_weights,
    expected_shapes,
    load_checkpoint,
    random_weights,
    save_checkpoint,
)

LLAMA = ModelSpec.from_fields(name="tiny-llama", family="llama", hidden_size=16,
                              intermediate_size=24,
                              num_layers=2, num_heads=4, num_kv_heads=2, head_dim=6, vocab_size=32,
                              rms_norm_eps=1e-6, rope_theta=500000.0).validate("test")
TIED = LLAMA.replaced(name="tiny-tied", tie_embeddings=True)
QWEN2 = LLAMA.replaced(name="tiny-qwen2", family="qwen2", tie_embeddings=True,
                       attention_bias=True)
MISTRAL = LLAMA.replaced(name="tiny-mistral", family="mistral", sliding_window=8,
                         dtype_bytes=4)
SPECS = [LLAMA, TIED, QWEN2, MISTRAL]


def without_source(spec: ModelSpec) -> dict:
    data = spec.to_dict()
    data.pop("source")
    return data


def one_line_error(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message and message
    return message


# --- shapes and random weights --------------------------------------------------------------

def test_shapes_of_an_untied_llama():
    shapes = expected_shapes(LLAMA)
    layer = {name[len("model.layers.1."):]: shape for name, shape in shapes.items()
             if name.startswith("model.layers.1.")}
    assert layer == {
        "input_layernorm.weight": (16,),
        "self_attn.q_proj.weight": (24, 16),
        "self_attn.k_proj.weight": (12, 16),
        "self_attn.v_proj.weight": (12, 16),
        "self_attn.o_proj.weight": (16, 24),
        "post_attention_layernorm.weight": (16,),
        "mlp.gate_proj.weight": (24, 16),
        "mlp.up_proj.weight": (24, 16),
        "mlp.down_proj.weight": (16, 24),
    }
    assert shapes["model.embed_tokens.weight"] == (32, 16)
    assert shapes["lm_head.weight"] == (32, 16)
    assert shapes["model.norm.weight"] == (16,)
    assert len(shapes) == 2 * 9 + 3


def test_tied_embeddings_have_no_lm_head_and_qwen2_has_qkv_biases():
    assert "lm_head.weight" not in expected_shapes(TIED)
    shapes = expected_shapes(QWEN2)
    assert shapes["model.layers.0.self_attn.q_proj.bias"] == (24,)
    assert shapes["model.layers.0.self_attn.k_proj.bias"] == (12,)
    assert shapes["model.layers.0.self_attn.v_proj.bias"] == (12,)
    assert "model.layers.0.self_attn.o_proj.bias" not in shapes


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_shapes_count_every_parameter_of_the_spec(spec):
    assert sum(int(np.prod(s)) for s in expected_shapes(spec).values()) == spec.params()


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_random_weights_have_the_expected_shapes_and_dtype(spec):
    weights = random_weights(spec, seed=0, dtype=np.float64)
    assert {n: w.shape for n, w in weights.items()} == expected_shapes(spec)
    assert all(w.dtype == np.float64 for w in weights.values())
    check_weights(spec, weights, "test")


def test_random_weights_are_deterministic_and_seeded():
    a, b = random_weights(LLAMA, seed=7), random_weights(LLAMA, seed=7)
    assert all(np.array_equal(a[n], b[n]) for n in a)
    c = random_weights(LLAMA, seed=8)
    assert not np.array_equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    # The same seed in another dtype is the same values, widened.
    wide = random_weights(LLAMA, seed=7, dtype=np.float64)
    assert all(np.array_equal(wide[n], a[n].astype(np.float64)) for n in a)


def test_random_weights_keep_projections_unit_scale():
    spec = load_model("tiny")
    weights = random_weights(spec, seed=0)
    x = np.random.default_rng(1).standard_normal((256, spec.hidden_size))
    q = x @ weights["model.layers.0.self_attn.q_proj.weight"].T
    assert 0.7 < q.std() < 1.3
    norm = weights["model.norm.weight"]
    assert 0.8 < norm.mean() < 1.2 and norm.std() > 0.01  # near one, not exactly one


def test_a_non_float_dtype_is_refused():
    with pytest.raises(UserError, match="floating-point"):
        random_weights(LLAMA, seed=0, dtype=np.int32)


# --- checkpoints ----------------------------------------------------------------------------

@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_checkpoint_round_trip(tmp_path, spec):
    pytest.importorskip("safetensors")
    weights = random_weights(spec, seed=3)
    save_checkpoint(tmp_path / "ckpt", spec, weights)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["config.json",
                                                                     "model.safetensors"]
    loaded_spec, loaded = load_checkpoint(tmp_path / "ckpt", np.float32)
    assert without_source(loaded_spec) == without_source(spec)
    assert list(loaded) == list(expected_shapes(spec))
    assert all(np.array_equal(loaded[n], weights[n]) for n in weights)
    # The config alone is also a valid model for the rest of wse-emu.
    assert load_model(tmp_path / "ckpt") == loaded_spec
    # A config.json path works as well as its directory, and dtype converts.
    _, wide = load_checkpoint(tmp_path / "ckpt" / "config.json", np.float64)
    assert all(wide[n].dtype == np.float64 for n in wide)


def test_sharded_checkpoint_and_ignored_extras(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    weights = random_weights(TIED, seed=4)
    save_checkpoint(tmp_path, TIED, weights)
    (tmp_path / "model.safetensors").unlink()
    names = list(weights)
    half = len(names) // 2
    safetensors_numpy.save_file({n: weights[n] for n in names[:half]},
                                str(tmp_path / "model-00001-of-00002.safetensors"))
    # Older Llama checkpoints carry rotary buffers, and tied ones sometimes the LM head copy.
    extras = {"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(3, np.float32),
              "lm_head.weight": weights["model.embed_tokens.weight"]}
    safetensors_numpy.save_file({**{n: weights[n] for n in names[half:]}, **extras},
                                str(tmp_path / "model-00002-of-00002.safetensors"))
    _, loaded = load_checkpoint(tmp_path)
    assert list(loaded) == names
    assert all(np.array_equal(loaded[n], weights[n]) for n in names)


def write_bfloat16_safetensors(path, weights):
    """The safetensors layout by hand (8-byte header length, JSON header, data), since numpy has
    no bfloat16: each value keeps the top 16 bits of its float32."""
    header, chunks, offset = {}, [], 0
    for name, array in weights.items():
        data = (array.astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def test_bfloat16_tensors_are_widened(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    weights = random_weights(LLAMA, seed=5)
    save_checkpoint(tmp_path, LLAMA, weights)
    write_bfloat16_safetensors(tmp_path / "model.safetensors", weights)
    with pytest.raises(TypeError):  # the reason for the fallback
        safetensors_numpy.load_file(str(tmp_path / "model.safetensors"))
    _, loaded = load_checkpoint(tmp_path)
    for name, array in weights.items():
        truncated = ((array.view(np.uint32) >> 16) << 16).view(np.float32)
        assert np.array_equal(loaded[name], truncated), name


# --- errors: one line naming the tensor or file ---------------------------------------------

def saved(tmp_path, spec, weights):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    save_checkpoint(tmp_path, spec, random_weights(spec, seed=0))
    safetensors_numpy.save_file(weights, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_missing_tensor(tmp_path):
    weights = random_weights(LLAMA, seed=0)
    del weights["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(UserError) as excinfo:
        load_checkpoint(saved(tmp_path, LLAMA, weights))
    message = one_line_error(excinfo)
    assert str(tmp_path) in message
    assert "missing tensor model.layers.1.mlp.up_proj.weight" in message


def test_wrong_shape(tmp_path):
    weights = random_weights(LLAMA, seed=0)
    weights["model.layers.1.mlp.up_proj.weight"] = np.zeros((16, 24), np.float32)
    with pytest.raises(UserError) as excinfo:
        load_checkpoint(saved(tmp_path, LLAMA, weights))
    assert one_line_error(excinfo) == (
        f"checkpoint {tmp_path}: model.layers.1.mlp.up_proj.weight has shape (16, 24), "
        "config.json implies (24, 16)")


def test_config_with_fewer_layers_than_the_weights(tmp_path):
    weights = random_weights(LLAMA, seed=0)
    directory = saved(tmp_path, LLAMA, weights)
    config = json.loads((directory / "config.json").read_text())
    config["num_hidden_layers"] = 1
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError) as excinfo:
        load_checkpoint(directory)
    assert "unexpected tensor 'model.layers.1." in one_line_error(excinfo)


def test_missing_qwen2_bias(tmp_path):
    weights = random_weights(QWEN2, seed=0)
    del weights["model.layers.0.self_attn.k_proj.bias"]
    with pytest.raises(UserError) as excinfo:
        load_checkpoint(saved(tmp_path, QWEN2, weights))
    assert "model.layers.0.self_attn.k_proj.bias" in one_line_error(excinfo)


@pytest.mark.parametrize("content", [b"", b"\x00" * 4, b"not a safetensors file at all",
                                     b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": \n"],
                         ids=["empty", "short", "garbage", "bad-header"])
def test_corrupt_file(tmp_path, content):
    pytest.importorskip("safetensors")
    save_checkpoint(tmp_path, LLAMA, random_weights(LLAMA, seed=0))
    (tmp_path / "model-00002.safetensors").write_bytes(content)
    with pytest.raises(UserError) as excinfo:
        load_checkpoint(tmp_path)
    assert f"checkpoint {tmp_path}: cannot read model-00002.safetensors:" in one_line_error(
        excinfo)


def test_truncated_file(tmp_path):
    pytest.importorskip("safetensors")
    save_checkpoint(tmp_path, LLAMA, random_weights(LLAMA, seed=0))
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError) as excinfo:
        load_checkpoint(tmp_path)
    assert "cannot read model.safetensors" in one_line_error(excinfo)


def test_duplicate_tensor_across_shards(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    save_checkpoint(tmp_path, LLAMA, random_weights(LLAMA, seed=0))
    safetensors_numpy.save_file({"model.norm.weight": np.ones(16, np.float32)},
                                str(tmp_path / "extra.safetensors"))
    with pytest.raises(UserError) as excinfo:
        load_checkpoint(tmp_path)
    assert one_line_error(excinfo) == (f"checkpoint {tmp_path}: tensor model.norm.weight is in "
                                       "both extra.safetensors and model.safetensors")


def test_missing_files(tmp_path):
    pytest.importorskip("safetensors")
    with pytest.raises(UserError, match="no such file or directory"):
        load_checkpoint(tmp_path / "nowhere")
    with pytest.raises(UserError, match="no config.json"):
        load_checkpoint(tmp_path)
    save_checkpoint(tmp_path, LLAMA, random_weights(LLAMA, seed=0))
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(UserError, match=r"no \*\.safetensors files"):
        load_checkpoint(tmp_path)


def test_a_bad_config_is_a_config_error(tmp_path):
    pytest.importorskip("safetensors")
    save_checkpoint(tmp_path, LLAMA, random_weights(LLAMA, seed=0))
    (tmp_path / "config.json").write_text("{ not json")
    with pytest.raises(ConfigError) as excinfo:
        load_checkpoint(tmp_path)
    assert "config.json" in one_line_error(excinfo)


def test_save_refuses_bad_weights_and_writes_nothing(tmp_path):
    weights = random_weights(LLAMA, seed=0)
    weights["lm_head.weight"] = weights["lm_head.weight"][:, :8]
    with pytest.raises(UserError) as excinfo:
        save_checkpoint(tmp_path / "out", LLAMA, weights)
    assert one_line_error(excinfo) == ("weights for tiny-llama: lm_head.weight has shape "
                                       "(32, 8), the model implies (32, 16)")
    assert not (tmp_path / "out").exists()


def test_check_weights_names_the_offender():
    weights = random_weights(TIED, seed=0)
    with pytest.raises(UserError, match=r"unexpected tensor 'lm_head.weight'"):
        check_weights(TIED, {**weights, "lm_head.weight": weights["model.norm.weight"]}, "w")
    weights["model.norm.weight"] = np.ones(16, np.int32)
    with pytest.raises(UserError, match=r"model.norm.weight has dtype int32"):
        check_weights(TIED, weights, "w")


def test_missing_safetensors_is_a_user_error(monkeypatch, tmp_path):
    import builtins

    real_import = builtins.__import__

    def no_safetensors(name, *args, **kwargs):
        if name.startswith("safetensors"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_safetensors)
    with pytest.raises(UserError, match="pip install safetensors"):
        save_checkpoint(tmp_path, LLAMA, random_weights(LLAMA, seed=0))
    assert not any(tmp_path.iterdir())
