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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from wse_emu.engines.messages import LINE
from wse_emu.engines.taskgraph import TaskGraph

EV_DELIVERY, EV_RELEASE, EV_DONE, EV_READY, EV_DISPATCH = 0, 1, 2, 3, 4


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
    base = graph.point_base()
    out = _simulate(graph.width, graph.height, hop, ramp, queue_wavelets, graph.task_pe,
                    graph.task_priority, graph.task_cycles,
                    graph.task_need, graph.out_ptr, graph.out_msg, graph.succ_ptr,
                    graph.succ_task, graph.msgs.t_ready, graph.msgs.src, graph.msgs.dst,
                    graph.msgs.length, graph.msgs.mode, base, graph.msg_target)
    cycles, start, end, first, done, point_done, busy, links = out
    return RunResult(int(cycles), start, end, first, done, point_done,
                     busy.reshape(graph.height, graph.width), links)


# --- a binary heap of events keyed by (time, kind, id) ------------------------------------

@njit(cache=True)
def _less(ht, hk, i, j):
    return ht[i] < ht[j] or (ht[i] == ht[j] and hk[i] < hk[j])


@njit(cache=True)
def _push(ht, hk, size, t, key):
    i = size
    ht[i] = t
    hk[i] = key
    while i > 0:
        parent = (i - 1) // 2
        if _less(ht, hk, i, parent):
            ht[i], ht[parent] = ht[parent], ht[i]
            hk[i], hk[parent] = hk[parent], hk[i]
            i = parent
        else:
            break
    return size + 1


@njit(cache=True)
def _pop(ht, hk, size):
    t, key = ht[0], hk[0]
    size -= 1
    ht[0], hk[0] = ht[size], hk[size]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= size:
            break
        child = left
        if left + 1 < size and _less(ht, hk, left + 1, left):
            child = left + 1
        if _less(ht, hk, child, i):
            ht[i], ht[child] = ht[child], ht[i]
            hk[i], hk[child] = hk[child], hk[i]
            i = child
        else:
            break
    return t, key, size


@njit(cache=True)
def _grow(ht, hk, size):
    if size < len(ht):
        return ht, hk
    nt = np.empty(2 * len(ht), dtype=np.int64)
    nk = np.empty(2 * len(hk), dtype=np.int64)
    nt[:size] = ht[:size]
    nk[:size] = hk[:size]
    return nt, nk


ID_BITS = 40


# --- per-PE ready queues: heaps keyed (priority, ready cycle, task id), one slice per PE ----

@njit(cache=True)
def _qpush(qa, qb, base, count, a, b):
    i = count
    qa[base + i] = a
    qb[base + i] = b
    while i > 0:
        parent = (i - 1) // 2
        pi, ci = base + parent, base + i
        if qa[ci] < qa[pi] or (qa[ci] == qa[pi] and qb[ci] < qb[pi]):
            qa[ci], qa[pi] = qa[pi], qa[ci]
            qb[ci], qb[pi] = qb[pi], qb[ci]
            i = parent
        else:
            break


@njit(cache=True)
def _qpop(qa, qb, base, count):
    """Remove and return the id of the best task in a PE's queue of ``count`` entries."""
    best = qb[base]
    count -= 1
    qa[base] = qa[base + count]
    qb[base] = qb[base + count]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= count:
            break
        child = left
        lc, rc = base + left, base + left + 1
        if left + 1 < count and (qa[rc] < qa[lc] or (qa[rc] == qa[lc] and qb[rc] < qb[lc])):
            child = left + 1
        ci, ii = base + child, base + i
        if qa[ci] < qa[ii] or (qa[ci] == qa[ii] and qb[ci] < qb[ii]):
            qa[ci], qa[ii] = qa[ii], qa[ci]
            qb[ci], qb[ii] = qb[ii], qb[ci]
            i = child
        else:
            break
    return best


PRIORITY_SHIFT = 40  # queue key: priority above the ready cycle
TASK_BITS = 32  # a READY event's id: priority above the task, so equal-time READYs go best first


@njit(cache=True)
def _ready(priority, task):
    return (EV_READY << ID_BITS) | (priority << TASK_BITS) | task


