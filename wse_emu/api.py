"""The Python face of wse-emu: what the command line does, as functions returning the objects
it prints. It wires the compiler, the emulated hardware, the serving runtime and the figures
together, as the command line does (the rest of ``wse_emu`` imports neither the compiler nor
the figures).

    from wse_emu import api
    program = api.compile("llama-3.1-8b", "wse3")
    step = api.run(program, "decode", batch=1, context=4096)
    print(f"{step.step_seconds * 1e6:.0f} us per token")

Errors in the inputs raise ``wse_emu.errors.UserError`` (the command line prints them as one
line and exits with 2), naming the argument, before any work: each function checks every
argument against its annotation on entry (``checks.typed``), then by range.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from pathlib import Path

import numpy as np

from wse_emu.compiler.bounds import stage_bounds
from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.options import CompileOptions, parse_region
from wse_emu.compiler.partition import disaggregated_splits, wafers_needed
from wse_emu.errors import CompileError, UserError
from wse_emu.experiments import frontier as frontier_mod
from wse_emu.experiments.comparison import (
    ExperimentReport,
    Space,
    StepTiming,
    VaryReport,
    describe_draws,
    disagg_experiment,
    longer_draws,
    tuning_requests,
    vary_experiment,
    workload_draws,
)
from wse_emu.experiments.goodput import RunBook, Targets
from wse_emu.experiments.layouts import (
    Footprint,
    PoolCluster,
    PoolHardware,
    per_kind_text,
    plan_pools,
    pool_layouts,
    pools_name,
    systems_of,
)
from wse_emu.experiments.pairings import PairingsReport, pairing_label
from wse_emu.experiments.sensitivity import StepScale, decode_step_s, parse_vary
from wse_emu.experiments.tuning import Layout, serve_choice
from wse_emu.hardware.fabric import ClusterSpec, FabricSpec, with_overrides
from wse_emu.hardware.fabric import load_fabric as fabric_file
from wse_emu.models.layer import MicroBatch
from wse_emu.models.load import load_model as model_file
from wse_emu.models.routing import Routing
from wse_emu.models.spec import ModelSpec, check_positions, formats_text, stored_as
from wse_emu.pools.kinds import Side
from wse_emu.pools.names import parse_pool
from wse_emu.pools.wafer import WAFER
from wse_emu.program.format import WaferProgram
from wse_emu.serving.metrics import RunMetrics, run_metrics
from wse_emu.serving.policies import check_in_tables
from wse_emu.serving.pools import wafer_pools, wafer_pools_of
from wse_emu.serving.serve import (
    LOOPS,
    ServeOptions,
    ServeResult,
    kv_shortfall,
    position_shortfall,
    setting_names,
)
from wse_emu.serving.serve import serve as serve_requests
from wse_emu.serving.workload import MAX_DRAWS, Requests, WorkloadSpec, workload_spec
from wse_emu.serving.workload import generate as generate_requests
from wse_emu.sim.runner import (
    DEFAULT_PREFILL_TILES,
    ENGINES,
    MAX_PREFILL_TILES,
    RegionRun,
    run_region,
    step_for,
)
from wse_emu.sweeps.sweep import (
    SweepRow,
    SweepSpec,
    check_size,
    claim_directory,
    load_sweep,
    run_sweep,
)
from wse_emu.util.checks import is_number, of_type, one_of, positive, short_repr, typed, whole
from wse_emu.util.fmt import seconds
from wse_emu.util.workers import HERE, point_pool

__all__ = ["load_model", "load_fabric", "compile", "run", "serve", "serve_pools", "experiment",
           "frontier", "pairings", "generate", "sweep", "draw", "Space", "Targets",
           "default_cache_dir"]


@typed
def default_cache_dir(cache_dir: Path | str | None = None) -> Path:
    """Where stage-time tables are kept: ``cache_dir``, else the user's cache directory. A
    ``cache_dir`` no folder can be made at (empty, a file, under a file) is refused here, by
    name: the functions that take one call this before any work, since the tables are
    written only after minutes of timing them."""
    if cache_dir is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                                ".cache")
        return Path(base) / "wse-emu"
    if not str(cache_dir).strip():
        # Not read as "the default": an empty --cache-dir is more likely a variable unset.
        raise UserError("`cache_dir` is empty: give a folder (or none, for the user's cache)")
    path = Path(cache_dir)
    found = next(p for p in (path, *path.absolute().parents) if p.exists())
    if not found.is_dir():
        where = "is a file" if found == path else f"is under a file ({found})"
        raise UserError(f"`cache_dir` {path} {where}: stage-time tables are kept in a folder")
    return path


@typed
def load_model(name_or_path: Path | str) -> ModelSpec:
    """A model preset's name (``programs/models/``), a model YAML, or a Hugging Face
    config.json (the file or its folder)."""
    return model_file(name_or_path)


@typed
def load_fabric(name_or_path: Path | str) -> FabricSpec:
    """A fabric preset's name (``programs/fabrics/``) or a fabric YAML."""
    return fabric_file(name_or_path)


def _model(model: ModelSpec | Path | str) -> ModelSpec:
    return model if isinstance(model, ModelSpec) else model_file(model)


def _fabric(fabric: FabricSpec | Path | str) -> FabricSpec:
    return fabric if isinstance(fabric, FabricSpec) else fabric_file(fabric)


def compile_options(**options) -> CompileOptions:
    """``CompileOptions`` of the fields given by name (each checked there); a name that is
    not one refused with the names that are."""
    names = [f.name for f in fields(CompileOptions)]
    unknown = [name for name in options if name not in names]
    if unknown:
        raise UserError(f"`{unknown[0]}` is not a compile option: the options are "
                        f"{', '.join(names)}")
    return CompileOptions(**options)


@typed
def compile(model: ModelSpec | Path | str, fabric: FabricSpec | Path | str = "wse3",
            systems: int = 1, *, weight_format: str | None = None,
            expert_weight_format: str | None = None, **options) -> WaferProgram:
    """Compile ``model`` (a preset, a model YAML or a Hugging Face config.json) onto
    ``systems`` wafers of ``fabric``, its weight matrices (and separately its experts') stored
    as ``weight_format`` (``expert_weight_format``) when given; ``options`` are
    ``compiler.options.CompileOptions`` fields (plan="disaggregated", region=(w, h),
    layers_per_stage=...). Every argument is checked before the compiler starts."""
    settings = compile_options(**options)
    spec = stored_as(_model(model), weight_format, expert_weight_format)
    return compile_model(spec, ClusterSpec(_fabric(fabric), systems), settings)


