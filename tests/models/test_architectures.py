"""Every architecture through every consumer of the layer description.

The op graph, the compiled kernels and the simulated tasks must name the same ops and count the
same FLOPs and bytes for them, for each family, both phases; and each family computed through
the tiles must follow the plain-numpy reference token for token.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from helpers import follows_reference, tasks_do_the_graphs_flops
from naive.reference_forward import ReferenceModel

from wse_emu.cli.main import main
from wse_emu.compiler.intensity import analyze
from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.opgraph import build_op_graph
from wse_emu.compiler.options import CompileOptions
from wse_emu.hardware.fabric import ClusterSpec, load_fabric
from wse_emu.kernels.stage import StageGraph
from wse_emu.models import layer as ly
from wse_emu.models.hf_config import hf_config, hf_config_v5
from wse_emu.models.layer import MicroBatch
from wse_emu.models.load import load_model
from wse_emu.models.spec import ModelSpec
from wse_emu.models.weights import load_checkpoint, random_weights, save_checkpoint, unfused
from wse_emu.sim.functional.generate import Generator
from wse_emu.sim.runner import run_region

BASE = dict(hidden_size=64, intermediate_size=96, num_layers=4, num_heads=4, num_kv_heads=2,
            head_dim=16, vocab_size=160)
GEMMA = dict(sandwich_norms=True, norm_weight_offset=1.0, scale_embeddings=True,
             hidden_act="gelu_tanh", tie_embeddings=True, rms_norm_eps=1e-6, sliding_window=6,
             layer_types=("sliding_attention", "full_attention") * 2)
FAMILIES = {
    "llama": ModelSpec.from_fields("a-llama", "llama", **BASE),
    "qwen2": ModelSpec.from_fields("a-qwen2", "qwen2", **BASE, attention_bias=True,
                                   tie_embeddings=True),
    "mistral": ModelSpec.from_fields("a-mistral", "mistral", **BASE, sliding_window=6),
    "qwen3": ModelSpec.from_fields("a-qwen3", "qwen3", **{**BASE, "head_dim": 24}, qk_norm=True,
                                   rms_norm_eps=1e-6, rope_theta=1e6),
    "gemma2": ModelSpec.from_fields("a-gemma2", "gemma2", **{**BASE, "head_dim": 32}, **GEMMA,
                                    attn_logit_softcap=50.0, final_logit_softcap=30.0,
                                    query_pre_attn_scalar=24.0),
    "gemma3": ModelSpec.from_fields("a-gemma3", "gemma3", **BASE, **GEMMA, qk_norm=True,
                                    query_pre_attn_scalar=16.0, rope_theta=1e6,
                                    rope_local_theta=1e4, rope_scaling="linear",
                                    rope_scaling_factor=8.0),
    "phi3": ModelSpec.from_fields("a-phi3", "phi3", **{**BASE, "num_kv_heads": 4},
                                  rope_scaling="longrope",
                                  rope_short_factor=tuple(1.0 + 0.1 * i for i in range(8)),
                                  rope_long_factor=tuple(1.0 + 0.5 * i for i in range(8)),
                                  rope_original_max_positions=16, max_position_embeddings=64),
}
SPECS = {name: spec.validate("test") for name, spec in FAMILIES.items()}
STEPS = [MicroBatch("prefill", tokens=12, chunks=2), MicroBatch("decode", batch=2, context=10)]


def compiled(spec, plan="colocated", region=(16, 16), fabric="mesh16"):
    return compile_model(spec, ClusterSpec(load_fabric(fabric), 1),
                         CompileOptions(plan=plan, region=region))


@pytest.mark.parametrize("family", SPECS)
@pytest.mark.parametrize("step", STEPS, ids=["prefill", "decode"])
def test_op_graph_kernels_and_tasks_agree(family, step):
    spec = SPECS[family]
    program = compiled(spec)
    graph = build_op_graph(spec)
    rows = analyze(graph, spec, step, program.fabric)["ops"]
    ops = ly.ops_by_name(spec)
    # The compiled kernels run exactly the graph's ops, each op in one kernel.
    layer_kernels = [k for k in program.kernels if program.stages[k.stage].num_layers]
    ran = {op for k in program.kernels for op in k.ops}
    assert ran == {row.op for row in rows}
    assert all(ops[op].kernel == k.name for k in layer_kernels for op in k.ops)
    # Weights: the kernels own what the graph counts, once.
    d = spec.storage.dtype_bytes
    weights = sum(k.weight_bytes for k in program.kernels)
    assert weights == graph_params(graph) * d
    # FLOPs and SRAM traffic per kernel: the graph's (over the stage's layers and the step's
    # tiles) against what the simulated tasks do.
    for stage in program.stages:
        sg = tasks_do_the_graphs_flops(program, stage, rows, step)
        for k in program.stage_kernels(stage):
            if k.kind in ("norm", "elementwise"):
                t = ly.op_tokens(ops[k.name], step) * (1 if k.layers == 1 else k.layers)
                cost = (ly.ELEMENTWISE.get(ops[k.name].kind) if k.kind == "elementwise"
                        else None)
                work = (ly.elementwise_work(cost, t * k.length, d) if cost else
                        ly.elementwise_work(ly.NORM_SQUARES, t * k.length, d)
                        + ly.elementwise_work(ly.NORM_SCALE, t * k.length, d))
                assert sg.ledger[k.name].reads == pytest.approx(work.reads), k.name
                assert sg.ledger[k.name].writes == pytest.approx(work.writes), k.name




def graph_params(graph) -> int:
    return sum(d["weight_params"] for _, d in graph.nodes(data=True))


@pytest.mark.parametrize("family", SPECS)
def test_simulated_stages_stay_above_their_bounds(family):
    spec = SPECS[family]
    program = compiled(spec)
    opts = CompileOptions()
    steps = {"prefill": MicroBatch("prefill", tokens=opts.bound_prefill_tokens),
             "decode": MicroBatch("decode", batch=opts.bound_decode_batch,
                                  context=opts.bound_decode_context)}
    for phase, step in steps.items():
        run = run_region(program, program.regions[0].name, step)
        for sr in run.stages:
            assert sr.cycles >= program.stages[sr.stage].bounds[phase]["cycles"]


PROMPT = [5, 17, 3, 99, 42, 7, 11, 64, 23, 8, 150, 2, 77, 31, 19, 120, 9, 14]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Each new family's seeded weights, saved as a Hugging Face checkpoint and read back."""
    out = {}
    for family in ("qwen3", "gemma2", "gemma3", "phi3"):
        directory = tmp_path_factory.mktemp(family)
        save_checkpoint(directory, SPECS[family], random_weights(SPECS[family], seed=7))
        out[family] = directory
    return out


