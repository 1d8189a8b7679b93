"""The PE cores, shared by both engines: each runs one task at a time, and when free starts
the ready task with the smallest (priority, ready cycle, task id).

Events sit in one heap keyed (cycle, kind, id). A READY at an idle PE with nothing
queued starts at once (READYs of one cycle are taken best first, so none better can follow);
otherwise the task waits in its PE's queue until a DISPATCH, due when the PE frees.

The helpers are inlined into the engines' loops: as calls, each would pay for passing (and
reference counting) its many arrays, a large share of a step's time.
"""

from __future__ import annotations

import numpy as np
from numba import njit

EV_DELIVERY, EV_RELEASE, EV_DONE, EV_READY, EV_DISPATCH = 0, 1, 2, 3, 4
ID_BITS = 40
TASK_BITS = 32  # a READY event's id: priority above the task, so equal-time READYs go best first
PRIORITY_SHIFT = 40  # queue key: priority above the ready cycle


# --- the event heap ---------------------------------------------------------------------------

# A 4-ary heap: half the levels of a binary one, and a node's four children share a cache
# line or two, so a pop from a heap of 10^5 events waits on memory half as often. Any
# min-heap pops the same sequence of (cycle, key) pairs, so the shape changes no result.

@njit(cache=True, inline="always")
def push(ht, hk, size, t, key):
    i = size
    while i > 0:  # sift up: move parents down until the new entry's place is found
        parent = (i - 1) >> 2
        pt, pk = ht[parent], hk[parent]
        if t < pt or (t == pt and key < pk):
            ht[i], hk[i] = pt, pk
            i = parent
        else:
            break
    ht[i], hk[i] = t, key
    return size + 1


@njit(cache=True, inline="always")
def pop(ht, hk, size):
    t, key = ht[0], hk[0]
    size -= 1
    lt, lk = ht[size], hk[size]  # the last entry, sifted down from the root
    i = 0
    while True:
        first = 4 * i + 1
        if first >= size:
            break
        child = first
        ct, ck = ht[first], hk[first]
        for c in range(first + 1, min(first + 4, size)):
            if ht[c] < ct or (ht[c] == ct and hk[c] < ck):
                child, ct, ck = c, ht[c], hk[c]
        if ct < lt or (ct == lt and ck < lk):
            ht[i], hk[i] = ct, ck
            i = child
        else:
            break
    ht[i], hk[i] = lt, lk
    return t, key, size


@njit(cache=True, inline="always")
def grow(ht, hk, size):
    if size < len(ht):
        return ht, hk
    nt = np.empty(2 * len(ht), dtype=np.int64)
    nk = np.empty(2 * len(hk), dtype=np.int64)
    nt[:size] = ht[:size]
    nk[:size] = hk[:size]
    return nt, nk


@njit(cache=True, inline="always")
def ready_key(priority, task):
    return (EV_READY << ID_BITS) | (priority << TASK_BITS) | task


# --- per-PE ready queues: heaps keyed (priority, ready cycle, task id), one slice per PE ----

@njit(cache=True, inline="always")
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


@njit(cache=True, inline="always")
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


@njit(cache=True)
def new_cores(n, task_pe):
    """(queue base per PE, queue keys a and b, queue lengths, running task, dispatch due)."""
    n_tasks = len(task_pe)
    q_base = np.zeros(n + 1, dtype=np.int64)
    for t in range(n_tasks):
        q_base[task_pe[t] + 1] += 1
    for p in range(n):
        q_base[p + 1] += q_base[p]
    qa = np.zeros(max(n_tasks, 1), dtype=np.int64)
    qb = np.zeros(max(n_tasks, 1), dtype=np.int64)
    return (q_base, qa, qb, np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64),
            np.zeros(n, dtype=np.bool_))


@njit(cache=True, inline="always")
def _start(task, p, now, task_cycles, start, busy, running, ht, hk, size):
    running[p] = task
    start[task] = now
    busy[p] += task_cycles[task]
    ht, hk = grow(ht, hk, size)
    size = push(ht, hk, size, now + task_cycles[task], (EV_DONE << ID_BITS) | task)
    return ht, hk, size


@njit(cache=True, inline="always")
def core_event(kind, ident, now, ht, hk, size, task_pe, task_priority, task_cycles, succ_ptr,
               succ_task, need, ready_at, start, end, busy, q_base, qa, qb, q_count, running,
               dispatch_due):
    """Handle a READY, DISPATCH or DONE event. Returns (ht, hk, size, the task that finished
    or -1); the caller sends the finished task's messages. ``ready_at`` holds, per task, the
    latest cycle one of its inputs arrives that was counted ahead of time (the fast engine
    counts a delivery when it times the message): a successor is READY at that cycle if it
    is later than now."""
    if kind == EV_READY:
        task = ident & ((1 << TASK_BITS) - 1)
        p = task_pe[task]
        if running[p] < 0 and q_count[p] == 0 and not dispatch_due[p]:
            ht, hk, size = _start(task, p, now, task_cycles, start, busy, running, ht, hk, size)
        else:
            _qpush(qa, qb, q_base[p], q_count[p], (task_priority[task] << PRIORITY_SHIFT) | now,
                   task)
            q_count[p] += 1
        return ht, hk, size, -1
    if kind == EV_DISPATCH:
        p = ident
        dispatch_due[p] = False
        if running[p] < 0 and q_count[p] > 0:
            task = _qpop(qa, qb, q_base[p], q_count[p])
            q_count[p] -= 1
            ht, hk, size = _start(task, p, now, task_cycles, start, busy, running, ht, hk, size)
        return ht, hk, size, -1
    # EV_DONE
    end[ident] = now
    p = task_pe[ident]
    running[p] = -1
    if q_count[p] > 0 and not dispatch_due[p]:
        dispatch_due[p] = True
        ht, hk = grow(ht, hk, size)
        size = push(ht, hk, size, now, (EV_DISPATCH << ID_BITS) | p)
    for i in range(succ_ptr[ident], succ_ptr[ident + 1]):
        s = succ_task[i]
        need[s] -= 1
        if need[s] == 0:
            ht, hk = grow(ht, hk, size)
            at = now if now > ready_at[s] else ready_at[s]
            size = push(ht, hk, size, at, ready_key(task_priority[s], s))
    return ht, hk, size, ident


@njit(cache=True)
def feed(target, now, need, task_priority, ht, hk, size):
    """A delivery to ``target`` (a task id, or -1): one input more; READY when all are in."""
    if target >= 0:
        need[target] -= 1
        if need[target] == 0:
            ht, hk = grow(ht, hk, size)
            size = push(ht, hk, size, now, ready_key(task_priority[target], target))
    return ht, hk, size
