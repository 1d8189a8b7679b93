"""Accelerators as pools: an instance (a preset such as ``trn2``, or an accelerator YAML)
timed by its stated roofline (``pools.accelerator_roofline``), laid out as its file says. A
system is one instance, drawing the instance power its file cites."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from wse_emu.hardware.accelerator import AcceleratorSpec, load_accelerator
from wse_emu.pools.accelerator_roofline import accelerator_pools
from wse_emu.pools.kinds import ServerKind, Side
from wse_emu.util.configfile import preset_names


class AcceleratorKind(ServerKind):
    noun = "an accelerator"
    file_mark = "its `device`"

    def presets(self) -> list[str]:
        return preset_names("accelerators")

    def load(self, name: str) -> AcceleratorSpec:
        return load_accelerator(name)

    def describes(self, mapping: dict) -> bool:
        return "device" in mapping  # an accelerator names its chip

    def load_file(self, path: Path) -> AcceleratorSpec:
        return load_accelerator(path)

    def owns(self, hardware) -> bool:
        return isinstance(hardware, AcceleratorSpec)

    def power_w(self, hardware: AcceleratorSpec) -> float:
        return hardware.instance_power_w

    def label(self, side: Side) -> str:
        count, hw = side.pool.count, side.pool.hardware
        return hw.name if count == 1 else f"{count} x {hw.name}"

    def pools(self, model, side: Side, role: str, first: int, clock_hz: float,
              cache: Path, grid: str) -> list:
        name = side.pool
        axes = {phase: self.table_axes(grid, phase) for phase in ("prefill", "decode")}
        return [replace(pool, engine=self.engine_knobs())
                for pool in accelerator_pools(name.hardware, model, role, clock_hz, name.count,
                                              first, axes)]

    def step_times_source(self, hardware: AcceleratorSpec) -> str:
        return f"the roofline of {hardware.name} (lower bounds)"


ACCELERATOR = AcceleratorKind()
