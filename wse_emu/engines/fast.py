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


@dataclass
class RunResult:
    cycles: int  # last event: every task done and every message delivered
    task_start: np.ndarray
    task_end: np.ndarray
    msg_first: np.ndarray  # cycle the first wavelet was injected
    msg_done: np.ndarray  # cycle the last wavelet reached the last delivery point
    point_done: np.ndarray
    pe_busy: np.ndarray  # (height, width) core cycles spent in tasks
    link_wavelets: np.ndarray  # (height*width, 4) wavelets sent per output direction

    def unfinished(self) -> int:
        return int((self.task_end < 0).sum())


def run(graph: TaskGraph, hop: int, ramp: int, queue_wavelets: int = 8) -> RunResult:
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
    more, and is READY at the latest arrival once it has them all."""
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
    deliver at each point (the heap is sized so that it never has to grow here)."""
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
