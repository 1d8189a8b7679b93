"""The fast engine: message-level, event-driven, with per-link occupancy.

Tasks follow the task-graph rules (``taskgraph``). A message is timed when its task completes:
its PE's ramp takes one wavelet per cycle (messages queue behind each other); the head leaves
the source router ``ramp`` cycles after injection; on each link of its dimension-ordered path it
starts when both the head has arrived (``hop`` cycles per hop) and the link is free, and holds
the link for its M wavelets; at each delivery point the ramp out takes M cycles, and the last
wavelet lands ``ramp + M - 1`` cycles after the head reached the router. A message held up
downstream also holds the links behind it, less what the queues in between can absorb
(``queue_wavelets`` per router), as a wormhole does. Links are claimed in the order messages
are injected. On an idle network this gives exactly the cycle engine's
zero-load latency; under contention it is an approximation, checked against the cycle engine.

A delivery changes nothing but the inputs its task still waits for, so it is not an event of its
own: when a message is timed, each delivery point's task counts the input at once and notes when
it lands, and the task's READY is queued for the latest of its inputs' arrivals. This gives the
same READY events as queuing each delivery, with half the events.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from wse_emu.engines import calendar
from wse_emu.engines.cores import (
    EV_DONE,
    EV_READY,
    EV_RELEASE,
    ID_BITS,
    TASK_BITS,
    core_event,
    input_arrives,
    new_cores,
    new_progress,
    queue_ready,
)
from wse_emu.engines.messages import EAST, NORTH, SOUTH, WEST
from wse_emu.engines.prefetch import prefetch
from wse_emu.engines.records import (
    Fill,
    Mesh,
    borrow,
    make,
    message_columns,
    new_message_times,
    record,
    route_ends,
    task_columns,
)
from wse_emu.engines.taskgraph import TaskGraph
from wse_emu.hardware.fabric import DEFAULT_QUEUE_WAVELETS


@dataclass
class RunResult:
    """What the fast engine measured. Cycles count from 0; -1 marks what never happened
    (a task that never ran, a message never sent or not delivered everywhere)."""

    cycles: int  # last event: every task done and every message delivered
    task_start: np.ndarray  # int64 (tasks,): cycle each task started
    task_end: np.ndarray  # int64 (tasks,): cycle each task finished
    msg_first: np.ndarray  # int64 (messages,): cycle the first wavelet was injected
    msg_done: np.ndarray  # int64 (messages,): cycle the last wavelet reached the last point
    point_done: np.ndarray  # int64 (delivery points,): cycle the point had every wavelet
    pe_busy: np.ndarray  # int64 (height, width): core cycles spent in tasks
    link_wavelets: np.ndarray  # int64 (height*width, 4): wavelets sent per direction N, E, S, W

    def unfinished(self) -> int:
        """Tasks that never finished (a graph whose inputs never all arrive)."""
        return int((self.task_end < 0).sum())


@record
class Network:
    """When each link and ramp is next free, and the wavelets each link carried.

    The links are kept in four planes, one per direction N, E, S, W, each laid out so that a
    straight run of a path walks it entry by entry: the east and west planes by router,
    row after row (``y * width + x``), the north and south planes column after column
    (``x * height + y``). A message's column leg then reads neighbouring entries, where a
    router-major table put each of its hops a row's width apart, on a cache line of its own
    (``router_links`` turns the planes back into a per-router table)."""

    link_free: np.int64  # (4 * routers,): cycle each output link is free from, by plane
    # (4 * routers + 1,): the wavelets each link sent, by plane, as differences while the
    # engine runs: a message's straight run adds its length at its first link and takes it
    # off after its last, so that a hop costs no write of its own; summed when it ends.
    link_wavelets: np.int64
    ramp_in_free: np.int64  # (routers,): cycle each PE's ramp into its router is free from
    ramp_out_free: np.int64  # (routers,): the same for its ramp out (deliveries)


def _new_network(mesh: Mesh) -> Network:
    """Every link and ramp free from cycle 0, nothing sent."""
    n = mesh.width * mesh.height
    return make(Network, link_free=Fill(4 * n, 0), link_wavelets=Fill(4 * n + 1, 0),
                ramp_in_free=Fill(n, 0), ramp_out_free=Fill(n, 0))


def router_links(planes: np.ndarray, width: int, height: int) -> np.ndarray:
    """``Network``'s planes as a (routers, 4) table: row ``y * width + x``, column N, E, S, W."""
    n = width * height
    by_plane = planes.reshape(4, n)
    out = np.empty((n, 4), dtype=planes.dtype)
    for d in range(4):
        out[:, d] = by_plane[d] if d in (EAST, WEST) else \
            by_plane[d].reshape(width, height).T.ravel()
    return out


