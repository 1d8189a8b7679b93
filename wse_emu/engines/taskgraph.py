"""Task graphs: what kernels expand into, and what both engines execute.

A task runs on one PE's core for ``cycles`` cycles once ``need`` inputs have arrived (message
deliveries to it plus completions of the tasks that precede it); a PE runs one task at a time,
and when free it starts the ready task with the smallest (priority, ready time, task id): an
earlier micro-batch's work goes first. When a task completes, the messages listed for
it join its PE's send queue in order and its successor tasks count one input more. A message's
delivery point (its destination, or each router of a line multicast) may name a task it feeds.
Messages with ``t_ready >= 0`` are sent at that time whatever the tasks do (external input).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from wse_emu.engines.messages import Messages

# The widest and tallest mesh the engines take: a message's route keeps each end's column and
# row in 15 bits (``records.route_of``). A wafer is about a thousand PEs a side.
MAX_SIDE = 1 << 15


@dataclass
class TaskGraph:
    width: int
    height: int
    task_pe: np.ndarray
    task_cycles: np.ndarray
    task_need: np.ndarray
    task_kind: np.ndarray  # a label per task (kernel index), for reports
    out_ptr: np.ndarray  # CSR over tasks: messages sent on completion, in order
    out_msg: np.ndarray
    succ_ptr: np.ndarray  # CSR over tasks: tasks that wait for this one
    succ_task: np.ndarray
    msgs: Messages
    msg_target: np.ndarray  # per delivery point (see Messages.points): task fed, or -1
    task_priority: np.ndarray | None = None  # lower runs first; None: all 0

    def __post_init__(self):
        if self.task_priority is None:
            self.task_priority = np.zeros(len(self.task_pe), dtype=np.int64)

    @property
    def tasks(self) -> int:
        return len(self.task_pe)

    def point_base(self) -> np.ndarray:
        base = np.zeros(len(self.msgs) + 1, dtype=np.int64)
        np.cumsum(self.msgs.points(self.width), out=base[1:])
        return base

    def check_ranges(self) -> None:
        """What the engines' columns and packed keys can hold: priorities below 256, ids of
        tasks, messages and delivery points below 2**31 (``records.TaskColumns``), a mesh of
        at most ``MAX_SIDE`` PEs a side."""
        if not (0 < self.width <= MAX_SIDE and 0 < self.height <= MAX_SIDE):
            raise ValueError(f"a mesh of {self.width} x {self.height} PEs; the engines take "
                             f"1 to {MAX_SIDE:,} a side")
        if self.tasks and (self.task_priority.min() < 0 or self.task_priority.max() >= 256):
            raise ValueError("task priorities must be in 0..255")
        if max(self.tasks, len(self.msg_target), len(self.msgs.src)) >= 2**31:
            raise ValueError("too many tasks, messages or delivery points for one graph")

    def validate(self) -> None:
        self.check_ranges()
        n = self.width * self.height
        if self.tasks and (self.task_pe.min() < 0 or self.task_pe.max() >= n):
            raise ValueError("task on a PE outside the mesh")
        if len(self.msg_target) != int(self.msgs.points(self.width).sum()):
            raise ValueError("msg_target needs one entry per delivery point")
        # Every task's need must be met exactly by its senders and predecessors.
        fed = np.zeros(self.tasks, dtype=np.int64)
        np.add.at(fed, self.msg_target[self.msg_target >= 0], 1)
        np.add.at(fed, self.succ_task, 1)
        if not np.array_equal(fed, self.task_need):
            bad = int(np.flatnonzero(fed != self.task_need)[0])
            raise ValueError(f"task {bad} needs {self.task_need[bad]} inputs but gets {fed[bad]}")
        # Messages sent by a task must start at that task's PE.
        for t in range(self.tasks):
            ms = self.out_msg[self.out_ptr[t]:self.out_ptr[t + 1]]
            if len(ms) and (self.msgs.src[ms] != self.task_pe[t]).any():
                raise ValueError(f"task {t} sends a message from another PE")


@njit(cache=True)
def grouped(keys: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(ptr, order): the positions of ``keys`` grouped by key, key 0 first, each group's in
    the order they come (a stable counting sort; keys outside 0..n-1 are left out), so that
    ``order[ptr[k]:ptr[k + 1]]`` are key k's: a CSR's pointers and entries, made in linear
    time where a stable sort takes n log n."""
    ptr = np.zeros(n + 1, dtype=np.int64)
    for k in keys:
        if 0 <= k < n:
            ptr[k + 1] += 1
    for k in range(n):
        ptr[k + 1] += ptr[k]
    fill = ptr[:-1].copy()
    order = np.empty(ptr[n], dtype=np.int64)
    for i in range(len(keys)):
        k = keys[i]
        if 0 <= k < n:
            order[fill[k]] = i
            fill[k] += 1
    return ptr, order


