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

One cycle, in order (the phases of ``_simulate``): wavelets reach PEs, feeding the tasks that
wait for them (``_reach_pes``); tasks start and finish (as in ``taskgraph``; finished ones queue
their messages to send), and external messages whose time has come queue too (``_run_tasks``,
``_release_external``); wavelets arrive from links and ramps (``_land_in_queues``); every router
moves at most one wavelet per input port and one per output port (``_switch``: input ports
tried round-robin starting at ``(cycle + router) % 5``, colors round-robin per port); every PE
injects at most one wavelet (``_inject``); freed credits return (``_return_credits``). A line
multicast moves only when all the outputs it needs (the next hop and the local ramp) are free
at once.

Only routers holding wavelets are visited, in index order. (A wavelet that arrives at a router
holding none waits outside the queues, as the router's lone wavelet, until it leaves or another
arrives: ``Routers.lone``; it is granted as its queue's first would be.) The order cannot
change the outcome: a router's grants depend on its own queues and credits alone, each queue
takes at most one arriving wavelet per cycle, and freed credits return only at the end of the
cycle.

Zero-load latency of an M-wavelet message over H hops is H*hop + 2*ramp + (M - 1) cycles from
the cycle it may start to the cycle its last wavelet reaches the PE.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from wse_emu.engines import calendar
from wse_emu.engines.cores import (
    ID_BITS,
    core_event,
    feed,
    new_cores,
    new_progress,
    queue_ready,
)
from wse_emu.engines.messages import PORTS, RAMP, Messages
from wse_emu.engines.records import (
    Fill,
    Mesh,
    MessageColumns,
    borrow,
    make,
    message_columns,
    new_message_times,
    record,
    route_ends,
    task_columns,
    with_shape,
)
from wse_emu.engines.taskgraph import TaskGraph
from wse_emu.hardware.fabric import MAX_QUEUE_WAVELETS, MAX_VCS

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
    input ports of ``vcs`` queues, each its first wavelet, ring index and length (16 bytes),
    its credit (2 bytes) and a ring of 8-byte entries for the ``queue_wavelets - 1``
    wavelets behind the first (one entry at least); and the router's lone wavelet (8
    bytes, ``Routers.lone``)."""
    return width * height * (PORTS * vcs * (8 * _ring_slots(queue_wavelets) + 18) + 8)


def _ring_slots(queue_wavelets: int) -> int:
    """Entries of a queue's ring: the wavelets behind its first (``Routers.qinfo``), at least
    one so that no array has a dimension of zero."""
    return max(queue_wavelets - 1, 1)


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
        Wavelets each virtual channel's queue holds, 1..MAX_QUEUE_WAVELETS
        (``FabricSpec.queue_wavelets``).
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
        checked (priorities 0..255, fewer than 2**31 tasks, messages and delivery points).
    vcs : int
        Virtual channels per router port, 1..MAX_VCS (``FabricSpec.virtual_channels``): a
        message of color class ``c`` (``graph.msgs.vc``, >= 0) waits in queue ``c % vcs``.
    queue_wavelets : int
        Wavelets each virtual channel's queue holds, 1..MAX_QUEUE_WAVELETS
        (``FabricSpec.queue_wavelets``); with ``vcs`` it sets the queues' memory, refused
        beyond ``MAX_QUEUE_BYTES``.
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
    if not 1 <= queue_wavelets <= MAX_QUEUE_WAVELETS:
        raise ValueError(f"the cycle engine models queues of 1 to {MAX_QUEUE_WAVELETS} "
                         f"wavelets, got {queue_wavelets}")
    need = queue_bytes(graph.width, graph.height, vcs, queue_wavelets)
    if need > MAX_QUEUE_BYTES:
        raise ValueError(
            f"{vcs} virtual channels of {queue_wavelets} wavelets on {graph.width} x "
            f"{graph.height} PEs need {need / 2**30:.1f} GiB of router queues; the cycle "
            f"engine allows {MAX_QUEUE_BYTES / 2**30:.0f} GiB")
    graph.check_ranges()
    mesh = make(Mesh, width=graph.width, height=graph.height, hop=hop, ramp=ramp,
                qcap=queue_wavelets, vcs=vcs)
    tasks, msgs = task_columns(graph), message_columns(graph, vcs)
    n = graph.width * graph.height
    progress, cores = new_progress(tasks), new_cores(n, tasks)
    events = calendar.new_calendar(graph.tasks, n)
    times = new_message_times(msgs)
    routers, flight, mail = _new_routers(mesh), _new_flight(mesh), _new_mailboxes(mesh, msgs)
    cycles, injected, delivered, occupancy, violation = _simulate(
        mesh, tasks, msgs, progress, cores, events, times, routers, flight, mail, max_cycles,
        check)
    return CycleResult(int(cycles), progress.start, progress.end, times.first, times.done,
                       times.point_done, msgs.point_base[:-1], routers.links, int(injected),
                       int(delivered), int(occupancy), int(violation))


# --- the engine's state -------------------------------------------------------------------

# Per-router scalars packed in one 64-byte row (one cache line): per input port a bit mask of
# its non-empty color queues, the total of queued wavelets, a bit mask of the input ports with
# anything queued, the arbitration start port, color round-robin pointers, x, y, and where the
# router's lone wavelet waits (``Routers.lone``).
_POCC, _ROCC, _PMASK, _START, _VRR, _X, _Y, _LONE, _RINFO = 0, 5, 6, 7, 8, 13, 14, 15, 16


@record
class Routers:
    """Every router's input queues, credits and link counts."""

    rinfo: np.int32  # (routers, _RINFO): per-router scalars (see the _POCC... offsets)
    # (routers, PORTS, vcs, 2): per queue, its first wavelet (``_pack``), and the index in
    # its ring of the wavelet behind it (low 32 bits) with the queue's length (high 32 bits).
    # A queue's first wavelet is kept beside its length, not in its ring, so that a router
    # switching reads one line per queue: a queue seldom holds more than one wavelet below
    # saturation, and then its ring is not touched at all.
    qinfo: np.int64
    qbuf: np.int64  # (routers, PORTS, vcs, ring): the rings of the wavelets behind the first
    # (routers, PORTS, vcs): free slots in the queue each output may still fill (0..3: the
    # neighbour's facing input port; RAMP: this router's injection queue); at most
    # MAX_QUEUE_WAVELETS, so two bytes each: half the memory a switching router reads for them
    cred: np.int16
    links: np.int64  # (routers, 4): wavelets sent per direction N, E, S, W
    # (routers,): the wavelet that arrived at a router holding none, kept here rather than in
    # its queue while it is the router's only one (rinfo's _LONE: its queue, port << 5 |
    # color; -1: none). Below saturation most wavelets move on the cycle they arrive, so most
    # never touch a queue: this array is a few pages, where the queues are megabytes.
    lone: np.int64
    active: np.int64  # (ceil(routers / 64),): bit set of the routers holding wavelets
    step: np.int64  # (4,): router index offset of the neighbour in each direction
    opposite: np.int64  # (4,): the input port a wavelet sent in each direction arrives on
    # (PORTS * routers,): queues freed of a wavelet this cycle (``_queue_id``), whose feeder
    # gets a credit back at its end
    freed: np.int64


