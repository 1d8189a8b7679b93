"""A mixture-of-experts layer cut between two wafers: when whole layers do not fill the wafers a
model needs, a layer's attention, router and first experts end one wafer and its other experts
start the next. The two parts own every expert once, compute the layer as the reference does
(colocated and disaggregated), do the layer's FLOPs between them, and their stages run above
their bounds on both engines."""

from __future__ import annotations

import dataclasses
import math

import pytest
from helpers import PROMPT, SPECS, follows_reference, routed_experts
from naive.reference_forward import ReferenceModel

from wse_emu.compiler.intensity import analyze
from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.opgraph import build_op_graph
from wse_emu.compiler.options import CompileOptions
from wse_emu.hardware.fabric import ClusterSpec, load_fabric
from wse_emu.kernels.stage import StageGraph
from wse_emu.models import layer as ly
from wse_emu.models.layer import MicroBatch
from wse_emu.models.weights import random_weights
from wse_emu.sim.functional.generate import Generator
from wse_emu.sim.runner import run_region, transfer_cycles

# 32 experts of 32 outputs, five layers, on 16x16 meshes of 12 KiB PEs: two hold the weights
# by SRAM but only four whole layers, so layer 2 is cut between them.
SPEC = SPECS["qwen3_moe"].replaced(name="a-split-moe", num_experts=32,
                                   moe_intermediate_size=32, num_layers=5).validate("test")
FABRIC = dataclasses.replace(load_fabric("mesh16"), sram_bytes_per_pe=12288)


def compiled(plan: str = "colocated"):
    if plan == "colocated":
        return compile_model(SPEC, ClusterSpec(FABRIC, 2), CompileOptions())
    return compile_model(SPEC, ClusterSpec(FABRIC, 4),
                         CompileOptions(plan="disaggregated", prefill_systems=2))


def test_a_layer_is_cut_between_the_wafers_and_every_expert_owned_once():
    program = compiled()
    held = [(s.layers, s.experts, s.rect.system) for s in program.stages]
    head, tail = [s for s in program.stages if s.experts is not None]
    assert head.layers == tail.layers and head.experts[0] == 0
    assert head.experts[1] == tail.experts[0] and tail.experts[1] == SPEC.experts.count
    assert head.rect.system == 0 and tail.rect.system == 1, held
    # The second part runs no attention and keeps no KV cache; its strips are the experts'.
    assert head.has_attention and not tail.has_attention and tail.kv_capacity_tokens == 0
    assert {k.name for k in program.stage_kernels(tail)} == {
        "experts_gate", "experts_up", "experts_act", "combine", "experts_down", "residual_mlp"}
    gate = {s.id: next(k for k in program.stage_kernels(s) if k.name == "experts_gate")
            for s in (head, tail)}
    assert gate[head.id].matrix[0] + gate[tail.id].matrix[0] == 32 * SPEC.hidden_size
    assert tail.describe_layers() == f"2 (experts {tail.experts[0]}-31)"


@pytest.mark.slow
@pytest.mark.parametrize("plan", ["colocated", "disaggregated"])
def test_a_split_layer_follows_the_reference_token_for_token(plan):
    weights = random_weights(SPEC, seed=7)
    program = compiled(plan)
    tail = next(s for s in program.stages if s.experts is not None and s.experts[0] > 0)
    # The prompt sends tokens to the second part's experts, so its work reaches the logits.
    routed = routed_experts(ReferenceModel(SPEC, weights), 2, PROMPT)
    assert any(e >= tail.experts[0] for e in routed)
    follows_reference(Generator(program, weights, "float32", prefill_tile=8),
                      ReferenceModel(SPEC, weights), PROMPT, tile=8, steps=6)


@pytest.mark.parametrize("step", [MicroBatch("decode", batch=8, context=40),
                                  MicroBatch("prefill", tokens=24, chunks=2)])
def test_the_two_parts_do_the_layers_flops_between_them(step):
    program = compiled()
    rows = analyze(build_op_graph(SPEC), SPEC, step, program.fabric)["ops"]
    ops = ly.ops_by_name(SPEC)
    for layer in range(SPEC.num_layers):
        want: dict[str, float] = {}
        for row in rows:
            if row.layer == layer:
                want[ops[row.op].kernel] = want.get(ops[row.op].kernel, 0) + row.cost.flops
        got: dict[str, float] = {}
        for stage in program.stages:
            if stage.layers[0] <= layer < stage.layers[1] and stage.num_layers == 1:
                sg = StageGraph(program, stage, step)
                sg.build()
                for name, work in sg.ledger.items():
                    if name in want:
                        got[name] = got.get(name, 0) + work.flops
        if any(s.num_layers > 1 and s.layers[0] <= layer < s.layers[1]
               for s in program.stages):
            continue  # a stage of several layers: held to the graph by test_moe_timing
        if sum(s.layers[0] == layer for s in program.stages) == 2:
            want["residual_mlp"] *= 2  # each part adds its experts' share to the stream
        assert got == pytest.approx(want, rel=1e-9), layer


@pytest.mark.parametrize("step", [MicroBatch("decode", batch=16, context=40),
                                  MicroBatch("prefill", tokens=64)])
def test_split_stages_run_above_their_bounds(step):
    # The program's bounds at this test's step; every kernel's busiest PE works at least its
    # kernel's compute and SRAM bounds (a part's routed ops: the pairs it must take).
    program = compile_model(SPEC, ClusterSpec(FABRIC, 2), CompileOptions(
        bound_decode_batch=16, bound_decode_context=40, bound_prefill_tokens=64))
    run = run_region(program, "mixed0", step)
    bounds = {s: {k.name: k.bounds[step.phase] for k in program.stage_kernels(program.stages[s])}
              for s in range(len(program.stages))}
    for sr in run.stages:
        assert sr.cycles >= program.stages[sr.stage].bounds[step.phase]["cycles"]
        for name, busy in sr.kernel_busy.items():
            bound = bounds[sr.stage][name]
            assert busy >= max(bound["compute"], bound["sram"]) - 1, (sr.stage, name)


@pytest.mark.slow
def test_split_stages_engines_agree_and_the_first_part_hands_on_more():
    program = compiled()
    step = MicroBatch("decode", batch=8, context=40)
    fast = run_region(program, "mixed0", step, engine="fast")
    cycle = run_region(program, "mixed0", step, engine="cycle")
    assert cycle.step_cycles == pytest.approx(fast.step_cycles, rel=0.25)
    head = next(s for s in program.stages if s.experts is not None and s.experts[0] == 0)
    after = program.stages[head.id + 1]
    # Across the wafers the first part hands on its experts' input and each token's choices
    # beside the stream: 2 x hidden values and k (id, weight) pairs per token.
    fabric, tokens = program.fabric, 64
    values = 2 * SPEC.hidden_size + SPEC.experts.top_k * 3  # 6 bytes a pair: 3 values
    assert ly.carried_values(SPEC, tuple(head.experts)) == values
    assert transfer_cycles(program, head, after, tokens) == 2 * fabric.ramp_latency_cycles + \
        math.ceil(values * tokens * 2 / fabric.offwafer_bytes_per_cycle())
