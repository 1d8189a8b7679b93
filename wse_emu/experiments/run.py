"""The experiments, run from their specs (``spec``): ``experiment`` (colocated against
disaggregated serving, or the same at each value of one input), ``frontier`` (both plans'
throughput against per-user speed, and the headline at one speed) and ``pairings`` (a frontier
for every pairing of kinds of hardware). ``wse_emu.api`` and the command line call these."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from wse_emu.errors import CompileError, UserError
from wse_emu.experiments import frontier as frontiers
from wse_emu.experiments.comparison import (
    ExperimentReport,
    VaryReport,
    experiment_swing,
    search_fixed,
    vary_experiment,
)
from wse_emu.experiments.draws import Swing, precision_report, run_until_precise
from wse_emu.experiments.drift import (
    DriftReport,
    DriftSpec,
    drift_row,
    relayout_seconds,
)
from wse_emu.experiments.goodput import RunBook
from wse_emu.experiments.pairings import PairingsReport, pairing_label
from wse_emu.experiments.sensitivity import StepScale, decode_step_s
from wse_emu.experiments.setup import Job, Setup
from wse_emu.experiments.spec import ExperimentSpec, FrontierSpec, PairingsSpec
from wse_emu.experiments.tuning import serve_choice
from wse_emu.models.load import load_model
from wse_emu.models.spec import ModelSpec
from wse_emu.serving.speculation import Speculation
from wse_emu.util.fmt import seconds
from wse_emu.util.workers import point_pool


def experiment(spec: ExperimentSpec) -> ExperimentReport | VaryReport:
    """The report ``experiment disagg --json`` prints (``ExperimentSpec`` says what)."""
    setup = Setup(spec)
    execution = spec.execution
    with point_pool(execution.scheduler, execution.workers) as pool:
        job = Job(pool, RunBook(pool, serve_choice), setup.all_draws, spec.targets,
                  setup.cluster)
        if spec.variation is not None:
            return vary_experiment(spec.variation, setup, job,
                                   None if spec.load.requests is not None else setup.draws_for,
                                   setup.plan)
        return _precise(setup, job)


def drift(spec: DriftSpec) -> DriftReport:
    """The report ``experiment drift --json`` prints: both plans tuned on the spec's first
    workload, then served as they are on every other one and tuned afresh on it, all on one
    set of layouts whose tables reach every workload's contexts (``experiments.drift``)."""
    if not isinstance(spec.model, ModelSpec):  # read once, for every workload
        spec = replace(spec, model=load_model(spec.model))
    setups = [Setup(spec.experiment(load)) for load in spec.loads]
    first, execution = setups[0], spec.execution
    with point_pool(execution.scheduler, execution.workers) as pool:
        book = RunBook(pool, serve_choice)
        jobs = [Job(pool, book, s.draws, spec.targets, s.cluster) for s in setups]
        first.layouts(pool, first.cluster, [p for s, j in zip(setups, jobs)
                                            for p in s.probes(j)])
        for s in setups[1:]:
            s.share_layouts(first)
        reports = []
        for k, (s, j) in enumerate(zip(setups, jobs)):
            if s.progress:
                s.progress(f"workload {k + 1} of {len(setups)}: {s.spec.name}, both plans "
                           "tuned on it")
            reports.append(_precise(s, j))
        fixed = reports[0].tuned
        rows = [drift_row(reports[0], [(r.configurations, r.comparison)
                                       for r in reports[0].draws()], None)]
        for s, j, data in zip(setups[1:], jobs[1:], reports[1:]):
            if s.progress:
                s.progress(f"{s.spec.name}: both plans as tuned on {first.spec.name}")
            draws = [search_fixed(s, j, fixed, runs, {
                choice: _rate_per_s(replicate, plan) for plan, choice in fixed.items()})
                for runs, replicate in zip(data.confirm_runs, data.draws())]
            row = drift_row(data, draws, None)
            row.relayout_s = _relayout_s(s, j, fixed, data, row)
            rows.append(row)
    cluster = first.cluster
    return DriftReport(first.model.name, f"{cluster.systems} x {cluster.fabric.name}",
                       first.spec.name, spec.targets, rows, reports)


def _precise(setup: Setup, job: Job) -> ExperimentReport:
    """``experiment``'s report on ``setup``'s workload, over as many draws as its plan asks."""
    (data, _), precision = run_until_precise(
        setup.plan, lambda n: setup.run(replace(job, draws=setup.first(n))),
        lambda result: experiment_swing(result[0], setup.all_draws), setup.progress)
    data.precision = None if setup.plan.fixed else precision
    return data


