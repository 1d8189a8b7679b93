"""Communication and compute primitives over lines of PEs, for whole arrays of lines at once.

A "line" is a row or column of PEs inside a strip: lines are given as 2-D arrays of PE indices
(lines, positions). Every function adds tasks and messages to a GraphBuilder and returns the
task ids downstream code waits for.
"""

from __future__ import annotations

import math

import numpy as np

from wse_emu.engines.messages import LINE
from wse_emu.kernels.graph import GraphBuilder

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


def line_broadcast(g: GraphBuilder, lines: np.ndarray, source: np.ndarray, ready: np.ndarray,
                   wave: np.ndarray, kind: int, cycles_at=None,
                   targets: np.ndarray | None = None) -> np.ndarray:
    """Each line's data, ready at task ``ready[i]`` on PE ``lines[i, source[i]]``, reaches every
    other PE of the line by line multicasts toward both ends. Returns a task per (line, pos)
    (shape of ``lines``): at the source the ready task itself, elsewhere a receive task of
    ``cycles_at`` (default 0) cycles. With ``targets`` (tasks shaped like ``lines``) the data
    feeds those tasks directly instead, and ``targets`` is returned."""
    n_lines, length = lines.shape
    rows = np.arange(n_lines)
    if targets is not None:
        g.then(ready, targets[rows, source])
        feed = targets
    out = np.empty(lines.shape, dtype=np.int64)
    out[rows, source] = ready
    cyc = 0 if cycles_at is None else cycles_at
    for direction in (-1, 1):
        # Lines grouped by how many PEs lie beyond the source in this direction.
        beyond = (source if direction < 0 else length - 1 - source)
        for hops in np.unique(beyond[beyond > 0]):
            sel = rows[beyond == hops]
            pos = source[sel][:, None] + direction * np.arange(1, hops + 1)[None, :]
            if targets is not None:
                recv = feed[sel[:, None], pos]
            else:
                recv = g.tasks(lines[sel[:, None], pos], cyc, kind).reshape(len(sel), hops)
            out[sel[:, None], pos] = recv
            g.send(ready[sel], lines[sel, source[sel]], lines[sel, pos[:, -1]], wave[sel], recv,
                   LINE, VC_BCAST)
    return targets if targets is not None else out


def line_reduce(g: GraphBuilder, lines: np.ndarray, root: np.ndarray, ready: np.ndarray,
                wave: np.ndarray, add_cycles: np.ndarray, kind: int,
                gather: bool = False) -> np.ndarray:
    """Partial results, ready at ``ready[i, pos]`` on each PE of each line, are summed onto the
    line's ``root`` position by a two-level tree. On each side of the root the line is cut into
    groups of about sqrt(length) PEs; members send to their group's leader, the member
    farthest from the root (level one, away from the root); leaders send their group's sum to
    the root (level two, toward the root). The two levels run in opposite directions, so one
    never holds up the other on a link. Returns the root's final task per line.
    ``wave``/``add_cycles``: message size and one addition's cost, per line. With ``gather``
    the pieces are concatenated instead: a leader sends on its whole group's."""
    n_lines, length = lines.shape
    rows = np.arange(n_lines)
    if length == 1:
        return ready[:, 0].copy()
    group = max(1, math.isqrt(length - 1) + 1)
    pos = np.arange(length)[None, :]
    side = np.sign(pos - root[:, None])  # -1 before the root, +1 after, 0 at it
    dist = np.abs(pos - root[:, None])
    reach = np.where(side < 0, root[:, None], length - 1 - root[:, None])  # PEs on that side
    k = np.maximum(dist - 1, 0) // group
    far = np.minimum((k + 1) * group, reach)  # distance of the group's leader
    on_side = dist > 0
    is_leader = on_side & (dist == far)
    members = on_side & ~is_leader
    # Level one: members to their leader.
    count1 = np.zeros((n_lines, length), dtype=np.int64)
    leader_pos = root[:, None] + side * far
    mi, mp = np.nonzero(members)
    np.add.at(count1, (mi, leader_pos[mi, mp]), 1)
    li, lp = np.nonzero(is_leader)
    level1 = ready[li, lp].copy()
    with_members = count1[li, lp] > 0
    if with_members.any():
        acc = g.tasks(lines[li[with_members], lp[with_members]],
                      add_cycles[li[with_members]] * count1[li, lp][with_members], kind)
        g.then(ready[li[with_members], lp[with_members]], acc)
        level1[with_members] = acc
    acc_at = np.full((n_lines, length), -1, dtype=np.int64)
    acc_at[li, lp] = level1
    g.send(ready[mi, mp], lines[mi, mp], lines[mi, leader_pos[mi, mp]], wave[mi],
           acc_at[mi, leader_pos[mi, mp]], 0, VC_REDUCE1)
    # Level two: leaders to the root.
    count2 = np.bincount(li, minlength=n_lines)
    final = ready[rows, root].copy()
    need = rows[count2 > 0]
    if len(need):
        done = g.tasks(lines[need, root[need]], add_cycles[need] * count2[need], kind)
        g.then(ready[need, root[need]], done)
        final[need] = done
    size = wave[li] * (count1[li, lp] + 1) if gather else wave[li]
    g.send(level1, lines[li, lp], lines[li, root[li]], size, final[li], 0, VC_REDUCE2)
    return final


def transfer(g: GraphBuilder, src_pe: np.ndarray, src_sizes: np.ndarray, src_ready: np.ndarray,
             dst_pe: np.ndarray, dst_sizes: np.ndarray, per_value_wavelets, kind: int,
             dst_cycles=0) -> np.ndarray:
    """A vector split into ``src_sizes`` pieces (ready at ``src_ready`` on ``src_pe``) is
    re-split into ``dst_sizes`` pieces on ``dst_pe``: one message per overlap. Returns a
    receive task per destination piece (it waits for all its overlaps)."""
    sb = np.concatenate([[0], np.cumsum(src_sizes)])
    db = np.concatenate([[0], np.cumsum(dst_sizes)])
    cuts = np.union1d(sb, db)
    lo, hi = cuts[:-1], cuts[1:]
    keep = hi > lo
    lo, hi = lo[keep], hi[keep]
    si = np.searchsorted(sb, lo, side="right") - 1
    di = np.searchsorted(db, lo, side="right") - 1
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
