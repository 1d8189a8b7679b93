"""A graph built on the form of an earlier one (``GraphBuilder.build(like)``) is the graph
built from nothing, to every array: taken only where every call made the same tasks, edges
and messages, refused (and built from nothing) where any differs."""

import numpy as np
import pytest

from tests.helpers import SPECS, compiled_on_mesh16
from tests.kernels.test_primitives import MESSAGE_COLUMNS, TASK_COLUMNS
from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.options import CompileOptions
from wse_emu.engines import fast
from wse_emu.engines.messages import LINE
from wse_emu.hardware.fabric import ClusterSpec, load_fabric
from wse_emu.kernels import stage as stages
from wse_emu.kernels.graph import GraphBuilder
from wse_emu.kernels.stage import StageGraph, stage_graph
from wse_emu.models.layer import MicroBatch
from wse_emu.models.load import load_model


def assert_same_graph(got, want):
    for name in TASK_COLUMNS:
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    for name in MESSAGE_COLUMNS:
        assert np.array_equal(getattr(got.msgs, name), getattr(want.msgs, name)), name
    assert (got.width, got.height) == (want.width, want.height)


def made(scale: int = 1, **change):
    """A small graph on a 6 x 4 mesh: tasks of two kinds and priorities, an edge, a unicast
    and a line message, costs times ``scale``; ``change`` alters one call's structure."""
    g = GraphBuilder(6, 4)
    a = g.tasks(change.get("pe", [0, 1, 2]), [3 * scale, 4 * scale, 5 * scale], 0)
    with g.prioritized(change.get("priority", 1)):
        b = g.tasks([7, 8], 2 * scale, change.get("kind", 1))
    g.then(a[:2], change.get("after", b))
    g.send(a[2], 2, change.get("dst", 8), 5 * scale, b[1], 0, change.get("vc", 0))
    g.send(-1, 6, 9, 2 * scale, [-1, -1, b[0]], LINE)
    if change.get("extra"):
        g.tasks([3], 1, 0)
    return g


def test_the_same_calls_at_other_costs_take_the_form_and_make_the_graph_anew_would():
    first = made()
    graph = first.build()
    again = made(scale=3)
    got = again.build(like=first.form)
    assert again.form is first.form
    assert_same_graph(got, made(scale=3).build())
    assert got.succ_ptr is graph.succ_ptr  # the arrays of the form, not new ones
    assert graph.task_cycles.tolist() == [3, 4, 5, 2, 2]  # the first graph's costs kept
    assert fast.run(got, 1, 2).task_end.tolist() == fast.run(made(scale=3).build(), 1,
                                                             2).task_end.tolist()


@pytest.mark.parametrize("change", [dict(pe=[0, 1, 3]), dict(priority=2), dict(kind=2),
                                    dict(after=[4, 4]), dict(dst=7), dict(vc=1),
                                    dict(extra=True)])
def test_a_call_that_differs_in_its_tasks_edges_or_messages_is_built_from_nothing(change):
    first = made()
    first.build()
    other = made(**change)
    got = other.build(like=first.form)
    assert other.form is not first.form
    assert_same_graph(got, made(**change).build())


def steps():
    return [MicroBatch("decode", batch=b, context=c) for b in (1, 4, 32) for c in (64, 4096)] \
        + [MicroBatch("prefill", tokens=t, prefix=p) for t in (16, 64) for p in (0, 4096)] \
        + [MicroBatch("decode", batch=b, context=512, drafted=2) for b in (1, 8)]


@pytest.mark.parametrize("program", ["tiny", "mixtral", "gpt_oss"])
def test_stage_graphs_made_on_forms_are_those_made_from_nothing(program):
    if program == "tiny":
        p = compile_model(load_model("tiny"), ClusterSpec(load_fabric("mesh8"), 1),
                          CompileOptions(region=(8, 8)))
    else:
        p = compiled_on_mesh16(SPECS[program])
    stages._forms.clear()
    taken = 0
    for stage in p.stages:
        for step in steps():
            like = stages._forms.get((id(p), stage.id, step.phase, step.drafted))
            got, finals, _ = stage_graph(p, stage, step, on_forms=True)
            want, want_finals = StageGraph(p, stage, step).build()
            assert_same_graph(got, want)
            assert all(np.array_equal(a, b) for a, b in zip(finals, want_finals))
            taken += like is not None and got.succ_ptr is like.graph.succ_ptr
    assert taken > 0  # most shapes of a stage's step are one graph with other costs
    assert len(stages._forms) <= stages.FORMS_KEPT


def test_a_graph_built_alone_keeps_no_form(tiny_8x8):
    stages._forms.clear()
    for stage in tiny_8x8.stages:
        stage_graph(tiny_8x8, stage, MicroBatch("decode", batch=2, context=64))
    assert not stages._forms  # a step's stages built once each: nothing held for later
