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

from wse_emu.engines.cores import (
    EV_RELEASE,
    ID_BITS,
    core_event,
    new_cores,
    pop,
    push,
    ready_key,
)
from wse_emu.engines.messages import LINE
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


def run(graph: TaskGraph, hop: int, ramp: int,
        queue_wavelets: int = DEFAULT_QUEUE_WAVELETS) -> RunResult:
    """Execute a task graph on the fast engine (message-level, event-driven).

    Parameters
    ----------
    graph : TaskGraph
        Tasks, their messages and the delivery points they feed, on a
        ``graph.width`` x ``graph.height`` mesh (see ``taskgraph``). Its packed ranges are
        checked (priorities 0..255, fewer than 2**32 tasks and delivery points). Message
        colors (``graph.msgs.vc``) are not used: this engine has no virtual channels.
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
    base = graph.point_base()
    out = _simulate(graph.width, graph.height, hop, ramp, queue_wavelets, graph.task_pe,
                    graph.task_priority, graph.task_cycles,
                    graph.task_need, graph.out_ptr, graph.out_msg, graph.succ_ptr,
                    graph.succ_task, graph.msgs.t_ready, graph.msgs.src, graph.msgs.dst,
                    graph.msgs.length, graph.msgs.mode, base, graph.msg_target)
    cycles, start, end, first, done, point_done, busy, links = out
    return RunResult(int(cycles), start, end, first, done, point_done,
                     busy.reshape(graph.height, graph.width), links)


@njit(cache=True, nogil=True)  # stages of a step are timed on parallel threads
def _simulate(width, height, hop, ramp, qcap, task_pe, task_priority, task_cycles, task_need,
              out_ptr, out_msg, succ_ptr, succ_task, t_ready, src, dst, length, mode,
              point_base, msg_target):
    """The fast engine's driver: run the event loop until no event is left.

    Events are task READY, DISPATCH and DONE (``cores``) and message RELEASE (an external
    message whose ``t_ready`` has come). A task's DONE times its messages at once
    (``_send``), which count their inputs to the tasks they feed.

    Parameters
    ----------
    width, height : int
        The mesh, in PEs; PE ``p`` sits at x = p % width, y = p // width.
    hop : int
        Cycles per link crossed.
    ramp : int
        Cycles between a core and its router, each way.
    qcap : int
        Wavelets one router queue holds (``queue_wavelets``).
    task_pe : int64 array, shape (tasks,)
        PE of each task.
    task_priority : int64 array, shape (tasks,)
        Priority of each task, 0..255, lower first.
    task_cycles : int64 array, shape (tasks,)
        Core cycles of each task.
    task_need : int64 array, shape (tasks,)
        Inputs (deliveries plus predecessors) each task waits for; copied, not written.
    out_ptr : int64 array, shape (tasks + 1,)
        CSR offsets of each task's messages in ``out_msg``.
    out_msg : int64 array, shape (sent,)
        Message ids each task sends when done, in order.
    succ_ptr : int64 array, shape (tasks + 1,)
        CSR offsets of each task's successors in ``succ_task``.
    succ_task : int64 array, shape (edges,)
        Successor task ids.
    t_ready : int64 array, shape (messages,)
        Cycle an external message is released, or -1 for one a task sends.
    src, dst : int64 array, shape (messages,)
        Source and destination PE of each message.
    length : int64 array, shape (messages,)
        Wavelets (32 bits each) of each message, >= 1.
    mode : int64 array, shape (messages,)
        UNICAST or LINE (a multicast delivered at every router after its source).
    point_base : int64 array, shape (messages + 1,)
        Index of each message's first delivery point (``TaskGraph.point_base``).
    msg_target : int64 array, shape (points,)
        The task each delivery point feeds, or -1.

    Returns
    -------
    last : int
        Cycle of the last event or delivery.
    start, end : int64 array, shape (tasks,)
        Start and end cycle of each task (-1: never).
    first : int64 array, shape (messages,)
        Cycle each message's first wavelet was injected (-1: never sent).
    done : int64 array, shape (messages,)
        Cycle its last delivery point had every wavelet (-1: not all delivered).
    point_done : int64 array, shape (points,)
        Cycle each delivery point had every wavelet (-1: never).
    busy : int64 array, shape (width * height,)
        Core cycles spent in tasks per PE.
    links : int64 array, shape (width * height, 4)
        Wavelets sent per router and output direction N, E, S, W.
    """
    n = width * height
    n_tasks = len(task_pe)
    n_msgs = len(src)
    need = task_need.copy()
    ready_at = np.zeros(n_tasks, dtype=np.int64)  # latest arrival of an input counted ahead
    start = np.full(n_tasks, -1, dtype=np.int64)
    end = np.full(n_tasks, -1, dtype=np.int64)
    first = np.full(n_msgs, -1, dtype=np.int64)
    done = np.full(n_msgs, -1, dtype=np.int64)
    point_done = np.full(len(msg_target), -1, dtype=np.int64)
    busy = np.zeros(n, dtype=np.int64)
    links = np.zeros((n, 4), dtype=np.int64)
    link_free = np.zeros((n, 4), dtype=np.int64)
    ramp_in_free = np.zeros(n, dtype=np.int64)
    ramp_out_free = np.zeros(n, dtype=np.int64)
    q_base, qa, qb, q_count, running, dispatch_due = new_cores(n, task_pe)
    path_r = np.zeros(width + height + 2, dtype=np.int64)  # scratch: one message's path
    path_d = np.zeros(width + height + 2, dtype=np.int64)
    path_t = np.zeros(width + height + 2, dtype=np.int64)

    # At most one READY and one DONE per task, one DISPATCH per PE and one RELEASE per message
    # are queued at a time.
    cap = 1024 + 2 * n_tasks + n + n_msgs
    ht = np.empty(cap, dtype=np.int64)
    hk = np.empty(cap, dtype=np.int64)
    size = 0
    for t in range(n_tasks):
        if need[t] == 0:
            size = push(ht, hk, size, 0, ready_key(task_priority[t], t))
    for m in range(n_msgs):
        if t_ready[m] >= 0:
            size = push(ht, hk, size, t_ready[m], (EV_RELEASE << ID_BITS) | m)
    last = 0
    while size > 0:
        now, key, size = pop(ht, hk, size)
        kind = key >> ID_BITS
        ident = key & ((1 << ID_BITS) - 1)
        if now > last:
            last = now
        if kind == EV_RELEASE:
            size = _send(ident, now, width, hop, ramp, qcap, src, dst, length, mode,
                         point_base, msg_target, need, ready_at, task_priority, point_done,
                         first, links, link_free, ramp_in_free, ramp_out_free, ht, hk, size,
                         path_r, path_d, path_t)
        else:
            ht, hk, size, finished = core_event(
                kind, ident, now, ht, hk, size, task_pe, task_priority, task_cycles, succ_ptr,
                succ_task, need, ready_at, start, end, busy, q_base, qa, qb, q_count, running,
                dispatch_due)
            if finished >= 0:
                for i in range(out_ptr[finished], out_ptr[finished + 1]):
                    size = _send(out_msg[i], now, width, hop, ramp, qcap, src, dst, length,
                                 mode, point_base, msg_target, need, ready_at, task_priority,
                                 point_done, first, links, link_free, ramp_in_free,
                                 ramp_out_free, ht, hk, size, path_r, path_d, path_t)
    for i in range(len(point_done)):  # the last delivery may come after the last event
        if point_done[i] > last:
            last = point_done[i]
    for m in range(n_msgs):
        latest = -1
        for i in range(point_base[m], point_base[m + 1]):
            if point_done[i] < 0:
                latest = -1
                break
            if point_done[i] > latest:
                latest = point_done[i]
        done[m] = latest
    return last, start, end, first, done, point_done, busy, links


@njit(cache=True, inline="always")
def _deliver(point, at, msg_target, need, ready_at, task_priority, point_done, ht, hk, size):
    """Delivery point ``point`` is reached at cycle ``at``: its task (if any) has one input
    more, and is READY at the latest arrival once it has them all.

    Parameters
    ----------
    point : int
        The delivery point's index.
    at : int
        Cycle its last wavelet lands in the PE.
    msg_target : int64 array, shape (points,)
        The task each delivery point feeds, or -1.
    need : int64 array, shape (tasks,)
        Inputs each task still awaits; the target's falls by one.
    ready_at : int64 array, shape (tasks,)
        Latest arrival counted so far per task; raised to ``at`` for the target.
    task_priority : int64 array, shape (tasks,)
        Priority of each task (0..255), for its READY key.
    point_done : int64 array, shape (points,)
        Cycle each point had every wavelet; set to ``at`` for ``point``.
    ht, hk : int64 array, shape (capacity,)
        The event heap, sized in advance for every READY it can ever hold.
    size : int
        Its entries in use.

    Returns
    -------
    int
        The heap's new size.
    """
    point_done[point] = at
    task = msg_target[point]
    if task >= 0:
        if at > ready_at[task]:
            ready_at[task] = at
        need[task] -= 1
        if need[task] == 0:
            size = push(ht, hk, size, ready_at[task], ready_key(task_priority[task], task))
    return size


@njit(cache=True, inline="always")
def _send(m, now, width, hop, ramp, qcap, src, dst, length, mode, point_base, msg_target, need,
          ready_at, task_priority, point_done, first, links, link_free, ramp_in_free,
          ramp_out_free, ht, hk, size, path_r, path_d, path_t):
    """Time message ``m`` released at ``now``: claim its ramp, links and ramps out, and
    deliver at each point (the heap is sized so that it never has to grow here).

    The message injects one wavelet per cycle once its PE's ramp is free; its head crosses
    each link of its x-then-y path when it has arrived and the link is free, holding the link
    for ``length[m]`` cycles; at each delivery point the ramp out takes as long. Then each
    link on the path stays held until the wavelets behind a hold-up downstream fit in the
    queues ahead (``qcap`` per router), as a wormhole does.

    Parameters
    ----------
    m : int
        The message id.
    now : int
        Cycle it may start (its task's DONE, or its release).
    width : int
        Mesh width in PEs.
    hop : int
        Cycles per link crossed.
    ramp : int
        Cycles between a core and its router, each way.
    qcap : int
        Wavelets one router queue holds.
    src, dst, length, mode : int64 array, shape (messages,)
        Source PE, destination PE, wavelets and UNICAST/LINE of each message.
    point_base : int64 array, shape (messages + 1,)
        Index of each message's first delivery point.
    msg_target : int64 array, shape (points,)
        The task each delivery point feeds, or -1.
    need, ready_at : int64 array, shape (tasks,)
        Inputs still awaited and latest counted arrival per task (see ``_deliver``).
    task_priority : int64 array, shape (tasks,)
        Priority of each task, for READY keys.
    point_done : int64 array, shape (points,)
        Cycle each delivery point had every wavelet; written for this message's points.
    first : int64 array, shape (messages,)
        Cycle each message's first wavelet was injected; written for ``m``.
    links : int64 array, shape (routers, 4)
        Wavelets sent per router and direction N, E, S, W; grows by ``length[m]`` per link.
    link_free : int64 array, shape (routers, 4)
        Cycle each output link is free from.
    ramp_in_free, ramp_out_free : int64 array, shape (routers,)
        Cycle each PE's ramp into its router (injection) and out of it (delivery) is free.
    ht, hk : int64 array, shape (capacity,)
        The event heap.
    size : int
        Its entries in use.
    path_r, path_d, path_t : int64 array, shape (width + height + 2,)
        Scratch: the router, direction and start cycle of each link of the path.

    Returns
    -------
    int
        The heap's new size.
    """
    s = src[m]
    M = length[m]
    inj = now if now > ramp_in_free[s] else ramp_in_free[s]
    ramp_in_free[s] = inj + M
    first[m] = inj
    head = inj + ramp  # head ready to leave the source router
    x, y = s % width, s // width
    dx, dy = dst[m] % width, dst[m] // width
    r = s
    point = 0
    hops = abs(dx - x) + abs(dy - y)
    line = mode[m] == LINE
    if hops == 0:
        e = head if head > ramp_out_free[r] else ramp_out_free[r]
        ramp_out_free[r] = e + M
        return _deliver(point_base[m], e + ramp + M - 1, msg_target, need, ready_at,
                        task_priority, point_done, ht, hk, size)
    n_links = 0
    while r != dst[m]:
        if dx > x:
            d = 1
        elif dx < x:
            d = 3
        elif dy > y:
            d = 2
        else:
            d = 0
        t = head if head > link_free[r, d] else link_free[r, d]
        link_free[r, d] = t + M
        links[r, d] += M
        path_r[n_links] = r
        path_d[n_links] = d
        path_t[n_links] = t
        n_links += 1
        if d == 0:
            y -= 1
            r -= width
        elif d == 1:
            x += 1
            r += 1
        elif d == 2:
            y += 1
            r += width
        else:
            x -= 1
            r -= 1
        head = t + hop  # head reaches the next router
        if line or r == dst[m]:
            e = head if head > ramp_out_free[r] else ramp_out_free[r]
            ramp_out_free[r] = e + M
            size = _deliver(point_base[m] + point, e + ramp + M - 1, msg_target, need,
                            ready_at, task_priority, point_done, ht, hk, size)
            point += 1
            # A multicast moves on only as its tap into this PE takes the wavelets.
            head = e
    # Wormhole: a link is held until the wavelets behind a hold-up fit in the queues ahead.
    hold = path_t[n_links - 1] + M
    for i in range(n_links - 2, -1, -1):
        hold = hold - hop - qcap
        if hold > link_free[path_r[i], path_d[i]]:
            link_free[path_r[i], path_d[i]] = hold
        else:
            hold = link_free[path_r[i], path_d[i]]
    return size
