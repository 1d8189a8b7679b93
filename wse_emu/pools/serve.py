"""Serving a workload, whole: on a compiled program's regions (``serve_program``) or on pools
named by their hardware (``serve_named``), every argument checked before any work
(``check_serving``), the run returned with its metrics and the report ``wse-emu serve
--json`` prints (``ServeRun``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from wse_emu.errors import CompileError, UserError
from wse_emu.hardware.fabric import ClusterSpec
from wse_emu.models.load import load_model
from wse_emu.models.spec import ModelSpec
from wse_emu.pools.kinds.wafer import WAFER, wafer_pools
from wse_emu.pools.named import named_pools, pool_sides
from wse_emu.pools.names import parse_pool
from wse_emu.pools.speculative import step_alone
from wse_emu.program.format import WaferProgram
from wse_emu.serving.metrics import RunMetrics, ServeReport, run_metrics
from wse_emu.serving.policies import check_in_tables
from wse_emu.serving.serve import (
    LOOPS,
    ServeOptions,
    ServeResult,
    kv_shortfall,
    position_shortfall,
    setting_names,
)
from wse_emu.serving.serve import serve as serve_requests
from wse_emu.serving.speculation import speculation_report
from wse_emu.serving.tables import default_cache_dir, longest_context
from wse_emu.serving.workload import Requests, WorkloadSpec, workload_spec
from wse_emu.serving.workload import generate as generate_requests
from wse_emu.util.checks import one_of, positive, whole


@dataclass
class ServeRun:
    """A serving run, whole: the per-request ``result``, its ``metrics`` (with the targets,
    the attainment) and the ``report`` the command line prints and keeps (``to_json()``)."""

    result: ServeResult
    metrics: RunMetrics
    report: ServeReport

    @property
    def requests(self) -> Requests:
        return self.result.requests


@dataclass(frozen=True)
class Demand:
    """What is served and how it is judged: a workload (a preset, a YAML or a WorkloadSpec) or
    a ``trace``'s replay, ``rate`` and ``requests`` overriding its own, and the targets
    (``ttft_s``, ``tpot_s``; None: not judged)."""

    workload: WorkloadSpec | Path | str | None = None
    trace: Path | str | None = None
    rate: float | None = None
    requests: int | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None

    @property
    def targets(self) -> dict:
        return {"ttft_s": self.ttft_s, "tpot_s": self.tpot_s}


def check_serving(demand: Demand, kinds: tuple = (WAFER,), **options) -> WorkloadSpec:
    """Check a serving run's arguments, all but the hardware, before any work: the workload
    (the one it reads is returned), the targets, and every serving option by name and range
    (the micro-batch sizes within the stage tables of every kind of hardware in ``kinds``)."""
    settings = ServeOptions.of(_NO_HARDWARE, _NO_HARDWARE, **options)
    if (settings.acceptance is not None or settings.acceptance_seed) \
            and not settings.draft_tokens:
        raise UserError("`acceptance` and `acceptance_seed` are for speculative decoding: give "
                        "`draft_tokens` too (without them they would be ignored)")
    values = {name: getattr(settings, name) for name in setting_names()}
    for kind in kinds:
        check_in_tables(values, kind.table_tops("full"), kind.tables_named("full"))
    for name, value in (("ttft_s", demand.ttft_s), ("tpot_s", demand.tpot_s)):
        if value is not None:
            positive(name, value)
    if (demand.workload is None) == (demand.trace is None):
        raise UserError("give a `workload` or a `trace`, one of them")
    if demand.rate is not None:
        positive("rate", demand.rate)
    if demand.requests is not None:
        whole("requests", demand.requests, 1)
    return workload_spec(demand.workload, demand.trace, demand.rate, demand.requests)


def serve_program(program: WaferProgram, demand: Demand, cache_dir: Path | str | None = None,
                  loop: str = "compiled", **options) -> ServeRun:
    """``demand`` served on ``program``'s regions; ``options`` are ``ServeOptions`` fields."""
    spec = check_serving(demand, **options)
    one_of("loop", loop, LOOPS)
    cache = default_cache_dir(cache_dir)
    settings = ServeOptions.of(program.fabric, program.model, **options)
    if program.draft is not None and not settings.draft_tokens:
        raise UserError(f"the program has a draft ({program.draft.model.name}) beside the "
                        "target, taking its strip of the wafer: give `draft_tokens` and "
                        "`acceptance` to speculate with it, or compile without `draft`")
    if settings.draft_tokens and program.draft is not None:
        # A handoff moves the draft's KV of the prompt with the target's.
        settings = replace(settings, kv_bytes_per_token=settings.kv_bytes_per_token
                           + program.draft.model.kv_bytes_per_token())
    reqs = generate_requests(spec)
    short = position_shortfall(reqs, program.model)
    if short:  # found before any table is timed
        raise UserError(short)
    short = kv_shortfall(reqs, program.regions)
    if short:
        raise UserError(f"{short}: {room_advice(program, reqs)}")
    pools = wafer_pools(program, cache, draft_tokens=settings.draft_tokens,
                        reach=longest_context(reqs))
    result = serve_requests(reqs, pools, settings, loop=loop)
    result.workload = spec.name
    metrics = run_metrics(result, reqs, demand.ttft_s, demand.tpot_s)
    report = ServeReport(demand.targets, metrics, result.regions, model=program.model.name,
                         cluster=f"{program.systems} x {program.fabric.name}",
                         plan=program.options.plan, policy=settings.policy,
                         workload=result.workload)
    spec = settings.speculation()
    if spec is not None:
        decoder = next(p for p in pools if p.verify is not None)
        report.speculation = speculation_report(
            spec, result.gap_request, result.gap_cycles,
            step_alone(decoder, decoder.draft_stages, settings.clock_hz),
            program.summary["draft"], result.regions)
    return ServeRun(result, metrics, report)


