"""Records: the engines' arrays grouped by what they describe, one argument each.

The compiled engines work on dozens of arrays (the task graph's columns, the message table,
the cores' queues, the routers' buffers...). Passed one by one, a function's signature is
a list of twenty anonymous arrays that every caller must repeat in order. A record is a
``typing.NamedTuple`` of them: Numba passes it as one value and reads a field (``tasks.pe``)
as a plain struct member, with no lookup at run time.

A record is declared once, by a class that lists each field with its dtype (``pe: np.int64``:
an array of int64) or as ``int`` (a scalar); ``@record`` turns the class into the NamedTuple
and keeps the dtypes in ``dtypes``, and ``make`` builds one with each field converted to its
dtype, contiguous, so that every run compiles to the same signature. The records of the task
graph and the message table are built from a ``TaskGraph`` here, in ``task_columns`` and
``message_columns``; each engine declares and builds its own state, in Python, before its
compiled driver runs.

Two steps at the top of a driver keep the records as cheap as loose arrays: ``borrow`` stops
Numba from counting references on a record's arrays (it would at every copy of the record,
in the innermost loops), and ``with_shape`` tells the compiler the dimensions it could not
see from arrays made outside (the five ports of a router), so that indexing stays shifts
and adds.
"""

import typing

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.core.imputils import impl_ret_borrowed
from numba.extending import intrinsic

from wse_emu.engines.messages import LINE
from wse_emu.engines.taskgraph import MAX_SIDE, TaskGraph


def record(cls):
    """The NamedTuple declared by ``cls``: its annotated fields, in order, as ``name: dtype``
    for an array or ``name: int`` for a scalar; its docstring, module and name stay, so that
    Numba's cache finds it where the class was."""
    dtypes = typing.get_type_hints(cls)
    tup = typing.NamedTuple(cls.__name__, [(name, np.ndarray if kind is not int else int)
                                           for name, kind in dtypes.items()])
    tup.__doc__ = cls.__doc__
    tup.__module__ = cls.__module__
    tup.__qualname__ = cls.__qualname__
    tup.dtypes = dtypes
    return tup


class Fill(typing.NamedTuple):
    """A new array for ``make``: of this shape, every entry ``value`` (None: left as the
    allocator finds it, for scratch that is written before it is read)."""

    shape: int | tuple
    value: int | None = None


def make(cls, **fields):
    """A ``cls`` record of ``fields``, every one named: an array becomes a contiguous array of
    its field's dtype (the same array when it already is one), a ``Fill`` a new one, a scalar
    an ``int``."""
    if set(cls.dtypes) != set(fields):
        raise TypeError(f"{cls.__name__} takes the fields {list(cls.dtypes)}, not "
                        f"{sorted(fields)}")
    return cls(**{name: _field_value(fields[name], kind) for name, kind in cls.dtypes.items()})


def _field_value(value, kind):
    if kind is int:
        return int(value)
    if isinstance(value, Fill):
        array = _aligned(value.shape, kind)
        if value.value is not None:
            array.fill(value.value)
        return array
    return np.ascontiguousarray(value, dtype=kind)


CACHE_LINE = 64


def _aligned(shape, dtype) -> np.ndarray:
    """An uninitialised array whose first entry starts a cache line: rows sized to a line
    (the cycle engine's per-router scalars) then stay on one line each, whatever address the
    allocator hands out."""
    count = int(np.prod(shape))
    itemsize = np.dtype(dtype).itemsize
    raw = np.empty(count * itemsize + CACHE_LINE, dtype=np.uint8)
    skip = -raw.ctypes.data % CACHE_LINE
    return raw[skip:skip + count * itemsize].view(dtype).reshape(shape)


