"""The engines' records: compiled functions take a few of them, they carry their declared
dtypes, borrowing one counts no reference, and the event heap's fixed size always suffices."""

import inspect
import sys

import numpy as np
import pytest
from numba import njit
from numba.core.dispatcher import Dispatcher
from numba.core.extending import _Intrinsic

from wse_emu.engines import (
    calendar,
    cores,
    cycle,
    fast,
    heap,
    messages,
    prefetch,
    records,
    reference,
    taskgraph,
)
from wse_emu.engines.messages import LINE
from wse_emu.engines.reference import cycle_twin, fast_twin
from wse_emu.engines.taskgraph import Builder

MAX_PARAMETERS = 12


def _compiled_functions():
    for module in (calendar, cores, cycle, fast, heap, messages, prefetch, records, reference,
                   taskgraph):
        for name, obj in vars(module).items():
            if isinstance(obj, Dispatcher) and obj.py_func.__module__ == module.__name__:
                yield f"{module.__name__}.{name}", inspect.signature(obj.py_func).parameters
            elif isinstance(obj, _Intrinsic) and obj._defn.__module__ == module.__name__:
                params = list(inspect.signature(obj._defn).parameters)[1:]  # typingctx
                yield f"{module.__name__}.{name}", params


def test_no_compiled_function_takes_more_than_twelve_parameters():
    found = dict(_compiled_functions())
    assert {"wse_emu.engines.cycle._simulate", "wse_emu.engines.cores.core_event"} <= set(found)
    wide = {name: len(params) for name, params in found.items()
            if len(params) > MAX_PARAMETERS}
    assert not wide


def test_make_gives_each_field_its_declared_dtype_and_wants_them_all():
    tasks = records.make(records.TaskColumns, pe=[0, 1], priority=[0, 0], cycles=[3, 4],
                         need=[0, 1], out_ptr=[0, 0, 0], out_msg=[], succ_ptr=[0, 1, 1],
                         succ_task=[1])
    assert [a.dtype for a in tasks] == list(records.TaskColumns.dtypes.values())
    assert tasks.pe.dtype == np.int32 and tasks.cycles.dtype == np.int64  # ids narrow, cycles not
    assert all(a.flags.c_contiguous for a in tasks)
    times = records.make(records.MessageTimes, first=records.Fill(3, -1),
                         done=records.Fill(3), point_done=np.arange(4, dtype=np.int32))
    assert times.first.tolist() == [-1, -1, -1] and times.point_done.dtype == np.int64
    assert times.first.ctypes.data % records.CACHE_LINE == 0
    with pytest.raises(TypeError, match="takes the fields"):
        records.make(records.MessageTimes, first=[1], done=[1])


def test_the_message_columns_place_each_endpoint_on_the_grid():
    b = Builder(5, 4)
    b.send(None, 7, 18, 2, [-1], t_ready=3)
    b.send(None, 0, 4, 1, [-1], t_ready=1)
    cols = records.message_columns(b.build())
    assert [records.route_ends(w) for w in cols.route.tolist()] == [(2, 1, 3, 3, False),
                                                                   (0, 0, 4, 0, False)]
    assert cols.external.tolist() == [1, 0]  # in order of release


@pytest.mark.parametrize("seed", range(4))
def test_the_message_columns_count_a_lines_points_as_the_graph_does(seed):
    # Lines along rows and columns, either way, and unicasts (one point, even at no hop).
    rng = np.random.default_rng(seed)
    w, h = 7, 5
    b = Builder(w, h)
    for _ in range(40):
        src = int(rng.integers(0, w * h))
        x, y = src % w, src // w
        if rng.random() < 0.5:
            dst = y * w + int(rng.integers(0, w)) if rng.random() < 0.5 \
                else int(rng.integers(0, h)) * w + x
            hops = abs(dst % w - x) + abs(dst // w - y)
            b.send(None, src, dst, 1, [-1] * max(hops, 1), LINE, t_ready=0)
        else:
            b.send(None, src, int(rng.integers(0, w * h)), 1, [-1], t_ready=0)
    graph = b.build()
    cols = records.message_columns(graph)
    assert cols.point_base.tolist() == graph.point_base().tolist()
    ends = [records.route_ends(w) for w in cols.route.tolist()]
    src, dst = graph.msgs.src.tolist(), graph.msgs.dst.tolist()
    assert ends == [(s % w, s // w, d % w, d // w, bool(mode == LINE))
                    for s, d, mode in zip(src, dst, graph.msgs.mode.tolist())]


def test_a_route_word_holds_the_widest_mesh_and_a_wider_one_is_refused():
    side = records.MAX_SIDE
    b = Builder(side, 2)
    b.send(None, 0, 2 * side - 1, 1, [-1] * side, LINE, t_ready=0)
    (word,) = records.message_columns(b.build()).route.tolist()
    assert records.route_ends(word) == (0, 0, side - 1, 1, True)
    wide = Builder(side + 1, 1)
    wide.send(None, 0, side, 1, [-1], t_ready=0)
    with pytest.raises(ValueError, match="engines take"):
        wide.build().check_ranges()


@njit
def _total_borrowed(times):
    times = records.borrow(times)
    total = 0
    for k in range(len(times.first)):
        total += times.first[k] + times.point_done[k]
    times.done[0] = total
    return total


def test_a_borrowed_record_reads_and_writes_the_callers_arrays_without_counting():
    times = records.make(records.MessageTimes, first=np.arange(5), done=records.Fill(5, 0),
                         point_done=np.arange(5) * 10)
    before = [sys.getrefcount(a) for a in times]
    for _ in range(3):
        assert _total_borrowed(times) == 110
    assert times.done[0] == 110
    assert [sys.getrefcount(a) for a in times] == before


@njit
def _corner(array, shape):
    return records.with_shape(array, shape)[-1, -1]


def test_with_shape_takes_only_the_arrays_own_shape():
    array = np.arange(12).reshape(3, 4)
    before = sys.getrefcount(array)
    assert _corner(array, (3, 4)) == 11
    with pytest.raises(ValueError, match="not the array's shape"):
        _corner(array, (4, 3))
    assert sys.getrefcount(array) == before


def _crowded_graph(width, height, per_pe, seed):
    """Several tasks per PE, all ready at once, each sending to a random PE's next task: the
    most events the heap can hold pending together (one per task and one DISPATCH per PE)."""
    rng = np.random.default_rng(seed)
    b = Builder(width, height)
    n = width * height
    first = [[b.task(p, int(rng.integers(1, 4)), priority=int(rng.integers(0, 3)))
              for _ in range(per_pe)] for p in range(n)]
    for p in range(n):
        for t in first[p]:
            q = int(rng.integers(0, n))
            b.send(t, p, q, 1, b.task(q, 1))
    return b.build()


def test_a_heap_sized_for_every_pending_event_never_overflows():
    g = _crowded_graph(24, 24, 3, seed=1)
    res = fast.run(g, 1, 2)
    start, end, point_done, _ = fast_twin(g, 1, 2)
    assert (list(res.task_start), list(res.task_end)) == (start, end)
    assert list(res.point_done) == point_done
    small = _crowded_graph(6, 5, 3, seed=2)
    res = cycle.run_graph(small, 2, 2, 1, 2, 10_000, check=True)
    _, _, t_done, _, _, start, end = cycle_twin(small.width, small.height, 2, 2, 1, 2,
                                                small.msgs, 10_000, graph=small)
    assert (list(res.task_start), list(res.task_end)) == (start, end)
    assert np.array_equal(res.t_done, t_done) and res.violation_cycle == -1