@typed
def run(program: WaferProgram, phase: str = "decode", *, batch: int = 1, context: int = 4096,
        tokens: int = 4096, tiles: int = DEFAULT_PREFILL_TILES, region: str | None = None,
        engine: str = "fast") -> RegionRun:
    """Simulate one step of ``phase`` on a region of ``program`` (by default the first that
    serves the phase): decode ``batch`` sequences at ``context``, or prefill ``tokens`` in
    ``tiles`` tiles (4 by default, as ``wse-emu run``). Its ``to_json()`` is what
    ``wse-emu run --json`` prints, the kernels' lower bounds included."""
    _check_step(phase, batch=batch, context=context, tokens=tokens, tiles=tiles, engine=engine)
    name, step = step_of(program, phase, region, batch=batch, context=context, tokens=tokens,
                         tiles=tiles)
    result = run_region(program, name, step, engine)
    result.bounds = stage_bounds(program, result)
    return result


def _check_step(phase: str, *, batch: int, context: int, tokens: int, tiles: int,
                engine: str) -> None:
    """A step's arguments by name and range, whichever phase reads them, before any program
    is needed (a sweep checks its points' before compiling any). What the model and the
    program bound (positions, KV room) is ``step_of``'s: a sweep keeps such a point's row,
    with why, as it keeps a point whose model does not fit."""
    one_of("phase", phase, ("prefill", "decode"))
    one_of("engine", engine, ENGINES)
    for name, value in (("batch", batch), ("context", context), ("tokens", tokens),
                        ("tiles", tiles)):
        whole(name, value, 1)
    if tiles > MAX_PREFILL_TILES:
        raise UserError(f"`tiles` must be at most {MAX_PREFILL_TILES}, got {tiles}")


def step_of(program: WaferProgram, phase: str, region: str | None = None, *, batch: int = 1,
            context: int = 4096, tokens: int = 4096,
            tiles: int = DEFAULT_PREFILL_TILES) -> tuple[str, MicroBatch]:
    """``runner.step_for``'s region and step, refused by name if it runs past the model's
    positions: a decode at ``context`` attends over that many (its own token's included),
    a prefill of ``tokens`` fills as many."""
    if phase == "decode":
        check_positions(program.model, whole("context", context, 1),
                        f"a decode step at `context={context}`")
    elif phase == "prefill":
        check_positions(program.model, whole("tokens", tokens, 1),
                        f"a prompt of `tokens={tokens}`")
    return step_for(program, phase, region, batch=batch, context=context, tokens=tokens,
                    tiles=tiles)


def check_serving(workload: WorkloadSpec | str | None = None, *,
                  trace: Path | str | None = None, rate: float | None = None,
                  requests: int | None = None, ttft_s: float | None = None,
                  tpot_s: float | None = None, kinds: tuple = (WAFER,),
                  **options) -> WorkloadSpec:
    """Check ``serve``'s arguments, all but the program, before any work: the workload (the
    one it reads is returned), the targets, and every serving option by name and range (the
    micro-batch sizes within the stage tables of every kind of hardware in ``kinds``)."""
    settings = ServeOptions.of(_NO_HARDWARE, _NO_HARDWARE, **options)
    values = {name: getattr(settings, name) for name in setting_names()}
    for kind in kinds:
        check_in_tables(values, kind.table_tops("full"), kind.tables_named("full"))
    for name, value in (("ttft_s", ttft_s), ("tpot_s", tpot_s)):
        if value is not None:
            positive(name, value)
    return _workload(workload, trace, rate, requests)


@typed
def serve(program: WaferProgram, workload: WorkloadSpec | Path | str | None = None, *,
          trace: Path | str | None = None, rate: float | None = None,
          requests: int | None = None, cache_dir: Path | str | None = None,
          ttft_s: float | None = None, tpot_s: float | None = None, loop: str = "compiled",
          **options) -> tuple[ServeResult, RunMetrics]:
    """Serve a workload (a preset, a YAML or a WorkloadSpec; or the replay of a ``trace``
    CSV) on ``program``, ``rate`` and ``requests`` overriding the workload's; ``options`` are
    ``ServeOptions`` fields (policy, prefill_tile, batch_limit, ...). Everything is checked
    before any work (``check_serving``). Returns the per-request result and the metrics the
    command line prints (with the targets, the attainment; ``RunMetrics.to_json()``)."""
    spec = check_serving(workload, trace=trace, rate=rate, requests=requests, ttft_s=ttft_s,
                         tpot_s=tpot_s, **options)
    one_of("loop", loop, LOOPS)
    cache = default_cache_dir(cache_dir)
    settings = ServeOptions.of(program.fabric, program.model, **options)
    reqs = generate_requests(spec)
    short = position_shortfall(reqs, program.model)
    if short:  # found before any table is timed
        raise UserError(short)
    short = kv_shortfall(reqs, program.regions)
    if short:
        raise UserError(f"{short}: {room_advice(program, reqs)}")
    pools = wafer_pools(program, cache)
    result = serve_requests(reqs, pools, settings, loop=loop)
    result.workload = spec.name
    return result, run_metrics(result, reqs, ttft_s, tpot_s)


def room_advice(program: WaferProgram, requests: Requests) -> str:
    """Where ``requests`` would find KV room on ``program``'s fabric: the smallest square
    region (sides doubling, then the whole wafer) that, compiled as ``program`` was, holds
    every request's KV; or what else to change when none does. Compiled to be sure, not
    estimated: a larger region also spreads the weights thinner."""
    fabric, options = program.fabric, program.options
    largest = max(r.pes for r in program.regions)  # no larger than this fell short
    sides = [(s, s) for s in (2 ** k for k in range(3, 16))
             if s <= min(fabric.width, fabric.height)] + [(fabric.width, fabric.height)]
    if options.plan == "colocated":
        for side in (s for s in sides if s[0] * s[1] > largest):
            try:
                bigger = compile_model(program.model, ClusterSpec(fabric, program.systems),
                                       replace(options, region=side))
            except CompileError:
                continue
            if kv_shortfall(requests, bigger.regions) is None:
                room = max(r.kv_capacity_tokens for r in bigger.regions)
                return (f"a region of {side[0]}x{side[1]} PEs holds it (KV room for "
                        f"{room:,} tokens): `region={side[0]}x{side[1]}`")
    return ("no region of one system holds it as compiled: more systems (`systems`), a "
            "fabric with more SRAM, or shorter requests")


class _Clock:
    """What ``ServeOptions.of`` reads of a fabric: the serving clock."""

    def __init__(self, clock_hz: float):
        self.clock_hz = clock_hz


# The clock a cluster of accelerators alone is served on: serving counts in cycles, and an
# accelerator's step times are seconds turned into cycles of it.
ACCELERATOR_CLOCK_HZ = 1e9


def named_pools(model: ModelSpec, sides: dict[str, str], cache_dir: Path | str | None = None,
                grid: str = "full") -> tuple[list, float]:
    """The pools of ``sides`` (role -> a pool named as on the command line, ``pool_names``:
    ``wse3x4``, ``trn2x2``, ``h200x8``; one ``mixed`` side for colocated serving, or a
    ``prefill`` and a ``decode`` side), and the clock they are served on (``pools_clock``).
    A wafer side holds the model as colocated serving lays it out, serving its role; an
    accelerator side is timed by its roofline (``accelerator_pool``), a GPU side from measured
    data (``gpu_pool``). The sides' systems are numbered in order."""
    names = {role: parse_pool(text) for role, text in sides.items()}
    clock_hz = pools_clock(list(names.values()))
    pools, first = [], 0
    for role, name in names.items():
        pools += side_pools(model, Side(name), role, first, clock_hz, cache_dir, grid)
        first += name.systems
    return pools, clock_hz


