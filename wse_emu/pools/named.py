"""Pools named as on the command line, built: the sides of a serving run (one ``mixed`` side
for colocated serving, or a ``prefill`` and a ``decode`` side), each side's pools made by its
kind, and the clock they are all served on."""

from __future__ import annotations

from pathlib import Path

from wse_emu.errors import UserError
from wse_emu.models.spec import ModelSpec
from wse_emu.pools.kinds.base import Side
from wse_emu.pools.names import parse_pool
from wse_emu.serving.tables import default_cache_dir

# The clock a cluster of accelerators alone is served on: serving counts in cycles, and an
# accelerator's step times are seconds turned into cycles of it.
ACCELERATOR_CLOCK_HZ = 1e9


def named_pools(model: ModelSpec, sides: dict[str, str], cache_dir: Path | str | None = None,
                grid: str = "full", reach: int = 0) -> tuple[list, float]:
    """The pools of ``sides`` (role -> a pool named as on the command line, ``pools.names``:
    ``wse3x4``, ``trn2x2``, ``h200x8``), and the clock they are served on (``pools_clock``).
    A wafer side holds the model as colocated serving lays it out, serving its role; an
    accelerator side is timed by its roofline, a GPU side from measured data. The sides'
    systems are numbered in order. Contexts are timed as far as ``reach`` tokens."""
    names = {role: parse_pool(text) for role, text in sides.items()}
    clock_hz = pools_clock(list(names.values()))
    pools, first = [], 0
    for role, name in names.items():
        pools += side_pools(model, Side(name), role, first, clock_hz, cache_dir, grid, reach)
        first += name.systems
    return pools, clock_hz


def pools_clock(names: list) -> float:
    """The clock pools of these kinds are served on: the first that counts its steps in
    cycles of its own (a wafer's), else ``ACCELERATOR_CLOCK_HZ``."""
    clocks = [n.kind.clock_hz(n.hardware) for n in names]
    return next((c for c in clocks if c is not None), ACCELERATOR_CLOCK_HZ)


def side_pools(model: ModelSpec, side: Side, role: str, first: int, clock_hz: float,
               cache_dir: Path | str | None = None, grid: str = "full",
               reach: int = 0) -> list:
    """The pools of one side (``kinds.Side``: a pool as named, in one of its layouts) in
    ``role``, on systems from ``first`` on, timed for ``clock_hz`` by the side's kind."""
    return side.pool.kind.pools(model, side, role, first, clock_hz,
                                default_cache_dir(cache_dir), grid, reach)


def pool_sides(pool: str | None, prefill_pool: str | None,
               decode_pool: str | None) -> dict[str, str]:
    """Colocated on ``pool``, or split between ``prefill_pool`` and ``decode_pool``: the sides
    ``named_pools`` takes; any other combination is refused."""
    if pool is not None and prefill_pool is None and decode_pool is None:
        return {"mixed": pool}
    if pool is None and prefill_pool is not None and decode_pool is not None:
        return {"prefill": prefill_pool, "decode": decode_pool}
    raise UserError("give `pool` (colocated), or `prefill_pool` and `decode_pool` (a split)")
