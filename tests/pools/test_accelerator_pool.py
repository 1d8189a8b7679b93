"""Accelerator pools timed by their roofline: the step times against their closed forms, the
KV capacity left after the weights, a model that does not fit refused by name, and an
accelerator's prefill feeding a wafer's decode in one serving run."""

import dataclasses
import json

import pytest
from helpers import SMALL_CHAT, assert_one_line_error, run_cli

from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.options import CompileOptions
from wse_emu.errors import ConfigError, UserError
from wse_emu.hardware.accelerator import accelerator_from_dict, load_accelerator
from wse_emu.hardware.fabric import ClusterSpec, load_fabric
from wse_emu.models import layer as ly
from wse_emu.models.load import load_model
from wse_emu.models.spec import stored_as
from wse_emu.pools.kinds.accelerator import accelerator_pools, kv_capacity_tokens, step_seconds
from wse_emu.pools.kinds.wafer import WaferRegion
from wse_emu.serving.serve import ServeOptions, serve
from wse_emu.serving.tables import SERVER_AXES, build_table, grid_axes
from wse_emu.serving.workload import generate, workload_from_dict

TRN2 = load_accelerator("trn2")
LLAMA = load_model("llama-3.1-8b")


def streamed_weight_bytes(model) -> float:
    """The weights a step reads whole: all but the embedding table, of which it reads rows."""
    return model.weight_bytes() - model.embedding_weight_bytes()


def test_a_lone_decode_step_reads_the_weights_at_the_memory_roofline():
    chips_bytes_per_s = TRN2.tensor_parallel * TRN2.memory_bytes_per_s
    floor = streamed_weight_bytes(LLAMA) / chips_bytes_per_s
    got = step_seconds(TRN2, LLAMA, ly.MicroBatch("decode", batch=1, context=64))
    assert floor <= got < 1.01 * floor


def test_a_long_prefill_tile_computes_at_the_compute_roofline():
    tokens = 4096
    chips_flops_per_s = TRN2.tensor_parallel * TRN2.bf16_flops_per_s
    matrices = 2 * tokens * (LLAMA.params() - LLAMA.embedding_params())
    got = step_seconds(TRN2, LLAMA, ly.MicroBatch("prefill", tokens=tokens))
    assert got >= matrices / chips_flops_per_s
    # Attention and the layers' all-reduces add to it, by less than the matrices take.
    assert got < 1.5 * matrices / chips_flops_per_s


def test_a_decode_riding_in_a_chunk_adds_its_attention_alone():
    """In a step shared with a prompt's chunk, a decode micro-batch adds the reading of its
    KV cache (attention is memory-bound at decode), nothing of the weights."""
    spec = dataclasses.replace(TRN2, step_overhead_s=0.0)
    step = ly.MicroBatch("decode", batch=16, context=4096)
    riding = step_seconds(spec, LLAMA, step, riding=True)
    kv = 16 * 4096 * LLAMA.kv_bytes_per_token()
    rate = spec.tensor_parallel * spec.memory_bytes_per_s * spec.memory_efficiency
    assert riding == pytest.approx(kv / rate, rel=0.02)
    assert riding < 0.5 * step_seconds(spec, LLAMA, step)


def test_each_layer_all_reduces_its_hidden_state_twice_over_the_ring():
    step = ly.MicroBatch("prefill", tokens=256)
    slow = dataclasses.replace(TRN2, interconnect_bytes_per_s=TRN2.interconnect_bytes_per_s / 2)
    tp, hidden = TRN2.tensor_parallel, 256 * LLAMA.hidden_size * LLAMA.storage.dtype_bytes
    ring = 2 * (tp - 1) / tp * hidden / TRN2.interconnect_bytes_per_s
    extra = step_seconds(slow, LLAMA, step) - step_seconds(TRN2, LLAMA, step)
    assert extra == pytest.approx(2 * LLAMA.num_layers * ring, rel=1e-9)
    alone = dataclasses.replace(TRN2, tensor_parallel=1)
    assert step_seconds(alone, LLAMA, step) == step_seconds(
        dataclasses.replace(alone, interconnect_bytes_per_s=1.0), LLAMA, step)


