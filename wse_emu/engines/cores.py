"""The PE cores, shared by both engines: each runs one task at a time, and when free starts
the ready task with the smallest (priority, ready cycle, task id).

Events sit in one heap keyed (cycle, kind, id). A READY at an idle PE with nothing
queued starts at once (READYs of one cycle are taken best first, so none better can follow);
otherwise the task waits in its PE's queue until a DISPATCH, due when the PE frees.

The helpers are inlined into the engines' loops: as calls, each would pay for passing (and
reference counting) its many arrays, a large share of a step's time. They take the arrays one
by one, as measured for speed (bundling them into named tuples would change the compiled code),
and each documents every one of them. The names recur across the module with one meaning each:

- the event heap: ``ht`` (cycle of each entry) and ``hk`` (its key: event kind in the bits
  from ``ID_BITS`` up, below them an id whose meaning depends on the kind), int64 arrays of
  equal length (the capacity), of which the first ``size`` entries are in use;
- the task graph's columns (``TaskGraph``), int64, one entry per task and never written:
  ``task_pe`` (the PE that runs it, ``y * width + x``), ``task_priority`` (0..255, lower
  first), ``task_cycles`` (core cycles it takes), and the successor lists in CSR form,
  ``succ_ptr`` (tasks + 1 offsets) into ``succ_task`` (task ids);
- per-task state, int64, one entry per task: ``need`` (inputs still awaited), ``ready_at``
  (latest cycle of an input counted ahead of its arrival), ``start`` and ``end`` (cycles, -1
  until then);
- per-PE core state (``new_cores``), one entry per PE: ``busy`` (core cycles spent in
  tasks), ``running`` (the task on the core, or -1), ``dispatch_due`` (a DISPATCH event is
  queued), ``q_count`` (tasks in its ready queue), and its ready queue, a binary heap kept in
  the slice ``q_base[p]:q_base[p + 1]`` of ``qa`` (priority << PRIORITY_SHIFT | ready cycle)
  and ``qb`` (task id).

All cycles are simulated clock cycles of the wafer, counted from 0.
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
    """Add the entry (``t``, ``key``) to the event heap.

    Parameters
    ----------
    ht, hk : int64 array, shape (capacity,)
        The heap's cycles and keys; entry ``size`` must exist (the caller grows the heap
        first, or sized it for the most events ever queued at once).
    size : int
        Entries in use.
    t : int
        Cycle of the event.
    key : int
        Its key: kind << ID_BITS | id. Equal cycles pop in increasing key order.

    Returns
    -------
    int
        The new size, ``size + 1``.
    """
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
    """Remove the smallest (cycle, key) entry of a non-empty event heap.

    Parameters
    ----------
    ht, hk : int64 array, shape (capacity,)
        The heap's cycles and keys.
    size : int
        Entries in use, at least 1.

    Returns
    -------
    t : int
        Cycle of the entry removed.
    key : int
        Its key.
    size : int
        The new size, ``size - 1``.
    """
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
    """Make room for one more event: the same arrays if there is, else copies twice as long.

    Parameters
    ----------
    ht, hk : int64 array, shape (capacity,)
        The heap's cycles and keys.
    size : int
        Entries in use.

    Returns
    -------
    ht, hk : int64 array, shape (capacity,) or (2 * capacity,)
        The arrays to use from now on (the caller must rebind its names to them).
    """
    if size < len(ht):
        return ht, hk
    nt = np.empty(2 * len(ht), dtype=np.int64)
    nk = np.empty(2 * len(hk), dtype=np.int64)
    nt[:size] = ht[:size]
    nk[:size] = hk[:size]
    return nt, nk


@njit(cache=True, inline="always")
def ready_key(priority, task):
    """The heap key of task ``task``'s READY event: kind EV_READY, then ``priority`` (0..255)
    above the task id (below 2**32), so that READYs of one cycle pop best first."""
    return (EV_READY << ID_BITS) | (priority << TASK_BITS) | task


# --- per-PE ready queues: heaps keyed (priority, ready cycle, task id), one slice per PE ----

@njit(cache=True, inline="always")
def _qpush(qa, qb, base, count, a, b):
    """Add (``a``, ``b``) to the binary heap of one PE's ready queue; the caller then adds one
    to the PE's ``q_count``.

    Parameters
    ----------
    qa, qb : int64 array, shape (max(tasks, 1),)
        Every PE's queue keys: ``qa`` priority << PRIORITY_SHIFT | ready cycle, ``qb`` task id.
    base : int
        Where the PE's slice starts (``q_base[p]``).
    count : int
        Entries in the PE's queue before this one.
    a, b : int
        The new entry's keys (ties on ``a`` go to the smaller ``b``).
    """
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
    """Remove the best entry, smallest (``qa``, ``qb``), of one PE's ready queue; the caller
    then takes one from the PE's ``q_count``.

    Parameters
    ----------
    qa, qb : int64 array, shape (max(tasks, 1),)
        Every PE's queue keys (see ``_qpush``).
    base : int
        Where the PE's slice starts (``q_base[p]``).
    count : int
        Entries in the PE's queue, at least 1.

    Returns
    -------
    int
        The task id (``qb``) of the entry removed.
    """
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
    """Idle cores with empty ready queues.

    Parameters
    ----------
    n : int
        PEs of the mesh (width * height).
    task_pe : int64 array, shape (tasks,)
        The PE of each task; a PE's queue gets room for all of its tasks.

    Returns
    -------
    q_base : int64 array, shape (n + 1,)
        PE ``p``'s queue lives in ``qa``/``qb`` at ``q_base[p]:q_base[p + 1]``.
    qa, qb : int64 array, shape (max(tasks, 1),)
        The queues' keys (see ``_qpush``).
    q_count : int64 array, shape (n,)
        Entries in each PE's queue (0).
    running : int64 array, shape (n,)
        The task running on each core (-1: idle).
    dispatch_due : bool array, shape (n,)
        Whether a DISPATCH event is queued for the PE (False).
    """
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
    """Task ``task`` starts on the idle core of PE ``p`` at cycle ``now`` and queues its DONE.

    Parameters
    ----------
    task, p, now : int
        The task id, its PE and the cycle.
    task_cycles : int64 array, shape (tasks,)
        Core cycles of each task.
    start : int64 array, shape (tasks,)
        Start cycle per task; written for ``task``.
    busy : int64 array, shape (n,)
        Core cycles per PE; ``p``'s grows by the task's cycles.
    running : int64 array, shape (n,)
        Task on each core; set to ``task`` for ``p``.
    ht, hk : int64 array, shape (capacity,)
        The event heap (grown if full).
    size : int
        Its entries in use.

    Returns
    -------
    ht, hk : int64 array
        The heap's arrays from now on.
    size : int
        Its new size.
    """
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
    """Handle one READY, DISPATCH or DONE event popped from the heap.

    READY: the task starts if its core is idle with nothing queued and no DISPATCH due, else
    joins the PE's ready queue. DISPATCH: an idle core starts the best task queued. DONE: the
    core frees (queuing a DISPATCH if tasks wait) and each successor counts one input; one
    that has all of them is READY at the later of ``now`` and its ``ready_at``. The caller
    sends the finished task's messages.

    Parameters
    ----------
    kind : int
        EV_READY, EV_DISPATCH or EV_DONE (the key's bits from ``ID_BITS`` up).
    ident : int
        The key's low ``ID_BITS`` bits: for READY, priority << TASK_BITS | task id; for
        DISPATCH, the PE; for DONE, the task id.
    now : int
        The event's cycle.
    ht, hk : int64 array, shape (capacity,)
        The event heap (grown when an event is added to a full one).
    size : int
        Its entries in use.
    task_pe, task_priority, task_cycles : int64 array, shape (tasks,)
        Each task's PE, priority (0..255) and core cycles.
    succ_ptr : int64 array, shape (tasks + 1,)
        CSR offsets of each task's successors in ``succ_task``.
    succ_task : int64 array, shape (edges,)
        Successor task ids.
    need : int64 array, shape (tasks,)
        Inputs each task still awaits; successors' counts fall by one on DONE.
    ready_at : int64 array, shape (tasks,)
        Per task, the latest cycle at which one of its inputs arrives that was counted ahead
        of time (the fast engine counts a delivery when it times the message; the cycle
        engine passes zeros): a successor is READY at that cycle if it is later than now.
    start, end : int64 array, shape (tasks,)
        Start and end cycle of each task (-1 until then); written here.
    busy : int64 array, shape (n,)
        Core cycles spent in tasks per PE.
    q_base, qa, qb, q_count, running, dispatch_due : arrays, see ``new_cores``
        The cores' ready queues and state.

    Returns
    -------
    ht, hk : int64 array
        The heap's arrays from now on.
    size : int
        Its new size.
    finished : int
        The task that finished (DONE), or -1.
    """
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
    """A delivery to ``target``: the task counts one input more and is READY at ``now`` once
    it has them all (the cycle engine, which counts inputs as they arrive).

    Parameters
    ----------
    target : int
        The task the delivery point feeds, or -1 (nothing happens).
    now : int
        The cycle of the delivery.
    need : int64 array, shape (tasks,)
        Inputs each task still awaits.
    task_priority : int64 array, shape (tasks,)
        Each task's priority (0..255), for its READY key.
    ht, hk : int64 array, shape (capacity,)
        The event heap (grown if full).
    size : int
        Its entries in use.

    Returns
    -------
    ht, hk : int64 array
        The heap's arrays from now on.
    size : int
        Its new size.
    """
    if target >= 0:
        need[target] -= 1
        if need[target] == 0:
            ht, hk = grow(ht, hk, size)
            size = push(ht, hk, size, now, ready_key(task_priority[target], target))
    return ht, hk, size
