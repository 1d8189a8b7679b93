"""Building task graphs in bulk: every call adds whole arrays of tasks, messages and edges."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from wse_emu.engines.messages import LINE, Messages
from wse_emu.engines.taskgraph import TaskGraph, grouped, input_counts


class GraphBuilder:
    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self._tasks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._n_tasks = 0
        self._succ: list[tuple[np.ndarray, np.ndarray]] = []
        self._msgs: list[tuple] = []
        self._priority: list[np.ndarray] = []
        self.priority = 0  # given to the tasks added from now on (lower runs first)

    @property
    def n_tasks(self) -> int:
        return self._n_tasks

    @contextmanager
    def prioritized(self, priority: int):
        """Tasks added inside the block get ``priority`` (an earlier tile's work goes first
        on every PE); the previous priority is restored after it."""
        before, self.priority = self.priority, priority
        try:
            yield
        finally:
            self.priority = before

    def pe(self, x, y) -> np.ndarray:
        return np.asarray(y, dtype=np.int64) * self.width + np.asarray(x, dtype=np.int64)

    def tasks(self, pe, cycles, kind: int) -> np.ndarray:
        pe = np.atleast_1d(np.asarray(pe, dtype=np.int64))
        cycles = np.broadcast_to(np.asarray(cycles, dtype=np.int64), pe.shape).ravel().copy()
        pe = pe.ravel()
        ids = np.arange(self._n_tasks, self._n_tasks + len(pe), dtype=np.int64)
        self._tasks.append((pe, cycles, np.full(len(pe), kind, dtype=np.int64)))
        self._priority.append(np.full(len(pe), self.priority, dtype=np.int64))
        self._n_tasks += len(pe)
        return ids

    def set_cycles(self, ids: np.ndarray, cycles: np.ndarray) -> None:
        """Set the cycles of tasks added earlier (ids from one ``tasks`` call)."""
        ids = np.asarray(ids, dtype=np.int64)
        offset = 0
        for pe, cyc, _ in self._tasks:
            lo, hi = offset, offset + len(pe)
            sel = (ids >= lo) & (ids < hi)
            if sel.any():
                cyc[ids[sel] - lo] = np.asarray(cycles, dtype=np.int64)[sel]
            offset = hi

    def then(self, before, after) -> None:
        before, after = np.broadcast_arrays(np.asarray(before, dtype=np.int64),
                                            np.asarray(after, dtype=np.int64))
        if before.size:
            self._succ.append((before.ravel().copy(), after.ravel().copy()))

    def send(self, sender, src, dst, wavelets, targets, mode: int = 0, vc=0) -> None:
        """Messages sent when ``sender`` tasks complete. ``targets``: for unicast one task per
        message (or -1); for a line, the tasks fed at each point of each message's path, the
        messages one after another (as an array (messages, points) when their paths are of
        one length). ``vc``: the messages' color class, one for all or one each."""
        src = np.atleast_1d(np.asarray(src, dtype=np.int64)).ravel()
        n = len(src)
        if n == 0:
            return
        dst = np.broadcast_to(np.asarray(dst, dtype=np.int64), (n,)).copy()
        length = np.maximum(np.broadcast_to(np.asarray(wavelets, dtype=np.int64), (n,)), 1)
        sender = np.broadcast_to(np.asarray(sender, dtype=np.int64), (n,)).copy()
        targets = np.asarray(targets, dtype=np.int64)
        if mode == LINE:
            points = (np.abs(dst % self.width - src % self.width)
                      + np.abs(dst // self.width - src // self.width))
            if targets.size != np.maximum(points, 1).sum():
                raise ValueError("a line message needs a target for every point of its path")
        else:
            targets = np.broadcast_to(targets, (n,)).reshape(n, 1)
        vc = np.broadcast_to(np.asarray(vc, dtype=np.int64), (n,))
        self._msgs.append((sender, src, dst, length.copy(), mode, vc, targets.ravel().copy()))

    def build(self) -> TaskGraph:
        pe = np.concatenate([t[0] for t in self._tasks]) if self._tasks else np.zeros(0, np.int64)
        cycles = np.concatenate([t[1] for t in self._tasks]) if self._tasks else pe.copy()
        kind = np.concatenate([t[2] for t in self._tasks]) if self._tasks else pe.copy()
        n = len(pe)
        if self._succ:
            before = np.concatenate([s[0] for s in self._succ])
            after = np.concatenate([s[1] for s in self._succ])
        else:
            before = after = np.zeros(0, np.int64)
        succ_ptr, order = grouped(before, n)
        succ_task = after[order]
        cols = [np.concatenate([m[i] if i != 4 else np.full(len(m[1]), m[i])
                                for m in self._msgs]) if self._msgs else np.zeros(0, np.int64)
                for i in range(6)]
        sender, src, dst, length, mode, vc = cols
        targets = (np.concatenate([m[6] for m in self._msgs]) if self._msgs
                   else np.zeros(0, np.int64))
        msgs = Messages(np.full(len(src), -1, dtype=np.int64), src, dst, length, mode, vc)
        # Messages without a sender start at t = 0 (external input).
        msgs.t_ready[sender < 0] = 0
        out_ptr, out_order = grouped(sender, n)  # messages without a sender left out
        need = input_counts(targets, after, n)
        priority = (np.concatenate(self._priority) if self._priority
                    else np.zeros(0, dtype=np.int64))
        return TaskGraph(self.width, self.height, pe, cycles, need, kind, out_ptr,
                         out_order, succ_ptr, succ_task, msgs, targets,
                         priority)
