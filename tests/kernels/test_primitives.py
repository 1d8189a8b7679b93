"""The line primitives build the graph a step-by-step walk of their plans builds: the same
tasks, edges and messages in the same order, so that the engines break their ties alike."""

import numpy as np
import pytest

from wse_emu.engines.taskgraph import grouped, input_counts
from wse_emu.kernels import primitives
from wse_emu.kernels.experts import down_order
from wse_emu.kernels.graph import GraphBuilder
from wse_emu.program.trees import tree_plan
from wse_emu.util.splits import even_split, even_splits

TASK_COLUMNS = ("task_pe", "task_cycles", "task_need", "task_kind", "out_ptr", "out_msg",
                "succ_ptr", "succ_task", "msg_target", "task_priority")
MESSAGE_COLUMNS = ("t_ready", "src", "dst", "length", "mode", "vc")


def reduce_step_by_step(g, lines, root, ready, wave, add_cycles, kind, gather=False, levels=2):
    """``line_reduce`` as its plan reads: each step's tasks, edge and messages in turn."""
    out = ready[np.arange(len(lines)), root].copy()
    if lines.shape[1] == 1:
        return out
    for r in np.unique(root):
        sel = np.flatnonzero(root == r)
        value = ready[sel].copy()
        held = np.ones(lines.shape[1], dtype=np.int64)
        for receiver, senders, level in tree_plan(lines.shape[1], int(r), levels).steps:
            senders = np.asarray(senders)
            acc = g.tasks(lines[sel, receiver], add_cycles[sel] * len(senders), kind)
            g.then(value[:, receiver], acc)
            pieces = held[senders] if gather else np.ones(len(senders), dtype=np.int64)
            g.send(value[:, senders].ravel(), lines[sel][:, senders].ravel(),
                   np.repeat(lines[sel, receiver], len(senders)),
                   (wave[sel][:, None] * pieces[None, :]).ravel(),
                   np.repeat(acc, len(senders)), 0,
                   primitives.VC_REDUCE1 if level % 2 else primitives.VC_REDUCE2)
            held[receiver] += held[senders].sum()
            value[:, receiver] = acc
        out[sel] = value[:, int(r)]
    return out


def built(reduce, lines, root, wave, add_cycles, gather, levels):
    height, width = lines.shape
    g = GraphBuilder(width, height)
    ready = g.tasks(lines.ravel(), 3, 0).reshape(lines.shape)
    out = reduce(g, lines, root, ready, wave, add_cycles, 1, gather, levels)
    return out, g.build()


@pytest.mark.parametrize("seed", range(40))
def test_a_reduction_builds_the_graph_its_plan_walked_step_by_step_builds(seed):
    rng = np.random.default_rng(seed)
    n_lines, length = int(rng.integers(1, 7)), int(rng.integers(1, 48))
    lines = np.arange(n_lines * length).reshape(n_lines, length)
    root = rng.integers(0, length, n_lines)
    wave, add_cycles = rng.integers(1, 9, n_lines), rng.integers(1, 5, n_lines)
    gather, levels = bool(seed % 2), int(rng.integers(1, 5))
    want_out, want = built(reduce_step_by_step, lines, root, wave, add_cycles, gather, levels)
    got_out, got = built(primitives.line_reduce, lines, root, wave, add_cycles, gather, levels)
    assert np.array_equal(got_out, want_out)
    for name in TASK_COLUMNS:
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    for name in MESSAGE_COLUMNS:
        assert np.array_equal(getattr(got.msgs, name), getattr(want.msgs, name)), name


@pytest.mark.parametrize("seed", range(20))
def test_grouping_is_a_stable_sort_by_key(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 50))
    keys = rng.integers(-3, n + 3, int(rng.integers(0, 400)))
    ptr, order = grouped(keys, n)
    kept = np.flatnonzero((keys >= 0) & (keys < n))
    assert np.array_equal(order, kept[np.argsort(keys[kept], kind="stable")])
    assert np.array_equal(np.diff(ptr), np.bincount(keys[kept], minlength=n))