@pytest.mark.parametrize("family", ["qwen3", "gemma2", "gemma3", "phi3"])
@pytest.mark.parametrize("plan", ["colocated", "disaggregated"])
def test_new_families_follow_the_reference_token_for_token(checkpoints, family, plan):
    spec, weights = load_checkpoint(checkpoints[family])
    assert spec.replaced(name=SPECS[family].name, source="") == SPECS[family]
    program = compiled(spec, plan, region=(16, 16) if plan == "colocated" else (8, 16))
    # Six decode steps take phi3 past its original context of 16: long rope factors.
    follows_reference(Generator(program, weights, "float32", prefill_tile=8),
                      ReferenceModel(spec, weights), PROMPT, tile=8, steps=6)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gemma3", "phi3"])
def test_a_v5_config_gives_the_same_tokens_and_logits_as_its_v4_twin(checkpoints, family,
                                                                      tmp_path):
    """transformers v5 writes rope_parameters and dtype; the same model must come out."""
    twin = tmp_path / "v5"
    shutil.copytree(checkpoints[family], twin)
    config = hf_config_v5(SPECS[family])
    assert "rope_parameters" in config and "rope_theta" not in config and "dtype" in config
    (twin / "config.json").write_text(json.dumps(config))
    results = []
    for directory in (checkpoints[family], twin):
        spec, weights = load_checkpoint(directory)
        program = compiled(spec)
        results.append(Generator(program, weights, "float32", prefill_tile=8).generate(PROMPT, 6))
    assert results[0].generated_ids == results[1].generated_ids
    assert np.array_equal(results[0].logits, results[1].logits)


