"""Pools by kind of hardware: wafers compiled and simulated, accelerators timed by their roofline,
GPUs timed from measured data, and pool names as the command line writes them. Each kind is one
module (``wafer``, ``accelerator``, ``gpu``) deriving from ``kinds.PoolKind``; this package
lists them.
"""

from __future__ import annotations

from typing import Any

from wse_emu.pools.accelerator import ACCELERATOR
from wse_emu.pools.gpu import GPU
from wse_emu.pools.kinds import PoolKind
from wse_emu.pools.wafer import WAFER


def kinds() -> tuple:
    """Every kind, in the order names are tried and listed."""
    return (WAFER, ACCELERATOR, GPU)


def kind_of(hardware: Any) -> PoolKind:
    """The kind ``hardware`` (a fabric, an accelerator, a GPU) is of."""
    for kind in kinds():
        if kind.owns(hardware):
            return kind
    raise TypeError(f"no pool kind holds {type(hardware).__name__}")
