"""AcceleratorSpec: an accelerator instance described by its roofline, for pools that are not
wafers (the vendor's 2026 deployment runs prefill on Trainium servers and decode on CS-3s).

An instance is ``devices`` chips joined by a fast interconnect; a copy of the model spans
``tensor_parallel`` of them. Every number comes from a preset in ``programs/accelerators/`` that
cites ``HARDWARE.md``; what is not published (how close real kernels come to the roofline, the
memory a runtime keeps for itself) is a field marked uncertain, never a constant in code. With
efficiencies of 1 a pool's step times are the roofline's: lower bounds, not predictions.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wse_emu.util.configfile import build_dataclass, check_version, load_named, require, shown


@dataclass(frozen=True)
class AcceleratorSpec:
    """One accelerator instance (a server of ``devices`` chips)."""

    name: str
    device: str
    devices: int  # chips per instance
    tensor_parallel: int  # chips one copy of the model spans (a divisor of ``devices``)
    # Dense peak FLOP/s of one chip: 16-bit matrices, and 8-bit ones (0: not supported).
    bf16_flops_per_s: float
    fp8_flops_per_s: float
    memory_bytes: float  # HBM per chip
    memory_bytes_per_s: float  # HBM bandwidth per chip
    interconnect_bytes_per_s: float  # chip-to-chip, per chip, each way (all-reduce)
    network_bytes_per_s: float  # per instance, out of it (a KV handoff to another system)
    network_latency_s: float = 0.0  # one way, a KV handoff to another system [U]
    # How close kernels come to the roofline (1: the roofline itself) [U].
    matrix_efficiency: float = 1.0
    memory_efficiency: float = 1.0
    # HBM a runtime keeps for itself (activations, workspace, fragmentation) [U].
    reserved_memory_share: float = 0.1
    step_overhead_s: float = 0.0  # per step, launch and synchronization [U]
    instance_power_w: float = 0.0  # 0 where no figure is cited
    description: str = ""

    @property
    def copies(self) -> int:
        """Copies of the model one instance holds."""
        return self.devices // self.tensor_parallel

    def flops_per_s(self, matrix_bytes: float) -> float:
        """Dense peak FLOP/s of one chip for matrices stored in ``matrix_bytes`` per weight."""
        return self.fp8_flops_per_s if matrix_bytes <= 1 and self.fp8_flops_per_s else \
            self.bf16_flops_per_s

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self, source: str) -> "AcceleratorSpec":
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float):
                require(math.isfinite(value), source,
                        f"field '{f.name}' must be a finite number, got {shown(value)}")
        for name in ("devices", "tensor_parallel", "bf16_flops_per_s", "memory_bytes",
                     "memory_bytes_per_s", "interconnect_bytes_per_s", "network_bytes_per_s"):
            require(getattr(self, name) > 0, source, f"field '{name}' must be positive")
        for name in ("fp8_flops_per_s", "step_overhead_s", "instance_power_w",
                     "network_latency_s"):
            require(getattr(self, name) >= 0, source, f"field '{name}' must be >= 0")
        for name in ("matrix_efficiency", "memory_efficiency"):
            require(0 < getattr(self, name) <= 1, source,
                    f"field '{name}' must be in (0, 1], got {shown(getattr(self, name))}")
        require(0 <= self.reserved_memory_share < 1, source,
                f"field 'reserved_memory_share' must be in [0, 1), got "
                f"{shown(self.reserved_memory_share)}")
        require(self.devices % self.tensor_parallel == 0, source,
                f"field 'tensor_parallel' ({self.tensor_parallel}) must divide 'devices' "
                f"({self.devices})")
        return self


def accelerator_from_dict(data: dict[str, Any], source: str) -> AcceleratorSpec:
    check_version(data, source)
    spec = build_dataclass(AcceleratorSpec, data, source, skip=("version", "sources"))
    return spec.validate(source)


def load_accelerator(name_or_path: str | Path) -> AcceleratorSpec:
    """A preset name under ``programs/accelerators/`` or a path to an accelerator YAML file."""
    return load_named("accelerators", "accelerator", name_or_path, accelerator_from_dict)