def pools_clock(names: list) -> float:
    """The clock pools of these kinds are served on: the first that counts its steps in
    cycles of its own (a wafer's), else ``ACCELERATOR_CLOCK_HZ``."""
    clocks = [n.kind.clock_hz(n.hardware) for n in names]
    return next((c for c in clocks if c is not None), ACCELERATOR_CLOCK_HZ)


def side_pools(model: ModelSpec, side: Side, role: str, first: int, clock_hz: float,
               cache_dir: Path | str | None = None, grid: str = "full") -> list:
    """The pools of one side (``pool_kinds.Side``: a pool as named, in one of its layouts) in
    ``role``, on systems from ``first`` on, timed for ``clock_hz`` by the side's kind."""
    return side.pool.kind.pools(model, side, role, first, clock_hz,
                                default_cache_dir(cache_dir), grid, compile)


def pool_sides(pool: str | None, prefill_pool: str | None,
               decode_pool: str | None) -> dict[str, str]:
    """Colocated on ``pool``, or split between ``prefill_pool`` and ``decode_pool``: the sides
    ``named_pools`` takes; any other combination is refused."""
    if pool is not None and prefill_pool is None and decode_pool is None:
        return {"mixed": pool}
    if pool is None and prefill_pool is not None and decode_pool is not None:
        return {"prefill": prefill_pool, "decode": decode_pool}
    raise UserError("give `pool` (colocated), or `prefill_pool` and `decode_pool` (a split)")


@typed
def serve_pools(model: ModelSpec | Path | str, workload: WorkloadSpec | Path | str | None = None, *,
                pool: str | None = None, prefill_pool: str | None = None,
                decode_pool: str | None = None, trace: Path | str | None = None,
                rate: float | None = None, requests: int | None = None,
                cache_dir: Path | str | None = None, ttft_s: float | None = None,
                tpot_s: float | None = None, loop: str = "compiled",
                **options) -> tuple[ServeResult, RunMetrics]:
    """``serve`` on pools named as on the command line (``named_pools``): colocated on
    ``pool`` (a wafer cluster, accelerator instances or GPUs), or disaggregated with prefill
    on ``prefill_pool`` and decode on ``decode_pool``, every copy of one side able to hand its
    KV to any copy of the other. Everything is checked before any work."""
    sides = pool_sides(pool, prefill_pool, decode_pool)
    # Named wrongly: refused before any work; the kinds' tables bound the micro-batches.
    kinds = tuple(parse_pool(text).kind for text in sides.values())
    spec = check_serving(workload, trace=trace, rate=rate, requests=requests, ttft_s=ttft_s,
                         tpot_s=tpot_s, kinds=kinds, **options)
    one_of("loop", loop, LOOPS)
    default_cache_dir(cache_dir)
    model = _model(model)
    reqs = generate_requests(spec)
    short = position_shortfall(reqs, model)
    if short:
        raise UserError(short)
    pools, clock_hz = named_pools(model, sides, cache_dir)
    settings = ServeOptions.of(_Clock(clock_hz), model, **options)
    result = serve_requests(reqs, pools, settings, loop=loop)
    result.workload = spec.name
    return result, run_metrics(result, reqs, ttft_s, tpot_s)


class _NoHardware:
    """What ``check_serving`` gives ``ServeOptions.of`` for a fabric and a model: the
    hardware's numbers are not what it checks."""

    clock_hz = 1.0

    @staticmethod
    def kv_bytes_per_token() -> int:
        return 0


_NO_HARDWARE = _NoHardware()


@typed
def experiment(model: ModelSpec | Path | str,
               workload: WorkloadSpec | Path | str | None = None, *,
               trace: Path | str | None = None, ttft_s: float, tpot_s: float,
               attainment: float | None = None, percentile: int = 90,
               fabric: FabricSpec | Path | str | None = None,
               systems: int | None = None, space: Space | None = None,
               requests: int | None = None, seeds: int = 1, tolerance: float = 0.05,
               vary: str | None = None, price_per_system_hour: float | None = None,
               scheduler: str | None = None, workers: int = 0,
               cache_dir: Path | str | None = None, progress: Callable | None = None,
               routing: Routing = Routing(), attention_tile: int = 0,
               pool: str | None = None, prefill_pool: str | None = None,
               decode_pool: str | None = None, split_pool: str | None = None,
               footprint: str = "systems", prices: dict | None = None,
               units_per_rack: dict | None = None) -> ExperimentReport | VaryReport:
    """Colocated against disaggregated serving of ``workload`` (or a ``trace`` CSV): both
    plans tuned over ``space``, each plan's best confirmed on long runs, over ``seeds`` draws;
    or, with ``vary`` (``NAME=V1,V2,...``), the same at each value of one input. The report
    ``experiment disagg --json`` prints. ``requests``: requests (sessions) per tuning run
    (by default the workload's, at most ``TUNING_REQUESTS`` model calls). ``scheduler``: a
    dask scheduler's address; else ``workers`` local worker processes (0: one per core; 1:
    none, run here; without dask they are started fresh, so a script calling this with
    ``workers`` other than 1 needs the usual ``if __name__ == "__main__":`` guard).
    ``routing`` and ``attention_tile`` (batch tiling on attention) apply to both plans alike.
    The targets ``ttft_s`` and ``tpot_s`` hold at the ``percentile`` of the requests (50, 90 or
    99), and ``attainment`` of them (by default the percentile's share) must meet both.

    On ``fabric`` (default wse3) x ``systems`` (default 1), or on pools named by their
    hardware instead (``pool_names``; ``experiments.layouts``): a split with prefill on
    ``prefill_pool`` and decode on ``decode_pool`` against colocated serving in the same
    footprint on each kind of the split (or on ``pool``), or every split of ``split_pool``
    against colocated serving on all of it; the footprint counted in ``footprint``
    (``systems``; ``racks`` with ``units_per_rack``: hardware name -> units one rack holds;
    ``kw``; or ``cost`` with ``prices``: hardware name -> price of one unit for an hour), every
    result per unit of it. Every argument is checked before any work. The
    report's ``to_json()`` is what the command prints with ``--json``."""
    targets = Targets(ttft_s, tpot_s, attainment, percentile)
    variation = None if vary is None else parse_vary(vary)
    pools = _pools(pool, prefill_pool, decode_pool, split_pool, footprint, prices,
                   units_per_rack)
    if pools is not None and variation is not None:
        raise UserError("`vary` is for one compiled cluster, not for pools named by their "
                        "hardware")
    setup = _Setup(model, workload, trace, fabric, systems, space, requests, seeds, tolerance,
                   price_per_system_hour, workers, cache_dir, progress, routing, attention_tile,
                   pools)
    with point_pool(scheduler, workers) as pool:
        one = setup.runner(RunBook(pool, serve_choice))
        if variation is None:
            return one(pool, setup.draws, targets, setup.cluster)[0]
        return vary_experiment(variation, one, pool, setup.draws, targets, setup.cluster,
                               None if requests is not None else setup.draws_for)