def run(graph: TaskGraph, hop: int, ramp: int,
        queue_wavelets: int = DEFAULT_QUEUE_WAVELETS) -> RunResult:
    """Execute a task graph on the fast engine (message-level, event-driven).

    Parameters
    ----------
    graph : TaskGraph
        Tasks, their messages and the delivery points they feed, on a
        ``graph.width`` x ``graph.height`` mesh (see ``taskgraph``). Its packed ranges are
        checked (priorities 0..255, fewer than 2**31 tasks, messages and delivery points).
        Message colors (``graph.msgs.vc``) are not used: this engine has no virtual channels.
    hop : int
        Cycles for a wavelet to cross one link (``FabricSpec.hop_latency_cycles``), >= 0.
    ramp : int
        Cycles between a PE's core and its router, each way
        (``FabricSpec.ramp_latency_cycles``), >= 0.
    queue_wavelets : int
        Wavelets one router queue holds (``FabricSpec.queue_wavelets``): how much of a
        blocked message each router behind it absorbs before the links behind it stay held.

    Returns
    -------
    RunResult
        Per-task, per-message and per-delivery-point cycles, core busy cycles per PE and
        wavelets per link. An idle network gives exactly the cycle engine's zero-load
        latencies; under contention the times approximate it.
    """
    graph.check_ranges()
    mesh = make(Mesh, width=graph.width, height=graph.height, hop=hop, ramp=ramp,
                qcap=queue_wavelets, vcs=0)
    tasks, msgs = task_columns(graph), message_columns(graph)
    n = graph.width * graph.height
    progress, cores = new_progress(tasks), new_cores(n, tasks)
    times, network = new_message_times(msgs), _new_network(mesh)
    events = calendar.new_calendar(graph.tasks, n, len(msgs.external))
    last = _simulate(mesh, tasks, msgs, progress, cores, times, network, events)
    return RunResult(int(last), progress.start, progress.end, times.first, times.done,
                     times.point_done, cores.busy.reshape(graph.height, graph.width),
                     router_links(np.cumsum(network.link_wavelets[:-1]), graph.width,
                                  graph.height))


@njit(cache=True, nogil=True)  # stages of a step are timed on parallel threads
def _simulate(mesh, tasks, msgs, progress, cores, times, network, events):
    """The fast engine's driver: run the event loop until no event is left, filling
    ``progress``, ``cores``, ``times`` and ``network``; returns the cycle of the last event
    or delivery.

    Events are task READY, DISPATCH and DONE (``cores``) and message RELEASE (an external
    message whose ``t_ready`` has come). A task's DONE times its messages at once
    (``_send``), which count their inputs to the tasks they feed. ``events``, a calendar
    (``calendar``), is empty.
    """
    # The caller holds every array until this returns: none need counting (``borrow``).
    tasks, msgs, progress, cores = borrow(tasks), borrow(msgs), borrow(progress), borrow(cores)
    times, events = borrow(times), borrow(events)
    network = borrow(network)
    size = queue_ready(tasks, progress, events)
    for m in msgs.external:
        size = calendar.push(events, size, msgs.t_ready[m], (EV_RELEASE << ID_BITS) | m)
    last = 0
    opened = -1  # the last cycle whose events were prefetched
    while size > 0:
        now, key, size = calendar.pop(events, size)
        if now != opened:  # a new cycle: ask for what its other events will read first
            opened = now
            _prefetch_cycle(mesh, events, tasks, progress, cores, msgs, network)
        kind = key >> ID_BITS
        ident = key & ((1 << ID_BITS) - 1)
        if now > last:
            last = now
        if kind == EV_RELEASE:
            size = _send(ident, now, mesh, msgs, tasks, progress, times, network, events, size)
        else:
            size, finished = core_event(kind, ident, now, tasks, progress, cores, events, size)
            if finished >= 0:
                for i in range(tasks.out_ptr[finished], tasks.out_ptr[finished + 1]):
                    size = _send(tasks.out_msg[i], now, mesh, msgs, tasks, progress, times,
                                 network, events, size)
    return _note_message_done(msgs, times, last)


