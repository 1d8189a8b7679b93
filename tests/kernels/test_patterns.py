"""The kernel-pattern registry: every entry is used by a compiled program, its kernels time
at or above the entry's bound on both engines, and a new pattern is one entry (here one
written in the test) that the compiler, the simulator and the functional engine take up."""


import numpy as np
import pytest

from wse_emu.compiler.bounds import kernel_bound
from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.options import CompileOptions
from wse_emu.engines import fast
from wse_emu.errors import UserError
from wse_emu.hardware.fabric import ClusterSpec, load_fabric
from wse_emu.kernels import patterns
from wse_emu.kernels.patterns.attention import KVSpread
from wse_emu.kernels.patterns.matrix import DenseStrip
from wse_emu.kernels.stage import kernel_graph
from wse_emu.models.layer import MicroBatch
from wse_emu.models.load import load_model
from wse_emu.models.spec import ModelSpec
from wse_emu.models.weights import random_weights
from wse_emu.sim.functional.generate import Generator
from wse_emu.sim.runner import run_region

MOE = ModelSpec.from_fields("a-moe", "mixtral", hidden_size=64, intermediate_size=96, num_layers=2,
                            num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=160, num_experts=8,
                            experts_per_token=2, moe_intermediate_size=96).validate("test")
STEPS = {"decode": MicroBatch("decode", batch=2, context=64),
         "prefill": MicroBatch("prefill", tokens=32)}


@pytest.fixture(scope="module")
def programs():
    mesh = ClusterSpec(load_fabric("mesh16"), 1)
    return [compile_model(load_model("tiny"), mesh, CompileOptions(region=(16, 16))),
            compile_model(load_model("tiny").replaced(tie_embeddings=False,
                                                      qk_norm=True).validate("test"), mesh,
                          CompileOptions(region=(16, 16))),
            compile_model(MOE, mesh, CompileOptions(region=(16, 16)))]


@pytest.mark.slow
def test_every_entry_is_used_and_every_kernel_holds_its_bound(programs):
    used = set()
    for p in programs:
        for stage in p.stages:
            for k in p.stage_kernels(stage):
                for phase, step in STEPS.items():
                    entry = patterns.of(k, phase)
                    used.add(entry)
                    g = kernel_graph(p, stage, k.name, step)
                    r = fast.run(g, p.fabric.hop_latency_cycles, p.fabric.ramp_latency_cycles)
                    assert r.unfinished() == 0
                    took = int(max(r.task_end.max(), r.msg_done.max(initial=0)))
                    bound = kernel_bound(k, stage.rect, p.model, p.fabric, step,
                                         range(*stage.layers), stage.part)["cycles"]
                    assert bound > 0 and took >= bound, (entry, k.name, took, bound)
    assert set(patterns.entries()) <= used, set(patterns.entries()) - used


def test_an_unknown_pattern_is_refused_by_name_before_compiling():
    options = CompileOptions(patterns=("matrix=gemv_sideways,gemm_stream",))
    with pytest.raises(UserError, match="no kernel pattern 'gemv_sideways' for matrix"):
        patterns.check(options)
    with pytest.raises(UserError, match="no kernel pattern 'gemv_sideways' for matrix"):
        compile_model(load_model("tiny"), ClusterSpec(load_fabric("mesh16"), 1), options)


def test_any_role_of_kernel_runs_the_pattern_chosen_for_it():
    """A pattern of another kind than matrix is chosen the same way: an attention entry under
    a new name runs as the default does; a name no attention entry has is refused by it."""
    class Spread(KVSpread):
        name = "attention_spread_again"

    patterns.register(Spread())
    try:
        mesh = ClusterSpec(load_fabric("mesh16"), 1)
        model = load_model("tiny").replaced(num_layers=1).validate("test")
        default = compile_model(model, mesh, CompileOptions(region=(16, 16)))
        chosen = compile_model(model, mesh, CompileOptions(
            region=(16, 16), patterns=("attention=attention_spread_again",)))
        attention = [k for k in chosen.kernels if k.kind == "attention"]
        assert attention and all(k.pattern == {"decode": "attention_spread_again",
                                               "prefill": "attention_spread_again"}
                                 for k in attention)
        step = MicroBatch("decode", batch=2, context=64)
        assert run_region(chosen, "mixed0", step).step_cycles == \
            run_region(default, "mixed0", step).step_cycles
    finally:
        del patterns.PATTERNS[("attention", "attention_spread_again")]
    with pytest.raises(UserError, match="no kernel pattern 'gemv_tree' for attention"):
        patterns.check(CompileOptions(patterns=("attention=gemv_tree",)))


class GemvWhole(DenseStrip):
    """A decode GEMV without MeshGEMV's overlap: each PE multiplies its whole block, then the
    tree reduces it (the recipe's example: one class, registered)."""

    name = "gemv_whole"
    chunked = False


@pytest.fixture
def gemv_whole():
    entry = patterns.register(GemvWhole())
    yield entry
    del patterns.PATTERNS[("matrix", "gemv_whole")]


def test_a_new_pattern_is_one_entry(gemv_whole):
    model = load_model("tiny").replaced(num_layers=1).validate("test")
    mesh = ClusterSpec(load_fabric("mesh16"), 1)
    tree = compile_model(model, mesh, CompileOptions(region=(16, 16)))
    whole = compile_model(model, mesh, CompileOptions(
        region=(16, 16), patterns=("matrix=gemv_whole,gemm_stream",)))
    q = next(k for k in whole.kernels if k.name == "q_proj")
    assert q.pattern == {"decode": "gemv_whole", "prefill": "gemm_stream"}
    step = MicroBatch("decode", batch=1, context=64)
    a, b = run_region(tree, "mixed0", step), run_region(whole, "mixed0", step)
    # Without the overlap the step cannot be faster; it stays above its stage's bound.
    assert b.step_cycles >= a.step_cycles
    for sr in b.stages:
        assert sr.cycles >= whole.stages[sr.stage].bounds["decode"]["cycles"]
    # The dataflow changed, not the numbers: the same tokens and logits through the tiles.
    weights = random_weights(model, 3)
    got = [Generator(p, weights).generate([1, 2, 3], 4) for p in (tree, whole)]
    assert got[0].generated_ids == got[1].generated_ids
    assert np.array_equal(got[0].logits[-1], got[1].logits[-1])


def test_a_kernel_cannot_run_patterns_that_plan_it_differently(gemv_whole):
    class Planned(DenseStrip):
        name = "gemv_planned"
        chunked = True

        def plan(self, b, stage, lay, strip, body, edge, high, names):
            return DenseStrip.plan(self, b, stage, lay, strip, body, edge, high, names)

    patterns.register(Planned())
    try:
        with pytest.raises(UserError, match="plan a kernel's SRAM differently"):
            compile_model(load_model("tiny"), ClusterSpec(load_fabric("mesh16"), 1),
                          CompileOptions(region=(16, 16),
                                         patterns=("matrix=gemv_planned,gemm_stream",)))
    finally:
        del patterns.PATTERNS[("matrix", "gemv_planned")]