@record
class InFlight:
    """Wavelets on links and ramps, as lists per arrival slot (the arrival cycle modulo the
    latency), each in the first ``*_count[slot]`` entries of its row."""

    link_q: np.int64  # (hop, 4 * routers): on links, the queue each will join (_queue_id)
    link_e: np.int64  # (hop, 4 * routers): and the packed wavelet (_pack)
    link_count: np.int64  # (hop,)
    in_r: np.int64  # (ramp, routers): on ramps into routers, the router
    in_m: np.int64  # (ramp, routers): and the message
    in_count: np.int64  # (ramp,)
    out_r: np.int64  # (ramp, routers): on ramps out to PEs, the router
    out_m: np.int64  # (ramp, routers): and the message
    out_count: np.int64  # (ramp,)


@record
class Mailboxes:
    """Each PE's send queue, a linked list of the messages released to it, and the wavelets
    each delivery point has received."""

    head: np.int64  # (routers,): first message of each PE's send queue (-1: empty)
    tail: np.int64  # (routers,): its last
    after: np.int64  # (messages,): the message after each in its send queue (-1: last)
    sent: np.int64  # (messages,): wavelets injected so far
    senders: np.int64  # (routers,): the PEs with a non-empty send queue (a prefix of it)
    point_count: np.int64  # (points,): wavelets received
    points_left: np.int64  # (messages,): its delivery points still short of wavelets


