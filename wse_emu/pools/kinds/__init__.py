"""The kinds of hardware a pool may be named by, one module each: ``wafer`` (compiled and
simulated), ``accelerator`` (timed by a stated roofline), ``gpu`` (timed from measured data).
A kind is a ``base.PoolKind`` named ``KIND`` in its module, found here: a new kind of hardware
is one module in this folder (plus its presets), no line elsewhere."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from typing import Any

from wse_emu.pools.kinds.base import PoolKind


@cache
def kinds() -> tuple:
    """Every kind, in the order names are tried and listed (``PoolKind.order``)."""
    found = []
    for module in pkgutil.iter_modules(__path__):
        if module.name != "base":
            kind = getattr(importlib.import_module(f"{__name__}.{module.name}"), "KIND", None)
            if isinstance(kind, PoolKind):
                found.append(kind)
    return tuple(sorted(found, key=lambda k: k.order))


def kind_of(hardware: Any) -> PoolKind:
    """The kind ``hardware`` (a fabric, an accelerator, a GPU) is of."""
    for kind in kinds():
        if kind.owns(hardware):
            return kind
    raise TypeError(f"no pool kind holds {type(hardware).__name__}")