def _pools(pool, prefill_pool, decode_pool, split_pool, footprint: str,
           prices: dict | None, units_per_rack: dict | None = None):
    """The splits, the colocated hardware and the footprint of pools named by their
    hardware (``plan_pools``), or None for one compiled cluster (where only a footprint in
    systems applies)."""
    counted = _footprint(footprint, prices, units_per_rack)
    plans = plan_pools(pool, prefill_pool, decode_pool, split_pool, counted)
    if plans is None:
        if counted != Footprint():
            raise UserError("`footprint`, `prices` and `units_per_rack` are for pools named "
                            "by their hardware; one compiled cluster counts its systems")
        return None
    splits, colocated = plans
    _given_for(counted, [n for pair in splits for n in pair] + colocated)
    return (*plans, counted)


def _footprint(footprint: str, prices: dict | None, units_per_rack: dict | None) -> Footprint:
    """The ``Footprint`` of the API's arguments: each number given per kind of hardware
    checked there, by name."""
    given = {}
    for what, values in (("prices", prices), ("units_per_rack", units_per_rack)):
        if values is not None and not isinstance(values, dict):
            raise UserError(f"`{what}` must be a mapping of hardware names to numbers, got "
                            f"{short_repr(values)}")
        given[what] = tuple((values or {}).items())
    return Footprint(footprint, given["prices"], given["units_per_rack"])


def _given_for(counted: Footprint, names: list) -> None:
    """Refuse a number given for a kind of hardware no pool of ``names`` is on: a typo
    (h20 for h200) or a kind left out would otherwise be ignored without a word, and a
    footprint in cost or racks, counted without it, would not be what the user meant."""
    kinds = list(dict.fromkeys(n.hardware.name for n in names))
    for what, given in (("prices", counted.prices), ("units_per_rack", counted.per_rack)):
        for name, value in given:
            if name not in kinds:
                raise UserError(f"{per_kind_text(what, name, value)}: no pool of this "
                                f"experiment is on {name}; its pools are on "
                                f"{', '.join(kinds)}")


def _check_space(space: Space, phases: dict) -> None:
    """The micro-batch sizes ``space`` gives to try, within the tables of every kind of
    hardware (kind -> the phases it serves in the experiment) at the space's grid; the
    values left to the hardware are its own (``tuning.Layout.knob_values``)."""
    largest = {name: max(values) for name, values in space.given().items()}
    for kind, served in phases.items():
        tops = {phase: top for phase, top in kind.table_tops(space.grid).items()
                if phase in served}
        check_in_tables(largest, tops, kind.tables_named(space.grid))


def _phases_by_kind(splits: list, colocated: list) -> dict:
    """Kind of hardware -> the phases its pools serve in the experiment: both where colocated,
    a side's where split."""
    phases: dict = {}
    for names, served in [(colocated, ("prefill", "decode"))] + [
            ([p], ("prefill",)) for p, _ in splits] + [([d], ("decode",)) for _, d in splits]:
        for name in names:
            phases[name.kind] = tuple(dict.fromkeys(phases.get(name.kind, ()) + served))
    return phases


class _Setup:
    """What ``experiment`` and ``frontier`` share: their arguments checked, before any work,
    the workload's draws, and ``runner(book)``, which runs one experiment."""

    def __init__(self, model, workload, trace, fabric, systems, space, requests, seeds,
                 tolerance, price_per_system_hour, workers, cache_dir, progress, routing,
                 attention_tile, pools=None):
        space = Space() if space is None else space
        if pools is not None and (fabric is not None or systems is not None):
            raise UserError("`fabric` and `systems` describe one compiled cluster; pools named "
                            "by their hardware say both")
        fabric = "wse3" if fabric is None else fabric
        systems = 1 if systems is None else systems
        if not isinstance(space, Space):
            raise UserError(f"`space` must be a Space, got {short_repr(space)}")
        if whole("seeds", seeds, 1) > MAX_DRAWS:
            raise UserError(f"`seeds` must be at most {MAX_DRAWS} (draws of the workload, "
                            f"each a whole search), got {seeds:,}")
        _workers(workers)
        self.cache = default_cache_dir(cache_dir)
        whole("systems", systems, 1)
        if not is_number(tolerance) or not 0 < tolerance < 1:
            raise UserError(f"`tolerance` must be between 0 and 1, got {short_repr(tolerance)}")
        if price_per_system_hour is not None:
            positive("price_per_system_hour", price_per_system_hour)
        if requests is not None and whole("requests", requests, 1) < 2:
            raise UserError(f"`requests` must be at least 2 (a rate needs two arrivals), got "
                            f"{requests}")
        whole("attention_tile", attention_tile, 0)
        model = _model(model)
        if not isinstance(routing, Routing):
            raise UserError(f"`routing` must be a Routing, got {short_repr(routing)}")
        if not model.is_moe and routing != Routing():
            raise UserError(f"`routing` applies to a mixture of experts; {model.name} is dense")
        self.pools = pools
        if pools is None:
            self.cluster = ClusterSpec(_fabric(fabric), systems)
            _check_space(space, {WAFER: ("prefill", "decode")})
        else:
            if routing != Routing() or attention_tile:
                raise UserError("`routing` and `attention_tile` are for compiled wafers; pools "
                                "named by their hardware time their steps themselves")
            if price_per_system_hour is not None:
                raise UserError("`price_per_system_hour` is for one compiled cluster; pools "
                                "named by their hardware take `prices` per kind, with "
                                "footprint 'cost'")
            splits, colocated, footprint = pools
            if footprint.kind == "cost":
                # A footprint in cost per hour: a unit of it costs 1 an hour, so the cost per
                # million output tokens follows (``comparison.economics``).
                price_per_system_hour = 1.0
            self.cluster = PoolCluster(
                PoolHardware(pools_name(splits, colocated, footprint),
                             pools_clock([n for pair in splits for n in pair] + colocated)),
                systems_of(list(splits[0])), footprint.unit)
            _check_space(space, _phases_by_kind(splits, colocated))
        spec = _workload(workload, trace, None, requests)
        if requests is None:
            spec.requests = tuning_requests(spec, self.cluster.systems)
        self.draws = workload_draws(spec, seeds)
        self.model, self.spec, self.space, self.seeds = model, spec, space, seeds
        self.tolerance, self.price, self.progress = tolerance, price_per_system_hour, progress
        self.routing, self.attention_tile = routing, attention_tile
        self._layouts: dict = {}

    def draws_for(self, n_systems: int) -> list:
        """The tuning runs' requests for ``n_systems`` systems (the base draws if the same)."""
        n = tuning_requests(self.spec, n_systems)
        return self.draws if n == self.spec.requests else workload_draws(
            replace(self.spec, requests=n), self.seeds)

    def layouts(self, pool, cluster: ClusterSpec, probes: list) -> tuple[dict, list]:
        """``build_layouts`` for ``cluster``, built once (a frontier asks on every rung); the
        ``probes`` are checked against the model's positions every time."""
        key = cluster.systems
        if key in self._layouts or self.pools is not None:
            # (``build_layouts`` checks them the first time)
            short = next(filter(None, (position_shortfall(r, self.model) for r in probes)), None)
            if short:
                raise UserError(short)
        if key not in self._layouts:
            self._layouts[key] = self._pool_layouts(cluster) if self.pools is not None \
                else build_layouts(
                    self.model, cluster, probes, self.cache, self.space.copies, self.progress,
                    grid=self.space.grid, routing=self.routing,
                    attention_tile=self.attention_tile, pool=pool,
                    layers_per_stage=self.space.layers_per_stage)
        return self._layouts[key]

    def _pool_layouts(self, cluster) -> tuple[dict, list]:
        """``pool_layouts`` of the pools named, every side timed for the cluster's clock."""
        def side(s, role: str, first: int) -> list:
            return side_pools(self.model, s, role, first, cluster.fabric.clock_hz,
                              self.cache, self.space.grid)
        splits, colocated, footprint = self.pools
        # Depths named are tried besides each wafer side's own ("matched" and "own": its own
        # only, since the sides are not compiled before they are laid out).
        depths = self.space.layers_per_stage
        return pool_layouts(self.model, splits, colocated, side, footprint, self.space.copies,
                            depths if isinstance(depths, tuple) else ())

    def runner(self, book: RunBook):
        """``one(pool, draws, targets, cluster, transform, scale)``: the experiment's report
        and configurations, its serving runs kept in ``book``."""
        model, spec, space = self.model, self.spec, self.space

        def one(pool, draws, targets, cluster, transform=lambda r: r, scale=StepScale()):
            def layouts_for(probes):
                layouts, skipped = self.layouts(pool, cluster, probes)
                return scale.layouts(layouts), skipped
            data, configs = disagg_experiment(
                model, cluster, spec.name, draws[0], targets, pool, layouts_for,
                space, self.tolerance, self.progress, draws[1:], self.price,
                longer_draws(spec, self.seeds, transform), book=book)
            if len(draws) > 1:
                data.over_replicates["draws"] = describe_draws(spec, data)
            # How both plans' steps were timed, beside their results.
            data.timing = StepTiming(self.routing.describe() if model.is_moe else None,
                                     self.attention_tile or None, formats_text(model) or None,
                                     scale.describe() or None)
            return data, configs
        return one