@pytest.mark.parametrize("seed", range(10))
def test_a_tasks_inputs_are_its_delivery_points_and_predecessors(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    targets = rng.integers(-1, n, int(rng.integers(0, 300)))
    after = rng.integers(0, n, int(rng.integers(0, 300)))
    want = np.bincount(targets[targets >= 0], minlength=n) + np.bincount(after, minlength=n)
    assert np.array_equal(input_counts(targets, after, n), want)


def straight_lines(rng, w: int, h: int, count: int) -> list[np.ndarray]:
    """Runs along rows or columns of a ``w`` x ``h`` mesh, either way, of any length."""
    out = []
    for _ in range(count):
        if rng.random() < 0.5:
            length = int(rng.integers(1, w + 1))
            x0, y = int(rng.integers(0, w - length + 1)), int(rng.integers(0, h))
            run = y * w + x0 + np.arange(length)
        else:
            length = int(rng.integers(1, h + 1))
            x, y0 = int(rng.integers(0, w)), int(rng.integers(0, h - length + 1))
            run = (y0 + np.arange(length)) * w + x
        out.append(run if rng.random() < 0.5 else run[::-1])
    return out


@pytest.mark.parametrize("seed", range(40))
def test_the_nearest_pe_of_a_line_is_the_first_of_the_closest(seed):
    # Straight runs (found at once) and lines of any PEs, repeats and ties included (searched),
    # on meshes one PE wide too, against a table of every distance.
    rng = np.random.default_rng(seed)
    w, h = int(rng.integers(1, 12)), int(rng.integers(1, 10))
    if seed % 2:  # straight runs of one length (the lines of one call are alike)
        runs = straight_lines(rng, w, h, 40)
        length = len(runs[0])
        lines = np.array([r for r in runs if len(r) == length])
    else:
        lines = rng.integers(0, w * h, (int(rng.integers(1, 8)), int(rng.integers(1, 10))))
    line = rng.integers(0, len(lines), 60)
    src = rng.integers(0, w * h, 60)
    cand = lines[line]
    dist = np.abs(cand % w - (src % w)[:, None]) + np.abs(cand // w - (src // w)[:, None])
    want = cand[np.arange(len(line)), np.argmin(dist, axis=1)]
    assert np.array_equal(primitives.nearest_on_lines(lines, line, src, w), want)


@pytest.mark.parametrize("w, h", [(1, 7), (7, 1), (2, 5)])
def test_the_nearest_pe_on_a_mesh_one_or_two_pes_across(w, h):
    # A column of a mesh one PE wide steps by 1, as a row does: it is still a column.
    runs = [np.arange(h) * w + x for x in range(w)] if h > 1 else [np.arange(w)]
    lines = np.array([r for run in runs for r in (run, run[::-1])])
    line, src = np.repeat(np.arange(len(lines)), w * h), np.tile(np.arange(w * h), len(lines))
    cand = lines[line]
    dist = np.abs(cand % w - (src % w)[:, None]) + np.abs(cand // w - (src // w)[:, None])
    want = cand[np.arange(len(line)), np.argmin(dist, axis=1)]
    assert np.array_equal(primitives.nearest_on_lines(lines, line, src, w), want)


@pytest.mark.parametrize("seed", range(8))
def test_downs_inputs_take_row_by_row_that_rows_slice_of_every_run(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        runs, span, rows = (int(rng.integers(1, 9)), int(rng.integers(1, 60)),
                            int(rng.integers(1, 70)))
        sizes = even_split(span, rows)
        starts = np.concatenate([[0], np.cumsum(sizes)])
        want = [r * span + i for j in range(rows) for r in range(runs)
                for i in range(starts[j], starts[j + 1])]
        assert down_order(runs, span, rows).tolist() == want


@pytest.mark.parametrize("targets, after", [([3], []), ([], [3]), ([], [-1])])
def test_an_input_to_a_task_that_does_not_exist_is_refused(targets, after):
    with pytest.raises(ValueError, match="does not exist"):
        input_counts(np.array(targets, dtype=np.int64), np.array(after, dtype=np.int64), 3)


def test_even_splits_are_even_split_row_by_row():
    rng = np.random.default_rng(0)
    for _ in range(200):
        totals, parts = rng.integers(0, 5000, int(rng.integers(1, 20))), int(rng.integers(1, 40))
        assert np.array_equal(even_splits(totals, parts),
                              np.stack([even_split(int(t), parts) for t in totals]))
