"""The answer under drift: a split is fixed, traffic is not.

On a wafer the prefill share is a layout chosen at compile time; with accelerators it is
hardware bought. Colocated serving adapts to a changing mix by itself, a split tuned for one
mix may lose on another. ``experiment drift`` tunes both plans on one workload (as
``experiment disagg`` does), then serves those same choices, unchanged, on other workloads and
on a mixture that changes over the run (a workload of ``phases``), each also tuned afresh on
it. Per workload it reports the ratio of the plans as tuned once, the ratio each would reach
retuned, the regret of each plan kept as tuned (the share of the retuned capacity it gives
up), and, for a split of compiled wafers that retuning would lay out anew, how long reloading
the weights over the systems' links takes, so that a reader can judge a split changed by the
hour."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from wse_emu.errors import UserError
from wse_emu.experiments.comparison import ExperimentReport, Space
from wse_emu.experiments.goodput import Targets
from wse_emu.experiments.intervals import interval, ratio_interval
from wse_emu.experiments.spec import (
    TOLERANCE,
    Execution,
    ExperimentSpec,
    Hardware,
    Load,
    WaferTiming,
    check_tolerance,
)
from wse_emu.models.spec import ModelSpec
from wse_emu.pools.kinds.wafer import WaferRegion
from wse_emu.serving import blocktrace
from wse_emu.serving.workload import trace_names
from wse_emu.util.checks import check_fields, short_repr
from wse_emu.util.flags import flagged

PLANS = ("colocated", "disaggregated")
RELAYOUT_BASIS = ("the retuned layout's copies of the weights on wafers loaded from host "
                  "memory over the wafers' off-wafer links, in parallel (a floor: compiling, "
                  "draining running sequences and moving their KV come on top, and "
                  "accelerators' own reloads are not counted)")


@dataclass(frozen=True)
class DriftSpec:
    """Both plans tuned on ``load`` (as ``ExperimentSpec`` has it), then served unchanged on
    each workload of ``served_on`` and tuned afresh on it, every run judged against
    ``targets``; each served-on workload drawn as ``load`` says (the same seeds, or draws
    added until its own ratio is precise), at its own size per tuning run."""

    model: ModelSpec | Path | str
    load: Load
    targets: Targets
    served_on: Sequence[str] = flagged(
        "workloads to serve both plans on as tuned on the first, unchanged, and tuned afresh: "
        "presets or YAML (a workload of phases, such as chat-to-agents, drifts within the "
        "run), or shipped traces", reads="words", metavar="W1,W2,...", required=True)
    hardware: Hardware = field(default_factory=Hardware)
    space: Space = field(default_factory=Space)
    execution: Execution = field(default_factory=Execution)
    timing: WaferTiming = field(default_factory=WaferTiming)
    tolerance: float = flagged(default=0.05, **TOLERANCE)

    def __post_init__(self):
        check_fields(self)
        check_tolerance(self.tolerance)
        served = self.served_on
        if isinstance(served, (str, bytes)) or not hasattr(served, "__iter__") or not served \
                or not all(isinstance(w, str) and w for w in served):
            raise UserError(f"`served_on` must name one or more workloads, got "
                            f"{short_repr(served)}")
        object.__setattr__(self, "served_on", tuple(dict.fromkeys(served)))
        first = self.load.spec().name
        loads = [self._load(w) for w in self.served_on]
        for load in loads:  # each read and checked before any work
            if load.spec().name == first:
                raise UserError(f"`served_on` names {first}, the workload both plans are "
                                "tuned on: it is always served first")
        object.__setattr__(self, "loads", [self.load] + loads)

    def _load(self, name: str) -> Load:
        """A served-on workload as a ``Load``: a shipped trace or a trace file is replayed,
        anything else is a workload; drawn as the tuned-on load is."""
        draws = {f.name: getattr(self.load, f.name) for f in fields(Load)
                 if f.name in ("seeds", "precision", "max_seeds")}
        is_trace = name in trace_names() or Path(name).suffix in (".csv", blocktrace.SUFFIX)
        return Load(**({"trace": name} if is_trace else {"workload": name}), **draws)

    def experiment(self, load: Load) -> ExperimentSpec:
        """The experiment that tunes both plans on ``load``."""
        return ExperimentSpec(self.model, load, self.targets, self.hardware, self.space,
                              self.execution, self.timing, self.tolerance)


@dataclass
class DriftRow:
    """Both plans on one workload: as tuned on the first (``fixed``) and as tuned on this one
    (``retuned``: the better of its own tuning's choice and the fixed one, on the same runs),
    each plan's label (the first draw's) and output tokens/s per system over the whole run
    (means over the draws), the ratio
    disaggregated / colocated of each over the draws (``intervals.ratio_interval``), each
    plan's regret (1 - fixed / retuned capacity, per draw, ``intervals.interval``), why the
    fixed choices stopped where they did (on the first draw), and the time to lay out the
    retuned split where its layout is another (None: the same layout, or not wafers)."""

    workload: str
    draws: int
    fixed: dict
    retuned: dict
    fixed_tokens_per_s_per_system: dict
    retuned_tokens_per_s_per_system: dict
    fixed_ratio: dict
    retuned_ratio: dict
    regret: dict
    fixed_limits: dict
    relayout_s: float | None = None

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: dict) -> "DriftRow":
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass
class DriftReport:
    """``experiment drift``'s report: a row per workload (the tuned-on one first) and each
    workload's own experiment (``ExperimentReport``), in that order."""

    model: str
    cluster: str
    tuned_on: str
    targets: Targets
    rows: list[DriftRow]
    experiments: list[ExperimentReport]
    relayout_basis: str = RELAYOUT_BASIS  # how ``relayout_s`` is worked out

    def to_json(self) -> dict:
        return {"model": self.model, "cluster": self.cluster, "tuned_on": self.tuned_on,
                "targets": self.targets.to_json(), "rows": [r.to_json() for r in self.rows],
                "relayout_basis": self.relayout_basis,
                "experiments": [e.to_json() for e in self.experiments]}

    @classmethod
    def from_json(cls, data: dict) -> "DriftReport":
        return cls(data["model"], data["cluster"], data["tuned_on"],
                   Targets.from_json(data["targets"]),
                   [DriftRow.from_json(r) for r in data["rows"]],
                   [ExperimentReport.from_json(e) for e in data["experiments"]],
                   data.get("relayout_basis", RELAYOUT_BASIS))