@typed
def frontier(model: ModelSpec | Path | str,
             workload: WorkloadSpec | Path | str | None = None, *,
             trace: Path | str | None = None, ttft_s: float, attainment: float | None = None,
             user_speeds: Sequence[float] | None = None, user_speed: float | None = None,
             step_scales: Sequence[float] = (0.7, 1.3),
             fabric: FabricSpec | Path | str | None = None,
             systems: int | None = None, space: Space | None = None,
             requests: int | None = None, seeds: int = 1, tolerance: float = 0.05,
             scheduler: str | None = None, workers: int = 0,
             cache_dir: Path | str | None = None, progress: Callable | None = None,
             routing: Routing = Routing(),
             attention_tile: int = 0, pool: str | None = None,
             prefill_pool: str | None = None, decode_pool: str | None = None,
             split_pool: str | None = None, footprint: str = "systems",
             prices: dict | None = None,
             units_per_rack: dict | None = None) -> frontier_mod.FrontierReport:
    """Each plan's frontier of output tokens/s per system against tokens/s per user, and the
    high-speed token capacity of both at ``user_speed`` (by default the model's published
    vendor speed, ``programs/vendor_speeds.yaml``): the report ``experiment frontier --json``
    prints. Every rung of the ladder (``user_speeds``, tokens/s per user; by default from a
    little slower than a lone sequence's decode step to 50) is ``experiment`` at a p90 TPOT
    target of 1/speed, the same tuning for both plans; the rungs share their serving runs.
    ``step_scales``: factors on the prefill and on the decode step times (each alone, the
    hardware unchanged) at which the headline is read again, to show how far it leans on the
    model's error (empty: not read). The other arguments are ``experiment``'s (the pools
    among them: ``frontier`` of a split named by its hardware). The report's
    ``to_json()`` is what the command prints with ``--json``."""
    attainment = Targets(ttft_s, 1.0, attainment).attainment  # checked before any work
    if user_speeds is not None:
        user_speeds = frontier_mod.check_speeds(user_speeds)
    if user_speed is not None:
        frontier_mod.check_speed("user_speed", user_speed)
    if isinstance(step_scales, (str, bytes)) or not hasattr(step_scales, "__iter__"):
        raise UserError(f"`step_scales` must be a sequence of factors, got "
                        f"{short_repr(step_scales)}")
    scales = tuple(step_scales)
    for f in scales:
        positive("step_scales", f)
    pools = _pools(pool, prefill_pool, decode_pool, split_pool, footprint, prices,
                   units_per_rack)
    setup = _Setup(model, workload, trace, fabric, systems, space, requests, seeds, tolerance,
                   None, workers, cache_dir, progress, routing, attention_tile, pools)
    vendor = frontier_mod.vendor_speed(setup.model.name)
    speed = user_speed if user_speed is not None else (vendor.tokens_per_s if vendor else None)
    with point_pool(scheduler, workers) as pool:
        book = RunBook(pool, serve_choice)
        one = setup.runner(book)
        layouts, _ = setup.layouts(pool, setup.cluster, setup.draws)
        # The floor is the fastest lone decode step of any layout either plan may take: the
        # depth of a pipeline and the PEs a layer gets set it, so no single layout is the floor.
        floor = min(decode_step_s(lay.regions, setup.draws[0], setup.cluster.fabric.clock_hz)
                    for lay in layouts.values())
        ladder = user_speeds or tuple(frontier_mod.speed_ladder(floor, speed))
        if speed is not None and not any(np.isclose(speed, s) for s in ladder):
            ladder = tuple(sorted((*ladder, speed), reverse=True))
        rungs = []
        for k, s in enumerate(ladder):
            if progress:
                progress(f"rung {k + 1} of {len(ladder)}: {s:,.0f} tokens/s per user "
                         f"(p90 TPOT <= {seconds(1.0 / s)})")
            data, _ = one(pool, setup.draws, Targets(ttft_s, 1.0 / s, attainment),
                          setup.cluster)
            rungs.append((s, data))
        leaning = []
        if speed is not None:
            for phase in ("prefill", "decode"):
                for f in scales:
                    if progress:
                        progress(f"the headline with {phase} step times x{f:g}")
                    scale = StepScale(**{phase: f})
                    data, _ = one(pool, setup.draws, Targets(ttft_s, 1.0 / speed, attainment),
                                  setup.cluster, scale=scale)
                    leaning.append(replace(frontier_mod.rung_row(speed, data), phase=phase,
                                           factor=f))
    rows = [frontier_mod.rung_row(s, d) for s, d in rungs]
    first = rungs[0][1]
    return frontier_mod.FrontierReport(
        setup.model.name, first.cluster, setup.spec.name, first.requests_per_run, seeds,
        ttft_s, attainment, setup.space.grid, floor, rows,
        **frontier_mod.summarize(rows, vendor, speed), step_time_leaning=leaning,
        experiments={f"{s:g}": d for s, d in rungs})