@intrinsic
def borrow(typingctx, rec):
    """``rec`` with no reference counted on its arrays: a compiled driver borrows each record
    it is given, as its first step, and uses the borrowed one throughout.

    Numba counts a reference for every array in a record each time the record is copied (a
    call, an inlined helper's argument, a field read): for a handful of records of a dozen
    arrays, passed to helpers inlined in the innermost loops, that counting would cost more
    than the work. An array whose owner pointer (meminfo) is null is not counted, and the
    compiler deletes the counting on it altogether. The arrays are the caller's, which holds
    them for the whole call, so the borrowed record is valid until the driver returns; it
    must not be returned, nor any of its arrays.
    """
    def codegen(context, builder, signature, args):
        value = args[0]
        for k, kind in enumerate(rec.types):
            if isinstance(kind, types.Array):
                array = context.make_array(kind)(context, builder,
                                                 builder.extract_value(value, k))
                array.meminfo = cgutils.get_null_value(array.meminfo.type)
                value = builder.insert_value(value, array._getvalue(), k)
        return value
    return rec(rec), codegen


@intrinsic
def _restate_shape(typingctx, array, shape):
    """``array`` (C-contiguous) with ``shape`` (a tuple of its ndim ints) written in as its
    shape, and the strides that follow from it."""
    if not isinstance(shape, types.BaseTuple) or len(shape) != array.ndim:
        return None

    def codegen(context, builder, signature, args):
        value = context.make_array(array)(context, builder, args[0])
        dims = [context.cast(builder, builder.extract_value(args[1], k), shape[k], types.intp)
                for k in range(array.ndim)]
        strides = [value.itemsize]
        for dim in reversed(dims[1:]):
            strides.insert(0, builder.mul(strides[0], dim))
        value.shape = cgutils.pack_array(builder, dims)
        value.strides = cgutils.pack_array(builder, strides)
        return impl_ret_borrowed(context, builder, array, value._getvalue())
    return array(array, shape), codegen


@njit(cache=True, inline="always")
def with_shape(array, shape):
    """``array``, a C-contiguous array of shape ``shape``, with the dimensions written out in
    the caller: those the caller knows as constants (the five ports of a router, a row of
    16 scalars) become constants of the compiled code, which then indexes with shifts and
    adds rather than multiplications by sizes loaded from memory. Raises ValueError when
    ``shape`` is not the array's shape."""
    if array.shape != shape:
        raise ValueError("with_shape: not the array's shape")
    return _restate_shape(array, shape)


@record
class Mesh:
    """The mesh and the fabric's numbers a run needs (scalars)."""

    width: int  # PEs per row; PE p sits at x = p % width, y = p // width
    height: int  # rows
    hop: int  # cycles for a wavelet to cross one link
    ramp: int  # cycles between a PE's core and its router, each way
    qcap: int  # wavelets one router queue (of one virtual channel) holds
    vcs: int  # virtual channels per router port (the cycle engine's; the fast engine: 0)


@record
class TaskColumns:
    """The task graph's columns over tasks (``TaskGraph``), which the engines only read. Ids
    and counts are held in 32 bits (below 2**31, ``TaskGraph.check_ranges``): a whole-wafer
    stage's columns are tens of megabytes, read in no order a cache follows. Cycles and
    offsets stay 64-bit."""

    pe: np.int32  # (tasks,): the PE that runs the task, y * width + x
    priority: np.int32  # (tasks,): 0..255, lower first
    cycles: np.int64  # (tasks,): core cycles it takes
    need: np.int32  # (tasks,): inputs it waits for (deliveries plus predecessors)
    out_ptr: np.int64  # (tasks + 1,): CSR offsets of each task's messages in out_msg
    out_msg: np.int32  # (sent,): message ids each task sends when done, in order
    succ_ptr: np.int64  # (tasks + 1,): CSR offsets of each task's successors in succ_task
    succ_task: np.int32  # (edges,): successor task ids


@record
class MessageColumns:
    """The message table (``Messages``) and its delivery points, which the engines only
    read."""

    t_ready: np.int64  # (messages,): cycle an external message may start, -1: a task sends it
    src: np.int32  # (messages,): source PE
    dst: np.int32  # (messages,): destination PE
    length: np.int64  # (messages,): wavelets (32 bits each), >= 1
    mode: np.int32  # (messages,): UNICAST or LINE (delivered at every router after its source)
    # (messages,): the source's column and row, the destination's, and whether it is a line
    # multicast, in one word (``route_of``): the engines take messages in no order a cache
    # follows, and read one entry where they read five
    route: np.int64
    vc: np.int64  # (messages,): virtual channel, the color class modulo the cycle engine's vcs
    external: np.int64  # (external messages,): ids with t_ready >= 0, in order of t_ready
    point_base: np.int64  # (messages + 1,): index of each message's first delivery point
    target: np.int32  # (points,): the task each delivery point feeds, or -1


