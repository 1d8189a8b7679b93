"""Pool names on the command line: ``NAME`` or ``NAMExN``, where NAME is a wafer fabric (a
preset such as ``wse3``, or a fabric YAML), an accelerator timed by its roofline (a preset such
as ``trn2``, or an accelerator YAML) or a GPU timed from measured data (``h200``): ``wse3x4``
is four CS-3 systems, ``trn2x2`` two Trn2 instances, ``h200x8`` eight H200 GPUs (``h200x8tp2``:
two GPUs per copy of the model)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wse_emu.errors import UserError
from wse_emu.pools.kinds import kind_of, kinds
from wse_emu.pools.kinds.base import PoolKind
from wse_emu.util.configfile import read_yaml_mapping

MAX_UNITS = 64


@dataclass(frozen=True)
class PoolName:
    """A pool as named: its hardware (a fabric, an accelerator, a GPU) and how many of it."""

    text: str
    hardware: Any
    count: int  # systems, instances or GPUs
    tensor_parallel: int | None = None  # GPUs: per copy, as named (None: the default)

    @property
    def kind(self) -> PoolKind:
        return kind_of(self.hardware)

    @property
    def systems(self) -> int:
        """Systems it takes: wafers, accelerator instances, or GPU nodes."""
        return -(-self.count // self.kind.per_system(self.hardware))


def parse_pool(text: str) -> PoolName:
    """``text`` read as a pool name; an unknown one is refused with the names it may take."""
    text = str(text)
    found = re.fullmatch(r"(.+?)x(\d+)(?:tp(\d+))?", text)
    base, count = (found.group(1), int(found.group(2))) if found else (text, 1)
    tp = int(found.group(3)) if found and found.group(3) else None
    if not 1 <= count <= MAX_UNITS:
        raise UserError(f"pool '{text}': the count must be between 1 and {MAX_UNITS}")
    kind, hardware = _hardware(text, base)
    if tp is not None and not kind.takes_tp:
        takers = " or ".join(k.noun for k in kinds() if k.takes_tp)
        raise UserError(f"pool '{text}': tpK (units per copy of the model) is for {takers} "
                        f"pools, not {kind.noun}")
    return PoolName(text, hardware, count, tp)


def _hardware(text: str, base: str) -> tuple[PoolKind, Any]:
    """The kind and the hardware ``base`` names: a file says what it describes."""
    if base.endswith((".yaml", ".yml")):
        mapping = read_yaml_mapping(Path(base))
        # A kind that claims it by its mark, else the default (whose loader says what the
        # file lacks).
        kind = next((k for k in kinds() if not k.default_file and k.describes(mapping)),
                    None) or next(k for k in kinds() if k.default_file)
        return kind, kind.load_file(Path(base))
    for kind in kinds():
        if base in kind.presets():
            return kind, kind.load(base)
    known = ", ".join(f"{k.noun} ({', '.join(k.presets())})" for k in kinds())
    files = " or ".join(f"{k.noun} YAML (stating {k.file_mark})" for k in kinds() if k.file_mark)
    raise UserError(f"unknown pool '{text}': {known}, optionally with xN for N of them, or "
                    f"{files}")