@typed
def pairings(model: ModelSpec | Path | str,
             workload: WorkloadSpec | Path | str | None = None, *,
             kinds: Sequence[str], trace: Path | str | None = None, ttft_s: float,
             attainment: float | None = None, user_speeds: Sequence[float] | None = None,
             user_speed: float | None = None, footprint: str = "systems",
             prices: dict | None = None, units_per_rack: dict | None = None,
             space: Space | None = None,
             requests: int | None = None, seeds: int = 1, tolerance: float = 0.05,
             scheduler: str | None = None, workers: int = 0,
             cache_dir: Path | str | None = None,
             progress: Callable | None = None) -> PairingsReport:
    """``frontier`` for every pairing of ``kinds`` (pool names: ``wse3``, ``trn2``,
    ``h200x8``; prefill on one, decode on another or the same), each against colocated
    serving on its kinds in its footprint: the report ``experiment pairings --json`` prints
    (without the step-time leaning, which each ``frontier`` can add). A pairing that cannot
    run (the model does not fit a side, the footprint holds no unit) is kept with why. The
    other arguments are ``frontier``'s."""
    kinds = list(dict.fromkeys(kinds))
    if not kinds:
        raise UserError("`kinds` must be one or more pool names, got none")
    names = {k: parse_pool(k) for k in kinds}  # named wrongly: refused before any work
    # Numbers per kind of hardware, checked against every kind before any pairing runs: a
    # pairing takes those of its own kinds, so one missing or misnamed would otherwise only
    # leave some pairings skipped, after the others' work.
    counted = _footprint(footprint, prices, units_per_rack)
    _given_for(counted, list(names.values()))
    if counted.kind in ("cost", "racks"):
        for name in names.values():
            counted.of([name])

    def own(values: dict | None, p: str, d: str) -> dict | None:
        on = {names[p].hardware.name, names[d].hardware.name}
        return None if values is None else {k: v for k, v in values.items() if k in on}
    model = _model(model)
    pairs = [(p, d) for p in kinds for d in kinds]
    frontiers, skipped, unit = {}, {}, "system"
    for n, (p, d) in enumerate(pairs):
        label = pairing_label(p, d)
        if progress:
            progress(f"pairing {n + 1} of {len(pairs)}: {label}")
        try:
            report = frontier(
                model, workload, trace=trace, ttft_s=ttft_s, attainment=attainment,
                user_speeds=user_speeds, user_speed=user_speed, step_scales=(), space=space,
                requests=requests, seeds=seeds, tolerance=tolerance, scheduler=scheduler,
                workers=workers, cache_dir=cache_dir, progress=progress, prefill_pool=p,
                decode_pool=d, footprint=footprint, prices=own(prices, p, d),
                units_per_rack=own(units_per_rack, p, d))
        except (CompileError, UserError) as exc:  # checked before any work: cheap to skip
            skipped[label] = str(exc)
            continue
        frontiers[label] = report
        unit = report.footprint_unit
    if not frontiers:  # an argument wrong for every pairing, or none fits: refused
        raise UserError(next(iter(skipped.values())))
    name = _workload(workload, trace, None, requests).name
    return PairingsReport(model.name, name, kinds, unit, frontiers, skipped)


# Local worker processes past a few per core only share the cores, and each holds its own
# interpreter (about 100 MB measured before any work) and tables: a typo of 10**6 would start
# processes until memory ran out.
WORKERS_PER_CORE = 4


def _workers(workers) -> int:
    """``workers``, a whole number from 0 (one per core) to WORKERS_PER_CORE per core."""
    cores = os.cpu_count() or 1
    if whole("workers", workers, 0) > WORKERS_PER_CORE * cores:
        raise UserError(f"`workers` must be at most {WORKERS_PER_CORE * cores} "
                        f"({WORKERS_PER_CORE} per core, {cores} cores here), got {workers:,}")
    return workers


def _workload(workload, trace, rate, requests) -> WorkloadSpec:
    """A workload (a preset, a YAML or a WorkloadSpec) or a trace's replay, with ``rate`` and
    ``requests`` overriding its own."""
    if (workload is None) == (trace is None):
        raise UserError("give a `workload` or a `trace`, one of them")
    if rate is not None:
        positive("rate", rate)
    if requests is not None:
        whole("requests", requests, 1)
    return workload_spec(workload, trace, rate, requests)


@typed
def generate(program: WaferProgram, prompt_ids: Sequence, new_tokens: int = 8, *,
             checkpoint: Path | str | None = None, weights_seed: int = 0):
    """Greedy generation computed through ``program``'s tiles, with a checkpoint's weights
    (a directory of config.json and *.safetensors) or random ones drawn from ``weights_seed``;
    returns the generator's result (``generated_ids``, the regions used)."""
    from wse_emu.models.weights import check_memory, load_checkpoint, random_weights
    from wse_emu.sim.functional.generate import Generator

    whole("new_tokens", new_tokens, 1)
    whole("weights_seed", weights_seed, 0)
    ids = list(prompt_ids)
    # Whole numbers of any kind (a tokenizer's NumPy array too), read as Python ints.
    wrong = next((i for i in ids if isinstance(i, bool) or not isinstance(i, numbers.Integral)),
                 None)
    if wrong is not None:
        raise UserError(f"`prompt_ids` must be token ids (whole numbers), got "
                        f"{short_repr(wrong)} among them")
    ids = [int(i) for i in ids]
    vocab = program.model.vocab_size
    if not ids:
        raise UserError("`prompt_ids` is empty: give at least one token id")
    bad = next((i for i in ids if not 0 <= i < vocab), None)
    if bad is not None:
        raise UserError(f"`prompt_ids`: token id {bad} is outside the vocabulary "
                        f"(0..{vocab - 1})")
    # Before the weights are drawn or read: the last new token is never fed back.
    check_positions(program.model, len(ids) + new_tokens - 1,
                    f"{len(ids):,} `prompt_ids` and `new_tokens={new_tokens}`")
    check_memory(program.model)
    if checkpoint is not None:
        _, weights = load_checkpoint(Path(checkpoint))
    else:
        weights = random_weights(program.model, weights_seed)
    return Generator(program, weights).generate(ids, new_tokens)