@record
class MessageTimes:
    """What both engines measure per message and delivery point (-1: never happened)."""

    first: np.int64  # (messages,): cycle its first wavelet was injected
    done: np.int64  # (messages,): cycle its last delivery point had every wavelet
    point_done: np.int64  # (points,): cycle the delivery point had every wavelet


def task_columns(graph: TaskGraph) -> TaskColumns:
    """The task graph's task columns, as the engines take them."""
    return make(TaskColumns, pe=graph.task_pe, priority=graph.task_priority,
                cycles=graph.task_cycles, need=graph.task_need, out_ptr=graph.out_ptr,
                out_msg=graph.out_msg, succ_ptr=graph.succ_ptr, succ_task=graph.succ_task)


def message_columns(graph: TaskGraph, vcs: int | None = None) -> MessageColumns:
    """The task graph's messages and delivery points, as the engines take them; ``vcs``
    folds the color classes onto that many virtual channels (None: kept as they are)."""
    msgs = graph.msgs
    external = np.flatnonzero(msgs.t_ready >= 0)
    external = external[np.argsort(msgs.t_ready[external], kind="stable")]
    n = len(msgs.src)
    route = np.empty(n, dtype=np.int64)
    point_base = np.empty(n + 1, dtype=np.int64)
    _geometry(msgs.src, msgs.dst, msgs.mode, graph.width, route, point_base)
    return make(MessageColumns, t_ready=msgs.t_ready, src=msgs.src, dst=msgs.dst,
                length=msgs.length, mode=msgs.mode, route=route,
                vc=msgs.vc if vcs is None else msgs.vc % vcs, external=external,
                point_base=point_base, target=graph.msg_target)


# A route word (``MessageColumns.route``): the source's column and row and the destination's,
# 15 bits each (a mesh of up to ``taskgraph.MAX_SIDE`` PEs a side, checked by
# ``TaskGraph.check_ranges``), then whether the message is a line multicast.
ROUTE_BITS = 15
ROUTE_MASK = (1 << ROUTE_BITS) - 1
assert MAX_SIDE - 1 <= ROUTE_MASK


@njit(cache=True, inline="always")
def route_of(sx, sy, tx, ty, line):
    return (sx | (sy << ROUTE_BITS) | (tx << (2 * ROUTE_BITS)) | (ty << (3 * ROUTE_BITS))
            | (line << (4 * ROUTE_BITS)))


@njit(cache=True, inline="always")
def route_ends(way):
    """The source's column and row, the destination's, and whether it is a line, of a route
    word."""
    return (way & ROUTE_MASK, (way >> ROUTE_BITS) & ROUTE_MASK,
            (way >> (2 * ROUTE_BITS)) & ROUTE_MASK, (way >> (3 * ROUTE_BITS)) & ROUTE_MASK,
            (way >> (4 * ROUTE_BITS)) != 0)


@njit(cache=True)
def _geometry(src, dst, mode, width, route, point_base):
    """Each message's route word and where its delivery points start
    (``TaskGraph.point_base``: a unicast has one, a line one per hop), in one pass: a graph
    has up to a million messages, and numpy's divisions and temporaries over them cost more
    than the engine's setup otherwise does."""
    point_base[0] = 0
    for m in range(len(src)):
        sy, sx = divmod(np.int64(src[m]), width)
        ty, tx = divmod(np.int64(dst[m]), width)
        line = mode[m] == LINE
        route[m] = route_of(sx, sy, tx, ty, np.int64(1 if line else 0))
        points = 1
        if line:
            points = max(abs(tx - sx) + abs(ty - sy), 1)
        point_base[m + 1] = point_base[m] + points


def new_message_times(msgs: MessageColumns) -> MessageTimes:
    """Nothing sent or delivered yet."""
    n_msgs, n_points = len(msgs.src), len(msgs.target)
    return make(MessageTimes, first=Fill(n_msgs, -1), done=Fill(n_msgs, -1),
                point_done=Fill(n_points, -1))