def _new_routers(mesh: Mesh) -> Routers:
    """Empty queues, every credit free, arbitration starting at port ``r % PORTS``."""
    n, w = mesh.width * mesh.height, mesh.width
    routers = make(Routers, rinfo=Fill((n, _RINFO), 0),
                   qinfo=Fill((n, PORTS, mesh.vcs, 2), 0),
                   qbuf=Fill((n, PORTS, mesh.vcs, _ring_slots(mesh.qcap)), 0),
                   cred=Fill((n, PORTS, mesh.vcs), mesh.qcap), links=Fill((n, 4), 0),
                   lone=Fill(n, 0), active=Fill((n + 63) // 64, 0), step=[-w, 1, w, -1],
                   opposite=[2, 3, 0, 1], freed=Fill(n * PORTS, 0))
    r = np.arange(n)
    routers.rinfo[:, _START] = r % PORTS
    routers.rinfo[:, _X] = r % w
    routers.rinfo[:, _Y] = r // w
    routers.rinfo[:, _LONE] = -1
    return routers


def _new_flight(mesh: Mesh) -> InFlight:
    """Nothing on links or ramps."""
    n, hop, ramp = mesh.width * mesh.height, mesh.hop, mesh.ramp
    return make(InFlight, link_q=Fill((hop, 4 * n), 0), link_e=Fill((hop, 4 * n), 0),
                link_count=Fill(hop, 0), in_r=Fill((ramp, n), 0), in_m=Fill((ramp, n), 0),
                in_count=Fill(ramp, 0), out_r=Fill((ramp, n), 0), out_m=Fill((ramp, n), 0),
                out_count=Fill(ramp, 0))


def _new_mailboxes(mesh: Mesh, msgs: MessageColumns) -> Mailboxes:
    """Empty send queues; no wavelet received."""
    n, n_msgs = mesh.width * mesh.height, len(msgs.src)
    return make(Mailboxes, head=Fill(n, -1), tail=Fill(n, -1), after=Fill(n_msgs, -1),
                sent=Fill(n_msgs, 0), senders=Fill(n, 0),
                point_count=Fill(len(msgs.target), 0), points_left=np.diff(msgs.point_base))


# --- the driver and its phases ------------------------------------------------------------

@njit(cache=True)
def _simulate(mesh, tasks, msgs, progress, cores, events, times, routers, flight, mail,
              max_cycles, check):
    """The cycle engine's driver: simulate cycle by cycle, each the six phases of the
    module's docstring, until every message is delivered and every task done, or
    ``max_cycles``; with ``check``, recount the wavelets in flight every cycle.

    Fills ``progress``, ``cores``, ``times``, ``routers``, ``flight`` and ``mail``, as
    ``_new_*`` and ``new_*`` made them; ``events`` (a calendar) is empty. Returns the cycles
    simulated, the wavelets injected by PEs and delivered to them, the sum over cycles of the
    wavelets in flight, and the first cycle the conservation check failed (-1: never, or not
    checked).
    """
    # The caller holds every array until this returns: none need counting (``borrow``).
    tasks, msgs, progress, cores = borrow(tasks), borrow(msgs), borrow(progress), borrow(cores)
    events, times, routers = borrow(events), borrow(times), borrow(routers)
    flight, mail = borrow(flight), borrow(mail)
    routers = _shaped(routers, mesh)
    size = queue_ready(tasks, progress, events)
    n_tasks, n_msgs = len(tasks.pe), len(msgs.src)
    tasks_done = finished = n_senders = released = 0
    injected = delivered = copies = occupancy = queued = 0
    violation = -1
    t = 0
    while t < max_cycles and (finished < n_msgs or tasks_done < n_tasks):
        # The slots of the wavelets on links and ramps that arrive at t, and leave now.
        ls, rs = t % mesh.hop, t % mesh.ramp
        size, got, completed = _reach_pes(t, rs, msgs, progress, events, size, times, routers,
                                          flight, mail)
        delivered += got
        finished += completed
        size, ended, n_senders = _run_tasks(t, tasks, progress, cores, events, size, msgs, mail,
                                            n_senders)
        tasks_done += ended
        n_senders, released = _release_external(t, msgs, mail, n_senders, released)
        queued += _land_in_queues(ls, rs, mesh, msgs, routers, flight)
        n_freed, moved, made = _switch(t, ls, rs, mesh, routers, flight)
        queued -= moved
        copies += made
        n_senders, sent = _inject(t, rs, msgs, times, routers, flight, mail, n_senders)
        injected += sent
        _return_credits(routers, n_freed)
        in_flight = injected + copies - delivered
        occupancy += in_flight
        if check and violation < 0 and not _conserved(mesh, routers, flight, queued,
                                                      in_flight):
            violation = t
        t += 1
    return t, injected, delivered, occupancy, violation


@njit(cache=True, inline="always")
def _shaped(routers, mesh):
    """``routers`` with its arrays' fixed dimensions (ports, the row of per-router scalars,
    the two numbers per queue, the four directions) known to the compiler (``with_shape``)."""
    n, vcs = mesh.width * mesh.height, mesh.vcs
    return Routers(with_shape(routers.rinfo, (n, _RINFO)),
                   with_shape(routers.qinfo, (n, PORTS, vcs, 2)),
                   with_shape(routers.qbuf, (n, PORTS, vcs, routers.qbuf.shape[3])),
                   with_shape(routers.cred, (n, PORTS, vcs)),
                   with_shape(routers.links, (n, 4)), routers.lone, routers.active,
                   routers.step, routers.opposite, routers.freed)


@njit(cache=True, inline="always")
def _reach_pes(t, rs, msgs, progress, events, size, times, routers, flight, mail):
    """Phase 1: the wavelets at the end of a ramp out (slot ``rs``) reach their PE. A delivery
    point that has all of its message's wavelets is done, and feeds its task; a message whose
    points are all done is delivered. Returns the number of events pending, the wavelets
    delivered and the messages completed."""
    delivered = completed = 0
    for i in range(flight.out_count[rs]):
        r = flight.out_r[rs, i]
        m = flight.out_m[rs, i]
        delivered += 1
        sx, sy, _, _, line = route_ends(msgs.route[m])
        dist = abs(routers.rinfo[r, _X] - sx) + abs(routers.rinfo[r, _Y] - sy)
        idx = msgs.point_base[m] + (dist - 1 if line and dist > 0 else 0)
        mail.point_count[idx] += 1
        if mail.point_count[idx] == msgs.length[m]:
            times.point_done[idx] = t
            size = feed(msgs.target[idx], t, progress, events, size)
            mail.points_left[m] -= 1
            if mail.points_left[m] == 0:
                times.done[m] = t
                completed += 1
    flight.out_count[rs] = 0
    return size, delivered, completed


@njit(cache=True, inline="always")
def _run_tasks(t, tasks, progress, cores, events, size, msgs, mail, n_senders):
    """Phase 2: the cores' events due by cycle ``t``: ready tasks claim their PE's core,
    finished ones queue their messages to send. Returns the number of events pending, the
    tasks finished and the number of PEs with messages to send."""
    ended = 0
    while size > 0 and calendar.due(events, t):
        _, key, size = calendar.pop(events, size)
        size, done_task = core_event(key >> ID_BITS, key & ((1 << ID_BITS) - 1), t, tasks,
                                     progress, cores, events, size)
        if done_task >= 0:
            ended += 1
            for i in range(tasks.out_ptr[done_task], tasks.out_ptr[done_task + 1]):
                n_senders = _queue_send(tasks.out_msg[i], msgs, mail, n_senders)
    return size, ended, n_senders


@njit(cache=True, inline="always")
def _release_external(t, msgs, mail, n_senders, released):
    """Phase 2 too: external messages whose time has come join their PE's send queue
    (``released`` of them already have). Returns the number of PEs with messages to send and
    of external messages released."""
    while released < len(msgs.external) and msgs.t_ready[msgs.external[released]] <= t:
        n_senders = _queue_send(msgs.external[released], msgs, mail, n_senders)
        released += 1
    return n_senders, released


@njit(cache=True, inline="always")
def _land_in_queues(ls, rs, mesh, msgs, routers, flight):
    """Phase 3: wavelets at the end of a link (slot ``ls``) or of a ramp in (slot ``rs``) join
    their router's queue (which has room: their sender held its credit). Returns how many."""
    for i in range(flight.link_count[ls]):
        r, p, v = _queue_parts(flight.link_q[ls, i])
        _arrive(routers, mesh, r, p, v, flight.link_e[ls, i])
    for i in range(flight.in_count[rs]):
        m = flight.in_m[rs, i]
        _, _, dx, dy, line = route_ends(msgs.route[m])
        e = _pack(m, dx, dy, 1 if line else 0)
        _arrive(routers, mesh, flight.in_r[rs, i], RAMP, msgs.vc[m], e)
    landed = flight.link_count[ls] + flight.in_count[rs]
    flight.link_count[ls] = 0
    flight.in_count[rs] = 0
    return landed


@njit(cache=True, inline="always")
def _inject(t, rs, msgs, times, routers, flight, mail, n_senders):
    """Phase 5: each PE with messages to send injects one wavelet of the first onto its ramp
    in (slot ``rs``), if its ramp queue has a credit; a PE whose queue empties leaves the
    senders. Returns the number of senders left and of wavelets injected."""
    injected = 0
    keep = 0
    for a in range(n_senders):
        s = mail.senders[a]
        m = mail.head[s]
        v = msgs.vc[m]
        if routers.cred[s, RAMP, v] > 0:
            routers.cred[s, RAMP, v] -= 1
            c = flight.in_count[rs]
            flight.in_r[rs, c] = s
            flight.in_m[rs, c] = m
            flight.in_count[rs] = c + 1
            injected += 1
            if mail.sent[m] == 0:
                times.first[m] = t
            mail.sent[m] += 1
            if mail.sent[m] == msgs.length[m]:
                mail.head[s] = mail.after[m]
                if mail.head[s] < 0:
                    mail.tail[s] = -1
        if mail.head[s] >= 0:
            mail.senders[keep] = s
            keep += 1
    return keep, injected


@njit(cache=True, inline="always")
def _return_credits(routers, n_freed):
    """Phase 6: the slots freed this cycle become credits for the next."""
    for i in range(n_freed):
        r, p, v = _queue_parts(routers.freed[i])
        routers.cred[r, p, v] += 1


@njit(cache=True, inline="always")
def _conserved(mesh, routers, flight, queued, in_flight):
    """Whether the wavelets are all accounted for: those on links and ramps and in queues
    make the ``in_flight`` count (injected + copies - delivered), and the routers' own
    counts make ``queued``."""
    counted = queued
    for i in range(mesh.hop):
        counted += flight.link_count[i]
    for i in range(mesh.ramp):
        counted += flight.in_count[i] + flight.out_count[i]
    recount = 0
    for r in range(mesh.width * mesh.height):
        recount += routers.rinfo[r, _ROCC]
    return counted == in_flight and in_flight >= 0 and recount == queued


@njit(cache=True)
def _queue_send(m, msgs, mail, n_senders):
    """Message ``m`` joins the end of its PE's send queue; a PE whose queue was empty joins
    the first ``n_senders`` entries of ``mail.senders``. Returns the new number of senders."""
    s = msgs.src[m]
    if mail.tail[s] < 0:
        mail.head[s] = m
        mail.senders[n_senders] = s
        n_senders += 1
    else:
        mail.after[mail.tail[s]] = m
    mail.tail[s] = m
    return n_senders


# --- the routers -------------------------------------------------------------------------

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
    # Without branches: the port hangs on the destination, which no predictor guesses.
    along_y = 4 - 2 * int(dy != y) - 2 * int(dy < y)  # SOUTH, NORTH or RAMP
    along_x = 1 + 2 * int(dx < x)  # EAST or WEST
    return along_y + int(dx != x) * (along_x - along_y)


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


_LOW = (1 << 32) - 1  # the ring index in a queue's second word (``Routers.qinfo``)


@njit(cache=True, inline="always")
def _arrive(routers, mesh, r, p, v, e):
    """Wavelet ``e`` (``_pack``) arrives in queue (port ``p``, color ``v``) of router ``r``:
    at a router holding nothing it waits as the router's lone wavelet (``Routers.lone``);
    else it joins its queue, after the router's lone wavelet, if any, has joined its own
    (each queue takes at most one wavelet a cycle, so their order is of no matter)."""
    rinfo = routers.rinfo
    if rinfo[r, _ROCC] == 0:
        routers.lone[r] = e
        rinfo[r, _LONE] = (p << 5) | v
        rinfo[r, _ROCC] = 1
        routers.active[r >> 6] |= 1 << (r & 63)
        return
    lone = rinfo[r, _LONE]
    if lone >= 0:
        rinfo[r, _LONE] = -1
        rinfo[r, _ROCC] = 0
        _enqueue(routers, mesh, r, lone >> 5, lone & 31, routers.lone[r])
    _enqueue(routers, mesh, r, p, v, e)


@njit(cache=True, inline="always")
def _enqueue(routers, mesh, r, p, v, e):
    """Wavelet ``e`` (``_pack``) joins queue (port ``p``, color ``v``) of router ``r``, which
    has room (its sender held a credit): as its first wavelet if it is empty, else at the
    end of its ring; the router becomes active."""
    rinfo, qinfo = routers.rinfo, routers.qinfo
    state = qinfo[r, p, v, 1]
    length = state >> 32
    if length == 0:
        qinfo[r, p, v, 0] = e
    else:
        pos = (state & _LOW) + length - 1
        if pos >= mesh.qcap - 1:
            pos -= mesh.qcap - 1
        routers.qbuf[r, p, v, pos] = e
    qinfo[r, p, v, 1] = state + (1 << 32)
    rinfo[r, p] |= 1 << v
    rinfo[r, _PMASK] |= 1 << p
    rinfo[r, _ROCC] += 1
    routers.active[r >> 6] |= 1 << (r & 63)


@njit(cache=True, inline="always")
def _dequeue(routers, mesh, r, p, v):
    """The first wavelet of the non-empty queue (port ``p``, color ``v``) of router ``r``
    leaves, the next (if any) moving up from the ring, and the port's color pointer moves
    past ``v``."""
    rinfo, qinfo = routers.rinfo, routers.qinfo
    state = qinfo[r, p, v, 1]
    length = state >> 32
    head = state & _LOW
    if length > 1:
        qinfo[r, p, v, 0] = routers.qbuf[r, p, v, head]
        head += 1
        if head == mesh.qcap - 1:
            head = 0
    length -= 1
    qinfo[r, p, v, 1] = head | (length << 32)
    if length == 0:
        rinfo[r, p] &= ~(1 << v)
        if rinfo[r, p] == 0:
            rinfo[r, _PMASK] &= ~(1 << p)
    rinfo[r, _ROCC] -= 1
    rinfo[r, _VRR + p] = 0 if v + 1 == mesh.vcs else v + 1


@record
class Moves:
    """What the routers move in one cycle, each list in the first entries of its array:
    views of this cycle's rows of ``InFlight`` and of ``Routers.freed``."""

    link_q: np.int64  # (4 * routers,): wavelets put on links: the queue each joins
    link_e: np.int64  # (4 * routers,): and the wavelet
    out_r: np.int64  # (routers,): wavelets put on ramps out: the router
    out_m: np.int64  # (routers,): and the message id
    freed: np.int64  # (PORTS * routers,): queues freed of a wavelet


@njit(cache=True, inline="always")
def _switch(t, ls, rs, mesh, routers, flight):
    """Phase 4: every router with queued wavelets switches (``_switch_router``); emptied
    ones leave the ``active`` bit set. Routers are taken in index order from the bit set, so
    their state is walked forwards in memory rather than at random.

    The wavelets moved go on slot ``ls`` of the links and ``rs`` of the ramps out of
    ``flight``. Returns the number of queues freed (the first entries of ``routers.freed``),
    the wavelets that left a queue and the extra copies made by line multicasts.
    """
    moves = Moves(flight.link_q[ls], flight.link_e[ls], flight.out_r[rs], flight.out_m[rs],
                  routers.freed)
    t_port = t % PORTS
    active = routers.active
    n_link = n_out = n_freed = moved = copies = 0
    for word in range(len(active)):
        bits = active[word]
        while bits != 0:
            b = _lowest_bit(bits)
            bits ^= 1 << b  # not bits & (bits - 1): for bit 63 that subtraction overflows
            r = (word << 6) + b
            n_link, n_out, n_freed, m, c = _switch_router(r, t_port, mesh, routers, moves,
                                                          n_link, n_out, n_freed)
            moved += m
            copies += c
            if routers.rinfo[r, _ROCC] == 0:
                active[word] &= ~(1 << (r & 63))
    flight.link_count[ls] = n_link
    flight.out_count[rs] = n_out
    return n_freed, moved, copies


# The switch functions are inlined by Numba itself: a call per router would pass all of the
# routers' arrays each time (measured, when they were loose arrays: about 40% slower overall).
@njit(cache=True, inline="always")
def _switch_router(r, t_port, mesh, routers, moves, n_link, n_out, n_freed):
    """Router ``r`` moves at most one wavelet per input port and one per output port: input
    ports round-robin from ``(t_port + r) % PORTS`` (``t_port``: the cycle modulo PORTS),
    colors round-robin per port. A moved wavelet joins the link list and/or the ramp-out list
    of ``moves``, the slot it frees the freed list; ``n_link``, ``n_out`` and ``n_freed`` are
    their lengths so far.

    A wavelet at the head of its queue is granted when its output port is not taken this
    cycle and, for a link, the next router's queue of its color has a credit; a line
    multicast passing through also needs the ramp out (its tap) free.

    Returns the three lists' new lengths, the wavelets that left a queue, and the extra
    copies made by line multicasts (a wavelet both passed on and delivered).
    """
    rinfo, qinfo, cred = routers.rinfo, routers.qinfo, routers.cred
    vcs = mesh.vcs
    rx = rinfo[r, _X]
    ry = rinfo[r, _Y]
    if rinfo[r, _ROCC] == 1:
        # One wavelet held (most routers, below saturation): no port or color to arbitrate,
        # no output taken before it; what the round-robin below would grant it, without the
        # walk. It is the router's lone wavelet unless it came to a queue behind others.
        lone = rinfo[r, _LONE]
        if lone >= 0:
            p, v, e = lone >> 5, lone & 31, routers.lone[r]
        else:
            p = _lowest_bit(rinfo[r, _PMASK])
            v = _lowest_bit(rinfo[r, p])
            e = qinfo[r, p, v, 0]
        out = _xy_port(rx, ry, (e >> 32) & 0x7FFF, (e >> 47) & 0x7FFF)
        if out < 4 and cred[r, out, v] == 0:
            return n_link, n_out, n_freed, 0, 0
        tap = (e >> 62) & 1 == 1 and out != RAMP and p != RAMP
        n_link, n_out, n_freed = _grant(r, p, v, e, out, tap, mesh, routers, moves, n_link,
                                        n_out, n_freed)
        return n_link, n_out, n_freed, 1, 1 if tap else 0
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
            e = qinfo[r, p, v, 0]
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
            n_link, n_out, n_freed = _grant(r, p, v, e, out, tap, mesh, routers, moves,
                                            n_link, n_out, n_freed)
            moved += 1
            used |= 1 << out
            if tap:
                used |= 1 << RAMP
                copies += 1
            break
    return n_link, n_out, n_freed, moved, copies


@njit(cache=True, inline="always")
def _grant(r, p, v, e, out, tap, mesh, routers, moves, n_link, n_out, n_freed):
    """Wavelet ``e``, router ``r``'s lone wavelet or first in its queue (port ``p``, color
    ``v``), is granted output ``out`` (and the ramp out too where it ``tap``s it): it leaves,
    the slot it frees goes on the freed list (a credit for whoever feeds the queue), and it
    goes on the link list and/or the ramp-out list. Returns the three lists' new lengths."""
    if routers.rinfo[r, _LONE] >= 0:
        # As its queue's dequeue would leave the router: empty, the color pointer moved.
        routers.rinfo[r, _LONE] = -1
        routers.rinfo[r, _ROCC] = 0
        routers.rinfo[r, _VRR + p] = 0 if v + 1 == mesh.vcs else v + 1
    else:
        _dequeue(routers, mesh, r, p, v)
    if p < 4:
        moves.freed[n_freed] = _queue_id(r + routers.step[p], routers.opposite[p], v)
    else:
        moves.freed[n_freed] = _queue_id(r, RAMP, v)
    n_freed += 1
    if out < 4:
        moves.link_q[n_link] = _queue_id(r + routers.step[out], routers.opposite[out], v)
        moves.link_e[n_link] = e
        n_link += 1
        routers.cred[r, out, v] -= 1
        routers.links[r, out] += 1
    if out == RAMP or tap:
        moves.out_r[n_out] = r
        moves.out_m[n_out] = e & _MSG_MASK
        n_out += 1
    return n_link, n_out, n_freed
