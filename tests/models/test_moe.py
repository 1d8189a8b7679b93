"""Mixture-of-experts models: described once in the layer table (router, top-k, experts,
combine), with their published parameter counts, costed for the roofline, compiled with every
expert resident and timed for the tokens a drawn routing sends each expert."""

import json
import subprocess
import sys

import pytest

from wse_emu.errors import CompileError, ConfigError
from wse_emu.hardware.fabric import ClusterSpec, load_fabric
from wse_emu.models import layer as ly
from wse_emu.models.layer import MicroBatch, expected_experts, op_cost, ops_by_name
from wse_emu.models.load import load_model
from wse_emu.models.spec import model_from_dict


# (preset, total, used per token, half a unit of the figures' last digit): the model cards'
# figures. Mixtral and Qwen3 count the embedding table among the active parameters, gpt-oss
# does not (its figures are checked below).
@pytest.mark.parametrize("name,total,active,within", [
    ("mixtral-8x7b", 46_702_792_704, 12.9e9, 0.05e9),
    ("qwen3-30b-a3b", 30.5e9, 3.3e9, 0.05e9),
    ("qwen3-235b-a22b", 235e9, 22e9, 0.5e9),
    ("gpt-oss-20b", 20.91e9, None, 0.005e9),
    ("gpt-oss-120b", 116.83e9, None, 0.005e9),
])
def test_presets_have_published_parameter_counts(name, total, active, within):
    m = load_model(name)
    assert m.params() == pytest.approx(total, abs=within)
    if active is not None:
        # Qwen's cards cut the figure short (3.35 B reads "3.3B"): at or above it, below the
        # next value of its last digit.
        assert active - within <= m.active_params() < active + 2 * within


@pytest.mark.parametrize("name,active", [("gpt-oss-20b", 3.61e9), ("gpt-oss-120b", 5.13e9)])
def test_gpt_oss_active_parameters_leave_out_the_embedding_table(name, active):
    m = load_model(name)
    assert m.active_params() - m.embedding_params() == pytest.approx(active, abs=0.005e9)


def test_dense_models_use_every_parameter():
    m = load_model("llama-3.1-8b")
    assert m.active_params() == m.params() and not m.is_moe


def test_expert_rows_replace_the_dense_mlp():
    ops = ops_by_name(load_model("mixtral-8x7b"))
    assert "gate_proj" not in ops and "down_proj" not in ops
    gate = ops["experts_gate"]
    assert gate.kind == ly.EXPERT_GEMM and gate.experts == 8 and gate.top_k == 2
    assert gate.weight_params == 8 * 4096 * 14336 and gate.active_params == 2 * 4096 * 14336
    assert ops["router"].matrix == (4096, 8) and ops["combine"].inputs == ("experts_act",
                                                                          "route")
    assert ops["experts_down"].inputs == ("combine",)  # its reduction sums the experts
    oss = ops_by_name(load_model("gpt-oss-120b"))
    assert oss["experts_act"].kind == ly.SWIGLU_CLAMPED
    assert oss["router"].bias and oss["experts_down"].bias and oss["o_proj"].bias
    assert oss["attn_softmax"].weight_params == 64  # one sink per query head


def test_expected_experts_between_top_k_and_all():
    assert expected_experts(128, 4, 1) == pytest.approx(4)
    assert expected_experts(128, 4, 2) == pytest.approx(128 * (1 - (124 / 128) ** 2))
    assert 4 < expected_experts(128, 4, 16) < 64
    assert expected_experts(8, 2, 10_000) == pytest.approx(8)


def test_decode_reads_only_the_experts_its_tokens_route_to():
    m = load_model("qwen3-30b-a3b")
    gate = ops_by_name(m)["experts_gate"]
    one = op_cost(gate, m, MicroBatch("decode", batch=1, context=1024))
    per_expert = 2048 * 768 * m.storage.dtype_bytes
    assert one.weight_bytes == pytest.approx(8 * per_expert)
    assert one.flops == 2 * 8 * 2048 * 768  # a token through its 8 experts
    big = op_cost(gate, m, MicroBatch("decode", batch=256, context=1024))
    assert big.weight_bytes == pytest.approx(128 * per_expert, rel=1e-3)  # all of them
    # More tokens share the experts they read: 256 tokens put 16 on each expert on average.
    assert big.intensity == pytest.approx(16 * one.intensity, rel=0.05)