# What a sweep point may set, beyond "fabric.FIELD" overrides of the fabric's parameters.
CLUSTER_SETTINGS = ("model", "fabric", "systems", "plan", "prefill_share", "prefill_systems",
                    "region", "layers_per_stage", "routing", "routing_seed", "attention_tile",
                    "weight_format", "expert_weight_format")
# Those of them that are compile options (region aside: a point may write it WxH).
COMPILED_SETTINGS = ("plan", "prefill_share", "prefill_systems", "layers_per_stage", "routing",
                     "routing_seed", "attention_tile")
RUN_DEFAULTS = {"phase": "decode", "batch": 1, "context": 4096, "tokens": 4096,
                "tiles": DEFAULT_PREFILL_TILES, "engine": "fast"}
POINT_SETTINGS = {"run": ("phase", "batch", "context", "tokens", "tiles", "engine"),
                  "serve": ("workload", "rate", "requests", "ttft_s", "tpot_s", "cache_dir",
                            *(name for name in setting_names() if name != "timeline_events"))}


def check_sweep(spec) -> None:
    """Every setting a sweep's points take (a SweepSpec's base and axes), checked by name
    before the first point runs: a name no point takes would fail at every point; then
    every point's values (``point_plan``), nothing compiled."""
    allowed = CLUSTER_SETTINGS + POINT_SETTINGS[spec.point]
    fabric_fields = sorted(f.name for f in fields(FabricSpec) if f.name != "name")
    for name in [*spec.base, *spec.axes]:
        if not isinstance(name, str):
            raise UserError(f"sweep {spec.name}: setting {short_repr(name)} is not a name")
        if name.startswith("fabric."):
            if name.split(".", 1)[1] not in fabric_fields:
                raise UserError(f"sweep {spec.name}: the fabric has no field "
                                f"{short_repr(name.split('.', 1)[1])} (its fields: "
                                f"{', '.join(fabric_fields)})")
        elif name not in allowed:
            raise UserError(f"sweep {spec.name}: a {spec.point} point does not take "
                            f"{short_repr(name)} (it takes {', '.join(allowed)}, and fabric.FIELD)")
    # Every point's values too: one every point would refuse (a batch of "8", a region of
    # 8xq) would otherwise be found at each point in turn, after its compile.
    loaded: dict = {}
    for config in spec.points():
        try:
            point_plan(spec.point, config, loaded)
        except UserError as exc:
            at = {k: config[k] for k in spec.axes}
            raise UserError(f"sweep {spec.name}, point {short_repr(at, 80)}: "
                            f"{' '.join(str(exc).split())}") from None


@typed
def sweep(sweep: SweepSpec | Path | str, output: Path | str | None = None, *,
          scheduler: str | None = None, workers: int = 0, max_points: int | None = None,
          progress: Callable | None = None) -> tuple[Path, list[SweepRow]]:
    """Every point of a sweep (a SweepSpec or its YAML) not yet in ``output`` (by default a
    folder named after the sweep), on ``workers`` local processes as ``experiment`` takes
    them, or on a dask cluster (``scheduler``); ``progress(done, total)`` after each point.
    Before the first point: every setting checked by name (``check_sweep``), the size against
    ``max_points`` (by default ``MAX_POINTS``), and the folder created or refused. Returns
    the folder and every row, in the order of the sweep's points."""
    spec = sweep if isinstance(sweep, SweepSpec) else load_sweep(sweep)
    _workers(workers)
    if max_points is not None:
        whole("max_points", max_points, 1)
    check_size(spec, max_points)
    check_sweep(spec)
    out = Path(output if output is not None else spec.name)
    claim_directory(spec, out)
    with point_pool(scheduler, workers) as pool:
        return out, run_sweep(spec, out, pool, evaluate_point, progress, max_points)


def point_plan(point: str, config: dict, loaded: dict | None = None) -> tuple:
    """What one sweep point (see ``wse_emu.sweeps.sweep``) runs, every setting checked by
    name and nothing compiled: the model as stored, the cluster, the compile options, and the
    arguments of ``run`` or ``serve`` besides the program. ``loaded``: the models and fabrics
    read so far, by name (``check_sweep`` reads each once for all the points)."""
    unknown = sorted(k for k in config if k not in CLUSTER_SETTINGS + POINT_SETTINGS[point]
                     and not k.startswith("fabric."))
    if unknown:
        raise UserError(f"a {point} point does not take {', '.join(unknown)}")
    if "model" not in config:
        raise UserError("a sweep point needs a model")
    loaded = {} if loaded is None else loaded

    def read(what: str, name, reader):
        key = (what, str(of_type(what, name, Path | str)))
        if key not in loaded:
            loaded[key] = reader(name)
        return loaded[key]
    model = stored_as(read("model", config["model"], model_file), config.get("weight_format"),
                      config.get("expert_weight_format"))
    fabric = read("fabric", config.get("fabric", "wse3"), fabric_file)
    overrides = {k.split(".", 1)[1]: v for k, v in config.items() if k.startswith("fabric.")}
    if overrides:
        fabric = with_overrides(fabric, **overrides)
    region = config.get("region")
    if isinstance(region, str):
        region = parse_region(region)
    elif isinstance(region, list):  # as YAML writes a pair
        region = tuple(region)
    options = compile_options(region=region, **{k: config[k] for k in COMPILED_SETTINGS
                                                if k in config})
    cluster = ClusterSpec(fabric, whole("systems", config.get("systems", 1), 1))
    if point == "run":
        args = {name: config.get(name, default) for name, default in RUN_DEFAULTS.items()}
        _check_step(**args)
        return model, cluster, options, args
    if "workload" not in config:
        raise UserError("a serve point needs a workload")
    knobs = {k: config[k] for k in setting_names() if k in config}
    args = {k: config.get(k) for k in ("rate", "requests", "ttft_s", "tpot_s", "cache_dir")}
    check_serving(config["workload"], **{k: v for k, v in args.items() if k != "cache_dir"},
                  **knobs)
    default_cache_dir(args["cache_dir"])
    return model, cluster, options, {"workload": config["workload"], **args, **knobs}


