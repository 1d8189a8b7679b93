"""FabricSpec: the emulated wafer's parameters, and the cluster of identical wafers.

Every number comes from a preset in ``programs/fabrics/`` that cites ``HARDWARE.md``; uncertain
values (clock, hop and ramp latency, reserved runtime memory, the router's virtual channels and
queue depth) are fields, never constants in code.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wse_emu.errors import ConfigError
from wse_emu.util.configfile import build_dataclass, check_version, load_named, require, shown

# Virtual channels the cycle engine can model: it names a queue's color with five bits and
# keeps a router port's non-empty colors as one 32-bit mask.
MAX_VCS = 32

# Sane upper limits: a typo must not ask for an emulated cluster of hundreds of GiB.
MAX_SIDE = 4096
MAX_SYSTEMS = 64
MAX_CLUSTER_PES = 64 * 755 * 1170  # per-PE plans of 64 wse3 systems fit a 24 GiB machine
MAX_QUEUE_WAVELETS = 1024
# The router model's defaults, for fabric files (and programs saved) before they were fields.
DEFAULT_VIRTUAL_CHANNELS = 4
DEFAULT_QUEUE_WAVELETS = 8


@dataclass(frozen=True)
class FabricSpec:
    """One wafer: a width x height mesh of PEs (the user rectangle) and its per-PE resources."""

    name: str
    width: int
    height: int
    sram_bytes_per_pe: int
    reserved_bytes_per_pe: int
    clock_hz: float
    fp16_flops_per_cycle: int
    fp32_flops_per_cycle: int
    sram_read_bytes_per_cycle: int
    sram_write_bytes_per_cycle: int
    link_bytes_per_cycle: int
    hop_latency_cycles: int
    ramp_latency_cycles: int
    colors_total: int
    colors_reserved: int
    offwafer_bytes_per_s: float
    # The engines' router model (not published; assumptions of the model). The cycle engine
    # gives every router input port one queue of ``queue_wavelets`` wavelets per virtual
    # channel; a message of color class c waits in queue ``c % virtual_channels``. The fast
    # engine has no virtual channels: a blocked message holds the links behind it, less what
    # ``queue_wavelets`` per router absorb.
    virtual_channels: int = DEFAULT_VIRTUAL_CHANNELS
    queue_wavelets: int = DEFAULT_QUEUE_WAVELETS
    host_transfer_overhead_s: float = 0.0
    # Wall power of one whole system, for energy per token; 0 where no figure is cited.
    system_power_w: float = 0.0
    description: str = ""

    @property
    def pes(self) -> int:
        return self.width * self.height

    @property
    def usable_bytes_per_pe(self) -> int:
        """SRAM left for weights, KV cache and activation buffers after code and runtime."""
        return self.sram_bytes_per_pe - self.reserved_bytes_per_pe

    @property
    def sram_bytes_total(self) -> int:
        return self.pes * self.sram_bytes_per_pe

    @property
    def colors_available(self) -> int:
        """Colors a program may allocate: the routable ones minus the runtime's reserved ones."""
        return self.colors_total - self.colors_reserved

    def flops_per_cycle(self, dtype_bytes: int) -> int:
        """Peak FLOP per cycle of one PE for 2-byte (FP16) or 4-byte (FP32) numbers."""
        return self.fp32_flops_per_cycle if dtype_bytes == 4 else self.fp16_flops_per_cycle

    def ridge_flop_per_byte(self) -> float:
        """FP16 FLOP per SRAM byte read at which a read-dominated op turns compute-bound."""
        return self.fp16_flops_per_cycle / self.sram_read_bytes_per_cycle

    def offwafer_bytes_per_cycle(self) -> float:
        return self.offwafer_bytes_per_s / self.clock_hz

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self, source: str) -> "FabricSpec":
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float):
                require(math.isfinite(value), source,
                        f"field '{f.name}' must be a finite number, got {shown(value)}")
        positive = [
            "width", "height", "sram_bytes_per_pe", "clock_hz", "fp16_flops_per_cycle",
            "fp32_flops_per_cycle", "sram_read_bytes_per_cycle", "sram_write_bytes_per_cycle",
            "link_bytes_per_cycle", "colors_total", "offwafer_bytes_per_s",
        ]
        for name in positive:
            require(getattr(self, name) > 0, source, f"field '{name}' must be positive")
        for name in ["reserved_bytes_per_pe", "hop_latency_cycles", "ramp_latency_cycles",
                     "colors_reserved", "host_transfer_overhead_s", "system_power_w"]:
            require(getattr(self, name) >= 0, source, f"field '{name}' must be >= 0")
        for name in ("width", "height"):
            require(getattr(self, name) <= MAX_SIDE, source,
                    f"field '{name}' must be <= {MAX_SIDE}, got {getattr(self, name)}")
        require(self.sram_bytes_per_pe <= 65535, source,
                "field 'sram_bytes_per_pe' must be <= 65535 (per-PE plans are 16-bit)")
        require(self.reserved_bytes_per_pe < self.sram_bytes_per_pe, source,
                "field 'reserved_bytes_per_pe' must be below 'sram_bytes_per_pe'")
        require(self.colors_reserved < self.colors_total, source,
                "field 'colors_reserved' must be below 'colors_total'")
        require(self.colors_total <= 32, source, "field 'colors_total' must be <= 32")
        for name, most in (("virtual_channels", MAX_VCS), ("queue_wavelets", MAX_QUEUE_WAVELETS)):
            value = getattr(self, name)
            require(1 <= value <= most, source,
                    f"field '{name}' must be between 1 and {most}, got {shown(value)}")
        return self


@dataclass(frozen=True)
class ClusterSpec:
    """N identical systems (wafers) joined by off-wafer links."""

    fabric: FabricSpec
    systems: int = 1

    def __post_init__(self):
        if self.systems < 1:
            raise ConfigError(f"`systems` must be at least 1, got {self.systems}")
        if self.systems > MAX_SYSTEMS:
            raise ConfigError(f"`systems` must be at most {MAX_SYSTEMS}, got {self.systems}")
        if self.systems * self.fabric.pes > MAX_CLUSTER_PES:
            raise ConfigError(
                f"{self.systems} x {self.fabric.name} is {self.systems * self.fabric.pes:,} PEs; "
                f"the emulator handles at most {MAX_CLUSTER_PES:,} (64 wse3 systems)")

    @property
    def sram_bytes_total(self) -> int:
        return self.systems * self.fabric.sram_bytes_total

    def describe(self) -> str:
        return f"{self.systems} x {self.fabric.name}"


def fabric_from_dict(data: dict[str, Any], source: str) -> FabricSpec:
    check_version(data, source)
    spec = build_dataclass(FabricSpec, data, source, skip=("version", "sources"))
    return spec.validate(source)


def load_fabric(name_or_path: str | Path) -> FabricSpec:
    """A preset name under ``programs/fabrics/`` or a path to a fabric YAML file."""
    return load_named("fabrics", "fabric", name_or_path, fabric_from_dict)


def with_overrides(spec: FabricSpec, **overrides: Any) -> FabricSpec:
    """A copy with some fields replaced (for the uncertain parameters), re-validated."""
    data = {**spec.to_dict(), **{k: v for k, v in overrides.items() if v is not None}}
    return fabric_from_dict(data, f"fabric {spec.name} with `set`")
