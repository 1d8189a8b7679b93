"""The PE cores, shared by both engines: each runs one task at a time, and when free starts
the ready task with the smallest (priority, ready cycle, task id).

Events are queued keyed (cycle, kind, id), in a calendar (``calendar``). A READY at an idle
PE with nothing queued starts at once (READYs of one cycle are taken best first, so none
better can follow); otherwise the task waits in its PE's queue until a DISPATCH, due when the
PE frees.

The helpers are inlined into the engines' loops: as calls, each would pay for passing (and
reference counting) its arrays, a large share of a step's time. They take records
(``records``): the task graph's columns (``TaskColumns``, read only), the tasks' progress
(``TaskProgress``), the cores (``Cores``) and the event calendar (``Calendar``, with the
number of events pending beside it, a scalar the loops keep in a register).

All cycles are simulated clock cycles of the wafer, counted from 0.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from wse_emu.engines import calendar
from wse_emu.engines.records import Fill, TaskColumns, make, record

EV_DELIVERY, EV_RELEASE, EV_DONE, EV_READY, EV_DISPATCH = 0, 1, 2, 3, 4
ID_BITS = 40
TASK_BITS = 32  # a READY event's id: priority above the task, so equal-time READYs go best first
PRIORITY_SHIFT = 40  # queue key: priority above the ready cycle
NEED_BITS = 32  # ``TaskProgress.need``: the inputs awaited below, the priority above
NEED_MASK = (1 << NEED_BITS) - 1


@record
class TaskProgress:
    """Where each task stands (one entry per task)."""

    # inputs still awaited, in the low ``NEED_BITS``, and the task's priority above them, so
    # that the input that makes it ready also gives its READY key (``input_arrives``)
    need: np.int64
    ready_at: np.int64  # latest arrival of an input counted ahead of time (the fast engine's)
    start: np.int64  # cycle it started, -1 until then
    end: np.int64  # cycle it finished, -1 until then


@record
class Cores:
    """Each PE's core and its ready queue, a binary heap kept in the slice
    ``q_base[p]:q_base[p + 1]`` of ``qa`` and ``qb``."""

    busy: np.int64  # (PEs,): core cycles spent in tasks
    running: np.int64  # (PEs,): the task on the core, -1: idle
    dispatch_due: np.bool_  # (PEs,): a DISPATCH event is queued
    q_count: np.int64  # (PEs,): tasks in the ready queue
    q_base: np.int64  # (PEs + 1,): where each PE's queue starts in qa and qb
    qa: np.int64  # (max(tasks, 1),): queue key, priority << PRIORITY_SHIFT | ready cycle
    qb: np.int64  # (max(tasks, 1),): queue entry's task id (the tie-break)


def new_progress(tasks: TaskColumns) -> TaskProgress:
    """No task started, each awaiting all of its inputs."""
    n = len(tasks.pe)
    need = (tasks.priority.astype(np.int64) << NEED_BITS) | tasks.need
    return make(TaskProgress, need=need, ready_at=Fill(n, 0), start=Fill(n, -1),
                end=Fill(n, -1))


def new_cores(n: int, tasks: TaskColumns) -> Cores:
    """The ``n`` PEs' cores idle, their ready queues empty, each with room for all of its
    tasks."""
    q_base = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(tasks.pe, minlength=n), out=q_base[1:])
    room = max(len(tasks.pe), 1)
    return make(Cores, busy=Fill(n, 0), running=Fill(n, -1), dispatch_due=Fill(n, False),
                q_count=Fill(n, 0), q_base=q_base, qa=Fill(room, 0), qb=Fill(room, 0))


@njit(cache=True, inline="always")
def ready_key(priority, task):
    """The heap key of task ``task``'s READY event: kind EV_READY, then ``priority`` (0..255)
    above the task id (below 2**32), so that READYs of one cycle pop best first."""
    return (EV_READY << ID_BITS) | (priority << TASK_BITS) | task


# --- per-PE ready queues: heaps keyed (priority, ready cycle, task id), one slice per PE ----

@njit(cache=True, inline="always")
def _qpush(cores, p, a, b):
    """Add (``a``, ``b``) to PE ``p``'s ready queue: ``a`` is priority << PRIORITY_SHIFT |
    ready cycle, ``b`` the task id, which breaks ties."""
    qa, qb, base = cores.qa, cores.qb, cores.q_base[p]
    i = cores.q_count[p]
    cores.q_count[p] = i + 1
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
def _qpop(cores, p):
    """Remove the best entry, smallest (``qa``, ``qb``), of PE ``p``'s non-empty ready queue;
    returns its task id."""
    qa, qb, base = cores.qa, cores.qb, cores.q_base[p]
    best = qb[base]
    count = cores.q_count[p] - 1
    cores.q_count[p] = count
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


# --- the cores' events -------------------------------------------------------------------

@njit(cache=True, inline="always")
def _start(task, p, now, tasks, progress, cores, events, size):
    """Task ``task`` starts on the idle core of PE ``p`` at cycle ``now`` and queues its
    DONE. Returns the number of events pending."""
    cores.running[p] = task
    progress.start[task] = now
    cores.busy[p] += tasks.cycles[task]
    return calendar.push(events, size, now + tasks.cycles[task], (EV_DONE << ID_BITS) | task)


@njit(cache=True, inline="always")
def core_event(kind, ident, now, tasks, progress, cores, events, size):
    """Handle one READY, DISPATCH or DONE event popped from the calendar at cycle ``now``.

    READY: the task starts if its core is idle with nothing queued and no DISPATCH due, else
    joins the PE's ready queue. DISPATCH: an idle core starts the best task queued. DONE: the
    core frees (queuing a DISPATCH if tasks wait) and each successor counts one input; one
    that has all of them is READY at the later of ``now`` and its ``ready_at`` (the fast
    engine counts a delivery when it times the message; the cycle engine's stay 0). The caller
    sends the finished task's messages.

    ``kind`` is the key's bits from ``ID_BITS`` up, ``ident`` its low bits: for READY,
    priority << TASK_BITS | task id; for DISPATCH, the PE; for DONE, the task id.

    Returns the number of events pending and the task that finished (DONE) or -1.
    """
    if kind == EV_READY:
        task = ident & ((1 << TASK_BITS) - 1)
        p = tasks.pe[task]
        if cores.running[p] < 0 and cores.q_count[p] == 0 and not cores.dispatch_due[p]:
            size = _start(task, p, now, tasks, progress, cores, events, size)
        else:  # its priority is the key's, above the task (``ready_key``): not read again
            _qpush(cores, p, ((ident >> TASK_BITS) << PRIORITY_SHIFT) | now, task)
        return size, -1
    if kind == EV_DISPATCH:
        p = ident
        cores.dispatch_due[p] = False
        if cores.running[p] < 0 and cores.q_count[p] > 0:
            task = _qpop(cores, p)
            size = _start(task, p, now, tasks, progress, cores, events, size)
        return size, -1
    # EV_DONE
    progress.end[ident] = now
    p = tasks.pe[ident]
    cores.running[p] = -1
    if cores.q_count[p] > 0 and not cores.dispatch_due[p]:
        cores.dispatch_due[p] = True
        size = calendar.push(events, size, now, (EV_DISPATCH << ID_BITS) | p)
    ready_at = progress.ready_at
    for i in range(tasks.succ_ptr[ident], tasks.succ_ptr[ident + 1]):
        s = tasks.succ_task[i]
        key = input_arrives(progress, s)
        if key >= 0:
            at = now if now > ready_at[s] else ready_at[s]
            size = calendar.push(events, size, at, key)
    return size, ident


@njit(cache=True, inline="always")
def feed(target, now, progress, events, size):
    """A delivery at cycle ``now`` to task ``target`` (-1: none, nothing happens): it counts
    one input more and is READY at ``now`` once it has them all (the cycle engine, which
    counts inputs as they arrive). Returns the number of events pending."""
    if target >= 0:
        key = input_arrives(progress, target)
        if key >= 0:
            size = calendar.push(events, size, now, key)
    return size


@njit(cache=True, inline="always")
def queue_ready(tasks, progress, events):
    """Every task that waits for nothing is READY at cycle 0, into an empty calendar.
    Returns the number of events pending."""
    size = 0
    for task in range(len(tasks.pe)):
        if awaits_nothing(progress, task):
            size = calendar.push(events, size, 0, ready_key(tasks.priority[task], task))
    return size


@njit(cache=True, inline="always")
def input_arrives(progress, task):
    """Task ``task`` has one input more: its READY key if that was the last it awaited, else
    -1."""
    word = progress.need[task] - 1
    progress.need[task] = word
    if word & NEED_MASK:
        return -1
    return ready_key(word >> NEED_BITS, task)


@njit(cache=True, inline="always")
def awaits_nothing(progress, task):
    """Whether task ``task`` has every input it needs."""
    return (progress.need[task] & NEED_MASK) == 0