def _rate_per_s(replicate, plan: str) -> float:
    """The rate per second a draw's best of ``plan`` met (0: none)."""
    row = replicate.rows().get(replicate.comparison.best(plan))
    return row.max_rate_per_s if row is not None else 0.0


def _relayout_s(setup: Setup, job: Job, fixed: dict, data: ExperimentReport, row) -> float | None:
    """How long laying out the split retuned on this workload takes, where retuning chose
    another layout (None: the same layout, or one with no wafer to lay out)."""
    tuned = data.tuned.get("disaggregated")
    if tuned is None or tuned.layout == fixed["disaggregated"].layout \
            or row.retuned["disaggregated"] != tuned.label:
        return None
    layouts, _ = setup.layouts_of(job, [])
    regions = layouts[("disaggregated", tuned.layout)].regions
    cluster = job.cluster
    return relayout_seconds(setup.model, regions, cluster.fabric.clock_hz,
                            None if setup.pools is not None else cluster.systems)


def frontier(spec: FrontierSpec) -> frontiers.FrontierReport:
    """The report ``experiment frontier --json`` prints: every rung of the ladder is
    ``experiment`` at a p90 TPOT target of 1/speed, the same tuning for both plans, the rungs
    sharing their serving runs; then the headline read again with each step-time factor. With
    ``baseline``, the same frontier without speculative decoding is run first and kept in
    the report."""
    if spec.baseline:
        if not isinstance(spec.model, ModelSpec):  # read once, for both frontiers
            spec = replace(spec, model=load_model(spec.model))
        if spec.execution.progress:
            spec.execution.progress("the frontier without speculative decoding, first")
        baseline = frontier(spec.without_speculation())
        report = frontier(replace(spec, baseline=False))
        report.baseline = baseline
        return report
    setup = Setup(spec)
    vendor = frontiers.vendor_speed(setup.model.name)
    speeds, progress = spec.speeds, setup.progress
    speed = speeds.user_speed if speeds.user_speed is not None else (
        vendor.tokens_per_s if vendor else None)
    with point_pool(spec.execution.scheduler, spec.execution.workers) as pool:
        job = Job(pool, RunBook(pool, serve_choice), setup.draws, None, setup.cluster)
        floor = decode_floor(setup, job)
        ladder = speeds.user_speeds or tuple(frontiers.speed_ladder(floor, speed))
        if speed is not None and not any(np.isclose(speed, s) for s in ladder):
            ladder = tuple(sorted((*ladder, speed), reverse=True))
        job, precision = headline_draws(setup, job, spec, speed, ladder)
        rungs = []
        for k, s in enumerate(ladder):
            if progress:
                progress(f"rung {k + 1} of {len(ladder)}: {s:,.0f} tokens/s per user "
                         f"(p90 TPOT <= {seconds(1.0 / s)})")
            rungs.append((s, setup.run(replace(job, targets=spec.targets(s)))[0]))
        leaning = [] if speed is None else step_time_leaning(setup, job, spec, speed)
    rows = [frontiers.rung_row(s, d) for s, d in rungs]
    first = rungs[0][1]
    return frontiers.FrontierReport(
        setup.model.name, first.cluster, setup.spec.name, first.requests_per_run,
        len(job.draws), spec.ttft_s, spec.attainment, setup.space.grid, floor, rows,
        **frontiers.summarize(rows, vendor, speed), step_time_leaning=leaning,
        experiments={f"{s:g}": d for s, d in rungs}, precision=precision)