def test_fused_phi3_tensors_split_into_the_layer_matrices():
    spec = SPECS["phi3"]
    weights = random_weights(spec, seed=1)
    fused = weights["model.layers.0.self_attn.qkv_proj.weight"]
    parts = unfused(spec, weights)
    q = parts["model.layers.0.self_attn.q_proj.weight"]
    assert q.shape == (spec.attention.q_size, spec.hidden_size)
    assert np.array_equal(np.concatenate([q, parts["model.layers.0.self_attn.k_proj.weight"],
                                          parts["model.layers.0.self_attn.v_proj.weight"]]),
                          fused)
    assert "model.layers.0.self_attn.qkv_proj.weight" not in parts


def test_gemma_layers_alternate_windows_in_the_timed_attention():
    """A full-attention layer at a long context costs more than a sliding one."""
    spec = SPECS["gemma2"]
    one_layer = spec.replaced(num_layers=2)
    program = compiled(one_layer)
    stage = program.stages[0]
    sg = StageGraph(program, stage, MicroBatch("decode", batch=1, context=60))
    sg.build()
    full = ly.op_cost(ly.ops_by_name(spec)["attn_scores"], spec,
                      MicroBatch("decode", batch=1, context=60), 1)
    sliding = ly.op_cost(ly.ops_by_name(spec)["attn_scores"], spec,
                         MicroBatch("decode", batch=1, context=60), 0)
    assert full.flops == 10 * sliding.flops


def test_reused_stage_times_tell_sliding_and_full_layers_apart():
    """Gemma's stages have one shape but alternate windows: reuse must not mix them up."""
    spec = SPECS["gemma2"].replaced(num_layers=8,
                                    layer_types=("sliding_attention", "full_attention") * 4)
    program = compile_model(spec, ClusterSpec(load_fabric("mesh32"), 1),
                            CompileOptions(layers_per_stage=1))
    step = MicroBatch("decode", batch=1, context=60)
    reused = run_region(program, program.regions[0].name, step)
    each = run_region(program, program.regions[0].name, step, reuse=False)
    assert [s.cycles for s in reused.stages] == [s.cycles for s in each.stages]
    full, sliding = (s.cycles for s in each.stages[1:3])  # one shape, layers 1 and 2
    assert sliding < full


NEW_PRESETS = ["qwen3-8b", "gemma-2-9b", "gemma-3-1b", "phi-3-mini", "phi-3.5-mini"]


@pytest.mark.slow
@pytest.mark.parametrize("preset", NEW_PRESETS)
def test_new_presets_compile_on_one_wse3_and_run_both_phases(preset):
    program = compile_model(load_model(preset), ClusterSpec(load_fabric("wse3"), 1),
                            CompileOptions())
    region = program.regions[0].name
    decode = run_region(program, region, MicroBatch("decode", batch=1, context=4096))
    prefill = run_region(program, region, MicroBatch("prefill", tokens=256, chunks=4))
    bounds = program.summary["bounds"][region]
    assert decode.step_seconds >= bounds["decode"]["pipeline_latency_s"]
    assert prefill.step_seconds > decode.step_seconds > 0


SMALL_WORKLOAD = """version: 1
name: small-chat
arrival: poisson
rate: 500
requests: 40
prompt: {kind: lognormal, median: 40, sigma: 0.5, low: 8, high: 120}
output: {kind: lognormal, median: 8, sigma: 0.5, low: 1, high: 30}
"""


@pytest.mark.slow
@pytest.mark.parametrize("plan", ["colocated", "disaggregated"])
def test_a_gemma_model_serves_a_workload(tmp_path, plan, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(hf_config(SPECS["gemma2"])))
    workload = tmp_path / "w.yaml"
    workload.write_text(SMALL_WORKLOAD)
    args = ["serve", str(config), "--fabric", "mesh32", "--plan", plan, "--workload",
            str(workload), "--cache-dir", str(tmp_path / "cache"), "--json"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["requests"] == 40
    assert data["ttft_s"]["p50"] > 0 and data["tpot_s"]["p50"] > 0


def test_inspect_lists_gemma_sliding_and_full_layers_apart(capsys):
    assert main(["inspect", "gemma-2-9b", "--phase", "decode", "--context", "8192"]) == 0
    out = capsys.readouterr().out
    assert "21 like layer 0, every 2" in out and "21 like layer 1, every 2" in out
    assert "L1.attn_scores" in out and "L2.attn_scores" not in out
