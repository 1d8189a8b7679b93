"""The program's reduction trees, as plans a functional run follows value by value.

``wse_emu.kernels.primitives.line_reduce`` times a two-level tree along a line of PEs: on each
side of the root the line is cut into groups of about sqrt(length) PEs; members send to their
group's leader (the member farthest from the root), and leaders send their group's total to the
root. ``tree_plan`` gives the same groups for one line, so that a functional reduction adds the
same partial values at the same PEs as the timed program moves them, and so that a wrong tree
(a lost member, a doubled leader) changes the result.

Every PE starts its accumulation with its own value and adds what arrives in order of
distance, nearest first; the simulator's arrival order would depend on timing, so this fixed
order stands for it and keeps results deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class TreePlan:
    """``groups``: (leader, members) on both sides of the root; ``root`` adds the leaders."""

    length: int
    root: int
    groups: tuple[tuple[int, tuple[int, ...]], ...]

    @property
    def leaders(self) -> tuple[int, ...]:
        return tuple(leader for leader, _ in self.groups)

    def edges(self) -> list[tuple[int, int]]:
        """(sender, receiver) position pairs of every message of the tree."""
        out = [(m, leader) for leader, members in self.groups for m in members]
        return out + [(leader, self.root) for leader in self.leaders]


@lru_cache(maxsize=None)
def tree_plan(length: int, root: int) -> TreePlan:
    if not 0 <= root < length:
        raise ValueError(f"root {root} outside a line of {length}")
    group = max(1, math.isqrt(length - 1) + 1) if length > 1 else 1
    groups = []
    for side in (-1, 1):
        reach = root if side < 0 else length - 1 - root
        for start in range(0, reach, group):
            far = min(start + group, reach)  # the leader's distance from the root
            members = tuple(root + side * d for d in range(start + 1, far))
            groups.append((root + side * far, members))
    # Leaders are added at the root nearest first, like members at their leader.
    groups.sort(key=lambda g: abs(g[0] - root))
    return TreePlan(length, root, tuple(groups))


def tree_reduce(items: list[T], root: int, combine: Callable[[T, T], T],
                send: Callable[[T], T] = lambda v: v) -> T:
    """Reduce ``items`` (one per position of a line) onto ``root`` along the program's tree.

    ``combine(accumulator, arriving)`` is what a PE does when a value arrives; ``send`` is
    applied to every value that leaves a PE (rounding to the wire's number format)."""
    plan = tree_plan(len(items), root)
    arrivals = []
    for leader, members in plan.groups:
        acc = items[leader]
        for m in members:
            acc = combine(acc, send(items[m]))
        arrivals.append(send(acc))
    acc = items[root]
    for value in arrivals:
        acc = combine(acc, value)
    return acc