@pytest.mark.parametrize("change,field", [
    ({"num_experts": 0}, "num_experts"),
    ({"experts_per_token": 9}, "experts_per_token"),
    ({"moe_intermediate_size": 0}, "moe_intermediate_size"),
])
def test_bad_expert_fields_are_refused_by_name(change, field):
    base = load_model("mixtral-8x7b").to_dict()
    with pytest.raises(ConfigError, match=field):
        model_from_dict({**base, **change, "version": 1}, "test")


def test_dense_family_with_experts_is_refused():
    base = load_model("llama-3.1-8b").to_dict()
    with pytest.raises(ConfigError, match="num_experts"):
        model_from_dict({**base, "num_experts": 8, "experts_per_token": 2,
                         "moe_intermediate_size": 64, "version": 1}, "test")


@pytest.mark.slow
def test_gpt_oss_120b_compiles_onto_the_fewest_wse3_that_hold_it():
    from wse_emu.cli.compile_cmd import render
    from wse_emu.compiler.mapper import compile_model

    model = load_model("gpt-oss-120b")  # 65.2 GB as stored: two WSE-3
    with pytest.raises(CompileError, match="needs 65 GB of weights.*`systems=2` or more"):
        compile_model(model, ClusterSpec(load_fabric("wse3"), 1))
    program = compile_model(model, ClusterSpec(load_fabric("wse3"), 2))
    names = {k.name for k in program.kernels}
    assert {"router", "route", "experts_gate", "experts_up", "experts_act", "combine",
            "experts_down"} <= names
    # Every expert resident: the strips hold E experts side by side, in MXFP4.
    down = next(k for k in program.kernels if k.name == "experts_down")
    assert down.matrix == [128 * 2880, 2880]
    held = int(program.arrays["sram_weights"].astype("int64").sum())
    assert model.weight_bytes() <= held < model.weight_bytes() * 1.001
    # It fits two only in MXFP4, and says so.
    assert "experts in mxfp4: 65.25 GB of weights where the dtype's would take 233.66 GB; " \
           "2 x wse3 per replica hold them where the dtype's would need 7" in render(program)


def test_cli_inspect_shows_total_and_active_parameters_and_compile_refuses():
    run = [sys.executable, "-m", "wse_emu.cli.main"]
    out = subprocess.run(run + ["inspect", "gpt-oss-20b"], capture_output=True, text=True)
    assert out.returncode == 0
    assert "parameters: 20.9 G in all, 4.19 G used per token (4 of 32 experts per layer; " \
           "3.61 G without the embedding table)" in out.stdout
    assert "expert_gemm" in out.stdout and "route" in out.stdout
    assert "systems: 1 x wse3 hold the weights by SRAM (2 in the model's dtype)" in out.stdout



@pytest.mark.slow
def test_qwen3_235b_compiles_onto_the_13_wse3_that_hold_it_by_sram():
    from wse_emu.compiler.mapper import compile_model

    model = load_model("qwen3-235b-a22b")  # 470 GB in bfloat16: 13 WSE-3 by SRAM
    with pytest.raises(CompileError, match="needs 470 GB of weights.*`systems=13` or more"):
        compile_model(model, ClusterSpec(load_fabric("wse3"), 12))
    # A WSE-3 holds 7.8 of its layers, so 13 hold 91 whole layers of its 94: a layer is cut
    # between each pair of wafers where whole layers leave room, its experts on both.
    program = compile_model(model, ClusterSpec(load_fabric("wse3"), 13))
    assert len(program.regions[0].parts) == 13
    parts = [s for s in program.stages if s.experts is not None]
    assert parts and all(a.layers == b.layers and a.experts[1] == b.experts[0]
                         and a.experts[0] == 0 and b.experts[1] == 128
                         and a.rect.system + 1 == b.rect.system
                         for a, b in zip(parts[0::2], parts[1::2]))
    # Every layer's attention once, so its KV cache once.
    assert sum(s.num_layers for s in program.stages if s.has_attention) == 94


@pytest.mark.parametrize("name,gib,wafers", [("gpt-oss-20b", 12.8, 1), ("gpt-oss-120b", 60.8, 2)])
def test_mxfp4_experts_size_gpt_oss_as_its_published_checkpoints(name, gib, wafers):
    # The model card's checkpoint sizes: experts in MXFP4, everything else in bfloat16.
    from wse_emu.compiler.partition import wafers_needed

    m = load_model(name)
    assert m.storage.expert_weight_format == "mxfp4" and m.storage.quantized
    assert m.weight_bytes() / 2**30 == pytest.approx(gib, abs=0.05)
    assert wafers_needed(m, load_fabric("wse3")) == wafers
    native = m.replaced(expert_weight_format="native")
    assert native.weight_bytes() == native.params() * 2