def headline_draws(setup: Setup, job: Job, spec: FrontierSpec, speed: float | None,
                   ladder: tuple = ()) -> tuple:
    """The job every rung runs, on as many draws as the headline's capacity ratio needs to be
    as precise as asked (``draws.run_until_precise``; the serving runs stay in the job's
    book for its rung), and the precision's account; with draws fixed, as it is and None.
    Without a headline speed there is no ratio to judge the draws by: the first ones, and
    the account says so. Where neither plan reaches the headline speed on any of the first
    draws, the draws are judged at the fastest rung of ``ladder`` below it that both plans
    reach on each of them (``judged_at`` in the account), so that the rungs where the plans
    can be compared are as precise as asked."""
    plan = setup.plan
    if plan.fixed:
        return job, None
    if speed is None:
        return job, precision_report(plan, len(job.draws), Swing(
            None, {}, [], "no headline speed (no vendor's speed for this model, and no "
                          "`user_speed`) to judge the draws by"))

    def at(s: float):
        targets = spec.targets(s)
        return lambda n: setup.run(replace(job, draws=setup.first(n), targets=targets))[0]

    def swing(data):
        return frontiers.capacity_swing(data, setup.all_draws)

    headline, precision = run_until_precise(plan, at(speed), swing, setup.progress)
    judged = _slower_rung_both_reach(at, headline, speed, ladder, plan.start)
    if judged is not None:
        if setup.progress:
            setup.progress(f"neither plan reaches {speed:,.0f} tokens/s per user: the draws "
                           f"judged at {judged:,.0f}, the fastest rung both reach")
        _, precision = run_until_precise(plan, at(judged), swing, setup.progress)
        precision["judged_at"] = judged
        precision["headline_unreached"] = speed
    return replace(job, draws=setup.first(precision["draws"])), precision


def _slower_rung_both_reach(at, headline, speed: float, ladder: tuple,
                            start: int) -> float | None:
    """Where the ``headline`` rung's first draws have neither plan reaching ``speed`` on any
    of them, the fastest rung of ``ladder`` slower than it on which both plans reach the rung
    on each of the first ``start`` draws (``at(s)(n)``: the rung at s on n draws); else
    None."""
    ratio = frontiers.capacity_ratio(headline)
    if ratio.neither_draws < ratio.draws:
        return None
    for s in sorted((s for s in ladder if s < speed and not np.isclose(s, speed)),
                    reverse=True):
        by_draw = frontiers.capacity_by_draw(at(s)(start))
        if all(got[plan] > 0 for got in by_draw for plan in frontiers.PLANS):
            return s
    return None


def decode_floor(setup: Setup, job: Job) -> float:
    """The fastest lone decode step of any layout either plan may take: the depth of a
    pipeline and the PEs a layer gets set it, so no single layout is the floor."""
    layouts, _ = setup.layouts(job.pool, job.cluster, setup.probes(job, confirming=False))
    timing = setup.timing
    return min(decode_step_s(lay.regions, job.draws[0], job.cluster.fabric.clock_hz,
                             Speculation.of(lay.draft_tokens, timing.acceptance)
                             .mean_tokens_per_step if lay.draft_tokens else 1.0)
               for lay in layouts.values())


def step_time_leaning(setup: Setup, job: Job, spec: FrontierSpec, speed: float) -> list:
    """The headline at ``speed`` read again with the prefill, then the decode, step times
    scaled by each of the spec's factors (the hardware unchanged)."""
    leaning = []
    for phase in ("prefill", "decode"):
        for f in spec.speeds.step_scales:
            if setup.progress:
                setup.progress(f"the headline with {phase} step times x{f:g}")
            data, _ = setup.run(replace(job, targets=spec.targets(speed),
                                        scale=StepScale(**{phase: f})))
            leaning.append(replace(frontiers.rung_row(speed, data), phase=phase, factor=f))
    return leaning


def pairings(spec: PairingsSpec) -> PairingsReport:
    """The report ``experiment pairings --json`` prints: ``frontier`` for every pairing of the
    spec's kinds, each against colocated serving on its kinds in its footprint. A pairing that
    cannot run (the model does not fit a side, the footprint holds no unit) is kept with
    why."""
    if not isinstance(spec.model, ModelSpec):  # read once, for every pairing
        spec = replace(spec, model=load_model(spec.model))
    kinds, progress = spec.kinds, spec.execution.progress
    pairs = [(p, d) for p in kinds for d in kinds]
    found, skipped, unit = {}, {}, "system"
    for n, (p, d) in enumerate(pairs):
        label = pairing_label(p, d)
        if progress:
            progress(f"pairing {n + 1} of {len(pairs)}: {label}")
        try:
            report = frontier(spec.pairing(p, d))
        except (CompileError, UserError) as exc:  # checked before any work: cheap to skip
            skipped[label] = str(exc)
            continue
        found[label] = report
        unit = report.footprint_unit
    if not found:  # an argument wrong for every pairing, or none fits: refused
        raise UserError(next(iter(skipped.values())))
    return PairingsReport(spec.model.name, spec.load.spec().name, list(kinds), unit, found,
                          skipped)