@njit(cache=True, inline="always")
def _prefetch_cycle(mesh, events, tasks, progress, cores, msgs, network):
    """Prefetch (``prefetch``) what the events of the cycle just opened will read, in passes,
    each reading what the one before asked for and asking for what that leads to: the
    events' chains of reads then wait for memory side by side, not one after another.

    A DONE reads its task's PE, a READY its task's PE and cycles, and both then that PE's
    core; a DONE also its task's successors and messages, then the successors' progress and
    the messages' routes, lengths and first delivery points (a task's messages leave from its
    PE, ``TaskGraph.validate``, so their ramp in is that PE's), then the task each such point
    feeds and the first link of each leg of the message's path; a RELEASE its message's
    route. The next cycles' first blocks of events are asked for too
    (``calendar.prefetch_ahead``). A prefetch that misses its mark costs a request, never a
    result.
    """
    calendar.prefetch_ahead(events)
    _, count = calendar.current(events)
    keys = events.now_key
    # A DONE's id is its task, a READY's its task below its priority (``cores.ready_key``):
    # the low TASK_BITS of either key.
    id_mask, task_mask = (1 << ID_BITS) - 1, (1 << TASK_BITS) - 1
    for i in range(count):
        key = keys[i]
        kind, task = key >> ID_BITS, key & task_mask
        if kind == EV_DONE:
            prefetch(tasks.pe, task)
            prefetch(tasks.succ_ptr, task)
            prefetch(tasks.out_ptr, task)
        elif kind == EV_READY:
            prefetch(tasks.pe, task)
            prefetch(tasks.cycles, task)
        elif kind == EV_RELEASE:
            prefetch(msgs.route, key & id_mask)
    for i in range(count):
        key = keys[i]
        kind, task = key >> ID_BITS, key & task_mask
        if kind == EV_DONE or kind == EV_READY:
            p = tasks.pe[task]
            prefetch(cores.running, p)
            prefetch(cores.q_count, p)
            prefetch(cores.busy, p)
            if kind == EV_DONE:
                prefetch(network.ramp_in_free, p)
                prefetch(tasks.succ_task, tasks.succ_ptr[task])
                prefetch(tasks.out_msg, tasks.out_ptr[task])
    for i in range(count):
        key = keys[i]
        kind, task = key >> ID_BITS, key & task_mask
        if kind == EV_DONE:
            for j in range(tasks.succ_ptr[task], tasks.succ_ptr[task + 1]):
                prefetch(progress.need, tasks.succ_task[j])
            for j in range(tasks.out_ptr[task], tasks.out_ptr[task + 1]):
                m = tasks.out_msg[j]
                prefetch(msgs.route, m)
                prefetch(msgs.length, m)
                prefetch(msgs.point_base, m)
    n = mesh.width * mesh.height
    for i in range(count):
        key = keys[i]
        kind, task = key >> ID_BITS, key & task_mask
        if kind == EV_DONE:
            for j in range(tasks.out_ptr[task], tasks.out_ptr[task + 1]):
                m = tasks.out_msg[j]
                prefetch(msgs.target, msgs.point_base[m])
                # the first link of each leg of its path (``_send``), and its last ramp out
                x, y, dx, dy, _ = route_ends(msgs.route[m])
                if dx != x:
                    li = (EAST if dx > x else WEST) * n + y * mesh.width + x
                    prefetch(network.link_free, li)
                if dy != y:
                    li = (SOUTH if dy > y else NORTH) * n + dx * mesh.height + y
                    prefetch(network.link_free, li)
                prefetch(network.ramp_out_free, dy * mesh.width + dx)
    for i in range(count):
        key = keys[i]
        kind, task = key >> ID_BITS, key & task_mask
        if kind == EV_DONE:
            for j in range(tasks.out_ptr[task], tasks.out_ptr[task + 1]):
                fed = msgs.target[msgs.point_base[tasks.out_msg[j]]]
                if fed >= 0:
                    prefetch(progress.need, fed)
                    prefetch(progress.ready_at, fed)


@njit(cache=True)
def _note_message_done(msgs, times, last):
    """Each message is done when its last delivery point is (-1 if one never was); returns
    the later of ``last`` and the last delivery, which may come after the last event."""
    point_done = times.point_done
    for i in range(len(point_done)):
        if point_done[i] > last:
            last = point_done[i]
    for m in range(len(msgs.src)):
        latest = -1
        for i in range(msgs.point_base[m], msgs.point_base[m + 1]):
            if point_done[i] < 0:
                latest = -1
                break
            if point_done[i] > latest:
                latest = point_done[i]
        times.done[m] = latest
    return last


@njit(cache=True, inline="always")
def _deliver(point, at, msgs, tasks, progress, times, events, size):
    """Delivery point ``point`` is reached at cycle ``at`` (its last wavelet lands in the PE):
    its task (if any) has one input more, and is READY at the latest arrival once it has them
    all. Returns the number of events pending."""
    times.point_done[point] = at
    task = msgs.target[point]
    if task >= 0:
        if at > progress.ready_at[task]:
            progress.ready_at[task] = at
        key = input_arrives(progress, task)
        if key >= 0:
            size = calendar.push(events, size, progress.ready_at[task], key)
    return size