def test_weight_formats_size_matrices_and_leave_norms_and_biases_alone():
    m = load_model("gpt-oss-120b")
    gate = ops_by_name(m)["experts_gate"]
    matrix = 128 * 2880 * 2880
    assert ly.weight_bytes(gate, m) == pytest.approx(matrix * 136 / 256 + 128 * 2880 * 2)
    assert ly.weight_bytes(ops_by_name(m)["o_proj"], m) == (4096 * 2880 + 2880) * 2
    fp8 = load_model("llama-3.1-8b").replaced(weight_format="fp8")
    q = ops_by_name(fp8)["q_proj"]
    assert op_cost(q, fp8, MicroBatch("decode")).weight_bytes == 4096 * 4096
    assert ly.weight_bytes(ops_by_name(fp8)["input_norm"], fp8) == 4096 * 2


def test_quantized_weights_take_their_format_in_sram_and_dequantize_per_use():
    from wse_emu.compiler.mapper import compile_model

    tiny = load_model("tiny")
    from wse_emu.compiler.options import CompileOptions

    cluster, one = ClusterSpec(load_fabric("mesh16"), 1), CompileOptions(region=(16, 16))
    native = compile_model(tiny, cluster, one)
    fp8 = tiny.replaced(weight_format="fp8")
    packed = compile_model(fp8, cluster, one)
    q = [sum(k.weight_bytes for k in p.kernels if k.name == "q_proj") for p in (native, packed)]
    assert q[1] * 2 == q[0] == 64 * 64 * 2 * 2  # two layers
    op = ops_by_name(fp8)["q_proj"]
    stored = ly.stored_weights(op, fp8)
    assert stored.bytes_per_weight == 1 and stored.dequant_ops == 1
    work = ly.matrix_work(8, 8, 1, 2, stored)
    assert work.flops == 3 * 64 and work.reads == 64 * 1 + 8 * 2


def test_unknown_weight_format_is_refused_by_name():
    base = load_model("llama-3.1-8b").to_dict()
    with pytest.raises(ConfigError, match="weight_format"):
        model_from_dict({**base, "weight_format": "fp4", "version": 1}, "test")
    with pytest.raises(ConfigError, match="expert_weight_format"):
        model_from_dict({**base, "expert_weight_format": "mxfp4", "version": 1}, "test")


@pytest.mark.slow
def test_inspect_run_directory_draws_the_roofline_with_expert_ops(tmp_path, capsys):
    from wse_emu.cli.main import main
    from wse_emu.visualize.roofline import op_points

    out = tmp_path / "oss"
    assert main(["inspect", "gpt-oss-20b", "-o", str(out), "--viz"]) == 0
    assert "report:" in capsys.readouterr().out
    assert (out / "figures" / "roofline.png").exists() and (out / "report.html").exists()
    record = json.loads((out / "inspect.json").read_text())
    assert record["model_spec"]["num_experts"] == 32 and record["fabric"] == "wse3"
    assert main(["viz", str(out)]) == 0  # redrawn from the run directory alone
    kinds = {kind for kind, _ in op_points(load_model("gpt-oss-20b"), load_fabric("wse3"))[
        "decode"]}
    assert {"expert_gemm", "route", "combine"} <= kinds


def test_attention_sinks_are_owned_by_the_attention_kernel():
    from wse_emu.compiler.mapper import compile_model
    from wse_emu.compiler.options import CompileOptions

    sinks = load_model("tiny").replaced(attention_sinks=True)
    program = compile_model(sinks, ClusterSpec(load_fabric("mesh16"), 1),
                            CompileOptions(region=(16, 16)))
    att = [k for k in program.kernels if k.name == "attention"]
    assert sum(k.weight_bytes for k in att) == 4 * 2 * 2  # a logit per head, per layer


def test_roofline_of_an_inspected_step_draws_that_step():
    from wse_emu.visualize.roofline import op_points, phases

    step = MicroBatch("decode", batch=64, context=1024)
    assert dict((p, w) for p, w, _, _ in phases(step))["decode"] == step
    m, wse3 = load_model("qwen3-30b-a3b"), load_fabric("wse3")
    default = dict(op_points(m, wse3)["decode"])
    batched = dict(op_points(m, wse3, step)["decode"])
    assert batched["expert_gemm"] > 3 * default["expert_gemm"]  # about 4 tokens per expert
    assert op_points(m, wse3, step)["prefill"] == op_points(m, wse3)["prefill"]


def test_dense_weight_bytes_stay_whole_numbers():
    m = load_model("llama-3.1-8b")
    assert isinstance(ly.weight_bytes(ops_by_name(m)["q_proj"], m), int)
