"""Compiled kernels on the engines: the engines agree, and nothing beats its analytic bound."""

import numpy as np
import pytest

from wse_emu.compiler.bounds import kernel_bound
from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.options import CompileOptions
from wse_emu.engines import cycle, fast
from wse_emu.hardware.fabric import ClusterSpec, load_fabric
from wse_emu.kernels.stage import kernel_graph, stage_graph
from wse_emu.models.layer import MicroBatch
from wse_emu.models.spec import ModelSpec
from wse_emu.sim.runner import run_region

SMALL = ModelSpec.from_fields(name="small", family="llama", hidden_size=512, intermediate_size=1536,
                              num_layers=2, num_heads=8, num_kv_heads=2, head_dim=64,
                              vocab_size=2048).validate("test")
STEPS = {"decode": (MicroBatch("decode", batch=2, context=256), MicroBatch("decode", batch=2,
                                                                  context=256)),
         "prefill": (MicroBatch("prefill", tokens=64), MicroBatch("prefill", tokens=64))}


@pytest.fixture(scope="module")
def small_on_64():
    return compile_model(SMALL, ClusterSpec(load_fabric("mesh64"), 1),
                         CompileOptions(region=(64, 64)))


def makespan_fast(g):
    r = fast.run(g, 1, 2)
    assert r.unfinished() == 0
    return int(max(r.task_end.max(), r.msg_done.max(initial=0)))


def makespan_cycle(g):
    r = cycle.run_graph(g, 4, 8, 1, 2, 10**7)
    assert (r.task_end >= 0).all()
    return int(max(r.task_end.max(), r.t_done.max(initial=0)))


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_every_kernel_at_or_above_its_bound_and_engines_agree(small_on_64, phase):
    p = small_on_64
    step, work = STEPS[phase]
    for stage in p.stages:
        for k in p.stage_kernels(stage):
            g = kernel_graph(p, stage, k.name, step)
            g.validate()
            f, c = makespan_fast(g), makespan_cycle(g)
            bound = kernel_bound(k, stage.rect, p.model, p.fabric, work)["cycles"]
            assert min(f, c) >= bound, (k.name, f, c, bound)
            # Within 10%, or a few hops' worth of cycles for kernels that last only a hundred.
            assert f == pytest.approx(c, rel=0.10, abs=16), (k.name, f, c)


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_whole_compiled_stage_engines_agree(small_on_64, phase):
    p = small_on_64
    step, _ = STEPS[phase]
    for stage in p.stages:
        g, finals, _ = stage_graph(p, stage, step)
        f, c = makespan_fast(g), makespan_cycle(g)
        assert f == pytest.approx(c, rel=0.10), (stage.id, f, c)


@pytest.mark.slow
def test_stage_time_at_or_above_the_stage_bound():
    opts = CompileOptions(region=(64, 64), bound_prefill_tokens=64, bound_decode_batch=2,
                          bound_decode_context=256)
    p = compile_model(SMALL, ClusterSpec(load_fabric("mesh64"), 1), opts)
    for phase, (step, _) in STEPS.items():
        run = run_region(p, "mixed0", step)
        for sr in run.stages:
            assert sr.cycles >= p.stages[sr.stage].bounds[phase]["cycles"]
        region_bound = p.summary["bounds"]["mixed0"][phase]["pipeline_latency_cycles"]
        assert run.step_cycles >= region_bound


@pytest.mark.slow
def test_reusing_equal_stages_changes_nothing():
    deep = ModelSpec.from_fields(**{**SMALL.to_dict(), "num_layers": 8}).validate("test")
    p = compile_model(deep, ClusterSpec(load_fabric("mesh128"), 1),
                      CompileOptions(region=(128, 128)))
    step = MicroBatch("decode", batch=1, context=128)
    reused = run_region(p, "mixed0", step, reuse=True)
    full = run_region(p, "mixed0", step, reuse=False)
    assert reused.simulated < full.simulated == len(full.stages)
    assert [s.cycles for s in reused.stages] == [s.cycles for s in full.stages]
    assert reused.step_cycles == full.step_cycles
    for a, b in zip(reused.stages, full.stages):
        assert np.array_equal(a.busy, b.busy) and np.array_equal(a.links, b.links)


def test_deterministic(small_on_64):
    step, _ = STEPS["decode"]
    a = run_region(small_on_64, "mixed0", step)
    b = run_region(small_on_64, "mixed0", step)
    assert a.step_cycles == b.step_cycles
    assert [s.cycles for s in a.stages] == [s.cycles for s in b.stages]


def test_prefill_tiles_stream_through_a_stage(small_on_64):
    p = small_on_64
    one = run_region(p, "mixed0", MicroBatch("prefill", tokens=256, chunks=1))
    four = run_region(p, "mixed0", MicroBatch("prefill", tokens=256, chunks=4))
    # Tiles overlap kernels, so the prompt gets through faster than as one block...
    assert four.step_cycles < one.step_cycles
    for sr in four.stages:
        # ...a tile alone is quicker than the whole prompt, and the flow shop adds up.
        assert sr.first_tile_cycles < sr.cycles
    periods = [(s.cycles - s.first_tile_cycles) / 3 for s in four.stages]
    assert four.step_cycles == pytest.approx(sum(s.first_tile_cycles for s in four.stages)
                                             + sum(four.transfers) + 3 * max(periods))


@pytest.mark.slow
def test_streamed_prefill_engines_agree(small_on_64):
    p = small_on_64
    step = MicroBatch("prefill", tokens=256, chunks=4)
    for stage in p.stages:
        g, _, _ = stage_graph(p, stage, step)
        assert makespan_fast(g) == pytest.approx(makespan_cycle(g), rel=0.12)


@pytest.mark.slow
def test_a_stage_wider_than_the_queries_still_runs_both_phases():
    """A small model on a whole WSE-3 gets stages more rows across than it has query features:
    its projections lay their outputs along their strips, and attention's queries and keys
    are re-split across the stage before it (a whole step simulated, both phases)."""
    tiny = ModelSpec.from_fields(name="tiny", family="llama", hidden_size=64,
                                 intermediate_size=128, num_layers=2, num_heads=4,
                                 num_kv_heads=2, head_dim=16, vocab_size=256).validate("test")
    p = compile_model(tiny, ClusterSpec(load_fabric("wse3"), 1),
                      CompileOptions(bound_prefill_tokens=64, bound_decode_batch=2,
                                     bound_decode_context=64))
    across = {s.id: min(s.rect.w, s.rect.h) for s in p.stages}
    narrow = [s.id for s in p.stages for k in p.stage_kernels(s)
              if k.name == "q_proj" and k.grid[1] < across[s.id]]
    assert narrow, "no stage lays its queries along the strip: the case is not exercised"
    for step in (MicroBatch("prefill", tokens=64), MicroBatch("decode", batch=2, context=64)):
        run = run_region(p, "mixed0", step)
        assert all(sr.cycles > 0 for sr in run.stages)
        for sr in run.stages:
            assert sr.cycles >= p.stages[sr.stage].bounds[step.phase]["cycles"]
