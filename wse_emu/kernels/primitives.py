"""Communication and compute primitives over lines of PEs, for whole arrays of lines at once.

A "line" is a row or column of PEs inside a strip: lines are given as 2-D arrays of PE indices
(lines, positions). Every function adds tasks and messages to a GraphBuilder and returns the
task ids downstream code waits for.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numba import njit

from wse_emu.engines.messages import LINE
from wse_emu.kernels.graph import GraphBuilder
from wse_emu.program.trees import tree_plan

SLICE_TOKENS = 512  # tokens per multiply task of a prefill tile

# Virtual channels by traffic class (the cycle engine maps colors onto these).
VC_BCAST, VC_REDUCE1, VC_REDUCE2, VC_TRANSFER = 0, 1, 2, 3


def wavelets(values, dtype_bytes: int) -> np.ndarray:
    """32-bit wavelets that carry ``values`` numbers of ``dtype_bytes`` each."""
    return -(-np.asarray(values, dtype=np.int64) * dtype_bytes // 4)


class CostModel:
    """Core cycles of a task from its FLOPs and SRAM traffic on one PE."""

    def __init__(self, fabric, dtype_bytes: int = 2):
        self.fpc = fabric.flops_per_cycle(dtype_bytes)
        self.rd = fabric.sram_read_bytes_per_cycle
        self.wr = fabric.sram_write_bytes_per_cycle

    def cycles(self, flops, reads, writes) -> np.ndarray:
        flops, reads, writes = (np.asarray(a, dtype=np.float64) for a in (flops, reads, writes))
        return np.ceil(np.maximum(np.maximum(flops / self.fpc, reads / self.rd),
                                  writes / self.wr)).astype(np.int64)

    def add(self, values, dtype_bytes: int) -> np.ndarray:
        """Adding a vector of ``values`` into an accumulator (read 2, write 1 per value)."""
        v = np.asarray(values)
        return self.cycles(v, 2 * v * dtype_bytes, v * dtype_bytes)


@njit(cache=True)
def nearest_on_lines(lines: np.ndarray, line: np.ndarray, src: np.ndarray,
                     width: int) -> np.ndarray:
    """For each ``i``, the PE of line ``line[i]`` (a row of ``lines``, PE ids on a mesh
    ``width`` wide) nearest to PE ``src[i]`` in hops, the first along the line among equals.

    A line that runs straight along a row or a column, one PE a step (a strip's are), has
    one nearest PE: where the source's column (or row) falls on it, clamped to its ends, found
    at once. Any other line is searched PE by PE. Numpy made a table of every line PE's
    distance to every source instead: tens of millions of entries for an expert strip's
    inputs."""
    n, length = lines.shape
    # Per line that runs straight: the axis it runs along (1: a row, 2: a column; 0: not
    # straight) and its direction (+1 or -1) on that axis.
    axis = np.zeros(n, dtype=np.int64)
    sign = np.ones(n, dtype=np.int64)
    for k in range(n):
        if length == 1:
            axis[k] = 1
            continue
        d = lines[k, 1] - lines[k, 0]
        if (d == 1 or d == -1) and lines[k, 0] // width == lines[k, length - 1] // width:
            along_row = True
        elif d == width or d == -width:
            along_row = False
        else:
            continue
        straight = True
        for b in range(2, length):
            if lines[k, b] - lines[k, b - 1] != d:
                straight = False
                break
        if straight:
            axis[k] = 1 if along_row else 2
            sign[k] = 1 if d > 0 else -1
    out = np.empty(len(line), dtype=np.int64)
    for i in range(len(line)):
        k = line[i]
        sx, sy = src[i] % width, src[i] // width
        if axis[k] != 0:
            first = lines[k, 0]
            offset = sx - first % width if axis[k] == 1 else sy - first // width
            b = offset * sign[k]  # steps from the line's first PE toward the source
            out[i] = lines[k, min(max(b, 0), length - 1)]
            continue
        best, nearest = -1, 0
        for pe in lines[k]:
            hops = abs(pe % width - sx) + abs(pe // width - sy)
            if best < 0 or hops < best:
                best, nearest = hops, pe
        out[i] = nearest
    return out


def line_broadcast(g: GraphBuilder, lines: np.ndarray, source: np.ndarray, ready: np.ndarray,
                   wave: np.ndarray, kind: int, targets: np.ndarray | None = None) -> np.ndarray:
    """Each line's data, ready at task ``ready[i]`` on PE ``lines[i, source[i]]``, reaches every
    other PE of the line by line multicasts toward both ends. Returns a task per (line, pos)
    (shape of ``lines``): at the source the ready task itself, elsewhere a receive task. With
    ``targets`` (tasks shaped like ``lines``) the data feeds those tasks directly instead, and
    ``targets`` is returned."""
    n_lines, length = lines.shape
    rows = np.arange(n_lines)
    # Positions as flat indices (line * length + position): numpy takes them faster than
    # pairs of index arrays.
    flat_lines = lines.ravel()
    flat_targets = targets.ravel() if targets is not None else None
    at_source = rows * length + source
    if targets is not None:
        g.then(ready, flat_targets[at_source])
    out = np.empty(lines.shape, dtype=np.int64)
    flat_out = out.reshape(-1)
    flat_out[at_source] = ready
    for direction in (-1, 1):
        # One multicast per line with PEs beyond its source in this direction, the lines in
        # order of how many (then of index), each reaching its PEs nearest first: the order
        # the engines break ties in, whatever the lines' lengths.
        beyond = (source if direction < 0 else length - 1 - source)
        has = rows[beyond > 0]
        if not len(has):
            continue
        order = has[np.argsort(beyond[has], kind="stable")]
        hops = beyond[order]
        # Per delivery point, its flat index: its line's source, then one step out more
        # than the point before it on the line.
        starts = np.cumsum(hops) - hops
        step = np.arange(int(hops.sum())) - np.repeat(starts, hops) + 1
        point = np.repeat(at_source[order], hops) + direction * step
        recv = flat_targets[point] if targets is not None else \
            g.tasks(flat_lines[point], 0, kind)
        flat_out[point] = recv
        g.send(ready[order], flat_lines[at_source[order]],
               flat_lines[at_source[order] + direction * hops], wave[order], recv, LINE,
               VC_BCAST)
    return targets if targets is not None else out


def line_reduce(g: GraphBuilder, lines: np.ndarray, root: np.ndarray, ready: np.ndarray,
                wave: np.ndarray, add_cycles: np.ndarray, kind: int,
                gather: bool = False, levels: int = 2) -> np.ndarray:
    """Partial results, ready at ``ready[i, pos]`` on each PE of each line, are summed onto the
    line's ``root`` position by a ``levels``-level tree (``trees.tree_plan``): at each step a
    receiver takes its senders' messages and adds each to its own value. Returns the root's
    final task per line. ``wave``/``add_cycles``: message size and one addition's cost, per
    line. With ``gather`` the pieces are concatenated instead: a sender passes on everything it
    has collected.

    Lines of one root are added all steps at once (``ReduceSchedule``), in the order a step by
    step walk adds them: tasks step by step, messages step by step and line by line, so that
    the graph is the same and the engines break their ties alike."""
    n_lines, length = lines.shape
    out = ready[np.arange(n_lines), root].copy()
    if length == 1:
        return out
    for r in np.unique(root):
        sel = np.flatnonzero(root == r)
        plan = reduce_schedule(length, int(r), levels)
        on, mine = lines[sel], ready[sel]  # (lines, positions)
        n = len(sel)
        # Every step's receiving task on every line, (steps, lines).
        acc = g.tasks(on[:, plan.receiver].T, add_cycles[sel][None, :] * plan.count[:, None],
                      kind).reshape(len(plan.receiver), n)

        def value(writer, position):
            """(lines, k): the task holding each position's value, as the last step before
            (``writer``, -1: none) left it."""
            held = mine[:, position]
            wrote = writer >= 0
            held[:, wrote] = acc[writer[wrote]].T
            return held

        g.then(value(plan.receiver_writer, plan.receiver).T, acc)
        # Messages as (lines, messages of the plan), then in the walk's order.
        senders = value(plan.sender_writer, plan.sender)
        size = wave[sel][:, None] * (plan.held[None, :] if gather else 1)
        order = plan.walk_order(n)
        g.send(senders.ravel()[order], on[:, plan.sender].ravel()[order],
               on[:, plan.receiver[plan.step]].ravel()[order],
               np.broadcast_to(size, senders.shape).ravel()[order],
               acc[plan.step].T.ravel()[order], 0,
               np.broadcast_to(plan.vc, senders.shape).ravel()[order])
        out[sel] = acc[plan.root_writer] if plan.root_writer >= 0 else mine[:, int(r)]
    return out


@dataclass(frozen=True)
class ReduceSchedule:
    """A tree plan (``trees.tree_plan``) as arrays: per step its receiver and number of
    senders; per message (step by step, nearest sender first) its step, sender position,
    pieces held (for a gather) and color; and for every value a step reads, the step that last
    wrote it (-1: the line's own partial result)."""

    receiver: np.ndarray  # (steps,)
    count: np.ndarray  # (steps,)
    receiver_writer: np.ndarray  # (steps,)
    step: np.ndarray  # (messages,)
    sender: np.ndarray  # (messages,)
    sender_writer: np.ndarray  # (messages,)
    held: np.ndarray  # (messages,)
    vc: np.ndarray  # (messages,)
    root_writer: int

    def walk_order(self, lines: int) -> np.ndarray:
        """Where each entry of a (lines, messages) array goes in the walk's order: step by
        step, within a step line by line, then message by message."""
        first = np.concatenate([[0], np.cumsum(self.count)[:-1]])[self.step]  # (messages,)
        m = np.arange(len(self.step))
        at = (lines * first[None, :] + np.arange(lines)[:, None] * self.count[self.step][None, :]
              + (m - first)[None, :]).ravel()
        order = np.empty(len(at), dtype=np.int64)
        order[at] = np.arange(len(at))
        return order


@lru_cache(maxsize=None)
def reduce_schedule(length: int, root: int, levels: int) -> ReduceSchedule:
    plan = tree_plan(length, root, levels)
    writer = np.full(length, -1, dtype=np.int64)  # the last step that wrote each position
    held = np.ones(length, dtype=np.int64)
    receiver_writer, step, sender, sender_writer, pieces, vc = [], [], [], [], [], []
    for s, (receiver, senders, level) in enumerate(plan.steps):
        receiver_writer.append(writer[receiver])
        for p in senders:
            step.append(s)
            sender.append(p)
            sender_writer.append(writer[p])
            pieces.append(held[p])
            vc.append(VC_REDUCE1 if level % 2 else VC_REDUCE2)
        held[receiver] += held[list(senders)].sum()
        writer[receiver] = s
    def as_array(values) -> np.ndarray:
        shared = np.asarray(values, dtype=np.int64)
        shared.flags.writeable = False  # cached: every reduction of this plan reads it
        return shared

    return ReduceSchedule(as_array([st[0] for st in plan.steps]),
                          as_array([len(st[1]) for st in plan.steps]), as_array(receiver_writer),
                          as_array(step), as_array(sender), as_array(sender_writer),
                          as_array(pieces), as_array(vc), int(writer[root]))


def overlaps(src_sizes, dst_sizes) -> tuple[np.ndarray, ...]:
    """Where a vector split into ``src_sizes`` pieces meets the same vector split into
    ``dst_sizes``: per non-empty overlap, (source piece, destination piece, first element,
    end)."""
    sb = np.concatenate([[0], np.cumsum(src_sizes)])
    db = np.concatenate([[0], np.cumsum(dst_sizes)])
    cuts = np.union1d(sb, db)
    lo, hi = cuts[:-1], cuts[1:]
    keep = hi > lo
    lo, hi = lo[keep], hi[keep]
    return (np.searchsorted(sb, lo, side="right") - 1, np.searchsorted(db, lo, side="right") - 1,
            lo, hi)


def transfer(g: GraphBuilder, src_pe: np.ndarray, src_sizes: np.ndarray, src_ready: np.ndarray,
             dst_pe: np.ndarray, dst_sizes: np.ndarray, per_value_wavelets, kind: int,
             dst_cycles=0) -> np.ndarray:
    """A vector split into ``src_sizes`` pieces (ready at ``src_ready`` on ``src_pe``) is
    re-split into ``dst_sizes`` pieces on ``dst_pe``: one message per overlap. Returns a
    receive task per destination piece (it waits for all its overlaps)."""
    si, di, lo, hi = overlaps(src_sizes, dst_sizes)
    recv = g.tasks(dst_pe, dst_cycles, kind)
    size = (hi - lo) * per_value_wavelets
    # Pieces on the same PE need no message: they feed the receive task directly.
    local = src_pe[si] == dst_pe[di]
    g.then(src_ready[si[local]], recv[di[local]])
    remote = ~local
    g.send(src_ready[si[remote]], src_pe[si[remote]], dst_pe[di[remote]],
           np.ceil(size[remote]).astype(np.int64), recv[di[remote]], 0, VC_TRANSFER)
    # Pieces of size zero on either side still need a receive that completes.
    empty = np.setdiff1d(np.arange(len(dst_pe)), di)
    if len(empty):
        g.then(np.full(len(empty), src_ready[0]), recv[empty])
    return recv