@njit(cache=True, inline="always")
def _tap(r, head, point, M, mesh, network, msgs, tasks, progress, times, events, size):
    """The wavelets reaching router ``r`` from cycle ``head`` on go down its ramp to the PE,
    as soon as the ramp is free, and deliver at ``point``. Returns the number of events
    pending, when the head moves on (a multicast only as its tap takes the wavelets), and
    whether it waited for the ramp."""
    ramp_out_free = network.ramp_out_free
    e = head
    waited = ramp_out_free[r] > e
    if waited:
        e = ramp_out_free[r]
    ramp_out_free[r] = e + M
    size = _deliver(point, e + mesh.ramp + M - 1, msgs, tasks, progress, times, events, size)
    return size, e, waited


@njit(cache=True, inline="always")
def _send(m, now, mesh, msgs, tasks, progress, times, network, events, size):
    """Time message ``m`` released at cycle ``now`` (its task's DONE, or its release): claim
    its ramp, links and ramps out, and deliver at each point. Returns the number of events
    pending.

    The message injects one wavelet per cycle once its PE's ramp is free; its head crosses
    each link of its x-then-y path when it has arrived and the link is free, holding the link
    for ``length[m]`` cycles; at each delivery point the ramp out takes as long. Then each
    link on the path stays held until the wavelets behind a hold-up downstream fit in the
    queues ahead (``qcap`` per router), as a wormhole does.
    """
    width, height, hop, ramp = mesh.width, mesh.height, mesh.hop, mesh.ramp
    link_free, link_wavelets = network.link_free, network.link_wavelets  # (differences)
    x, y, dx, dy, line = route_ends(msgs.route[m])
    s = y * width + x
    M = msgs.length[m]
    inj = now if now > network.ramp_in_free[s] else network.ramp_in_free[s]
    network.ramp_in_free[s] = inj + M
    times.first[m] = inj
    head = inj + ramp  # head ready to leave the source router
    r = s
    point = 0
    hops = abs(dx - x) + abs(dy - y)
    base = msgs.point_base[m]
    if hops == 0:  # to its own PE: down the ramp it came up
        return _tap(r, head, base, M, mesh, network, msgs, tasks, progress, times, events,
                    size)[0]
    # Whether the head waited anywhere past its first link (for a link, or a tap into a PE):
    # if not, no link is held past its own wavelets and the wormhole pass below is skipped.
    waited = False
    n = width * height
    # The two legs, x first, then y: straight runs, each one direction and stride, whose
    # links are neighbouring entries of their direction's plane (``Network``), from ``li``.
    count0, stride0, step0 = (dx - x, 1, 1) if dx > x else (x - dx, -1, -1)
    li0 = (EAST if dx > x else WEST) * n + r
    count1, stride1, step1 = (dy - y, width, 1) if dy > y else (y - dy, -width, -1)
    li1 = (SOUTH if dy > y else NORTH) * n + dx * height + y
    crossed = 0
    last_start = head  # when the head started on the path's last link
    for leg in range(2):
        count, stride, step, li = (count0, stride0, step0, li0) if leg == 0 else (
            count1, stride1, step1, li1)
        if count > 0:  # the run's links, li to li + (count - 1) * step, each carry M
            first = li if step > 0 else li + (count - 1) * step
            link_wavelets[first] += M
            link_wavelets[first + count] -= M
        for _ in range(count):
            t = link_free[li]
            if t > head:
                waited = waited or crossed > 0
            else:
                t = head
            link_free[li] = t + M
            last_start = t
            crossed += 1
            r += stride
            li += step
            head = t + hop  # head reaches the next router
            if line:
                size, head, late = _tap(r, head, base + point, M, mesh, network, msgs, tasks,
                                        progress, times, events, size)
                waited = waited or late
                point += 1
    if not line:  # a unicast is delivered at the end of its path alone (``r`` is ``dst``)
        size, head, late = _tap(r, head, base, M, mesh, network, msgs, tasks, progress, times,
                                events, size)
        waited = waited or late
    if not waited:
        # Every link after the first was crossed as soon as the head reached it: the
        # wavelets behind never back up past a queue, so no link is held longer.
        return size
    # Wormhole: a link is held until the wavelets behind a hold-up fit in the queues ahead,
    # the links walked back from the last but one (their places found again from the legs).
    hold = last_start + M
    after_last = True
    for leg in range(2):
        count, step, li = (count1, step1, li1) if leg == 0 else (count0, step0, li0)
        k = count - 1
        if after_last and count > 0:
            k -= 1  # the path's last link, where ``hold`` starts
            after_last = False
        while k >= 0:
            here = li + k * step
            hold = hold - hop - mesh.qcap
            if hold > link_free[here]:
                link_free[here] = hold
            else:
                hold = link_free[here]
            k -= 1
    return size
