"""The cycle engine: wavelet-level, cycle by cycle.

Every router has five input ports (N, E, S, W and the ramp from its PE) and five outputs. Each
input port has one queue per virtual channel (color) of ``queue_wavelets`` entries; colors share
the physical link, which carries one wavelet per cycle per direction. A wavelet may leave only
when the queue it goes to has room (credits, returned one cycle after the wavelet moves on), so
none is ever dropped. A link delivers after ``hop`` cycles, a ramp after ``ramp`` cycles.

The hardware has 24 routable colors (HARDWARE.md); the engine models ``vcs`` virtual channels
(at most ``MAX_VCS``, the fabric's ``virtual_channels``), and a message of color class ``c``
(``Messages.vc``) waits in queue ``c % vcs`` at every port it crosses. The kernels send four
classes (``kernels.primitives``: broadcasts, the two alternating levels of a reduction tree,
transfers), so with four or more virtual channels each class has queues of its own and more
change nothing; with fewer, classes share queues and a blocked one can hold up another.

One cycle, in order: wavelets reach PEs (feeding the tasks that wait for them); tasks start and
finish (as in ``taskgraph``; finished ones queue their messages to send), and external messages
whose time has come queue too; wavelets arrive from links and ramps; every router moves at most
one wavelet per input port and one per output port (input ports tried round-robin starting at
``(cycle + router) % 5``, colors round-robin per port); every PE injects at most one wavelet;
freed credits return. A line multicast moves only when all the outputs it needs (the next hop
and the local ramp) are free at once.

Only routers with queued wavelets are visited, in index order. The order cannot change the
outcome: a router's grants depend on its own queues and credits alone, each queue takes at most
one arriving wavelet per cycle, and freed credits return only at the end of the cycle.

Zero-load latency of an M-wavelet message over H hops is H*hop + 2*ramp + (M - 1) cycles from
the cycle it may start to the cycle its last wavelet reaches the PE.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from wse_emu.engines.cores import (
    ID_BITS,
    core_event,
    feed,
    new_cores,
    pop,
    push,
    ready_key,
)
from wse_emu.engines.messages import LINE, PORTS, RAMP, Messages
from wse_emu.engines.taskgraph import TaskGraph
from wse_emu.hardware.fabric import MAX_VCS

# The router queues' memory (bytes) beyond which a run is refused: a typo in the queue depth
# must not ask for tens of GiB.
MAX_QUEUE_BYTES = 2 << 30


@dataclass
class CycleResult:
    """What the cycle engine measured. Cycles count from 0; -1 marks what never happened
    before the run ended."""

    cycles: int  # cycles simulated
    task_start: np.ndarray  # int64 (tasks,): cycle each task started (-1: never)
    task_end: np.ndarray  # int64 (tasks,): cycle each task finished (-1: not)
    t_first: np.ndarray  # int64 (messages,): cycle its first wavelet was injected (-1: never)
    t_done: np.ndarray  # int64 (messages,): cycle its last wavelet reached its last point
    point_done: np.ndarray  # int64 (points,): cycle the delivery point had all wavelets
    point_base: np.ndarray  # int64 (messages,): index of each message's first delivery point
    link_wavelets: np.ndarray  # int64 (routers, 4): wavelets sent per direction N, E, S, W
    injected: int  # wavelets injected by PEs
    delivered: int  # wavelets delivered to PEs (a line multicast's copies each count)
    in_flight_cycles: int  # sum over cycles of wavelets in flight (for Little's law)
    violation_cycle: int  # first cycle where injected + copies != delivered + in flight


def queue_bytes(width: int, height: int, vcs: int, queue_wavelets: int) -> int:
    """Bytes of the router queues the cycle engine allocates for a mesh: per router, five
    input ports of ``vcs`` queues of ``queue_wavelets`` 8-byte entries, with 12 bytes of
    head, length and credit per queue."""
    return width * height * PORTS * vcs * (8 * queue_wavelets + 12)


def run(width: int, height: int, vcs: int, queue_wavelets: int, hop: int, ramp: int,
        messages: Messages, max_cycles: int, check: bool = False) -> CycleResult:
    """Simulate traffic alone (no tasks) on the cycle engine.

    Parameters
    ----------
    width, height : int
        The mesh, in PEs.
    vcs : int
        Virtual channels per router port, 1..MAX_VCS (``FabricSpec.virtual_channels``).
    queue_wavelets : int
        Wavelets each virtual channel's queue holds, >= 1 (``FabricSpec.queue_wavelets``).
    hop : int
        Cycles for a wavelet to cross one link, >= 1 (``FabricSpec.hop_latency_cycles``).
    ramp : int
        Cycles between a PE's core and its router, each way, >= 1
        (``FabricSpec.ramp_latency_cycles``).
    messages : Messages
        The traffic, every message external (``t_ready`` >= 0, sorted), on virtual channels
        ``0..vcs - 1`` (checked here, with the endpoints).
    max_cycles : int
        Cycles after which the run stops, delivered or not.
    check : bool
        Check every cycle that wavelets are conserved (injected + multicast copies =
        delivered + in flight); the first cycle where not is ``violation_cycle``. Slower.

    Returns
    -------
    CycleResult
        Per-message and per-point cycles, link counts and the conservation check.
    """
    messages.validate(width, height, vcs)
    empty = np.zeros(0, dtype=np.int64)
    graph = TaskGraph(width, height, empty, empty, empty, empty, np.zeros(1, np.int64), empty,
                      np.zeros(1, np.int64), empty, messages,
                      np.full(int(messages.points(width).sum()), -1, dtype=np.int64))
    return run_graph(graph, vcs, queue_wavelets, hop, ramp, max_cycles, check)


def run_graph(graph: TaskGraph, vcs: int, queue_wavelets: int, hop: int, ramp: int,
              max_cycles: int, check: bool = False) -> CycleResult:
    """Execute a task graph on the cycle engine, wavelet by wavelet.

    Parameters
    ----------
    graph : TaskGraph
        Tasks, their messages and the delivery points they feed, on a
        ``graph.width`` x ``graph.height`` mesh (see ``taskgraph``). Its packed ranges are
        checked (priorities 0..255, fewer than 2**32 tasks and delivery points).
    vcs : int
        Virtual channels per router port, 1..MAX_VCS (``FabricSpec.virtual_channels``): a
        message of color class ``c`` (``graph.msgs.vc``, >= 0) waits in queue ``c % vcs``.
    queue_wavelets : int
        Wavelets each virtual channel's queue holds, >= 1 (``FabricSpec.queue_wavelets``);
        with ``vcs`` it sets the queues' memory, refused beyond ``MAX_QUEUE_BYTES``.
    hop : int
        Cycles for a wavelet to cross one link, >= 1 (``FabricSpec.hop_latency_cycles``).
    ramp : int
        Cycles between a PE's core and its router, each way, >= 1
        (``FabricSpec.ramp_latency_cycles``).
    max_cycles : int
        Cycles after which the run stops, finished or not (unfinished tasks end at -1).
    check : bool
        Check every cycle that wavelets are conserved; the first cycle where not is
        ``violation_cycle`` (-1: none). Slower.

    Returns
    -------
    CycleResult
        Per-task, per-message and per-point cycles, link counts and the conservation check.

    Raises
    ------
    ValueError
        For a latency below one cycle, virtual channels or a queue depth out of range, or
        queues beyond ``MAX_QUEUE_BYTES``.
    """
    if hop < 1 or ramp < 1:
        raise ValueError("the cycle engine needs hop and ramp latency of at least one cycle")
    if not 1 <= vcs <= MAX_VCS:
        raise ValueError(f"the cycle engine models 1 to {MAX_VCS} virtual channels, got {vcs}")
    if queue_wavelets < 1:
        raise ValueError(f"queues must hold at least one wavelet, got {queue_wavelets}")
    need = queue_bytes(graph.width, graph.height, vcs, queue_wavelets)
    if need > MAX_QUEUE_BYTES:
        raise ValueError(
            f"{vcs} virtual channels of {queue_wavelets} wavelets on {graph.width} x "
            f"{graph.height} PEs need {need / 2**30:.1f} GiB of router queues; the cycle "
            f"engine allows {MAX_QUEUE_BYTES / 2**30:.0f} GiB")
    graph.check_ranges()
    msgs = graph.msgs
    base = graph.point_base()
    external = np.flatnonzero(msgs.t_ready >= 0)
    external = external[np.argsort(msgs.t_ready[external], kind="stable")]
    out = _simulate(graph.width, graph.height, vcs, queue_wavelets, hop, ramp, msgs.t_ready,
                    msgs.src, msgs.dst, msgs.length, msgs.mode, msgs.vc % vcs, base,
                    external, graph.task_pe, graph.task_priority, graph.task_cycles,
                    graph.task_need, graph.out_ptr,
                    graph.out_msg, graph.succ_ptr, graph.succ_task, graph.msg_target,
                    max_cycles, check)
    (cycles, start, end, t_first, t_done, point_done, links, injected, delivered, occupancy,
     violation) = out
    return CycleResult(int(cycles), start, end, t_first, t_done, point_done, base[:-1], links,
                       int(injected), int(delivered), int(occupancy), int(violation))


@njit(cache=True)
def _xy_port(x, y, dx, dy):
    """Dimension-ordered routing: x first, then y; RAMP at the destination.

    Parameters
    ----------
    x, y : int
        The router's position.
    dx, dy : int
        The wavelet's destination.

    Returns
    -------
    int
        The output port: EAST (1) or WEST (3) while x differs, then SOUTH (2, y grows) or
        NORTH (0), and RAMP (4) at the destination.
    """
    if dx > x:
        return 1  # EAST
    if dx < x:
        return 3  # WEST
    if dy > y:
        return 2  # SOUTH
    if dy < y:
        return 0  # NORTH
    return RAMP


@njit(cache=True)
def _queue_send(m, src, pe_head, pe_tail, nxt, senders, n_senders):
    """Message ``m`` joins the end of its PE's send queue (a linked list of messages).

    Parameters
    ----------
    m : int
        The message id.
    src : int64 array, shape (messages,)
        Source PE of each message.
    pe_head, pe_tail : int64 array, shape (routers,)
        First and last message of each PE's send queue (-1: empty).
    nxt : int64 array, shape (messages,)
        The message after each in its send queue (-1: last).
    senders : int64 array, shape (routers,)
        The PEs with a non-empty send queue, in its first ``n_senders`` entries.
    n_senders : int
        How many.

    Returns
    -------
    int
        The new number of senders.
    """
    s = src[m]
    if pe_tail[s] < 0:
        pe_head[s] = m
        senders[n_senders] = s
        n_senders += 1
    else:
        nxt[pe_tail[s]] = m
    pe_tail[s] = m
    return n_senders


# A queued wavelet is one int64: its message id (low 32 bits) and what routing needs, so that
# a router never looks the message up: destination x (15 bits), y (15 bits), line flag.
_MSG_MASK = (1 << 32) - 1


@njit(cache=True)
def _pack(m, dx, dy, line):
    """One queued wavelet as an int64: message id ``m`` (below 2**32) in bits 0-31, its
    destination ``dx`` in bits 32-46 and ``dy`` in bits 47-61, ``line`` (1: a line multicast)
    in bit 62."""
    return m | (dx << 32) | (dy << 47) | (line << 62)


# A queue (router, input port, color) named by one int64, so that a wavelet on a link or a
# credit on its way back is one list entry. Five bits of color: at most MAX_VCS = 32 colors,
# which the per-port color masks below allow anyway.


@njit(cache=True)
def _queue_id(r, p, v):
    """The int64 naming queue (router ``r``, input port ``p`` in 0..4, color ``v`` in 0..31):
    ``r << 8 | p << 5 | v``."""
    return (r << 8) | (p << 5) | v


@njit(cache=True)
def _queue_parts(q):
    """(router, port, color) of a ``_queue_id``."""
    return q >> 8, (q >> 5) & 7, q & 31


# Per-router scalars packed in one 64-byte row (one cache line): per input port a bit mask of
# its non-empty color queues, the total of queued wavelets, a bit mask of the input ports with
# anything queued, the arbitration start port, color round-robin pointers, x, y.
_POCC, _ROCC, _PMASK, _START, _VRR, _X, _Y, _RINFO = 0, 5, 6, 7, 8, 13, 14, 16


@intrinsic
def _lowest_bit(typingctx, word):
    """Index of the lowest set bit of a non-zero int64 (one instruction: LLVM's cttz); a
    Numba intrinsic: ``word`` (int64, not 0) -> int64 in 0..63."""
    def codegen(context, builder, signature, args):
        return builder.cttz(args[0], cgutils.true_bit)  # true: zero never asked
    return types.int64(types.int64), codegen


@njit(cache=True)
def _rotate(mask, first, size):
    """Bit i of the result is bit ``(first + i) % size`` of the ``size``-bit ``mask``: taking
    set bits lowest first visits them round-robin from ``first``, with no modulo per try.

    Parameters
    ----------
    mask : int
        A bit mask of ``size`` bits (higher bits are ignored: a 32-bit mask read from an
        int32 array arrives sign-extended).
    first : int
        The bit to visit first, 0..size - 1.
    size : int
        Bits in the mask: PORTS for input ports, ``vcs`` for colors (at most 32).

    Returns
    -------
    int
        The rotated mask, ``size`` bits.
    """
    full = (1 << size) - 1
    mask &= full  # a 32-color mask read from int32 arrives sign-extended
    return ((mask >> first) | (mask << (size - first))) & full


@njit(cache=True)
def _enqueue(r, p, v, e, qcap, qbuf, qinfo, rinfo, active):
    """Wavelet ``e`` joins queue (port ``p``, color ``v``) of router ``r``, which has room
    (its sender held a credit).

    Parameters
    ----------
    r, p, v : int
        Router, input port (0..4) and color (0..vcs - 1).
    e : int
        The packed wavelet (``_pack``).
    qcap : int
        Wavelets one queue holds.
    qbuf : int64 array, shape (routers, PORTS, vcs, qcap)
        The queues' ring buffers of packed wavelets (``_pack``).
    qinfo : int32 array, shape (routers, PORTS, vcs, 2)
        Per queue: index of its head in ``qbuf``, and its length.
    rinfo : int32 array, shape (routers, _RINFO)
        Per-router scalars (see the ``_POCC``... offsets): per input port a mask of its
        non-empty colors, the wavelets queued, a mask of non-empty input ports, the
        arbitration start port, per port the color to try first, x and y.
    active : int64 array, shape (ceil(routers / 64),)
        Bit set of the routers with queued wavelets; ``r``'s bit is set.
    """
    pos = qinfo[r, p, v, 0] + qinfo[r, p, v, 1]
    if pos >= qcap:
        pos -= qcap
    qbuf[r, p, v, pos] = e
    qinfo[r, p, v, 1] += 1
    rinfo[r, p] |= 1 << v
    rinfo[r, _PMASK] |= 1 << p
    rinfo[r, _ROCC] += 1
    active[r >> 6] |= 1 << (r & 63)


@njit(cache=True)
def _dequeue(r, p, v, vcs, qcap, qinfo, rinfo):
    """The head wavelet of queue (port ``p``, color ``v``) of router ``r`` leaves, and the
    port's color pointer moves past ``v``.

    Parameters
    ----------
    r, p, v : int
        Router, input port (0..4) and color (0..vcs - 1); the queue is not empty.
    vcs : int
        Virtual channels per port.
    qcap : int
        Wavelets one queue holds.
    qinfo : int32 array, shape (routers, PORTS, vcs, 2)
        Per queue: index of its head in ``qbuf``, and its length.
    rinfo : int32 array, shape (routers, _RINFO)
        Per-router scalars (see the ``_POCC``... offsets): per input port a mask of its
        non-empty colors, the wavelets queued, a mask of non-empty input ports, the
        arbitration start port, per port the color to try first, x and y.
    """
    h = qinfo[r, p, v, 0] + 1
    qinfo[r, p, v, 0] = 0 if h == qcap else h
    qinfo[r, p, v, 1] -= 1
    if qinfo[r, p, v, 1] == 0:
        rinfo[r, p] &= ~(1 << v)
        if rinfo[r, p] == 0:
            rinfo[r, _PMASK] &= ~(1 << p)
    rinfo[r, _ROCC] -= 1
    rinfo[r, _VRR + p] = 0 if v + 1 == vcs else v + 1


# The switch functions are inlined by Numba itself: called, each would take its many arrays
# with reference counting, per router (measured: about 40% slower overall).
@njit(cache=True, inline="always")
def _switch_router(r, t_port, vcs, qcap, rinfo, qinfo, qbuf, cred, links, step, opposite,
                   link_q, link_e, n_link, out_r, out_m, n_out, ret, n_ret):
    """Router ``r`` moves at most one wavelet per input port and one per output port: input
    ports round-robin from ``(t + r) % 5``, colors round-robin per port. A moved wavelet joins
    the link list (``link_q``, ``link_e``) and/or the ramp-out list (``out_r``, ``out_m``), the
    slot it frees the credit list ``ret``.

    A wavelet at the head of its queue is granted when its output port is not taken this
    cycle and, for a link, the next router's queue of its color has a credit; a line
    multicast passing through also needs the ramp out (its tap) free.

    Parameters
    ----------
    r : int
        The router.
    t_port : int
        The cycle modulo PORTS (input ports are tried from ``(t_port + r) % PORTS``).
    vcs : int
        Virtual channels per port.
    qcap : int
        Wavelets one queue holds.
    rinfo : int32 array, shape (routers, _RINFO)
        Per-router scalars (see the ``_POCC``... offsets): per input port a mask of its
        non-empty colors, the wavelets queued, a mask of non-empty input ports, the
        arbitration start port, per port the color to try first, x and y.
    qinfo : int32 array, shape (routers, PORTS, vcs, 2)
        Per queue: index of its head in ``qbuf``, and its length.
    qbuf : int64 array, shape (routers, PORTS, vcs, qcap)
        The queues' ring buffers of packed wavelets (``_pack``).
    cred : int32 array, shape (routers, PORTS, vcs)
        Credits: free slots in the queue each output (0..3: the neighbour's facing input
        port; RAMP: this router's injection queue) may still fill.
    links : int64 array, shape (routers, 4)
        Wavelets sent per router and direction N, E, S, W.
    step : int64 array, shape (4,)
        Router index offset of the neighbour in each direction.
    opposite : int64 array, shape (4,)
        The input port a wavelet sent in each direction arrives on.
    link_q, link_e : int64 array, shape (4 * routers,)
        Wavelets put on links this cycle: the queue each joins (``_queue_id``) and the
        wavelet, in the first ``n_link`` entries.
    n_link : int
        Entries of the link list in use.
    out_r, out_m : int64 array, shape (routers,)
        Wavelets put on ramps out this cycle: the router and the message id, in the first
        ``n_out`` entries.
    n_out : int
        Entries of the ramp-out list in use.
    ret : int64 array, shape (PORTS * routers,)
        Queues freed of a wavelet this cycle, whose feeder gets a credit back at its end,
        in the first ``n_ret`` entries.
    n_ret : int
        Entries of the credit list in use.

    Returns
    -------
    n_link, n_out, n_ret : int
        The three lists' new lengths.
    moved : int
        Wavelets that left a queue.
    copies : int
        Extra copies made by line multicasts (a wavelet both passed on and delivered).
    """
    rx = rinfo[r, _X]
    ry = rinfo[r, _Y]
    used = 0  # bit mask of output ports taken this cycle
    moved = 0
    copies = 0
    start = rinfo[r, _START] + t_port
    if start >= PORTS:
        start -= PORTS
    ports = _rotate(rinfo[r, _PMASK], start, PORTS)  # only input ports with queued wavelets
    while ports != 0:
        p = start + _lowest_bit(ports)
        ports &= ports - 1
        if p >= PORTS:
            p -= PORTS
        first = rinfo[r, _VRR + p]
        colors = _rotate(rinfo[r, p], first, vcs)
        while colors != 0:
            v = first + _lowest_bit(colors)
            colors &= colors - 1
            if v >= vcs:
                v -= vcs
            e = qbuf[r, p, v, qinfo[r, p, v, 0]]
            out = _xy_port(rx, ry, (e >> 32) & 0x7FFF, (e >> 47) & 0x7FFF)
            # A line multicast taps the ramp at every router after its source (where it
            # entered from the ramp).
            tap = (e >> 62) & 1 == 1 and out != RAMP and p != RAMP
            if used & (1 << out):
                continue
            if out < 4 and cred[r, out, v] == 0:
                continue
            if tap and used & (1 << RAMP):
                continue
            # Granted: the slot it frees is a credit for whoever feeds this queue.
            _dequeue(r, p, v, vcs, qcap, qinfo, rinfo)
            moved += 1
            if p < 4:
                ret[n_ret] = _queue_id(r + step[p], opposite[p], v)
            else:
                ret[n_ret] = _queue_id(r, RAMP, v)
            n_ret += 1
            used |= 1 << out
            if out < 4:
                link_q[n_link] = _queue_id(r + step[out], opposite[out], v)
                link_e[n_link] = e
                n_link += 1
                cred[r, out, v] -= 1
                links[r, out] += 1
            if out == RAMP or tap:
                out_r[n_out] = r
                out_m[n_out] = e & _MSG_MASK
                n_out += 1
                if tap:
                    used |= 1 << RAMP
                    copies += 1
            break
    return n_link, n_out, n_ret, moved, copies


@njit(cache=True, inline="always")
def _switch(active, t_port, vcs, qcap, rinfo, qinfo, qbuf, cred, links, step, opposite,
            link_q, link_e, out_r, out_m, ret):
    """Every router with queued wavelets switches; emptied ones leave the ``active`` bit set.
    Routers are taken in index order from the bit set, so their state is walked forwards in
    memory rather than at random.

    Parameters
    ----------
    active : int64 array, shape (ceil(routers / 64),)
        Bit set of the routers with queued wavelets.
    t_port, vcs, qcap, rinfo, qinfo, qbuf, cred, links, step, opposite
        As in ``_switch_router``.
    link_q, link_e, out_r, out_m, ret : int64 array
        The link, ramp-out and credit lists of ``_switch_router``, filled from empty.

    Returns
    -------
    n_link, n_out, n_ret : int
        The lengths of the link list, the ramp-out list and the credit list.
    moved : int
        Wavelets that left a queue.
    copies : int
        Extra copies made by line multicasts.
    """
    n_link = 0
    n_out = 0
    n_ret = 0
    moved = 0
    copies = 0
    for word in range(len(active)):
        bits = active[word]
        while bits != 0:
            b = _lowest_bit(bits)
            bits ^= 1 << b  # not bits & (bits - 1): for bit 63 that subtraction overflows
            r = (word << 6) + b
            n_link, n_out, n_ret, m, c = _switch_router(
                r, t_port, vcs, qcap, rinfo, qinfo, qbuf, cred, links, step, opposite, link_q,
                link_e, n_link, out_r, out_m, n_out, ret, n_ret)
            moved += m
            copies += c
            if rinfo[r, _ROCC] == 0:
                active[word] &= ~(1 << (r & 63))
    return n_link, n_out, n_ret, moved, copies


@njit(cache=True)
def _simulate(width, height, vcs, qcap, hop, ramp, t_ready, src, dst, length, mode, vc,
              point_base, external, task_pe, task_priority, task_cycles, task_need, out_ptr,
              out_msg, succ_ptr, succ_task, msg_target, max_cycles, check):
    """The cycle engine's driver: simulate cycle by cycle (the six phases of the module's
    docstring) until every message is delivered and every task done, or ``max_cycles``.

    Parameters
    ----------
    width, height : int
        The mesh, in PEs (one router each); PE ``p`` sits at x = p % width, y = p // width.
    vcs : int
        Virtual channels per router port, 1..MAX_VCS.
    qcap : int
        Wavelets each virtual channel's queue holds, >= 1.
    hop : int
        Cycles to cross one link, >= 1.
    ramp : int
        Cycles between a core and its router, each way, >= 1.
    t_ready : int64 array, shape (messages,)
        Cycle an external message may start, or -1 for one a task sends.
    src, dst : int64 array, shape (messages,)
        Source and destination PE of each message.
    length : int64 array, shape (messages,)
        Wavelets (32 bits each) of each message, >= 1.
    mode : int64 array, shape (messages,)
        UNICAST or LINE (a multicast delivered at every router after its source).
    vc : int64 array, shape (messages,)
        Virtual channel of each message, 0..vcs - 1 (its color class modulo ``vcs``).
    point_base : int64 array, shape (messages + 1,)
        Index of each message's first delivery point.
    external : int64 array, shape (external messages,)
        Ids of the messages with ``t_ready`` >= 0, in order of ``t_ready``.
    task_pe, task_priority, task_cycles, task_need : int64 array, shape (tasks,)
        Each task's PE, priority (0..255, lower first), core cycles and inputs awaited
        (copied, not written).
    out_ptr : int64 array, shape (tasks + 1,)
        CSR offsets of each task's messages in ``out_msg``.
    out_msg : int64 array, shape (sent,)
        Message ids each task sends when done, in order.
    succ_ptr : int64 array, shape (tasks + 1,)
        CSR offsets of each task's successors in ``succ_task``.
    succ_task : int64 array, shape (edges,)
        Successor task ids.
    msg_target : int64 array, shape (points,)
        The task each delivery point feeds, or -1.
    max_cycles : int
        Cycles after which the run stops.
    check : bool
        Recount the wavelets in flight every cycle and note the first cycle they disagree.

    Returns
    -------
    t : int
        Cycles simulated.
    start_t, end_t : int64 array, shape (tasks,)
        Start and end cycle of each task (-1: not).
    t_first : int64 array, shape (messages,)
        Cycle each message's first wavelet was injected (-1: never).
    t_done : int64 array, shape (messages,)
        Cycle its last delivery point had every wavelet (-1: not).
    point_done : int64 array, shape (points,)
        Cycle each delivery point had every wavelet (-1: not).
    links : int64 array, shape (routers, 4)
        Wavelets sent per router and direction N, E, S, W.
    injected, delivered : int
        Wavelets injected by PEs and delivered to them.
    occupancy : int
        Sum over cycles of the wavelets in flight.
    violation : int
        First cycle the conservation check failed (-1: never, or not checked).
    """
    n = width * height
    m_count = len(src)
    opposite = np.array([2, 3, 0, 1], dtype=np.int64)
    step = np.array([-width, 1, width, -1], dtype=np.int64)  # router offset per direction
    rinfo = np.zeros((n, _RINFO), dtype=np.int32)
    for r in range(n):
        rinfo[r, _START] = r % PORTS
        rinfo[r, _X] = r % width
        rinfo[r, _Y] = r // width
    mdx = np.empty(m_count, dtype=np.int32)
    mdy = np.empty(m_count, dtype=np.int32)
    msx = np.empty(m_count, dtype=np.int32)
    msy = np.empty(m_count, dtype=np.int32)
    for m in range(m_count):
        mdx[m] = dst[m] % width
        mdy[m] = dst[m] // width
        msx[m] = src[m] % width
        msy[m] = src[m] // width
    qbuf = np.zeros((n, PORTS, vcs, qcap), dtype=np.int64)
    qinfo = np.zeros((n, PORTS, vcs, 2), dtype=np.int32)  # head, length
    cred = np.full((n, PORTS, vcs), qcap, dtype=np.int32)  # port RAMP: the PE's injection
    ret = np.zeros(n * PORTS, dtype=np.int64)  # queues whose freed slot is credited next

    # Wavelets on links and ramps, as lists per arrival slot (cycle modulo the latency).
    l_q = np.zeros((hop, 4 * n), dtype=np.int64)  # the queue it will join (_queue_id)
    l_m = np.zeros((hop, 4 * n), dtype=np.int64)  # the wavelet
    l_n = np.zeros(hop, dtype=np.int64)
    i_r = np.zeros((ramp, n), dtype=np.int64)
    i_m = np.zeros((ramp, n), dtype=np.int64)
    i_n = np.zeros(ramp, dtype=np.int64)
    o_r = np.zeros((ramp, n), dtype=np.int64)
    o_m = np.zeros((ramp, n), dtype=np.int64)
    o_n = np.zeros(ramp, dtype=np.int64)

    # Send queues: per PE a linked list of released messages; PEs with one are listed.
    pe_head = np.full(n, -1, dtype=np.int64)
    pe_tail = np.full(n, -1, dtype=np.int64)
    nxt = np.full(m_count, -1, dtype=np.int64)
    sent = np.zeros(m_count, dtype=np.int64)
    senders = np.zeros(n, dtype=np.int64)
    n_senders = 0
    active = np.zeros((n + 63) // 64, dtype=np.int64)  # bit r: router r has queued wavelets

    total_points = point_base[m_count]
    point_count = np.zeros(total_points, dtype=np.int64)
    point_done = np.full(total_points, -1, dtype=np.int64)
    points_left = np.zeros(m_count, dtype=np.int64)
    for m in range(m_count):
        points_left[m] = point_base[m + 1] - point_base[m]
    t_first = np.full(m_count, -1, dtype=np.int64)
    t_done = np.full(m_count, -1, dtype=np.int64)
    links = np.zeros((n, 4), dtype=np.int64)

    # Tasks: an event heap of (cycle, kind, task), as in the fast engine.
    n_tasks = len(task_pe)
    need = task_need.copy()
    no_wait = np.zeros(len(need), dtype=np.int64)  # inputs are counted as they arrive
    start_t = np.full(n_tasks, -1, dtype=np.int64)
    end_t = np.full(n_tasks, -1, dtype=np.int64)
    q_base, qa, qb, q_count, running, dispatch_due = new_cores(n, task_pe)
    busy = np.zeros(n, dtype=np.int64)
    ht = np.empty(1024 + 2 * n_tasks, dtype=np.int64)
    hk = np.empty(1024 + 2 * n_tasks, dtype=np.int64)
    hsize = 0
    for k in range(n_tasks):
        if need[k] == 0:
            hsize = push(ht, hk, hsize, 0, ready_key(task_priority[k], k))
    tasks_done = 0

    released = 0
    finished = 0
    injected = 0
    delivered = 0
    copies = 0
    occupancy = 0
    queued = 0
    violation = -1
    t = 0
    while t < max_cycles and (finished < m_count or tasks_done < n_tasks):
        # 1. Arrivals at PEs: a delivery point with all its wavelets may make a task ready.
        rs = t % ramp
        ls = t % hop
        for i in range(o_n[rs]):
            r = o_r[rs, i]
            m = o_m[rs, i]
            delivered += 1
            dist = abs(rinfo[r, _X] - msx[m]) + abs(rinfo[r, _Y] - msy[m])
            idx = point_base[m] + (dist - 1 if mode[m] == LINE and dist > 0 else 0)
            point_count[idx] += 1
            if point_count[idx] == length[m]:
                point_done[idx] = t
                # Only a point some task waits on calls feed (whose array arguments cost
                # reference counting per call).
                if msg_target[idx] >= 0:
                    ht, hk, hsize = feed(msg_target[idx], t, need, task_priority, ht, hk, hsize)
                points_left[m] -= 1
                if points_left[m] == 0:
                    t_done[m] = t
                    finished += 1
        o_n[rs] = 0

        # 2. Tasks: ready ones claim their PE's core, finished ones send their messages.
        #    External messages whose time has come join their PE's send queue too.
        while hsize > 0 and ht[0] <= t:
            _, key, hsize = pop(ht, hk, hsize)
            ht, hk, hsize, done_task = core_event(
                key >> ID_BITS, key & ((1 << ID_BITS) - 1), t, ht, hk, hsize, task_pe,
                task_priority, task_cycles, succ_ptr, succ_task, need, no_wait, start_t, end_t,
                busy, q_base, qa, qb, q_count, running, dispatch_due)
            if done_task >= 0:
                tasks_done += 1
                for i in range(out_ptr[done_task], out_ptr[done_task + 1]):
                    n_senders = _queue_send(out_msg[i], src, pe_head, pe_tail, nxt, senders,
                                            n_senders)
        while released < len(external) and t_ready[external[released]] <= t:
            n_senders = _queue_send(external[released], src, pe_head, pe_tail, nxt, senders,
                                    n_senders)
            released += 1

        # 3. Arrivals from links and ramps into router queues.
        for i in range(l_n[ls]):
            r, p, v = _queue_parts(l_q[ls, i])
            _enqueue(r, p, v, l_m[ls, i], qcap, qbuf, qinfo, rinfo, active)
        for i in range(i_n[rs]):
            m = i_m[rs, i]
            e = _pack(m, mdx[m], mdy[m], 1 if mode[m] == LINE else 0)
            _enqueue(i_r[rs, i], RAMP, vc[m], e, qcap, qbuf, qinfo, rinfo, active)
        queued += l_n[ls] + i_n[rs]
        l_n[ls] = 0
        i_n[rs] = 0

        # 4. Switch: one wavelet per input port and per output port.
        l_n[ls], o_n[rs], n_ret, moved, made = _switch(
            active, t % PORTS, vcs, qcap, rinfo, qinfo, qbuf, cred, links, step, opposite,
            l_q[ls], l_m[ls], o_r[rs], o_m[rs], ret)
        queued -= moved
        copies += made

        # 5. Each PE injects at most one wavelet of the message at the head of its queue.
        keep = 0
        for a in range(n_senders):
            s = senders[a]
            m = pe_head[s]
            v = vc[m]
            if cred[s, RAMP, v] > 0:
                cred[s, RAMP, v] -= 1
                c = i_n[rs]
                i_r[rs, c] = s
                i_m[rs, c] = m
                i_n[rs] = c + 1
                injected += 1
                if sent[m] == 0:
                    t_first[m] = t
                sent[m] += 1
                if sent[m] == length[m]:
                    pe_head[s] = nxt[m]
                    if pe_head[s] < 0:
                        pe_tail[s] = -1
            if pe_head[s] >= 0:
                senders[keep] = s
                keep += 1
        n_senders = keep

        # 6. Credits freed this cycle become usable next cycle.
        for i in range(n_ret):
            r, p, v = _queue_parts(ret[i])
            cred[r, p, v] += 1

        flight = injected + copies - delivered
        occupancy += flight
        if check and violation < 0:
            counted = queued
            for i in range(hop):
                counted += l_n[i]
            for i in range(ramp):
                counted += i_n[i] + o_n[i]
            recount = 0
            for r in range(n):
                recount += rinfo[r, _ROCC]
            if counted != flight or flight < 0 or recount != queued:
                violation = t
        t += 1
    return (t, start_t, end_t, t_first, t_done, point_done, links, injected, delivered,
            occupancy, violation)
