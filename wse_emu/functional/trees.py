"""The program's reduction trees, followed value by value.

``wse_emu.program.trees.tree_plan`` is the tree the timed program moves partial results along
(``primitives.line_reduce``); ``tree_reduce`` adds the same values at the same PEs in the same
order, so that a wrong tree (a lost member, a doubled leader) changes the result. Each receiver
starts from its own value and adds what arrives nearest first; the simulator's arrival order
would depend on timing, so this fixed order stands for it and keeps results deterministic.
"""

from __future__ import annotations

from typing import Callable, TypeVar

from wse_emu.program.trees import TreePlan, tree_plan

__all__ = ["TreePlan", "tree_plan", "tree_reduce"]

T = TypeVar("T")


def tree_reduce(items: list[T], root: int, combine: Callable[[T, T], T],
                send: Callable[[T], T] = lambda v: v, levels: int = 2) -> T:
    """Reduce ``items`` (one per position of a line) onto ``root`` along the program's tree.

    ``combine(accumulator, arriving)`` is what a PE does when a value arrives; ``send`` is
    applied to every value that leaves a PE (rounding to the wire's number format)."""
    plan = tree_plan(len(items), root, levels)
    value = list(items)
    for receiver, senders, _ in plan.steps:
        acc = value[receiver]
        for s in senders:
            acc = combine(acc, send(value[s]))
        value[receiver] = acc
    return value[root]
