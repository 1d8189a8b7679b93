"""The model in parts and the family rows.

Every family a preset or a Hugging Face fixture names has a row; the flat record files speak
rebuilds the same spec and writes the same mapping; and a new dense family is one row: added
here to the registry, a config.json naming it is read, compiled, timed and computed token for
token like the reference, without any other change.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from helpers import follows_reference
from naive.reference_forward import ReferenceModel

from wse_emu import api
from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.options import CompileOptions
from wse_emu.errors import ConfigError
from wse_emu.hardware.fabric import ClusterSpec, load_fabric
from wse_emu.models.families import FAMILIES, Family, family_of
from wse_emu.models.hf_config import hf_config, model_from_hf_config
from wse_emu.models.load import load_model
from wse_emu.models.spec import PARTS, ModelFields, ModelSpec, model_from_dict
from wse_emu.models.weights import load_checkpoint, random_weights, save_checkpoint
from wse_emu.sim.functional.generate import Generator
from wse_emu.util.configfile import preset_dir

HERE = Path(__file__).parents[1]  # tests/
PRESETS = sorted(p.stem for p in preset_dir("models").glob("*.yaml"))
# The fixtures read as models (the others are there to be refused: a vision model, GPT-2, a
# Mixtral-like config with a key we do not model).
REFUSED = {"gemma-3-4b-it", "gpt2", "mixtral-like"}
HF_CONFIGS = sorted(str(p) for p in (HERE / "fixtures" / "hf_configs").glob("*/config.json")
                    if p.parent.name not in REFUSED)


@pytest.mark.parametrize("name", PRESETS + HF_CONFIGS)
def test_every_preset_and_fixture_family_has_a_row(name):
    spec = load_model(name)
    row = family_of(spec.family)
    assert row.is_moe == spec.is_moe
    assert (spec.experts is None) == (not spec.is_moe)


@pytest.mark.parametrize("name", PRESETS + HF_CONFIGS)
def test_the_flat_record_round_trips(name):
    spec = load_model(name)
    fields = spec.fields()
    assert ModelSpec.from_fields(fields) == spec
    assert ModelSpec.from_fields(**dataclasses.asdict(fields)) == spec
    # The mapping programs and digests keep: every flat field, in the record's order.
    assert list(spec.to_dict()) == [f.name for f in dataclasses.fields(ModelFields)]
    assert spec.to_dict() == dataclasses.asdict(fields)
    assert spec.replaced() == spec
    assert spec.replaced(num_layers=1).num_layers == 1


def test_every_flat_field_lives_in_exactly_one_place():
    names = [f.name for f in dataclasses.fields(ModelFields)]
    assert sorted(PARTS) == sorted(names)
    places = list(PARTS.values())
    assert len(set(places)) == len(places)
    spec = load_model("gpt-oss-20b")
    for name, (part, attribute) in PARTS.items():
        holder = spec if part is None else getattr(spec, part)
        assert getattr(holder, attribute) == getattr(spec.fields(), name), name


def test_a_field_changed_by_name_lands_in_its_part():
    spec = load_model("tiny")
    changed = spec.replaced(num_heads=8, num_kv_heads=4, rope_theta=5e5, rms_norm_eps=1e-6,
                            dtype_bytes=4, intermediate_size=256)
    assert (changed.attention.num_heads, changed.attention.num_kv_heads) == (8, 4)
    assert changed.rope.theta == 5e5 and changed.norm.eps == 1e-6
    assert changed.storage.dtype_bytes == 4 and changed.mlp.intermediate_size == 256
    with pytest.raises(TypeError):
        spec.replaced(no_such_field=1)


def test_a_dense_model_refuses_expert_fields_it_has_no_part_for():
    with pytest.raises(ConfigError, match="field 'experts_per_token' applies to experts only"):
        load_model("tiny").replaced(experts_per_token=2)
    with pytest.raises(ConfigError, match="a.yaml: field 'moe_intermediate_size' applies"):
        model_from_dict({**load_model("tiny").to_dict(), "moe_intermediate_size": 8,
                         "version": 1}, "a.yaml")


# --- a new dense family: one row -------------------------------------------------------------

RENAMED = dataclasses.replace(FAMILIES["llama"], name="renamed_llama",
                              architecture="RenamedLlamaForCausalLM",
                              model_type="renamed_llama")
CONFIG = {
    "architectures": ["RenamedLlamaForCausalLM"], "model_type": "renamed_llama",
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 160,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
}
PROMPT = [3, 17, 42, 99, 5, 120, 64, 7, 33, 150]


@pytest.fixture
def renamed_family(monkeypatch):
    monkeypatch.setitem(FAMILIES, RENAMED.name, RENAMED)
    return RENAMED


def test_an_unregistered_architecture_is_refused_by_name():
    with pytest.raises(ConfigError, match="unsupported architecture RenamedLlamaForCausalLM"):
        model_from_hf_config(CONFIG, "renamed")


def test_a_new_dense_family_is_one_row(renamed_family, tmp_path):
    assert isinstance(renamed_family, Family) and not renamed_family.is_moe
    spec = model_from_hf_config(CONFIG, "renamed", name="renamed-tiny")
    assert spec.family == "renamed_llama" and spec.validate("test") is spec
    # Written back as its own architecture, and read back the same.
    assert hf_config(spec)["architectures"] == ["RenamedLlamaForCausalLM"]
    save_checkpoint(tmp_path, spec, random_weights(spec, seed=11))
    spec, weights = load_checkpoint(tmp_path)
    assert spec.family == "renamed_llama"

    program = compile_model(spec, ClusterSpec(load_fabric("mesh16"), 1),
                            CompileOptions(region=(16, 16)))
    step = api.run(program, "decode", batch=2, context=16)
    assert step.step_cycles > 0
    follows_reference(Generator(program, weights, "float32", prefill_tile=8),
                      ReferenceModel(spec, weights), PROMPT, tile=8, steps=3)

    # The same model as a Llama compiles to the same program (its model's family aside) and
    # the same times.
    llama = compile_model(spec.replaced(family="llama"), ClusterSpec(load_fabric("mesh16"), 1),
                          CompileOptions(region=(16, 16)))
    ours, theirs = program.to_json(), llama.to_json()
    assert ours.pop("model")["family"] == "renamed_llama"
    assert theirs.pop("model")["family"] == "llama"
    assert ours == theirs
    assert np.array_equal(llama.sram_total(), program.sram_total())
    assert api.run(llama, "decode", batch=2, context=16).step_cycles == step.step_cycles
