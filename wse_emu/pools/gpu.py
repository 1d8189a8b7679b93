"""GPUs as pools: GPUs timed from AIConfigurator's measured data (``pools.gpu_measured``, the
``gpu`` extra; refused by name without it), named by our names for them (``h200``) with the
GPUs per copy when fixed (``h200x8tp2``), else tried at every tensor parallel degree that holds
the model. A system is one node of them (part of a node counts whole); a unit draws the
database's GPU power."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from wse_emu.pools.gpu_measured import GPUS, GpuSpec, gpu_pools, load_gpu, tensor_parallel
from wse_emu.pools.kinds import ServerKind, Side


class GpuKind(ServerKind):
    noun = "a GPU"
    takes_tp = True

    def presets(self) -> list[str]:
        return list(GPUS)

    def load(self, name: str) -> GpuSpec:
        return load_gpu(name)  # refused by name without the extra

    def owns(self, hardware) -> bool:
        return isinstance(hardware, GpuSpec)

    def per_system(self, hardware: GpuSpec) -> int:
        return hardware.gpus_per_node

    def power_w(self, hardware: GpuSpec) -> float:
        return hardware.power_w

    def variants(self, name, model, copies: tuple, depths: tuple) -> list[Side]:
        """At the degree named, or each power of two from the fewest GPUs that hold the
        model to a node or the pool's GPUs (the splits AIConfigurator tries)."""
        gpu = name.hardware
        if name.tensor_parallel is not None:
            return [Side(name, tensor_parallel(gpu, model, name.count, name.tensor_parallel))]
        tp, out = tensor_parallel(gpu, model, name.count), []
        while tp <= min(name.count, gpu.gpus_per_node):
            if name.count % tp == 0:
                out.append(Side(name, tp))
            tp *= 2
        return out

    def label(self, side: Side) -> str:
        return f"{side.pool.count} x {side.pool.hardware.name} tp{side.tp}"

    def pools(self, model, side: Side, role: str, first: int, clock_hz: float,
              cache: Path, grid: str) -> list:
        name = side.pool
        axes = {phase: self.table_axes(grid, phase) for phase in ("prefill", "decode")}
        return [replace(pool, engine=self.engine_knobs())
                for pool in gpu_pools(name.hardware, model, role, clock_hz, name.count, first,
                                      axes, side.tp or name.tensor_parallel)]

    def step_times_source(self, hardware: GpuSpec) -> str:
        return hardware.source


GPU = GpuKind()
