"""Pool names on the command line: ``NAME`` or ``NAMExN``, where NAME is a wafer fabric (a
preset such as ``wse3``, or a fabric YAML), an accelerator timed by its roofline (a preset such
as ``trn2``, or an accelerator YAML) or a GPU timed from measured data (``h200``): ``wse3x4``
is four CS-3 systems, ``trn2x2`` two Trn2 instances, ``h200x8`` eight H200 GPUs (``h200x8tp2``:
two GPUs per copy of the model)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from wse_emu.accelerator import AcceleratorSpec, load_accelerator
from wse_emu.configfile import preset_names, read_yaml_mapping
from wse_emu.errors import UserError
from wse_emu.fabric import FabricSpec, load_fabric
from wse_emu.runtime.gpu_pool import GPUS, GpuSpec, load_gpu

MAX_UNITS = 64


@dataclass(frozen=True)
class PoolName:
    """A pool as named: its hardware (a fabric or an accelerator) and how many of it."""

    text: str
    hardware: FabricSpec | AcceleratorSpec | GpuSpec
    count: int  # systems, instances or GPUs
    tensor_parallel: int | None = None  # GPUs: per copy, as named (None: the default)

    @property
    def is_wafer(self) -> bool:
        return isinstance(self.hardware, FabricSpec)

    @property
    def is_gpu(self) -> bool:
        return isinstance(self.hardware, GpuSpec)

    @property
    def systems(self) -> int:
        """Systems it takes: wafers, accelerator instances, or GPU nodes."""
        if self.is_gpu:
            return -(-self.count // self.hardware.gpus_per_node)
        return self.count


def parse_pool(text: str) -> PoolName:
    """``text`` read as a pool name; an unknown one is refused with the names it may take."""
    text = str(text)
    found = re.fullmatch(r"(.+?)x(\d+)(?:tp(\d+))?", text)
    base, count = (found.group(1), int(found.group(2))) if found else (text, 1)
    tp = int(found.group(3)) if found and found.group(3) else None
    if tp is not None and base not in GPUS:
        raise UserError(f"pool '{text}': tpK is for GPU pools; an accelerator's YAML says "
                        "its tensor_parallel")
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
    if base in GPUS:  # measured data, from an optional extra: refused by name without it
        return PoolName(text, load_gpu(base), count, tp)
    raise UserError(f"unknown pool '{text}': a fabric ({', '.join(preset_names('fabrics'))}) "
                    f"an accelerator ({', '.join(preset_names('accelerators'))}) or a GPU "
                    f"({', '.join(GPUS)}), "
                    "optionally with xN for N of them, or a fabric or accelerator YAML")
