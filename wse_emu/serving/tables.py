"""Stage-time tables: how long each stage of a region takes for a micro-batch, over a grid of
micro-batch shapes, simulated once with the fast engine and interpolated in between.

Serving a long trace asks for thousands of stage times; simulating each directly would take
hours. Stage time grows smoothly with tokens, batch and context, so a table over a grid,
interpolated bilinearly, stays within a few percent of direct simulation (tested). Tables are
cached on disk under a key made from the program, the region, the engine and the grid, so a
second run with the same program reads them back; each stage's times are cached too, under a
key made from what they depend on (``stage_content``), so a stage alike to one timed for
another program is read back, not timed again. An entry is written whole or not at all,
with a digest of its contents, and one that is damaged is reported, timed again and replaced.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import zipfile
from bisect import bisect_left
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from wse_emu.errors import UserError
from wse_emu.models.layer import MicroBatch, attention_tile_of
from wse_emu.program.format import WaferProgram, hash_arrays
from wse_emu.sim.runner import region_transfers, signature, stage_cycles
from wse_emu.sim.shared_ends import ends_cycles, trips_cycles
from wse_emu.sim.warm import warm_engine
from wse_emu.util.cachedir import user_cache_dir
from wse_emu.util.checks import typed
from wse_emu.util.memory import keep_freed_memory
from wse_emu.util.progress import Phase, warn
from wse_emu.util.workers import gathered

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
# Contexts (and cached prefixes) past the grids' longest, timed only where a workload reaches
# them (``reaching``): a decode step at 131,072 tokens of context read off the grid above would
# be extrapolated from its last two rungs, 7% to 9% short of the engine's time for Llama-3.1-8B
# on one WSE-3 (a prefill tile after such a prefix, 5% short to 17% over).
LONG_CONTEXTS = (32768, 65536, 131072)
VECTORS_KEPT = 100_000  # interpolated shapes remembered per table (about 30 MB at most)
# Pools timed by a formula or from a measured database (accelerators, GPUs) cost next to
# nothing per shape, so their tables span the sizes their serving engines run whatever the
# grid: decode batches of up to 256 sequences, chunks of up to 8,192 tokens
# (``pool_kinds.SERVER_KNOBS``).
SERVER_AXES = {"decode": ((1, 2, 4, 8, 16, 32, 64, 128, 256), DECODE_CONTEXT + LONG_CONTEXTS),
               "prefill": ((16, 64, 256, 1024, 2048, 4096, 8192),
                           PREFILL_PREFIX + LONG_CONTEXTS)}


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


def _timing_sources(engine: str) -> bytes:
    """The code a stage's time on ``engine`` comes from (kernel patterns, the layouts their
    kernels name, the layer description, that engine and what the engines share, the runner,
    the experts' routing): a cached table is reused only while all of it is unchanged. The
    other engine's module and the engines' plain-Python twins are not in it: a change to the
    cycle engine leaves the fast engine's tables as they were."""
    root = Path(__file__).resolve().parent.parent
    others = {module for name, module in ENGINE_MODULES.items() if name != engine}
    engines = [f for f in (root / "engines").glob("*.py")
               if f.name not in others and f.name != "reference.py"]
    files = sorted([*(root / "kernels").rglob("*.py"), *engines,
                    *(root / "program" / name for name in TIMED_LAYOUTS),
                    root / "models" / "layer.py", root / "models" / "routing.py",
                    root / "sim" / "runner.py", root / "sim" / "shared_ends.py"])
    return b"".join(f.read_bytes() for f in files)


# The program format's modules a stage's task graph reads (its other modules only describe it).
TIMED_LAYOUTS = ("trees.py", "kvlayout.py", "expert_runs.py")
# Each engine's own module in ``engines`` (the rest of the package the two share).
ENGINE_MODULES = {"fast": "fast.py", "cycle": "cycle.py"}


@lru_cache(maxsize=None)
def _timing_digest(engine: str) -> str:
    """Read once per engine, when a table is first looked up (not at import)."""
    return hashlib.sha256(_timing_sources(engine)).hexdigest()


def _key(what: str, where: list, phase: str, engine: str, axes) -> str:
    """A cache key: the timing code, ``what`` is timed (a program, or a stage's content),
    ``where`` in it (a region, or nothing), the phase, the engine and the grid."""
    digest = hashlib.sha256()
    digest.update(_timing_digest(engine).encode())
    digest.update(what.encode())
    digest.update(json.dumps([*where, phase, engine, [list(map(int, a)) for a in axes]]).encode())
    return digest.hexdigest()[:24]


