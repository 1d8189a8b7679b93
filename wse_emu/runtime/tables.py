"""Stage-time tables: how long each stage of a region takes for a micro-batch, over a grid of
micro-batch shapes, simulated once with the fast engine and interpolated in between.

Serving a long trace asks for thousands of stage times; simulating each directly would take
hours. Stage time grows smoothly with tokens, batch and context, so a table over a grid,
interpolated bilinearly, stays within a few percent of direct simulation (tested). Tables are
cached on disk under a key made from the program, the region, the engine and the grid, so a
second run with the same program reads them back.
"""

from __future__ import annotations

import hashlib
import json
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wse_emu.kernels.stage import Step
from wse_emu.program import WaferProgram
from wse_emu.runner import run_region

DECODE_BATCH = (1, 2, 4, 8, 16, 32, 64)
DECODE_CONTEXT = (64, 256, 1024, 4096, 16384)
PREFILL_TOKENS = (16, 64, 256, 1024, 4096)
PREFILL_PREFIX = (0, 1024, 4096, 16384)


@dataclass
class StageTable:
    """Per stage of a region, cycles over a 2-D grid: decode (batch, context) or prefill
    (tile tokens, tokens already cached before the tile)."""

    phase: str
    axis0: np.ndarray
    axis1: np.ndarray
    cycles: np.ndarray  # (stages, len(axis0), len(axis1))
    transfers: np.ndarray  # (len(axis0), len(axis1)) cycles between stages, summed

    def __post_init__(self):
        self._x = [float(v) for v in self.axis0]  # plain lists: fast scalar look-ups
        self._y = [float(v) for v in self.axis1]

    def at(self, a: float, b: float) -> tuple[np.ndarray, float]:
        """(cycles of every stage, cycles between stages in all) at (a, b), interpolated."""
        i, j, i1, j1, fx, fy = _cell(self._x, self._y, a, b)
        w00, w10, w01, w11 = (1 - fx) * (1 - fy), fx * (1 - fy), (1 - fx) * fy, fx * fy
        c, t = self.cycles, self.transfers
        stages = w00 * c[:, i, j] + w10 * c[:, i1, j] + w01 * c[:, i, j1] + w11 * c[:, i1, j1]
        between = w00 * t[i, j] + w10 * t[i1, j] + w01 * t[i, j1] + w11 * t[i1, j1]
        return stages, float(between)

    def stage_cycles(self, a: float, b: float) -> np.ndarray:
        """Interpolated cycles of every stage at (a, b); clamped to the grid's range."""
        return self.at(a, b)[0]

    def transfer_cycles(self, a: float, b: float) -> float:
        return self.at(a, b)[1]

    def to_npz(self, path: Path) -> None:
        np.savez(path, phase=self.phase, axis0=self.axis0, axis1=self.axis1, cycles=self.cycles,
                 transfers=self.transfers)

    @classmethod
    def from_npz(cls, path: Path) -> "StageTable":
        with np.load(path) as z:
            return cls(str(z["phase"]), z["axis0"], z["axis1"], z["cycles"], z["transfers"])


def _cell(x, y, a: float, b: float):
    """The grid cell holding (a, b), clamped to the grid, and the position inside it.
    Bilinear interpolation over the cell is exact for times of the form c0 + c1*a + c2*b +
    c3*a*b: fixed latency, per-token work, per-cached-token work, and attention's
    per-token-per-cached-token work."""
    a = min(max(a, x[0]), x[-1])
    b = min(max(b, y[0]), y[-1])
    i = min(max(bisect_left(x, a) - 1, 0), max(len(x) - 2, 0))
    j = min(max(bisect_left(y, b) - 1, 0), max(len(y) - 2, 0))
    fx = 0.0 if len(x) == 1 else (a - x[i]) / (x[i + 1] - x[i])
    fy = 0.0 if len(y) == 1 else (b - y[j]) / (y[j + 1] - y[j])
    return i, j, min(i + 1, len(x) - 1), min(j + 1, len(y) - 1), fx, fy


def _key(program: WaferProgram, region: str, phase: str, engine: str, axes) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps(program.to_json(), sort_keys=True, default=str).encode())
    digest.update(json.dumps([region, phase, engine, [list(map(int, a)) for a in axes]]).encode())
    return digest.hexdigest()[:24]


def build_table(program: WaferProgram, region: str, phase: str, engine: str = "fast",
                axes: tuple | None = None, cache_dir: Path | None = None,
                progress=None) -> StageTable:
    """The table of ``region`` for ``phase``, read from ``cache_dir`` when it is there."""
    if axes is None:
        axes = (DECODE_BATCH, DECODE_CONTEXT) if phase == "decode" else (PREFILL_TOKENS,
                                                                          PREFILL_PREFIX)
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"stage-table-{_key(program, region, phase, engine, axes)}.npz"
        if path.exists():
            return StageTable.from_npz(path)
    a0, a1 = (np.asarray(a, dtype=np.int64) for a in axes)
    stages = len(program.region(region).stage_ids)
    cycles = np.zeros((stages, len(a0), len(a1)), dtype=np.float64)
    transfers = np.zeros((len(a0), len(a1)), dtype=np.float64)
    total, done = len(a0) * len(a1), 0
    for i, x in enumerate(a0):
        for j, y in enumerate(a1):
            if phase == "decode":
                step = Step("decode", batch=int(x), context=int(y))
            else:
                step = Step("prefill", tokens=int(x), prefix=int(y))
            run = run_region(program, region, step, engine)
            cycles[:, i, j] = [s.cycles for s in run.stages]
            transfers[i, j] = sum(run.transfers)
            done += 1
            if progress:
                progress(done, total)
    table = StageTable(phase, a0, a1, cycles, transfers)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        table.to_npz(tmp)
        tmp.replace(path)
    return table