@njit(cache=True)
def _simulate(width, height, hop, ramp, qcap, task_pe, task_priority, task_cycles, task_need,
              out_ptr, out_msg, succ_ptr, succ_task, t_ready, src, dst, length, mode,
              point_base, msg_target):
    n = width * height
    n_tasks = len(task_pe)
    n_msgs = len(src)
    need = task_need.copy()
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
    # Ready tasks wait in their PE's queue; a PE runs one task at a time.
    q_base = np.zeros(n + 1, dtype=np.int64)
    for t in range(n_tasks):
        q_base[task_pe[t] + 1] += 1
    for p in range(n):
        q_base[p + 1] += q_base[p]
    qa = np.zeros(max(n_tasks, 1), dtype=np.int64)
    qb = np.zeros(max(n_tasks, 1), dtype=np.int64)
    q_count = np.zeros(n, dtype=np.int64)
    running = np.full(n, -1, dtype=np.int64)
    dispatch_due = np.zeros(n, dtype=np.bool_)
    path_r = np.zeros(width + height + 2, dtype=np.int64)  # scratch: one message's path
    path_d = np.zeros(width + height + 2, dtype=np.int64)
    path_t = np.zeros(width + height + 2, dtype=np.int64)

    cap = 1024 + 4 * (n_tasks + len(msg_target))
    ht = np.empty(cap, dtype=np.int64)
    hk = np.empty(cap, dtype=np.int64)
    size = 0
    for t in range(n_tasks):
        if need[t] == 0:
            size = _push(ht, hk, size, 0, _ready(task_priority[t], t))
    for m in range(n_msgs):
        if t_ready[m] >= 0:
            size = _push(ht, hk, size, t_ready[m], (EV_RELEASE << ID_BITS) | m)
    last = 0
    while size > 0:
        now, key, size = _pop(ht, hk, size)
        kind = key >> ID_BITS
        ident = key & ((1 << ID_BITS) - 1)
        if now > last:
            last = now
        if kind == EV_READY:
            task = ident & ((1 << TASK_BITS) - 1)
            p = task_pe[task]
            if running[p] < 0 and q_count[p] == 0 and not dispatch_due[p]:
                # An idle PE: READYs at one cycle arrive best first, so this one goes now.
                running[p] = task
                start[task] = now
                busy[p] += task_cycles[task]
                ht, hk = _grow(ht, hk, size)
                size = _push(ht, hk, size, now + task_cycles[task], (EV_DONE << ID_BITS) | task)
            else:
                _qpush(qa, qb, q_base[p], q_count[p],
                       (task_priority[task] << PRIORITY_SHIFT) | now, task)
                q_count[p] += 1
        elif kind == EV_DISPATCH:
            p = ident
            dispatch_due[p] = False
            if running[p] < 0 and q_count[p] > 0:
                task = _qpop(qa, qb, q_base[p], q_count[p])
                q_count[p] -= 1
                running[p] = task
                start[task] = now
                busy[p] += task_cycles[task]
                ht, hk = _grow(ht, hk, size)
                size = _push(ht, hk, size, now + task_cycles[task], (EV_DONE << ID_BITS) | task)
        elif kind == EV_DONE:
            end[ident] = now
            p = task_pe[ident]
            running[p] = -1
            if q_count[p] > 0 and not dispatch_due[p]:
                dispatch_due[p] = True
                ht, hk = _grow(ht, hk, size)
                size = _push(ht, hk, size, now, (EV_DISPATCH << ID_BITS) | p)
            for i in range(succ_ptr[ident], succ_ptr[ident + 1]):
                s = succ_task[i]
                need[s] -= 1
                if need[s] == 0:
                    ht, hk = _grow(ht, hk, size)
                    size = _push(ht, hk, size, now, _ready(task_priority[s], s))
            for i in range(out_ptr[ident], out_ptr[ident + 1]):
                ht, hk = _grow(ht, hk, size + 64)
                size = _send(out_msg[i], now, width, hop, ramp, qcap, src, dst, length, mode,
                             point_base, first, links, link_free, ramp_in_free, ramp_out_free,
                             ht, hk, size, path_r, path_d, path_t)
        elif kind == EV_RELEASE:
            ht, hk = _grow(ht, hk, size + 64)
            size = _send(ident, now, width, hop, ramp, qcap, src, dst, length, mode,
                         point_base, first, links, link_free, ramp_in_free, ramp_out_free, ht,
                         hk, size, path_r, path_d, path_t)
        else:  # EV_DELIVERY of one point
            point_done[ident] = now
            target = msg_target[ident]
            if target >= 0:
                need[target] -= 1
                if need[target] == 0:
                    ht, hk = _grow(ht, hk, size)
                    size = _push(ht, hk, size, now, _ready(task_priority[target], target))
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


@njit(cache=True)
def _send(m, now, width, hop, ramp, qcap, src, dst, length, mode, point_base, first, links,
          link_free, ramp_in_free, ramp_out_free, ht, hk, size, path_r, path_d, path_t):
    """Time message ``m`` released at ``now``: claim its ramp, links and ramps out, and push
    a delivery event per point."""
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
        return _push(ht, hk, size, e + ramp + M - 1,
                     (EV_DELIVERY << ID_BITS) | point_base[m])
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
            size = _push(ht, hk, size, e + ramp + M - 1,
                         (EV_DELIVERY << ID_BITS) | (point_base[m] + point))
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