# Per grid and phase, the table's two axes.
GRIDS = {"full": {"decode": (DECODE_BATCH, DECODE_CONTEXT),
                  "prefill": (PREFILL_TOKENS, PREFILL_PREFIX)},
         "quick": {"decode": (QUICK_DECODE_BATCH, QUICK_DECODE_CONTEXT),
                   "prefill": (QUICK_PREFILL_TOKENS, QUICK_PREFILL_PREFIX)}}


def default_axes(phase: str) -> tuple:
    return grid_axes("full", phase)


def grid_axes(grid: str, phase: str, reach: int = 0) -> tuple:
    """The axes of ``grid`` ("full" or "quick") for ``phase``, the context (or cached prefix)
    timed as far as ``reach`` tokens (``reaching``)."""
    if grid not in GRIDS:
        raise UserError(f"`grid` must be one of {', '.join(GRIDS)}, got {grid!r}")
    sizes, contexts = GRIDS[grid]["decode" if phase.startswith(VERIFY) else phase]
    return sizes, reaching(contexts, reach)


def reaching(contexts: tuple, reach: int) -> tuple:
    """``contexts`` (a grid's axis of tokens of context, or of cached prefix) with, when
    ``reach`` lies past its last, the rungs of ``LONG_CONTEXTS`` up to the first at or past
    ``reach`` (and ``reach`` itself past the last of those): every context a workload reaches
    is then timed between two rungs, never extrapolated."""
    out = list(contexts)
    for rung in LONG_CONTEXTS:
        if out[-1] >= reach:
            break
        if rung > out[-1]:
            out.append(rung)
    if out[-1] < reach:
        out.append(int(reach))
    return tuple(out)


def longest_context(*requests) -> int:
    """The most tokens of context any of these requests' steps reach (prompt and output;
    ``workload.Requests``): how far its tables must time contexts."""
    return max((int((r.prompt_tokens + r.output_tokens).max()) for r in requests if len(r)),
               default=0)


def timed_table(phase: str, axes: tuple, clock_hz: float, seconds) -> StageTable:
    """A one-stage table over ``axes`` (for ``phase``) from ``seconds(a, b)``, a step's time in
    seconds at each shape (decode: batch, context; prefill: tile tokens, tokens cached before
    it), in cycles of a serving clock of ``clock_hz``: how a pool that is not a compiled
    region (an accelerator's, a GPU's) is timed."""
    axis0, axis1 = axes
    cycles = np.array([[[seconds(int(a), int(b)) * clock_hz for b in axis1] for a in axis0]])
    return StageTable(phase, np.asarray(axis0, float), np.asarray(axis1, float), cycles,
                      np.zeros((len(axis0), len(axis1))))


def table_path(program: WaferProgram, region: str, phase: str, cache_dir: Path,
               engine: str = "fast", axes: tuple | None = None, text: str | None = None) -> Path:
    """Where the table of ``region`` for ``phase`` is cached under ``cache_dir`` (``text``:
    the program as ``program_text`` writes it, when the caller has it already)."""
    axes = default_axes(phase) if axes is None else axes
    what = program_text(program) if text is None else text
    return Path(cache_dir) / f"stage-table-{_key(what, [region], phase, engine, axes)}.npz"


def program_text(program: WaferProgram) -> str:
    """The whole program as its tables' cache keys read it."""
    return json.dumps(program.to_json(), sort_keys=True, default=str)


VERIFY = "verify"  # a verify table's phase: "verify4", for four drafted tokens


def verify_phase(draft_tokens: int) -> str:
    """The phase a table of the later tiles of verify steps of ``draft_tokens`` goes by: it is
    keyed, cached and checked as a phase of its own."""
    return f"{VERIFY}{int(draft_tokens)}"


# A shared-ends table's phase: per stage of a speculating region, the cycles its kernels of the
# model's ends (embedding, LM head) take for one drafted token of each sequence of a decode
# micro-batch, for a draft that shares them (``sim.shared_ends``); between stages, that
# token's trips between the draft's strip and them. Timed at one context, which they do not
# read.
ENDS = "ends"


def ends_axes(grid: str) -> tuple:
    """A shared-ends table's axes: the decode batches of ``grid``, one context."""
    sizes, contexts = grid_axes(grid, "decode")
    return sizes, contexts[:1]