def test_fp8_matrices_run_at_the_fp8_peak_and_attention_in_16_bits():
    """A compute-bound tile: fp8 layer matrices save what their FLOPs take at the two
    peaks, and the LM head (one position: memory-bound) half its read; attention and the
    all-reduces stay as they were, so the step is never faster than the peaks' ratio."""
    tokens = 1024
    step = ly.MicroBatch("prefill", tokens=tokens)
    fp8_model = stored_as(LLAMA, "fp8")
    bf16, fp8 = (step_seconds(TRN2, m, step) for m in (LLAMA, fp8_model))
    matrix_flops = 2 * tokens * LLAMA.num_layers * LLAMA.layer_params()
    chips = TRN2.tensor_parallel
    saved = matrix_flops / (chips * TRN2.bf16_flops_per_s) \
        - matrix_flops / (chips * TRN2.fp8_flops_per_s) \
        + (LLAMA.head_weight_bytes() - fp8_model.head_weight_bytes()) \
        / (chips * TRN2.memory_bytes_per_s)
    assert bf16 - fp8 == pytest.approx(saved, rel=0.002)
    assert fp8 / bf16 > TRN2.bf16_flops_per_s / TRN2.fp8_flops_per_s


def test_the_kv_cache_takes_the_memory_left_after_the_weights():
    usable = TRN2.tensor_parallel * TRN2.memory_bytes * (1 - TRN2.reserved_memory_share)
    assert kv_capacity_tokens(TRN2, LLAMA) == int(
        (usable - LLAMA.weight_bytes()) // LLAMA.kv_bytes_per_token())
    one_chip = dataclasses.replace(TRN2, tensor_parallel=1)
    with pytest.raises(UserError, match=r"llama-3.1-70b does not fit 1 x Trainium2 \(trn2\)"):
        kv_capacity_tokens(one_chip, load_model("llama-3.1-70b"))


def test_an_instance_holds_its_copies_each_a_pool_on_its_system():
    pools = accelerator_pools(TRN2, LLAMA, "prefill", 1.1e9, instances=2, first_system=3)
    assert len(pools) == 2 * TRN2.copies
    assert [p.system for p in pools] == [3] * TRN2.copies + [4] * TRN2.copies
    assert all(p.decode is None and p.prefill.cycles.shape[0] == 1 for p in pools)
    tokens, prefixes = SERVER_AXES["prefill"]
    assert pools[0].prefill.cycles[0, 1, 0] == pytest.approx(step_seconds(
        TRN2, LLAMA, ly.MicroBatch("prefill", tokens=tokens[1], prefix=prefixes[0])) * 1.1e9)


@pytest.mark.parametrize("change, needle", [
    ({"tensor_parallel": 3}, "'tensor_parallel' (3) must divide 'devices' (16)"),
    ({"matrix_efficiency": 1.5}, "'matrix_efficiency' must be in (0, 1]"),
    ({"memory_bytes_per_s": 0}, "'memory_bytes_per_s' must be positive"),
])
def test_a_bad_accelerator_file_is_refused_by_field(change, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        accelerator_from_dict({**TRN2.to_dict(), **change}, "a.yaml")


def test_accelerator_prefill_feeds_wafer_decode():
    """Prefill on an accelerator instance (system 1), decode on a wafer's region (system 0):
    a lone request's first token comes after the accelerator's prefill, its KV crosses the
    slower of the two systems' links, and its tokens follow at the wafer's decode steps."""
    tiny = load_model("tiny")
    fabric = load_fabric("mesh16")
    program = compile_model(tiny, ClusterSpec(fabric, 1), CompileOptions(plan="disaggregated"))
    decode = next(r for r in program.regions if r.role == "decode")
    table = build_table(program, decode.name, "decode", axes=grid_axes("quick", "decode"))
    wafer = WaferRegion(decode.name, "decode", decode.kv_capacity_tokens, None, table,
                        system=0).for_fabric(fabric)
    prefill = accelerator_pools(TRN2, tiny, "prefill", fabric.clock_hz, first_system=1)[:1]
    options = ServeOptions.of(fabric, tiny, prefill_tile=64, batch_limit=8)
    request = generate(workload_from_dict({"name": "one", "requests": 1,
                                           "prompt": {"kind": "fixed", "value": 64},
                                           "output": {"kind": "fixed", "value": 4}}, "t"))
    res = serve(request, prefill + [wafer], options)
    ttft = step_seconds(TRN2, tiny, ly.MicroBatch("prefill", tokens=64)) * fabric.clock_hz
    assert res.first_token[0] - res.arrival[0] == pytest.approx(ttft)
    handoff = 64 * tiny.kv_bytes_per_token() / min(prefill[0].link_bytes_per_cycle,
                                                    wafer.link_bytes_per_cycle)
    steps = sum(table.stage_cycles(1, 64 + k).sum() + table.transfer_cycles(1, 64 + k)
                for k in range(1, 4))
    assert res.finish[0] - res.first_token[0] == pytest.approx(handoff + steps)


@pytest.mark.e2e  # a command, end to end: 3 s
def test_the_command_line_serves_a_split_between_two_kinds_of_hardware(tmp_path):
    proc = run_cli("serve", "tiny", "--prefill-pool", "trn2", "--decode-pool", "mesh16",
                   "--workload", SMALL_CHAT, "--cache-dir", tmp_path, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    roles = {name: r["role"] for name, r in report["regions"].items()}
    assert {roles[n] for n in roles if n.startswith("trn2-")} == {"prefill"}
    assert {roles[n] for n in roles if n.startswith("mesh16-")} == {"decode"}
    assert report["requests"] == 40 and report["refused"] == 0


def test_the_command_line_serves_colocated_on_accelerators(tmp_path):
    proc = run_cli("serve", "tiny", "--pool", "trn2x2", "--workload", SMALL_CHAT, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["plan"] == "colocated" and report["requests"] == 40
    regions = report["regions"]
    assert len(regions) == 2 * TRN2.copies
    assert {r["role"] for r in regions.values()} == {"mixed"}
    assert report["step_times"] == {"step times": "the roofline of trn2 (lower bounds)"}


@pytest.mark.parametrize("args, needle", [
    (["--prefill-pool", "trn2"], "--prefill-pool and --decode-pool go together"),
    (["--pool", "trn2", "--decode-pool", "wse3"], "--pool (colocated) does not go with"),
    (["--prefill-pool", "v100", "--decode-pool", "wse3"], "unknown pool 'v100'"),
    (["--prefill-pool", "trn2x0", "--decode-pool", "wse3"], "count must be between 1 and 64"),
    (["--prefill-pool", "trn2", "--decode-pool", "wse3", "--systems", "2"], "--systems"),
])
def test_a_split_named_wrongly_is_refused_in_one_line(args, needle):
    assert_one_line_error(run_cli("serve", "tiny", "--workload", "chat", *args), needle)


@pytest.mark.e2e  # a command and its figures, end to end: 8 s
def test_a_run_directory_of_pools_named_by_their_hardware_is_written_and_drawn(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("serve", "tiny", "--prefill-pool", "trn2", "--decode-pool", "mesh16",
                   "--workload", SMALL_CHAT, "--cache-dir", tmp_path / "cache", "-o", out,
                   "--viz")
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["step_times"] == {"prefill step times": "the roofline of trn2 (lower bounds)",
                                     "decode step times": "simulated on mesh16"}
    assert (out / "report.html").exists() and (out / "figures" / "latency_cdfs.png").exists()
    drawn = run_cli("viz", out)  # read back from the directory alone
    assert drawn.returncode == 0, drawn.stderr


def test_a_wafer_side_too_small_is_refused_in_the_pools_terms():
    proc = run_cli("serve", "llama-3.1-70b", "--prefill-pool", "trn2", "--decode-pool", "wse3",
                   "--workload", "chat")
    assert_one_line_error(proc, "decode pool wse3: llama-3.1-70b needs", "use wse3x4 or more")
