"""Weights in their stored formats: MXFP4 blocks and scales decode to the values the OCP format
defines and FP8, int8 and bfloat16 round as theirs do (checked by hand); a checkpoint stores
gpt-oss's experts packed and reads back exactly; and the functional engine computes with exactly
the values the wafer stores, token for token against the reference."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import FAMILIES, PROMPT, compiled_on_mesh16, follows_reference
from naive.reference_forward import ReferenceModel

from wse_emu.errors import UserError
from wse_emu.models import mxfp4, storage
from wse_emu.models.weights import as_stored, load_checkpoint, random_weights, save_checkpoint
from wse_emu.sim.functional.generate import Generator

SPEC = FAMILIES["gpt_oss"].replaced(name="a-gpt-oss-mxfp4",
                                    expert_weight_format="mxfp4").validate("test")


def test_blocks_decode_as_the_format_defines():
    blocks = np.zeros((2, 16), np.uint8)
    blocks[0, 0] = 0x21  # low nibble first: code 1 (0.5), then code 2 (1.0)
    blocks[1, 0] = 0xF9  # code 9 (-0.5), then code 15 (-6.0)
    scales = np.array([128, 125], np.uint8)  # 2 ** 1, 2 ** -2
    values = mxfp4.dequantize(blocks, scales)
    assert values.shape == (64,)
    assert list(values[:2]) == [1.0, 2.0]
    assert list(values[32:34]) == [-0.125, -1.5]
    assert not values[2:32].any() and not values[34:].any()


def test_values_round_to_the_nearest_code_under_the_blocks_scale():
    # Largest magnitude 7: scale 2 ** (2 - 2) = 1, so 7 saturates at 6; ties go to the even
    # code (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 2.5 -> 2, 5 -> 4).
    row = np.zeros(32, np.float32)
    row[:9] = [0.25, 0.75, 1.25, 2.5, 5.0, 7.0, -1.75, 0.3, -0.2]
    expected = [0.0, 1.0, 1.0, 2.0, 4.0, 6.0, -2.0, 0.5, -0.0]
    assert list(mxfp4.quantize(row)[:9]) == expected
    # A block of small values takes a small scale: 0.01 is 1.28 * 2 ** -7, scale 2 ** -9.
    small = np.full(32, 0.01, np.float32)
    assert mxfp4.quantize(small)[0] == pytest.approx(0.01, rel=0.25)
    assert mxfp4.encode(small)[1][0] == 127 - 9
    # Values already on the grid stay there; blocks run along the axis asked for.
    w = np.random.default_rng(0).standard_normal((3, 64, 5)).astype(np.float32)
    q = mxfp4.quantize(w, axis=1)
    assert np.array_equal(mxfp4.quantize(q, axis=1), q)
    assert not np.array_equal(q, w)
    with pytest.raises(UserError, match="blocks of 32"):
        mxfp4.quantize(np.ones((2, 48), np.float32), where="x")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("mxfp4")
    raw = random_weights(SPEC, seed=7)
    save_checkpoint(directory, SPEC, raw)
    return directory, raw


def test_a_checkpoint_keeps_its_experts_as_blocks_and_reads_them_back(checkpoint):
    from safetensors.numpy import load_file

    directory, raw = checkpoint
    stored = load_file(str(directory / "model.safetensors"))
    name = "model.layers.0.mlp.experts.gate_up_proj"
    assert name not in stored
    e, h, two_m = raw[name].shape
    assert stored[name + "_blocks"].shape == (e, two_m, h // 32, 16)
    assert stored[name + "_blocks"].dtype == np.uint8
    assert stored[name + "_scales"].shape == (e, two_m, h // 32)
    spec, weights = load_checkpoint(directory)
    assert spec.storage.expert_weight_format == "mxfp4"
    assert np.array_equal(weights[name], mxfp4.quantize(raw[name], axis=1))
    assert not np.array_equal(weights[name], raw[name])  # the format rounds
    for other in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.router.weight"):
        assert np.array_equal(weights[other], raw[other])


def test_blocks_without_an_mxfp4_config_are_refused(checkpoint, tmp_path):
    import shutil

    directory, _ = checkpoint
    copy = tmp_path / "plain"
    shutil.copytree(directory, copy)
    config = json.loads((copy / "config.json").read_text())
    config.pop("quantization_config")
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="MXFP4 blocks, but config.json does not declare"):
        load_checkpoint(copy)


@pytest.mark.slow
@pytest.mark.parametrize("plan", ["colocated", "disaggregated"])
def test_mxfp4_experts_follow_the_reference_token_for_token(checkpoint, plan):
    directory, raw = checkpoint
    spec, weights = load_checkpoint(directory)
    program = compiled_on_mesh16(spec, plan)
    follows_reference(Generator(program, weights, "float32", prefill_tile=8),
                      ReferenceModel(spec, weights), PROMPT, tile=8, steps=6)
    # Given the unrounded weights, the tiles store what the checkpoint would: the same run.
    follows_reference(Generator(program, raw, "float32", prefill_tile=8),
                      ReferenceModel(spec, weights), PROMPT, tile=8, steps=6)


def test_fp8_int8_and_bf16_round_as_their_formats_do():
    # E4M3: 3 mantissa bits; halves to even; 2 ** -9 the smallest step; 448 the largest.
    given = [1.0625, 1.1875, 17.0, 19.0, -3.3, 2.0 ** -10, 3 * 2.0 ** -10, 500.0]
    assert list(storage.e4m3(np.array(given, np.float32))) == \
        [1.0, 1.25, 16.0, 20.0, -3.25, 0.0, 2.0 ** -8, 448.0]
    # One scale per matrix: its largest magnitude lands on 448.
    m = np.array([[0.5, -2.0], [0.01, 1.0]], np.float32)
    scale = 2.0 / 448
    assert storage.fp8_matrix(m)[0, 1] == pytest.approx(-2.0)
    assert storage.fp8_matrix(m)[1, 0] == pytest.approx(
        float(storage.e4m3(np.float32(0.01 / scale))) * scale)
    # int8: one scale per output (column of an (in, out) matrix).
    q = storage.int8_matrix(np.array([[1.0, 0.3], [0.5, -0.2]], np.float32))
    assert q[:, 0] == pytest.approx([1.0, round(0.5 * 127) / 127])
    assert q[:, 1] == pytest.approx([0.3, round(-0.2 / 0.3 * 127) * 0.3 / 127])
    # bfloat16: 8 mantissa bits; a tie goes to the even neighbour.
    assert list(storage.bf16(np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 1 + 2.0 ** -7],
                                      np.float32))) == [1.0, 1 + 2.0 ** -6, 1 + 2.0 ** -7]


@pytest.mark.parametrize("weight_format, expert_format", [("int8", "fp8"), ("fp8", "int8"),
                                                          ("bf16", "native")])
def test_stored_formats_are_computed_as_stored(weight_format, expert_format):
    spec = FAMILIES["mixtral"].replaced(name="a-mixtral-stored",
                                        weight_format=weight_format,
                                        expert_weight_format=expert_format).validate("test")
    raw = random_weights(spec, seed=3)
    stored = as_stored(spec, raw)
    experts = "model.layers.0.block_sparse_moe.experts.0.w1.weight"
    other = "model.layers.0.self_attn.q_proj.weight"
    assert not np.array_equal(stored[other], raw[other])
    assert np.array_equal(stored[experts], raw[experts]) == (expert_format == "native")
    norm = "model.layers.0.input_layernorm.weight"
    assert np.array_equal(stored[norm], raw[norm])
    program = compiled_on_mesh16(spec, "colocated")
    follows_reference(Generator(program, raw, "float32", prefill_tile=8),
                      ReferenceModel(spec, stored), PROMPT, tile=8, steps=4)


@pytest.mark.slow
def test_a_format_is_set_by_option_and_a_model_that_fits_only_narrower_says_so(tmp_path):
    import subprocess
    import sys

    from wse_emu import api
    from wse_emu.models.load import load_model
    from wse_emu.models.spec import stored_as

    # Set by an option: fp8 halves a bfloat16 model's matrices; the rest stays in bfloat16.
    one_b = load_model("llama-3.2-1b")
    fp8 = api.compile(one_b, "mesh128", 3, weight_format="fp8")
    assert fp8.model.storage.weight_format == "fp8" and fp8.summary["wafers_per_replica"] == 2
    assert fp8.summary["wafers_per_replica_in_dtype"] == 4
    assert fp8.summary["weight_bytes_model"] < 0.51 * fp8.summary["weight_bytes_in_dtype"]
    with pytest.raises(UserError, match="`weight_format` must be one of"):
        stored_as(one_b, "fp4")
    with pytest.raises(UserError, match="`expert_weight_format` applies to a mixture"):
        stored_as(one_b, expert_weight_format="mxfp4")
    # Too big in its dtype: the error offers the narrower format that fits fewer systems.
    run = [sys.executable, "-m", "wse_emu.cli.main"]
    out = subprocess.run(run + ["compile", "llama-3.1-70b"], capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "use --systems 4 or more, or store them narrower: with matrices in fp8 " \
           "(--weight-format fp8) they need 2" in out.stderr
    out = subprocess.run(run + ["inspect", "llama-3.1-70b", "--weight-format", "fp8"],
                         capture_output=True, text=True)
    assert "systems: 2 x wse3 hold the weights by SRAM (4 in the model's dtype)" in out.stdout