def evaluate_point(point: str, config: dict) -> dict:
    """One sweep point (see ``wse_emu.sweeps.sweep``): compile the cluster ``config``
    describes, then time one step (``run``) or serve a workload (``serve``); the numbers the
    commands print. A setting it does not know, or a value it refuses, is refused by name
    before the compile (``point_plan``)."""
    model, cluster, options, args = point_plan(point, config)
    program = compile_model(model, cluster, options)
    if point == "run":
        step = run(program, **args)
        # The cluster's regions for this phase are replicas of the region timed, each with
        # its own pipeline; the compiler cuts them from the wafer evenly, so they differ by at
        # most one row or column of PEs, and each is counted at the timed one's rate.
        phase = args["phase"]
        replicas = sum(r.role in (phase, "mixed") for r in program.regions)
        out = {"region": step.region, "step_seconds": step.step_seconds,
               "tokens_per_s_alone": step.latency_tokens_per_s(),
               "tokens_per_s_pipelined": step.tokens_per_s(), "replicas": replicas,
               "tokens_per_s_cluster": replicas * step.tokens_per_s(),
               "compute_utilization": step.compute_utilization()}
        if program.model.is_moe:
            out["expert_pe_utilization"] = step.experts()["expert_pe_utilization"]
        return out
    _, metrics = serve(program, **args)
    reported = metrics.to_json()  # as serve --json prints them
    return {k: reported[k] for k in ("requests", "output_tokens_per_s", "requests_per_s",
                                     "slo_attainment", "goodput_requests_per_s", "ttft_s",
                                     "tpot_s", "itl_s")}


@typed
def draw(run_dir: Path | str,
         what: Sequence | str = ("maps", "roofline", "serving", "experiment")) -> Path:
    """Draw a run directory's figures and report.html; returns the report's path. ``what``:
    kinds of figures, from maps, roofline, serving, experiment and sweep (a list, or words
    split by commas); a word that is none of them is refused by name."""
    from wse_emu.visualize.rundraw import draw_run

    return draw_run(Path(run_dir), what)


def build_layouts(model: ModelSpec, cluster: ClusterSpec, probes: list[Requests], cache: Path,
                  copies=(1,), progress=None, splits: list[dict] | None = None,
                  grid: str = "full", routing: Routing = Routing(),
                  attention_tile: int = 0, pool=None,
                  layers_per_stage="own") -> tuple[dict, list[str]]:
    """Every layout to tune: colocated with each number of ``copies`` of the model per wafer
    (side by side in column bands), and disaggregated at each of ``splits`` (by default every
    split ``disaggregated_splits`` proposes), each at the compiler's own pipeline depth and at
    the other depths (layers per stage) ``layers_per_stage`` asks for: "own", none; "matched",
    every depth some layout came to by itself, so that both plans get the same choice; or
    numbers. A layout that does not compile is
    skipped, with why (colocated with one copy at its own depth must compile). A layout whose
    regions cannot hold some request stays: serving refuses that request, which then misses its
    targets, so which layouts are tried does not depend on how long the runs are. ``probes``
    (every set of requests the experiment may serve) are checked against the model's
    positions. Layouts are compiled, and their stage tables timed over ``grid``'s shapes, on
    ``pool``'s workers (in this process without one). Returns (plan, name) -> Layout, and the
    skipped."""
    fabric = cluster.fabric
    splits = disaggregated_splits(model, cluster) if splits is None else splits
    span = wafers_needed(model, fabric)
    if not splits:
        raise UserError(f"{model.name} spans {span} x {fabric.name} per replica, so "
                        f"{cluster.systems} system(s) leave no prefill/decode split to compare: "
                        f"it needs {2 * span} systems or more")
    short = next(filter(None, (position_shortfall(r, model) for r in probes)), None)
    if short:  # the same on every layout, so refused before any is compiled
        raise UserError(short)
    plans, skipped = _layout_plans(model, fabric, span, copies, splits)

    def compile_all(batch: list) -> dict:
        """(plan, name) -> program of every (plan, name, split, depth) in ``batch`` that
        compiles, compiled on ``pool``'s workers; the others skipped, with why (colocated
        with one copy at its own depth must compile)."""
        if progress:
            progress(f"compiling {len(batch)} layout{'s' if len(batch) > 1 else ''}")
        jobs = [(CompileOptions(plan=plan, routing=routing.spec(), routing_seed=routing.seed,
                                attention_tile=attention_tile, layers_per_stage=depth,
                                **split),) for plan, _, split, depth in batch]
        run = (pool or HERE).bind(compile_or_why, (model, cluster))
        out = {}
        for (plan, name, split, depth), (program, why) in zip(batch, run(jobs)):
            if program is not None:
                out[(plan, name)] = program
            elif plan == "colocated" and not split and depth is None:
                raise CompileError(why)
            else:
                skipped.append(f"{plan} {name}: {' '.join(why.split())}")
        return out

    # At the compiler's own depth first, then at the other depths asked for.
    programs = compile_all([(plan, name, split, None) for plan, name, split in plans])
    own = {key: _layers_per_stage(p) for key, p in programs.items()}
    depths = {"own": [], "matched": sorted(set(own.values()))}.get(layers_per_stage)
    if depths is None:  # numbers, checked as ``Space`` checks them
        depths = Space(layers_per_stage=layers_per_stage).layers_per_stage
    deeper = [(plan, f"{name} at {depth} layer{'s' if depth > 1 else ''}/stage", split, depth)
              for plan, name, split in plans for depth in depths
              if (plan, name) in programs and depth != own[(plan, name)]]
    if deeper:
        programs.update(compile_all(deeper))
    # Every layout's tables at once, so that stages alike across layouts are timed once and
    # no core waits for one layout's last shape.
    pools = wafer_pools_of(list(programs.values()), cache, grid=grid, pool=pool)
    layouts = {(plan, name): Layout(plan, name, regions)
               for (plan, name), regions in zip(programs, pools)}
    if not any(plan == "disaggregated" for plan, _ in layouts):
        raise UserError("no disaggregated split compiles: " + "; ".join(skipped))
    return layouts, skipped


def compile_or_why(model: ModelSpec, cluster: ClusterSpec,
                   options: CompileOptions) -> tuple[WaferProgram | None, str | None]:
    """The program, or None and why it does not compile (a job for a worker pool)."""
    try:
        return compile_model(model, cluster, options), None
    except CompileError as exc:
        return None, str(exc)


def _layout_plans(model: ModelSpec, fabric: FabricSpec, span: int, copies,
                  splits: list[dict]) -> tuple[list, list[str]]:
    """(plan, name, compile options) of every layout, and those no wafer can take."""
    plans, skipped = [], []
    for n in sorted(set(copies) | {1}):
        name = f"{n} cop{'y' if n == 1 else 'ies'}"
        if n == 1:
            plans.append(("colocated", name, {}))
        elif span > 1:
            skipped.append(f"colocated {name}: {model.name} spans {span} wafers of "
                           f"{fabric.name}, so a wafer holds no whole copy")
        elif n > fabric.width:
            skipped.append(f"colocated {name}: a wafer has only {fabric.width} columns")
        else:
            plans.append(("colocated", name, {"region": (fabric.width // n, fabric.height)}))
    for split in splits:
        if "prefill_share" in split:
            name = f"share {split['prefill_share']:g}"
        else:
            n = split["prefill_systems"]
            name = f"{n} prefill system{'s' if n > 1 else ''}"
        plans.append(("disaggregated", name, split))
    return plans, skipped


def _layers_per_stage(program) -> int:
    """The most layers any stage of ``program`` holds: its pipeline's depth, as compiled."""
    return max(s.layers[1] - s.layers[0] for s in program.stages)