@njit(cache=True)
def input_counts(targets: np.ndarray, after: np.ndarray, n: int) -> np.ndarray:
    """Each of ``n`` tasks' inputs: the delivery points that feed it (``targets``, -1 for
    none) and the tasks it follows (``after``), counted in one pass over each, where numpy
    would count each apart and add the two counts. An id outside the tasks is refused (the
    builder's own slip, never a user's)."""
    need = np.zeros(n, dtype=np.int64)
    for t in targets:
        if t >= n:
            raise ValueError("a delivery point feeds a task that does not exist")
        if t >= 0:
            need[t] += 1
    for t in after:
        if t < 0 or t >= n:
            raise ValueError("an edge leads to a task that does not exist")
        need[t] += 1
    return need


class Builder:
    """Append tasks and messages, then ``build()`` the CSR arrays (used by tests and tools;
    kernel expanders write the arrays directly)."""

    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self.tasks: list[list] = []  # pe, cycles, kind, [out msgs], [succ tasks]
        self.msgs: list[list] = []  # t_ready, src, dst, length, mode, vc, [targets]

    def task(self, pe: int, cycles: int, kind: int = 0, priority: int = 0) -> int:
        self.tasks.append([pe, cycles, kind, [], [], priority])
        return len(self.tasks) - 1

    def then(self, before: int, after: int) -> None:
        self.tasks[before][4].append(after)

    def send(self, task: int | None, src: int, dst: int, length: int, targets, mode: int = 0,
             vc: int = 0, t_ready: int = -1) -> int:
        self.msgs.append([t_ready, src, dst, length, mode, vc, list(np.atleast_1d(targets))])
        m = len(self.msgs) - 1
        if task is not None:
            self.tasks[task][3].append(m)
        return m

    def build(self) -> TaskGraph:
        n_tasks = len(self.tasks)
        out_ptr = np.zeros(n_tasks + 1, dtype=np.int64)
        succ_ptr = np.zeros(n_tasks + 1, dtype=np.int64)
        out_ptr[1:] = np.cumsum([len(t[3]) for t in self.tasks])
        succ_ptr[1:] = np.cumsum([len(t[4]) for t in self.tasks])
        cols = list(zip(*[m[:6] for m in self.msgs])) if self.msgs else [[]] * 6
        msgs = Messages.build(*[np.array(c, dtype=np.int64) for c in cols]) if self.msgs else \
            Messages.build([], [], [], [], [], [])
        targets = np.array([x for m in self.msgs for x in m[6]], dtype=np.int64)
        need = np.zeros(n_tasks, dtype=np.int64)
        np.add.at(need, targets[targets >= 0], 1)
        for t in self.tasks:
            for s in t[4]:
                need[s] += 1
        g = TaskGraph(
            self.width, self.height,
            np.array([t[0] for t in self.tasks], dtype=np.int64),
            np.array([t[1] for t in self.tasks], dtype=np.int64), need,
            np.array([t[2] for t in self.tasks], dtype=np.int64),
            out_ptr, np.array([m for t in self.tasks for m in t[3]], dtype=np.int64),
            succ_ptr, np.array([s for t in self.tasks for s in t[4]], dtype=np.int64),
            msgs, targets, np.array([t[5] for t in self.tasks], dtype=np.int64))
        g.validate()
        return g