def drift_row(data: ExperimentReport, fixed_draws: list, relayout_s: float | None) -> DriftRow:
    """The row of one workload: ``data`` is its own experiment, ``fixed_draws`` the choices
    tuned on the first workload searched on each of its draws' confirming runs (rows,
    comparison) per draw."""
    own = data.draws()
    per = {"fixed": {p: [] for p in PLANS}, "retuned": {p: [] for p in PLANS}}
    tokens = {"fixed": {p: [] for p in PLANS}, "retuned": {p: [] for p in PLANS}}
    labels = {"fixed": {}, "retuned": {}}
    for replicate, (rows, cmp_) in zip(own, fixed_draws):
        fixed_rows = {r.configuration: r for r in rows}
        for plan in PLANS:
            f = fixed_rows.get(cmp_.best(plan))
            o = replicate.rows().get(replicate.comparison.best(plan))
            f_rate, o_rate = _rate(f), _rate(o)
            best = f if f_rate >= o_rate else o  # retuning could keep the fixed choice
            per["fixed"][plan].append(f_rate)
            per["retuned"][plan].append(max(f_rate, o_rate))
            tokens["fixed"][plan].append(_tokens(f))
            tokens["retuned"][plan].append(_tokens(best))
            labels["fixed"].setdefault(plan, cmp_.best(plan))
            labels["retuned"].setdefault(plan, best.configuration if best else None)
    first_rows = {r.configuration: r for r in fixed_draws[0][0]}
    return DriftRow(
        data.workload, len(fixed_draws), labels["fixed"], labels["retuned"],
        {p: float(np.mean(tokens["fixed"][p])) for p in PLANS},
        {p: float(np.mean(tokens["retuned"][p])) for p in PLANS},
        _ratios(per["fixed"]), _ratios(per["retuned"]),
        {p: _regret(per["fixed"][p], per["retuned"][p]) for p in PLANS},
        {p: getattr(first_rows.get(labels["fixed"][p]), "limited_by", None) for p in PLANS},
        relayout_s)


def _regret(fixed: list, retuned: list) -> dict:
    """1 - fixed / retuned capacity per draw (none where retuning reached nothing either),
    over the draws; the interval cut to the shares a regret can be, 0 to 1."""
    out = interval([1.0 - f / r if r > 0 else None for f, r in zip(fixed, retuned)])
    if "low" in out:
        out.update(low=max(out["low"], 0.0), high=min(out["high"], 1.0))
    return out


def _rate(row) -> float:
    """A row's highest rate met per system (0: it met none, or no row)."""
    return (row.max_rate_per_system or 0.0) if row is not None else 0.0


def _tokens(row) -> float:
    return (row.output_tokens_per_s_per_system or 0.0) if row is not None else 0.0


def _ratios(per_plan: dict) -> dict:
    """The ratio disaggregated / colocated per draw, over the draws; a draw where colocated
    met no rate has none: unbounded where the split met one (``unbounded_draws``), and no
    ratio at all where neither did."""
    pairs = list(zip(per_plan["disaggregated"], per_plan["colocated"]))
    out = ratio_interval([d / c for d, c in pairs if c > 0])
    unbounded = sum(c <= 0 < d for d, c in pairs)
    return {**out, "unbounded_draws": unbounded} if unbounded else out


def relayout_seconds(model: ModelSpec, regions: list, clock_hz: float,
                     systems: int | None = None) -> float | None:
    """How long laying a layout out anew on its wafers takes at least: each wafer region (a
    copy of the model) loads its weights from host memory, the ``systems`` wafers (None:
    those the regions sit on) in parallel, each over its own off-wafer link (its rate in
    bytes per cycle of the serving clock ``clock_hz``). Compiling, draining the sequences
    running and moving their KV come on top; regions of other hardware (accelerators,
    GPUs), which reload from their own hosts, are not counted. None: no wafer region."""
    wafers = [r for r in regions if isinstance(r, WaferRegion)]
    if not wafers:
        return None
    systems = systems or len({r.system for r in wafers})
    rate = min(r.link_bytes_per_cycle for r in wafers) * clock_hz
    return len(wafers) * model.weight_bytes() / (systems * rate)


__all__ = ["DriftReport", "DriftRow", "DriftSpec", "RELAYOUT_BASIS", "drift_row",
           "relayout_seconds"]
