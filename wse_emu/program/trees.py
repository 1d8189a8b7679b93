"""Reduction trees along a line of PEs: K levels over groups of about N^(1/K) PEs.

A line of N PEs reduces onto its root as WaferLLM's MeshGEMV does, in K phases: on each side of
the root the PEs are cut into runs of g^(K-1) by distance (g, the branching, is the smallest
whole number with g^K >= N); each run reduces onto its leader, the PE of the run farthest from
the root, by the same rule one level down; then the leaders send to the root. One level sends
everything straight to the root (a chain of arrivals at one ramp); more levels trade hops for
fewer arrivals at any one PE. Consecutive levels send in opposite directions, so one level never
holds up the next on a link.

The plan is pure data, shared by the timed pattern (``primitives.line_reduce``) and the
functional engine (``functional.trees.tree_reduce``), so that values are added at the same PEs
in the same order as the program moves them. ``choose_levels`` picks K for a line from the
cost model: the time at the busiest receiver of each level plus the hops the level spans.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

MAX_LEVELS = 4


def branching(length: int, levels: int) -> int:
    """The smallest g with g^levels >= length - 1 + 1, i.e. g^levels > length - 1."""
    if length <= 1:
        return 1
    g = max(1, round((length - 1) ** (1.0 / levels)))
    while g ** levels <= length - 1:
        g += 1
    while g > 1 and (g - 1) ** levels > length - 1:
        g -= 1
    return g


@dataclass(frozen=True)
class TreePlan:
    """``steps``: (receiver, senders) in the order they happen, deepest level first; each
    receiver adds its senders' values (nearest first) to its own."""

    length: int
    root: int
    levels: int
    steps: tuple[tuple[int, tuple[int, ...], int], ...]  # (receiver, senders, level)

    def edges(self) -> list[tuple[int, int]]:
        """(sender, receiver) position pairs of every message of the tree."""
        return [(s, r) for r, senders, _ in self.steps for s in senders]


@lru_cache(maxsize=None)
def tree_plan(length: int, root: int, levels: int = 2) -> TreePlan:
    if not 0 <= root < length:
        raise ValueError(f"root {root} outside a line of {length}")
    levels = max(1, min(levels, MAX_LEVELS))
    g = branching(length, levels)
    steps: list[tuple[int, tuple[int, ...], int]] = []

    def reduce_run(run: list[int], receiver: int, level: int) -> None:
        """``run``: positions ordered from the receiver outward."""
        if not run:
            return
        if level == 1:
            steps.append((receiver, tuple(run), 1))
            return
        size = g ** (level - 1)
        leaders = []
        for start in range(0, len(run), size):
            chunk = run[start:start + size]
            leader = chunk[-1]
            reduce_run(chunk[:-1][::-1], leader, level - 1)
            leaders.append(leader)
        steps.append((receiver, tuple(leaders), level))

    for side in (-1, 1):
        reach = root if side < 0 else length - 1 - root
        reduce_run([root + side * d for d in range(1, reach + 1)], root, levels)
    # The root's two sides merge into one step per level, nearest senders first.
    merged: dict[tuple[int, int], list[int]] = {}
    for receiver, senders, level in steps:
        merged.setdefault((level, receiver), []).extend(senders)
    ordered = sorted(merged.items(), key=lambda item: (item[0][0], item[0][1]))
    return TreePlan(length, root, levels, tuple(
        (receiver, tuple(sorted(senders, key=lambda s: abs(s - receiver))), level)
        for (level, receiver), senders in ordered))


def tree_cycles(length: int, levels: int, message_cycles: float, add_cycles: float,
                hop: float) -> float:
    """Estimated critical path of a ``levels``-level reduce along ``length`` PEs: per level,
    the arrivals at its busiest receiver (each a message through the ramp and an addition)
    and the hops its farthest sender is away."""
    if length <= 1:
        return 0.0
    g = branching(length, levels)
    total = 0.0
    for level in range(1, levels + 1):
        # The root takes its leaders from both sides at the top level.
        arrivals = min(length - 1, (2 if level == levels else 1) * g)
        total += arrivals * (message_cycles + add_cycles) + hop * min(g ** level, length - 1)
    return total


def choose_levels(length: int, message_cycles: float, add_cycles: float, hop: float,
                  most: int = MAX_LEVELS) -> int:
    """The number of levels, up to ``most``, with the shortest estimated critical path (fewest
    on a tie)."""
    if length <= 2:
        return 1
    best = min(range(1, max(1, min(most, MAX_LEVELS)) + 1),
               key=lambda k: (tree_cycles(length, k, message_cycles, add_cycles, hop), k))
    return best
