"""Pool names on the command line: ``NAME`` or ``NAMExN`` (N systems or instances), where NAME
is a wafer fabric (a preset such as ``wse3``, or a fabric YAML) or an accelerator (a preset
such as ``trn2``, or an accelerator YAML): ``wse3x4`` is four CS-3 systems, ``trn2x2`` two Trn2
instances."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from wse_emu.accelerator import AcceleratorSpec, load_accelerator
from wse_emu.configfile import preset_names, read_yaml_mapping
from wse_emu.errors import UserError
from wse_emu.fabric import FabricSpec, load_fabric

MAX_UNITS = 64


@dataclass(frozen=True)
class PoolName:
    """A pool as named: its hardware (a fabric or an accelerator) and how many of it."""

    text: str
    hardware: FabricSpec | AcceleratorSpec
    count: int

    @property
    def is_wafer(self) -> bool:
        return isinstance(self.hardware, FabricSpec)


def parse_pool(text: str) -> PoolName:
    """``text`` read as a pool name; an unknown one is refused with the names it may take."""
    text = str(text)
    found = re.fullmatch(r"(.+?)x(\d+)", text)
    base, count = (found.group(1), int(found.group(2))) if found else (text, 1)
    if not 1 <= count <= MAX_UNITS:
        raise UserError(f"pool '{text}': the count must be between 1 and {MAX_UNITS}")
    if base.endswith((".yaml", ".yml")):
        # A file says what it describes: an accelerator names its device.
        accelerator = "device" in read_yaml_mapping(Path(base))
        return PoolName(text, (load_accelerator if accelerator else load_fabric)(base), count)
    if base in preset_names("fabrics"):
        return PoolName(text, load_fabric(base), count)
    if base in preset_names("accelerators"):
        return PoolName(text, load_accelerator(base), count)
    raise UserError(f"unknown pool '{text}': a fabric ({', '.join(preset_names('fabrics'))}) "
                    f"or an accelerator ({', '.join(preset_names('accelerators'))}), "
                    "optionally with xN for N of them, or a fabric or accelerator YAML")
