"""Stage-time tables: how long each stage of a region takes for a micro-batch, over a grid of
micro-batch shapes, simulated once with the fast engine and interpolated in between.

Serving a long trace asks for thousands of stage times; simulating each directly would take
hours. Stage time grows smoothly with tokens, batch and context, so a table over a grid,
interpolated bilinearly, stays within a few percent of direct simulation (tested). Tables are
cached on disk under a key made from the program, the region, the engine and the grid, so a
second run with the same program reads them back; an entry is written whole or not at all,
with a digest of its contents, and one that is damaged is reported, timed again and replaced.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from bisect import bisect_left
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from wse_emu.errors import UserError
from wse_emu.layer import MicroBatch
from wse_emu.program import WaferProgram, hash_arrays
from wse_emu.progress import Phase, warn
from wse_emu.runner import run_region
from wse_emu.runtime.workers import gathered

DECODE_BATCH = (1, 2, 4, 8, 16, 32, 64)
DECODE_CONTEXT = (64, 256, 1024, 4096, 16384)
PREFILL_TOKENS = (16, 64, 256, 1024, 4096)
PREFILL_PREFIX = (0, 1024, 4096, 16384)
# A coarser grid, for a first look in a fraction of the time (``wse-emu demo``): 21 shapes
# instead of 55, for micro-batches of up to 64 sequences and prefill tiles of up to 256 tokens.
# On Llama-3.1-8B on one WSE-3 (colocated) it is within 4.5% of the full grid at every one of
# the full grid's shapes in that range, stage by stage (within 1.2% for the stages' sum).
QUICK_DECODE_BATCH = (1, 4, 32, 64)
QUICK_DECODE_CONTEXT = (64, 4096, 16384)
QUICK_PREFILL_TOKENS = (16, 64, 256)
QUICK_PREFILL_PREFIX = (0, 4096, 16384)
VECTORS_KEPT = 100_000  # interpolated shapes remembered per table (about 30 MB at most)


# The knobs that size a micro-batch, and the phase whose table times it.
MICRO_BATCH_KNOBS = {"batch_limit": "decode", "prefill_tile": "prefill",
                     "token_budget": "prefill"}


def check_in_grid(values: dict, grid: str) -> None:
    """Micro-batch sizes (knob name -> value) must lie within the tables of ``grid``: their
    times are interpolated inside the grid, not guessed beyond."""
    for name, value in values.items():
        if name in MICRO_BATCH_KNOBS:
            top = int(grid_axes(grid, MICRO_BATCH_KNOBS[name])[0][-1])
            if value > top:
                raise UserError(f"`{name}` must be between 1 and {top} (the range of the "
                                f"stage tables' {grid} grid), got {value}")


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
        # (len(axis0), len(axis1), stages + 2): every stage's cycles, the transfers, and the
        # stages' sum (wanted for every micro-batch; interpolating it costs nothing more).
        self._grid = np.concatenate([np.moveaxis(self.cycles, 0, -1),
                                     self.transfers[:, :, None],
                                     self.cycles.sum(axis=0)[:, :, None]], axis=-1)
        self._lines: dict = {}  # a -> the grid interpolated along axis0 at a, and its steps
        self._vectors: dict = {}  # (a, b) -> vector: serving asks for the same shapes again

    def scaled(self, factor: float) -> "StageTable":
        """The same table with every time ``factor`` times as long (the stages' and the
        transfers' alike): a step time off by that much, the hardware left as it is."""
        return StageTable(self.phase, self.axis0, self.axis1, self.cycles * factor,
                          self.transfers * factor)

    def __getstate__(self) -> dict:
        """The table without its caches: they can be large, and a pool may pickle the table
        while this process is still adding to them."""
        return {k: getattr(self, k) for k in ("phase", "axis0", "axis1", "cycles", "transfers")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__post_init__()

    def vector(self, a: float, b: float) -> np.ndarray:
        """Cycles of every stage, then the cycles between stages in all, then the stages' sum,
        at (a, b).
        Interpolated bilinearly: first along axis0 at ``a`` (kept, since micro-batches come
        in few sizes), then along axis1."""
        known = self._vectors.get((a, b))
        if known is not None:
            return known
        found = self._lines.get(a)
        line, steps = found if found is not None else self._line(a)
        y = self._y
        if len(y) == 1:
            return line[0]
        j = bisect_left(y, b) - 1  # the interval holding b, the end ones extended
        j = 0 if j < 0 else min(j, len(y) - 2)
        fy = (b - y[j]) / (y[j + 1] - y[j])
        v = line[j] + fy * steps[j]
        if not 0.0 <= fy <= 1.0:
            v = np.maximum(v, 0.0)  # extended past the grid: never below zero
        if len(self._vectors) < VECTORS_KEPT:
            self._vectors[(a, b)] = v
        return v

    def grid(self) -> np.ndarray:
        """(len(axis0), len(axis1), stages + 2): every stage's cycles, the transfers and the
        stages' sum at each grid point, as ``vector`` interpolates them."""
        return self._grid

    def at(self, a: float, b: float) -> tuple[np.ndarray, float]:
        """(cycles of every stage, cycles between stages in all) at (a, b), interpolated."""
        v = self.vector(a, b)
        return v[:-2], float(v[-2])

    def stage_cycles(self, a: float, b: float) -> np.ndarray:
        """Interpolated cycles of every stage at (a, b)."""
        return self.at(a, b)[0]

    def transfer_cycles(self, a: float, b: float) -> float:
        return self.at(a, b)[1]

    def _line(self, a: float):
        found = self._lines.get(a)
        if found is None:
            i, fx = _position(self._x, a)
            i1 = min(i + 1, len(self._x) - 1)
            line = (1 - fx) * self._grid[i] + fx * self._grid[i1]
            if not 0.0 <= fx <= 1.0:
                line = np.maximum(line, 0.0)
            steps = np.diff(line, axis=0) if len(line) > 1 else np.zeros_like(line)
            found = (line, steps)
            if len(self._lines) < 100_000:
                self._lines[a] = found
        return found

    def arrays(self) -> dict:
        return {"phase": np.asarray(self.phase), "axis0": np.asarray(self.axis0),
                "axis1": np.asarray(self.axis1), "cycles": np.asarray(self.cycles),
                "transfers": np.asarray(self.transfers)}

    def to_npz(self, path: Path) -> None:
        """Written under a temporary name, then renamed (a crash or a full disk leaves no
        half-written table under ``path``), with a digest of its contents."""
        arrays = self.arrays()
        # Named for this process, so that two workers timing the same table never write
        # into one file; a writer killed midway leaves only its own ``.partial``, never read.
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        try:
            with open(partial, "wb") as fh:
                np.savez(fh, digest=np.asarray(_digest_of(arrays)), **arrays)
                fh.flush()
                os.fsync(fh.fileno())  # on disk before it takes the name
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)

    @classmethod
    def from_npz(cls, path: Path) -> "StageTable":
        """The table stored at ``path``; ValueError saying what is wrong if it cannot be read
        or its contents do not match their digest."""
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {name: z[name] for name in TABLE_ARRAYS}
                # Entries written before digests were kept have none; they were written whole
                # (under a temporary name, then renamed) and are checked for shape only.
                digest = str(z["digest"]) if "digest" in z.files else None
        except KeyError as exc:
            raise ValueError(f"it has no {exc}") from None
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise ValueError(f"it cannot be read ({exc.__class__.__name__}: {exc})") from None
        if digest is not None and digest != _digest_of(arrays):
            raise ValueError("its contents do not match the digest written with them")
        return cls(str(arrays["phase"]), arrays["axis0"], arrays["axis1"], arrays["cycles"],
                   arrays["transfers"])


TABLE_ARRAYS = ("phase", "axis0", "axis1", "cycles", "transfers")


def _digest_of(arrays: dict) -> str:
    """A digest of a table's arrays: their names, dtypes, shapes and bytes."""
    digest = hashlib.sha256()
    hash_arrays(digest, arrays, TABLE_ARRAYS)
    return digest.hexdigest()


def _cached(path: Path, phase: str, stages: int, a0, a1) -> "StageTable | None":
    """The table cached at ``path`` if it is there, whole, and of the shape asked for; else
    None, with a warning if something was there (it is timed again and overwritten)."""
    if not path.exists():
        return None
    try:
        table = StageTable.from_npz(path)
        if table.phase != phase or not np.array_equal(table.axis0, a0) \
                or not np.array_equal(table.axis1, a1):
            raise ValueError("it is of another phase or grid than its name says")
        if table.cycles.shape != (stages, len(a0), len(a1)) \
                or table.transfers.shape != (len(a0), len(a1)):
            raise ValueError(f"its cycles are shaped {table.cycles.shape}, not "
                             f"{(stages, len(a0), len(a1))}")
        if not (np.isfinite(table.cycles).all() and (table.cycles >= 0).all()
                and np.isfinite(table.transfers).all() and (table.transfers >= 0).all()):
            raise ValueError("it holds times that are negative or not numbers")
    except ValueError as exc:
        warn(f"the cached stage table {path} is unusable ({exc}): timing it again")
        return None
    return table


def _position(x: list, a: float) -> tuple[int, float]:
    """The grid interval holding ``a`` and the position inside it (below 0 or above 1 outside
    the grid: the end interval extended). Bilinear interpolation over a cell is exact for times
    of the form c0 + c1*a + c2*b + c3*a*b: fixed latency, per-token work, per-cached-token
    work, and attention's per-token-per-cached-token work; the same form carries on past the
    grid's ends (a 4-token tile of a prompt, a context longer than any timed)."""
    i = min(max(bisect_left(x, a) - 1, 0), max(len(x) - 2, 0))
    return i, (0.0 if len(x) == 1 else (a - x[i]) / (x[i + 1] - x[i]))


def _timing_sources() -> bytes:
    """The code a stage's time comes from (kernel patterns, the layer description, the
    engines, the runner, the experts' routing): a cached table is reused only while all of it
    is unchanged."""
    root = Path(__file__).resolve().parent.parent
    files = sorted([*(root / "kernels").glob("*.py"), *(root / "engines").glob("*.py"),
                    root / "layer.py", root / "runner.py", root / "routing.py"])
    return b"".join(f.read_bytes() for f in files)


@lru_cache(maxsize=1)
def _timing_digest() -> str:
    """Read once, when a table is first looked up (not at import)."""
    return hashlib.sha256(_timing_sources()).hexdigest()


def _key(program: WaferProgram, region: str, phase: str, engine: str, axes) -> str:
    digest = hashlib.sha256()
    digest.update(_timing_digest().encode())
    digest.update(json.dumps(program.to_json(), sort_keys=True, default=str).encode())
    digest.update(json.dumps([region, phase, engine, [list(map(int, a)) for a in axes]]).encode())
    return digest.hexdigest()[:24]


# Per grid and phase, the table's two axes.
GRIDS = {"full": {"decode": (DECODE_BATCH, DECODE_CONTEXT),
                  "prefill": (PREFILL_TOKENS, PREFILL_PREFIX)},
         "quick": {"decode": (QUICK_DECODE_BATCH, QUICK_DECODE_CONTEXT),
                   "prefill": (QUICK_PREFILL_TOKENS, QUICK_PREFILL_PREFIX)}}


def default_axes(phase: str) -> tuple:
    return GRIDS["full"][phase]


def grid_axes(grid: str, phase: str) -> tuple:
    """The axes of ``grid`` ("full" or "quick") for ``phase``."""
    if grid not in GRIDS:
        raise UserError(f"`grid` must be one of {', '.join(GRIDS)}, got {grid!r}")
    return GRIDS[grid][phase]


def table_path(program: WaferProgram, region: str, phase: str, cache_dir: Path,
               engine: str = "fast", axes: tuple | None = None) -> Path:
    """Where the table of ``region`` for ``phase`` is cached under ``cache_dir``."""
    axes = default_axes(phase) if axes is None else axes
    return Path(cache_dir) / f"stage-table-{_key(program, region, phase, engine, axes)}.npz"


def time_shape(program: WaferProgram, region: str, phase: str, engine: str, x: int,
               y: int) -> tuple[list, float]:
    """One grid point of a table: every stage's cycles and the transfers between them, for a
    decode of ``x`` sequences at context ``y`` or a prefill tile of ``x`` tokens after ``y``
    (each shape's stages one after another: shapes are what runs in parallel)."""
    step = (MicroBatch("decode", batch=x, context=y) if phase == "decode"
            else MicroBatch("prefill", tokens=x, prefix=y))
    run = run_region(program, region, step, engine, threads=1)
    return [s.cycles for s in run.stages], float(sum(run.transfers))


def build_table(program: WaferProgram, region: str, phase: str, engine: str = "fast",
                axes: tuple | None = None, cache_dir: Path | None = None,
                progress=None, pool=None) -> StageTable:
    """The table of ``region`` for ``phase``, read from ``cache_dir`` when it is there.
    ``progress(done, total)`` hears of each shape timed (by default, a progress bar). The
    shapes are timed on ``pool``'s workers when it is a cluster's (``pool.remote``), else on
    this machine's cores."""
    if axes is None:
        axes = default_axes(phase)
    a0, a1 = (np.asarray(a, dtype=np.int64) for a in axes)
    stages = len(program.region(region).stage_ids)
    path = None
    if cache_dir is not None:
        path = table_path(program, region, phase, cache_dir, engine, axes)
        table = _cached(path, phase, stages, a0, a1)
        if table is not None:
            return table
    cycles = np.zeros((stages, len(a0), len(a1)), dtype=np.float64)
    transfers = np.zeros((len(a0), len(a1)), dtype=np.float64)
    points = [(i, j) for i in range(len(a0)) for j in range(len(a1))]
    if progress is None:
        bar = Phase(f"timing the {phase} stage table of region {region}", len(points))
        progress = lambda done, total: bar.update(done)  # noqa: E731
    jobs = [(int(a0[i]), int(a1[j])) for i, j in points]
    if pool is not None and getattr(pool, "remote", False):
        run = pool.bind(time_shape, (program, region, phase, engine))
        timed = run(jobs, done=lambda n: progress(n, len(jobs)))
    else:
        timed = _on_threads(program, region, phase, engine, jobs,
                            lambda n: progress(n, len(jobs)))
    for (i, j), (stage_cycles, between) in zip(points, timed):
        cycles[:, i, j] = stage_cycles
        transfers[i, j] = between
    table = StageTable(phase, a0, a1, cycles, transfers)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        table.to_npz(path)
    return table


def _on_threads(program, region, phase, engine, jobs: list, done) -> list:
    """``time_shape`` of every (x, y) job on parallel threads, results in job order. Each
    shape's stages run one after another, so the cores stay busy to the end (timing one
    shape's stages in parallel would wait on its largest stage, the LM head's); the engine
    releases the GIL, and the results do not depend on the order."""
    with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as threads:
        return gathered([threads.submit(time_shape, program, region, phase, engine, x, y)
                         for x, y in jobs], as_completed, done)