def drafted_of(phase: str) -> int:
    """The drafted tokens of a verify table's phase (0 for a decode's or a prefill's)."""
    return int(phase[len(VERIFY):]) if phase.startswith(VERIFY) else 0


def _step(phase: str, x: int, y: int) -> MicroBatch:
    """A decode of ``x`` sequences at context ``y`` (a verify step, for a verify table), or a
    prefill tile of ``x`` tokens after ``y`` already cached."""
    if phase == "prefill":
        return MicroBatch("prefill", tokens=x, prefix=y)
    return MicroBatch("decode", batch=x, context=y, drafted=drafted_of(phase))


def time_shape(program: WaferProgram, region: str, phase: str, engine: str, stage: int, x: int,
               y: int) -> float:
    """One grid point of a table: the cycles of stage ``stage`` (an id) for shape (x, y), or,
    for ``stage`` -1, the cycles between the region's stages in all. For a verify table, a
    stage's cycles for the whole verify step, as the engine times it (its tiles follow each
    other through the stage), which ``build_tables`` turns into what the table keeps; between
    stages, each tile hops as a decode step's does."""
    step = _step(phase, x, y)
    if phase == ENDS:
        if stage >= 0:
            return float(ends_cycles(program, program.stages[stage], step, engine))
        return float(trips_cycles(program, region, step))
    if stage >= 0:
        # A verify step whole: ``build_tables`` takes its first tile's cycles off, from the
        # decode table's at the same shape, which times that tile alone.
        return float(stage_cycles(program, program.stages[stage], step, engine,
                                  on_forms=True))
    stages = [program.stages[i] for i in program.region(region).stage_ids]
    return float(sum(region_transfers(program, stages, step, engine)[0]))


def stage_content(program: WaferProgram, stage) -> str:
    """What a stage's time depends on, and nothing of where it sits: its shape, its kernels
    (placed relative to it), its layers' attention windows, the model, the fabric and the
    compile options that change how a step runs. Two stages alike in all of it take the same
    time in any program, so their tables are timed once (a colocated layout and a split
    often share stages of one shape)."""
    r = stage.rect
    kernels = []
    for k in program.stage_kernels(stage):
        fields = {f: getattr(k, f) for f in ("name", "kind", "pattern", "layers", "ops",
                                            "matrix", "grid", "k_axis", "length",
                                            "weight_bytes", "root", "trees")}
        fields["ref"] = k.weight_ref is None
        fields["rect"] = [k.rect.x - r.x, k.rect.y - r.y, k.rect.w, k.rect.h]
        kernels.append(fields)
    options = program.options
    return json.dumps({
        "shape": [r.w, r.h], "strip_axis": stage.strip_axis, "layers": stage.num_layers,
        "embedding": stage.has_embedding, "head": stage.has_head, "part": stage.part,
        "windows": [program.model.attention.window(i) for i in range(*stage.layers)],
        "kernels": kernels, "model": program.model.to_dict(),
        "fabric": program.fabric.to_dict(),
        "routing": [str(options.routing), options.routing_seed],
        "attention_tile": attention_tile_of(options)}, sort_keys=True, default=str)


def stage_table_path(program: WaferProgram, stage, phase: str, cache_dir: Path, engine: str,
                     axes: tuple) -> Path:
    """Where one stage's times over ``axes`` are cached under ``cache_dir``."""
    return Path(cache_dir) / f"stage-times-{_stage_key(program, stage, phase, engine, axes)}.npz"


def _stage_key(program: WaferProgram, stage, phase: str, engine: str, axes: tuple) -> str:
    return _key(stage_content(program, stage), [], phase, engine, axes)


@dataclass(frozen=True)
class TableAsk:
    """A stage table wanted: of ``region`` of ``program`` for ``phase``, over ``axes``."""

    program: WaferProgram
    region: str
    phase: str
    axes: tuple


@dataclass
class _Assembly:
    """A table not in the cache yet: where it goes, and which timed stage each stage takes."""

    path: Path | None
    a0: np.ndarray
    a1: np.ndarray
    stage_keys: list  # per stage of the region, the content key of its times
    transfers: int  # index of its transfers' first job


def build_table(program: WaferProgram, region: str, phase: str, engine: str = "fast",
                axes: tuple | None = None, cache_dir: Path | None = None,
                progress=None, pool=None) -> StageTable:
    """The table of ``region`` for ``phase`` (``build_tables`` of one)."""
    axes = default_axes(phase) if axes is None else axes
    return build_tables([TableAsk(program, region, phase, axes)], engine, cache_dir, progress,
                        pool)[0]


