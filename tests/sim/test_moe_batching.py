"""How a mixture of experts' step moves its tokens: the router splits its inputs across the
stage where it has fewer outputs than the stage is wide, an expert strip's input pieces cross
straight to their lines, and batch tiling on attention runs a decode micro-batch's attention in
tiles while the experts take the whole micro-batch; the experts' starvation at small batches
shows in the step's summary."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import SPECS, compiled_on_mesh16

from wse_emu.cli.main import main
from wse_emu.compiler.stages import StripSpec
from wse_emu.engines.messages import LINE
from wse_emu.kernels.stage import stage_graph
from wse_emu.models.layer import MicroBatch
from wse_emu.sim.runner import run_region, simulate_stage

DECODE = MicroBatch("decode", batch=8, context=40)


@pytest.fixture(scope="module")
def one_stage():
    """Tiny gpt-oss on one 16 x 16 stage: its 8-logit router is narrower than the stage."""
    return compiled_on_mesh16(SPECS["gpt_oss"], layers_per_stage=4)


def kernel(program, name):
    return next(k for k in program.kernels if k.name == name)


def test_a_router_narrower_than_its_stage_splits_its_inputs_across_the_stage(one_stage):
    stage = one_stage.stages[0]
    short = stage.rect.h if stage.strip_axis == "x" else stage.rect.w
    router = kernel(one_stage, "router")
    assert router.matrix == [64, 8]
    assert router.k_axis != stage.strip_axis  # K across the stage, the 8 logits along it
    assert router.grid[0] == short
    # Every PE of the strip holds a slice of the weights, where a line along K would leave
    # all but eight PEs of it empty.
    r = router.rect
    weights = one_stage.arrays["sram_weights"][r.system, r.y:r.y1, r.x:r.x1]
    assert (weights > 0).all()
    # Its sums meet on one line along the strip, where the top-k takes them.
    route = kernel(one_stage, "route")
    assert route.rect.area == router.grid[1]
    # Dense strips are as wide as their outputs or wider: none is turned.
    assert not StripSpec("k_proj", 4096, 1024, 1, 0).transposed(377)
    assert StripSpec("router", 2880, 128, 1, 0).transposed(377)


def test_expert_input_pieces_cross_straight_to_their_lines(one_stage):
    """Each piece of the hidden vector goes straight across to the line that needs it (then
    along the line), so pieces bound for many lines do not crowd the source's own line."""
    stage = one_stage.stages[0]
    graph, _, _ = stage_graph(one_stage, stage, DECODE)
    width = graph.width
    for name in ("experts_gate", "experts_up", "experts_down"):
        r, st = kernel(one_stage, name).rect, stage.rect
        inside = np.zeros((st.h, st.w), bool)
        inside[r.y - st.y:r.y1 - st.y, r.x - st.x:r.x1 - st.x] = True
        src, dst = graph.msgs.src, graph.msgs.dst
        into = (~inside.ravel()[src]) & inside.ravel()[dst] & (graph.msgs.mode != LINE)
        assert into.sum() > 0, name
        straight = (src[into] % width == dst[into] % width) | (src[into] // width
                                                               == dst[into] // width)
        assert straight.all(), name


def test_attention_tiles_run_the_attention_per_tile_and_the_experts_once(one_stage):
    stage = one_stage.stages[0]
    whole = simulate_stage(one_stage, stage, DECODE, "fast")
    graph, _, names = stage_graph(one_stage, stage, DECODE)
    tiled_program = compiled_on_mesh16(SPECS["gpt_oss"], layers_per_stage=4, attention_tile=2)
    tiled = simulate_stage(tiled_program, stage, DECODE, "fast")
    tiled_graph, _, tiled_names = stage_graph(tiled_program, stage, DECODE)

    def tasks(g, kind_names, name):
        return int((g.task_kind == kind_names.index(name)).sum())

    # Four tiles of two sequences: the attention's tasks four times over, the experts' once.
    assert tasks(tiled_graph, tiled_names, "q_proj") > 3 * tasks(graph, names, "q_proj")
    for name in ("router", "experts_gate", "experts_up", "experts_down"):
        assert tasks(tiled_graph, tiled_names, name) == tasks(graph, names, name), name
    # The same work either way, and no faster than the bound.
    assert tiled.busy.sum() == pytest.approx(whole.busy.sum(), rel=0.01)
    assert tiled.cycles >= tiled_program.stages[0].bounds["decode"]["cycles"]


@pytest.mark.slow
def test_attention_tiles_leave_prefill_and_small_batches_alone(one_stage):
    program = compiled_on_mesh16(SPECS["gpt_oss"], layers_per_stage=4, attention_tile=8)
    stage = program.stages[0]
    for step in (DECODE, MicroBatch("prefill", tokens=24, chunks=2)):
        a = simulate_stage(one_stage, stage, step, "fast")
        b = simulate_stage(program, stage, step, "fast")
        assert a.cycles == b.cycles


def test_expert_starvation_shows_in_the_steps_summary(one_stage):
    region = one_stage.regions[0].name
    busy = {}
    for batch in (1, 8):
        run = run_region(one_stage, region, MicroBatch("decode", batch=batch, context=40))
        experts = run.experts()
        assert run.to_json()["experts"] == experts
        busy[batch] = experts["expert_pe_utilization"]
        assert experts["experts"] == 8 and 1 <= experts["active_experts"] <= 8
        assert experts["busiest_tokens"] <= batch
    assert 0 < busy[1] < busy[8] < 1  # a lone token leaves most expert PEs idle


def test_run_states_its_attention_tiles_and_refuses_a_negative_one(tmp_path, capsys):
    import yaml

    model = tmp_path / "moe.yaml"
    spec = SPECS["gpt_oss"].validate("test")
    model.write_text(yaml.safe_dump({**spec.to_dict(), "version": 1}))
    args = ["run", str(model), "--fabric", "mesh16", "--region", "16x16",
            "--layers-per-stage", "4", "--batch", "8", "--context", "40"]
    assert main(args + ["--attention-tile", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["step"]["attention_tile"] == 2
    assert data["experts"]["experts"] == 8
    assert main(args + ["--attention-tile", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "attention-tile" in err[0] and "-1" in err[0]
    # A prefill has no attention batch to tile: said so, not ignored.
    assert main(args + ["--phase", "prefill", "--tokens", "16", "--attention-tile", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a prefill step has none to tile" in err[0]
