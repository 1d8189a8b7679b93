"""What every experiment shares before it runs: its arguments checked together (``Setup``), the
cluster both plans share (one compiled cluster, or pools named by their hardware counted as a
footprint), the workload's draws, and the layouts each plan may take, compiled and timed once
(``wafer_layouts`` for a compiled cluster, ``layouts.pool_layouts`` for pools). One run of the
experiment is a ``Job``: the runs' pool and book, the draws, the targets, the cluster and how
the requests and the step times are varied."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from wse_emu.errors import UserError
from wse_emu.experiments.comparison import (
    StepTiming,
    confirm_cap,
    describe_draws,
    disagg_experiment,
    longer_draws,
    trace_windows,
    tuning_requests,
    unchanged,
    workload_draws,
)
from wse_emu.experiments.goodput import RunBook, Targets
from wse_emu.experiments.layouts import (
    PoolCluster,
    PoolHardware,
    pool_layouts,
    pools_name,
    systems_of,
)
from wse_emu.experiments.sensitivity import StepScale
from wse_emu.experiments.wafer_layouts import build_layouts
from wse_emu.hardware.fabric import ClusterSpec, FabricSpec, load_fabric
from wse_emu.models.load import load_model
from wse_emu.models.spec import ModelSpec, formats_text
from wse_emu.pools.kinds.wafer import WAFER
from wse_emu.pools.named import pools_clock, side_pools
from wse_emu.serving.policies import check_in_tables
from wse_emu.serving.serve import position_shortfall
from wse_emu.serving.tables import longest_context


@dataclass(frozen=True)
class Job:
    """One run of the experiment: on ``pool``'s workers (its serving runs kept in ``book``),
    the tuning runs' ``draws``, the ``targets``, the ``cluster``; ``transform`` applied to a
    confirming run's requests and ``scale`` to the stage tables (a varied input's)."""

    pool: object
    book: RunBook
    draws: list
    targets: Targets
    cluster: object
    transform: object = unchanged
    scale: StepScale = field(default_factory=StepScale)


class Setup:
    """An experiment's arguments (an ``ExperimentSpec`` or a ``FrontierSpec``) checked
    together, before any work, and what its runs share: the model, the cluster, the workload
    and its draws, the search space, the layouts of each cluster size (built once: a frontier
    asks on every rung)."""

    def __init__(self, spec):
        hardware, self.space = spec.hardware, spec.space
        self.model = spec.model if isinstance(spec.model, ModelSpec) else load_model(spec.model)
        spec.timing.check_for(self.model, hardware)
        self.pools = hardware.named
        self.cache, self.progress = spec.execution.cache, spec.execution.progress
        if self.pools is None:
            fabric = "wse3" if hardware.fabric is None else hardware.fabric
            fabric = fabric if isinstance(fabric, FabricSpec) else load_fabric(fabric)
            self.cluster = ClusterSpec(fabric, 1 if hardware.systems is None
                                       else hardware.systems)
            check_space(self.space, {WAFER: ("prefill", "decode")})
        else:
            splits, colocated, footprint = self.pools
            if self.space.splits != "all":
                raise UserError("`splits` chooses among one compiled cluster's splits; pools "
                                "named by their hardware are split as they are named")
            self.cluster = PoolCluster(
                PoolHardware(pools_name(splits, colocated, footprint),
                             pools_clock([n for pair in splits for n in pair] + colocated)),
                systems_of(list(splits[0])), footprint.unit)
            check_space(self.space, phases_by_kind(splits, colocated))
        self.price = getattr(spec, "price_per_system_hour", None)
        if self.pools is not None and self.pools[2].kind == "cost":
            # A footprint in cost per hour: a unit of it costs 1 an hour, so the cost per
            # million output tokens follows (``comparison.economics``).
            self.price = 1.0
        self.spec = spec.load.spec()
        if spec.load.requests is None:
            self.spec.requests = tuning_requests(self.spec, self.cluster.systems)
        self.tolerance, self.timing = spec.tolerance, spec.timing
        plan = spec.load.draw_plan()
        if self.spec.arrival == "trace" and not plan.fixed:  # (fixed draws: as asked)
            plan = plan.within(trace_windows(self.spec, plan.cap))
        self.plan = plan
        # Every draw a run may use, the first ``plan.start`` to begin with: a trace's windows
        # for confirming runs are cut for the most draws (``plan.cap``), so that adding draws
        # leaves the first ones as they were.
        self.all_draws = workload_draws(self.spec, plan.cap)
        self.draws = self.all_draws[:plan.start]
        self._layouts: dict = {}

    def draws_for(self, n_systems: int) -> list:
        """The tuning runs' requests for ``n_systems`` systems, every draw a run may use (the
        base draws if the same)."""
        n = tuning_requests(self.spec, n_systems)
        return self.all_draws if n == self.spec.requests else workload_draws(
            replace(self.spec, requests=n), self.plan.cap)

    def first(self, n: int) -> list:
        """The first ``n`` draws of the workload."""
        return self.all_draws[:n]

    def probes(self, job: Job, confirming: bool = True) -> list:
        """Every set of requests a run of ``job`` may serve (with ``confirming``, the
        confirming runs' included), and those of the draws that may yet be added to it:
        layouts built for the first draws hold the later ones too (their tables reach their
        contexts)."""
        draws = list(job.draws)
        if all(a is b for a, b in zip(draws, self.all_draws)):
            draws = list(self.all_draws)
        if self.space.window_s <= 0 or not confirming:
            return draws
        longer = self.longer(job)
        return draws + [longer(r, confirm_cap(draws[0])) for r in range(len(draws))]

    def layouts(self, pool, cluster, probes: list) -> tuple[dict, list]:
        """``build_layouts`` for ``cluster``, built once; the ``probes`` are checked against
        the model's positions every time."""
        key = cluster.systems
        if key in self._layouts or self.pools is not None:
            # (``build_layouts`` checks them the first time)
            short = next(filter(None, (position_shortfall(r, self.model) for r in probes)), None)
            if short:
                raise UserError(short)
        if key not in self._layouts:
            self._layouts[key] = self._pool_layouts(cluster, probes) if self.pools is not None \
                else build_layouts(self.model, cluster, probes, self.cache, self.space,
                                   self.timing, pool, self.progress)
        return self._layouts[key]

    def share_layouts(self, other: "Setup") -> None:
        """Take ``other``'s layouts (built, or built by whichever asks first) as this one's:
        experiments on several workloads that serve the same choices serve them on the same
        layouts (``run.drift``)."""
        self._layouts = other._layouts

    def layouts_of(self, job: Job, probes: list) -> tuple[dict, list]:
        """The layouts ``job`` tunes over: its cluster's, their tables scaled as it asks."""
        layouts, skipped = self.layouts(job.pool, job.cluster, probes)
        return job.scale.layouts(layouts), skipped

    def longer(self, job: Job):
        """``longer(draw, n)`` for ``job``'s confirming runs (``comparison.longer_draws``)."""
        return longer_draws(self.spec, self.plan.cap, job.transform)

    def _pool_layouts(self, cluster, probes: list) -> tuple[dict, list]:
        """``pool_layouts`` of the pools named, every side timed for the cluster's clock (as
        far in context as the ``probes`` reach)."""
        splits, colocated, footprint = self.pools
        # Depths named are tried besides each wafer side's own ("matched" and "own": its own
        # only, since the sides are not compiled before they are laid out).
        depths = self.space.layers_per_stage
        side = SideBuilder(self.model, cluster.fabric.clock_hz, self.cache, self.space.grid,
                           longest_context(*probes))
        return pool_layouts(self.model, splits, colocated, side, footprint,
                            self.space.copies, depths if isinstance(depths, tuple) else ())

    def run(self, job: Job):
        """One experiment: its report and configurations, its serving runs kept in the job's
        book."""
        data, configs = disagg_experiment(self, job)
        data.configs = configs
        if len(job.draws) > 1:
            data.over_replicates["draws"] = describe_draws(self.spec, data)
        # How both plans' steps were timed, beside their results.
        model = self.model
        timing = self.timing
        speculation = None if timing.draft is None else {
            "draft": timing.draft, "draft_tokens": list(timing.draft_tokens),
            "draft_strips": list(timing.draft_strips), "acceptance": timing.acceptance,
            "acceptance_seed": timing.acceptance_seed}
        data.timing = StepTiming(timing.routing.describe() if model.is_moe else None,
                                 timing.attention_tile or None, formats_text(model) or None,
                                 job.scale.describe() or None, speculation)
        return data, configs


@dataclass(frozen=True)
class SideBuilder:
    """The pools of one side of a layout of pools named by their hardware (``side(side,
    role, first)``, as ``layouts.pool_layouts`` calls it), on systems from ``first`` on."""

    model: ModelSpec
    clock_hz: float
    cache: object
    grid: str
    reach: int = 0  # tokens of context its tables time, at least (``tables.reaching``)

    def __call__(self, side, role: str, first: int) -> list:
        return side_pools(self.model, side, role, first, self.clock_hz, self.cache, self.grid,
                          self.reach)


def check_space(space, phases: dict) -> None:
    """The micro-batch sizes ``space`` gives to try, within the tables of every kind of
    hardware (kind -> the phases it serves in the experiment) at the space's grid; the
    values left to the hardware are its own (``tuning.Layout.knob_values``)."""
    largest = {name: max(values) for name, values in space.given().items()}
    for kind, served in phases.items():
        tops = {phase: top for phase, top in kind.table_tops(space.grid).items()
                if phase in served}
        check_in_tables(largest, tops, kind.tables_named(space.grid))


def phases_by_kind(splits: list, colocated: list) -> dict:
    """Kind of hardware -> the phases its pools serve in the experiment: both where colocated,
    a side's where split."""
    phases: dict = {}
    for names, served in [(colocated, ("prefill", "decode"))] + [
            ([p], ("prefill",)) for p, _ in splits] + [([d], ("decode",)) for _, d in splits]:
        for name in names:
            phases[name.kind] = tuple(dict.fromkeys(phases.get(name.kind, ()) + served))
    return phases