def build_tables(asks: list[TableAsk], engine: str = "fast", cache_dir: Path | None = None,
                 progress=None, pool=None) -> list[StageTable]:
    """Every table asked for, read from ``cache_dir`` when it is there. Stages alike
    (``stage_content``), in one region or in any of the programs, are timed once, and a stage
    whose times the cache holds is not timed again. What is left is timed as one batch of
    jobs, a stage at one shape each, longest first: on ``pool``'s workers (worker processes,
    or a cluster's), else on this machine's threads, so that no core waits for one table's
    last shape while another table has work. ``progress(done, total)`` hears of each job (by
    default, a progress bar)."""
    out: list = [None] * len(asks)
    times: dict[str, np.ndarray] = {}  # stage content key -> (len(a0), len(a1)) cycles
    todo: dict[str, tuple] = {}  # content key -> (program, stage, phase, a0, a1, path)
    first_tiles: dict[str, str] = {}  # a verify stage's content key -> its decode's
    pending: dict[int, _Assembly] = {}
    jobs: list[tuple] = []
    blobs = _Blobs()
    texts: dict[int, str] = {}  # each program written out once (its tables' keys read it)
    for i, ask in enumerate(asks):
        program, phase = ask.program, ask.phase
        a0, a1 = (np.asarray(a, dtype=np.int64) for a in ask.axes)
        stages = [program.stages[s] for s in program.region(ask.region).stage_ids]
        path = None
        if cache_dir is not None:
            if id(program) not in texts:
                texts[id(program)] = program_text(program)
            path = table_path(program, ask.region, phase, cache_dir, engine, ask.axes,
                              texts[id(program)])
            table = _cached(path, phase, len(stages), a0, a1)
            if table is not None:
                out[i] = table
                continue
        # Stages alike (``signature``, as ``run_region`` has it) take the first one's times.
        first_of: dict[tuple, str] = {}
        stage_keys = []

        def wanted(stage, phase: str) -> str:
            """The content key of ``stage``'s times for ``phase``, which are read back from
            the cache or queued to be timed unless they already are."""
            key = _stage_key(program, stage, phase, engine, ask.axes)
            if key not in times and key not in todo:
                known = None
                spath = None
                if cache_dir is not None:
                    spath = Path(cache_dir) / f"stage-times-{key}.npz"
                    known = _cached(spath, phase, 1, a0, a1)
                if known is not None:
                    times[key] = known.cycles[0]
                else:
                    todo[key] = (program, stage, phase, a0, a1, spath)
                    if phase.startswith(VERIFY):
                        # A verify step's first tile is a decode step at the same shape:
                        # its cycles are the decode table's, taken from there.
                        first_tiles[key] = wanted(stage, "decode")
            return key

        for stage in stages:
            sig = signature(program, stage)
            if sig not in first_of:
                first_of[sig] = wanted(stage, phase)
            stage_keys.append(first_of[sig])
        # The transfers between the region's stages (stage -1: closed forms, unless the
        # embeddings are tied), at every shape.
        pending[i] = _Assembly(path, a0, a1, stage_keys, len(jobs))
        jobs += [(*blobs.of(program), ask.region, phase, engine, -1, int(x), int(y))
                 for x in a0 for y in a1]
    first_stage_job = len(jobs)
    # Longest first: a stage's time grows with its PEs (its tasks and messages).
    order = sorted(todo, key=lambda k: -todo[k][1].rect.w * todo[k][1].rect.h)
    weights = []
    for key in order:
        program, stage, phase, a0, a1, _ = todo[key]
        jobs += [(*blobs.of(program), "", phase, engine, stage.id, int(x), int(y))
                 for x in a0 for y in a1]
        weights += [stage.rect.w * stage.rect.h] * (len(a0) * len(a1))
    if not jobs:
        return out
    if progress is None:
        what = f"{len(todo)} stage{'s' if len(todo) != 1 else ''}"
        bar = Phase(f"timing the stage tables ({what} at every shape)", len(jobs),
                    weights + [0] * first_stage_job)
        progress = lambda done, total: bar.update(done)  # noqa: E731
    # Submitted stage jobs first (longest first), the cheap transfers last.
    ordered = jobs[first_stage_job:] + jobs[:first_stage_job]
    # A first compile said, before the threads or the workers wait on it (the workers load
    # what it wrote to Numba's cache, rather than each compiling the engine with nothing said).
    warm_engine(engine)
    if pool is not None and pool.parallel:
        timed = pool.bind(time_blob, ())(ordered, done=lambda n: progress(n, len(jobs)))
    else:
        timed = _on_threads(ordered, lambda n: progress(n, len(jobs)))
    timed = timed[len(jobs) - first_stage_job:] + timed[:len(jobs) - first_stage_job]
    at = first_stage_job
    for key in order:
        _, _, _, a0, a1, _ = todo[key]
        times[key] = np.asarray(timed[at:at + len(a0) * len(a1)], dtype=np.float64).reshape(
            len(a0), len(a1))
        at += len(a0) * len(a1)
    for key, decode in first_tiles.items():
        # What a verify table keeps: the stage's cycles per later tile, its time beyond its
        # first tile's over the drafted tokens.
        times[key] = (times[key] - times[decode]) / drafted_of(todo[key][2])
    for key in order:
        _, _, phase, a0, a1, spath = todo[key]
        grid = times[key]
        if spath is not None:
            spath.parent.mkdir(parents=True, exist_ok=True)
            StageTable(phase, a0, a1, grid[None], np.zeros_like(grid)).to_npz(spath)
    for i, job in pending.items():
        n = len(job.a0) * len(job.a1)
        transfers = np.asarray(timed[job.transfers:job.transfers + n],
                               dtype=np.float64).reshape(len(job.a0), len(job.a1))
        cycles = np.stack([times[key] for key in job.stage_keys])
        out[i] = StageTable(asks[i].phase, job.a0, job.a1, cycles, transfers)
        if job.path is not None:
            job.path.parent.mkdir(parents=True, exist_ok=True)
            out[i].to_npz(job.path)
    return out


