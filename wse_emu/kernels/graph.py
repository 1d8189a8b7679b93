"""Building task graphs in bulk: every call adds whole arrays of tasks, messages and edges.

A stage's graph at another shape of its step (a decode of more sequences, a longer context)
is often the same graph with other costs: the same calls with the same tasks, edges and
message routes, only the tasks' cycles and the messages' lengths differ. ``build`` given the
form of a graph built before (``GraphForm``) checks that, call by call and array by array, and
when it holds gives the new costs on the earlier graph's own arrays, rather than assembling
them again (about a third of a graph's making); when it does not, it assembles the graph as
ever.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np

from wse_emu.engines.messages import LINE, Messages
from wse_emu.engines.taskgraph import TaskGraph, grouped, input_counts


@dataclass(frozen=True)
class GraphForm:
    """A built graph apart from its costs: the calls that made it, each with every array but
    its cycles (tasks) or lengths (messages), and the graph (``GraphBuilder.build``). Its
    arrays are shared by every graph built to the same form, and nothing writes to them (the
    engines only read a graph)."""

    width: int
    height: int
    tasks: tuple  # per call: (PEs, kind, priority)
    edges: tuple  # per call: (before, after)
    messages: tuple  # per call: (sender, src, dst, mode, vc, targets)
    graph: TaskGraph


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two int64 arrays hold the same values: byte strings compared, which costs
    less than numpy's comparison for the hundreds of small arrays a graph is made of."""
    return a is b or (a.shape == b.shape and a.tobytes() == b.tobytes())


class GraphBuilder:
    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self._tasks: list[tuple[np.ndarray, np.ndarray, int, int]] = []  # pe, cycles, kind, prio
        self._n_tasks = 0
        self._succ: list[tuple[np.ndarray, np.ndarray]] = []
        self._msgs: list[tuple] = []  # sender, src, dst, length, mode, vc, targets
        self.priority = 0  # given to the tasks added from now on (lower runs first)
        self.form: GraphForm | None = None  # what ``build`` made, apart from its costs

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
        self._tasks.append((pe, cycles, int(kind), int(self.priority)))
        self._n_tasks += len(pe)
        return ids

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
        self._msgs.append((sender, src, dst, length.copy(), int(mode), vc,
                           targets.ravel().copy()))

    def build(self, like: GraphForm | None = None) -> TaskGraph:
        """The graph of every call so far; on ``like``'s arrays, with this builder's costs,
        where its calls made the same graph apart from them (checked whole). ``form`` is
        then the graph's form."""
        if like is not None and self._made_like(like):
            self.form = like
            return self._costed(like.graph)
        graph = self._assembled()
        self.form = GraphForm(self.width, self.height,
                              tuple((pe, kind, prio) for pe, _, kind, prio in self._tasks),
                              tuple(self._succ),
                              tuple((m[0], m[1], m[2], m[4], m[5], m[6]) for m in self._msgs),
                              graph)
        return graph

    def _made_like(self, form: GraphForm) -> bool:
        """Whether every call made the same tasks, edges and messages as ``form``'s did,
        their cycles and lengths aside (``_same`` compares shapes before bytes)."""
        if ((self.width, self.height) != (form.width, form.height)
                or len(self._tasks) != len(form.tasks) or len(self._succ) != len(form.edges)
                or len(self._msgs) != len(form.messages)):
            return False
        return (all(kind == f_kind and prio == f_prio and _same(pe, f_pe)
                    for (pe, _, kind, prio), (f_pe, f_kind, f_prio)
                    in zip(self._tasks, form.tasks))
                and all(_same(before, f_before) and _same(after, f_after)
                        for (before, after), (f_before, f_after) in zip(self._succ, form.edges))
                and all(mode == f_mode and _same(sender, f_sender) and _same(src, f_src)
                        and _same(dst, f_dst) and _same(vc, f_vc) and _same(targets, f_targets)
                        for (sender, src, dst, _, mode, vc, targets),
                        (f_sender, f_src, f_dst, f_mode, f_vc, f_targets)
                        in zip(self._msgs, form.messages)))

    def _costed(self, graph: TaskGraph) -> TaskGraph:
        """``graph`` with this builder's task cycles and message lengths."""
        cycles = (np.concatenate([t[1] for t in self._tasks]) if self._tasks
                  else np.zeros(0, np.int64))
        length = (np.concatenate([m[3] for m in self._msgs]) if self._msgs
                  else np.zeros(0, np.int64))
        return replace(graph, task_cycles=cycles, msgs=replace(graph.msgs, length=length))

    def _assembled(self) -> TaskGraph:
        """The graph's arrays made from the calls: tasks, edges and messages in the order
        added, grouped per task (``taskgraph.grouped``)."""
        counts = np.array([len(t[0]) for t in self._tasks], dtype=np.int64)
        if self._tasks:
            pe = np.concatenate([t[0] for t in self._tasks])
            cycles = np.concatenate([t[1] for t in self._tasks])
        else:
            pe = cycles = np.zeros(0, np.int64)
        kind = np.repeat(np.array([t[2] for t in self._tasks], dtype=np.int64), counts)
        priority = np.repeat(np.array([t[3] for t in self._tasks], dtype=np.int64), counts)
        n = len(pe)
        if self._succ:
            before = np.concatenate([s[0] for s in self._succ])
            after = np.concatenate([s[1] for s in self._succ])
        else:
            before = after = np.zeros(0, np.int64)
        succ_ptr, order = grouped(before, n)
        succ_task = after[order]
        if self._msgs:
            sender, src, dst, length, vc, targets = (
                np.concatenate([m[i] for m in self._msgs]) for i in (0, 1, 2, 3, 5, 6))
            mode = np.repeat(np.array([m[4] for m in self._msgs], dtype=np.int64),
                             [len(m[1]) for m in self._msgs])
        else:
            sender = src = dst = length = vc = targets = mode = np.zeros(0, np.int64)
        msgs = Messages(np.full(len(src), -1, dtype=np.int64), src, dst, length, mode, vc)
        # Messages without a sender start at t = 0 (external input).
        msgs.t_ready[sender < 0] = 0
        out_ptr, out_order = grouped(sender, n)  # messages without a sender left out
        need = input_counts(targets, after, n)
        return TaskGraph(self.width, self.height, pe, cycles, need, kind, out_ptr,
                         out_order, succ_ptr, succ_task, msgs, targets, priority)