def serve_named(model: ModelSpec | Path | str, demand: Demand, sides: str | dict,
                cache_dir: Path | str | None = None, loop: str = "compiled",
                **options) -> ServeRun:
    """``demand`` served on pools named as on the command line (``named.named_pools``):
    colocated on one (``sides`` a pool name: a wafer cluster, accelerator instances or GPUs),
    or disaggregated (``sides`` {"prefill": name, "decode": name}), every copy of one side
    able to hand its KV to any copy of the other. Everything is checked before any work."""
    sides = sides_of(sides)
    # Named wrongly: refused before any work; the kinds' tables bound the micro-batches.
    kinds = tuple(parse_pool(text).kind for text in sides.values())
    spec = check_serving(demand, kinds, **options)
    one_of("loop", loop, LOOPS)
    default_cache_dir(cache_dir)
    model = model if isinstance(model, ModelSpec) else load_model(model)
    reqs = generate_requests(spec)
    short = position_shortfall(reqs, model)
    if short:
        raise UserError(short)
    pools, clock_hz = named_pools(model, sides, cache_dir, reach=longest_context(reqs))
    settings = ServeOptions.of(_Clock(clock_hz), model, **options)
    result = serve_requests(reqs, pools, settings, loop=loop)
    result.workload = spec.name
    metrics = run_metrics(result, reqs, demand.ttft_s, demand.tpot_s)
    colocated = "mixed" in sides
    sources = {"step times" if role == "mixed" else f"{role} step times":
               _source(parse_pool(name)) for role, name in sides.items()}
    report = ServeReport(demand.targets, metrics, result.regions, model=model.name,
                         cluster=sides["mixed"] if colocated else
                         f"{sides['prefill']} (prefill) + {sides['decode']} (decode)",
                         plan="colocated" if colocated else "disaggregated",
                         policy=settings.policy, workload=result.workload, step_times=sources)
    return ServeRun(result, metrics, report)


def sides_of(sides: str | dict) -> dict[str, str]:
    """A pool name (colocated) or {"prefill": name, "decode": name} (a split): role -> name,
    as ``named_pools`` takes them; anything else is refused."""
    if isinstance(sides, str):
        return pool_sides(sides, None, None)
    if isinstance(sides, dict) and set(sides) == {"prefill", "decode"}:
        return pool_sides(None, sides["prefill"], sides["decode"])
    raise UserError("`sides` must be a pool name (colocated) or {'prefill': NAME, 'decode': "
                    "NAME} (a split)")


def _source(pool) -> str:
    """Where a pool's step times come from, as its kind says."""
    return pool.kind.step_times_source(pool.hardware)


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
        # The compiler, with the engines under it, imported only here: serving a compiled
        # program needs neither.
        from wse_emu.compiler.mapper import compile_model

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


class _NoHardware:
    """What ``check_serving`` gives ``ServeOptions.of`` for a fabric and a model: the
    hardware's numbers are not what it checks."""

    clock_hz = 1.0

    @staticmethod
    def kv_bytes_per_token() -> int:
        return 0


_NO_HARDWARE = _NoHardware()