class _Blobs:
    """Each program once as a pickle, without what timing never reads (its per-PE arrays,
    routes and summary), and a digest to know it by: a job carries these bytes, and a worker
    unpickles them once (``time_blob``)."""

    def __init__(self):
        self.made: dict[int, tuple[str, bytes]] = {}

    def of(self, program: WaferProgram) -> tuple[str, bytes]:
        if id(program) not in self.made:
            light = dataclasses.replace(program, arrays={}, routes=[], summary={})
            blob = pickle.dumps(light, protocol=pickle.HIGHEST_PROTOCOL)
            self.made[id(program)] = (hashlib.sha256(blob).hexdigest(), blob)
        return self.made[id(program)]


_PROGRAMS: dict[str, WaferProgram] = {}  # in a worker: the programs it has unpickled, by digest
_PROGRAMS_KEPT = 16


def time_blob(digest: str, blob: bytes, region: str, phase: str, engine: str, stage: int,
              x: int, y: int) -> float:
    """``time_shape`` of a program given as ``_Blobs`` made it."""
    keep_freed_memory()  # the next shape reuses this one's pages (``util.memory``)
    program = _PROGRAMS.get(digest)
    if program is None:
        if len(_PROGRAMS) >= _PROGRAMS_KEPT:
            _PROGRAMS.clear()
        program = _PROGRAMS[digest] = pickle.loads(blob)
    return time_shape(program, region, phase, engine, stage, x, y)


def _on_threads(jobs: list, done) -> list:
    """``time_blob`` of every job on parallel threads, results in job order (the engine
    releases the GIL, and the results do not depend on the order)."""
    threads = ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1))
    try:
        return gathered([threads.submit(time_blob, *job) for job in jobs], as_completed, done)
    finally:
        # Not waited for: after Ctrl-C (or an error) the shapes still being timed are of no use.
        threads.shutdown(wait=False, cancel_futures=True)


@typed
def default_cache_dir(cache_dir: Path | str | None = None) -> Path:
    """Where stage-time tables are kept: ``cache_dir``, else the user's cache directory. A
    ``cache_dir`` no folder can be made at (empty, a file, under a file) is refused here, by
    name: the functions that take one call this before any work, since the tables are
    written only after minutes of timing them."""
    if cache_dir is None:
        return user_cache_dir()
    if not str(cache_dir).strip():
        # Not read as "the default": an empty --cache-dir is more likely a variable unset.
        raise UserError("`cache_dir` is empty: give a folder (or none, for the user's cache)")
    path = Path(cache_dir)
    found = next(p for p in (path, *path.absolute().parents) if p.exists())
    if not found.is_dir():
        where = "is a file" if found == path else f"is under a file ({found})"
        raise UserError(f"`cache_dir` {path} {where}: stage-time tables are kept in a folder")
    return path
