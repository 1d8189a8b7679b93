"""The frontier: each plan's output tokens/s per system against tokens/s per user, as the field
reads the trade-off (NVIDIA's AIConfigurator and SemiAnalysis' InferenceMAX plot throughput per
GPU against interactivity), and the answer at the vendor's own token speed.

Each rung of a ladder of per-user speeds S is one experiment (``comparison``): both plans
tuned alike at a p90 TPOT target of 1/S, each plan's best searched again on long runs, over the
draws. Its point per plan is that best: its output tokens/s per system over the steady window,
the per-user speeds it gave (p50, p90, mean), its goodput, its configuration and what binds it.
A serving run does not depend on the target, so the rungs share every run they have in common
(``RunBook``): the rungs cost far less than as many experiments.

The headline is high-speed token capacity: the output tokens/s per system a plan sustains with
the per-user speed of at least 90% of requests at or above S (p90 TPOT <= 1/S), at S = the
model's published vendor speed (``vendor_speed``). A plan that reaches S at no rate has a
capacity of 0, and a ratio over a zero is reported as unbounded, never as a number.

``wse-emu experiment frontier`` prints a ``FrontierReport``; its ``to_json()`` is the
``--json`` and experiment.json, and ``report_from_json`` reads any experiment.json back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from pathlib import Path

import numpy as np
import yaml

from wse_emu.errors import UserError
from wse_emu.experiments.comparison import ExperimentReport, VaryReport
from wse_emu.experiments.draws import Swing
from wse_emu.experiments.intervals import has_interval, interval, ratio_interval
from wse_emu.serving.metrics import UserSpeeds
from wse_emu.util.checks import is_number, short_repr

VENDOR_SPEEDS = Path(str(resources.files("wse_emu.programs"))) / "vendor_speeds.yaml"
SLOWEST_TPOT_S = 0.02  # the ladder's slow end: 50 tokens/s per user
RUNGS = 8  # rungs between the fastest a lone sequence allows and the slow end
FLOOR_MARGIN = 1.1  # the fastest rung's TPOT target: this many lone decode steps
PLANS = ("colocated", "disaggregated")


@dataclass(frozen=True)
class VendorSpeed:
    """A per-user output speed the vendor sells for a model, with where it is published."""

    tokens_per_s: float
    source: str


def vendor_speed(model_name: str) -> VendorSpeed | None:
    """The model's published vendor speed (``programs/models/vendor_speeds.yaml``), if any."""
    data = yaml.safe_load(VENDOR_SPEEDS.read_text()) or {}
    entry = data.get(model_name)
    if entry is None:
        return None
    return VendorSpeed(float(entry["tokens_per_s"]), str(entry["source"]))


def speed_ladder(floor_s: float, vendor: float | None = None, rungs: int = RUNGS) -> list[float]:
    """Per-user speeds (tokens/s) to aim at, fastest first: from 1/(FLOOR_MARGIN lone decode
    steps) down to 1/SLOWEST_TPOT_S in even steps of log, with the vendor's speed among them
    when it is reachable at all (slower than a lone sequence's step)."""
    fastest = 1.0 / (FLOOR_MARGIN * floor_s)
    slowest = 1.0 / SLOWEST_TPOT_S
    speeds = list(np.geomspace(fastest, slowest, rungs)) if fastest > slowest else [fastest]
    if vendor is not None and vendor < 1.0 / floor_s:
        speeds.append(float(vendor))
    return sorted({round(float(s), 6) for s in speeds}, reverse=True)


def is_speed(value) -> bool:
    """Whether ``value`` is a per-user speed a rung can aim at: a positive number of tokens/s
    whose TPOT target, 1/speed, is a positive number too (inf has none, nor has 1e-320,
    whose inverse overflows): refused here, not as a TPOT target after the tables are
    timed."""
    return is_number(value) and 0 < value < math.inf and 0 < 1.0 / value < math.inf


def check_speed(name: str, value) -> float:
    """``value`` if it is a per-user speed (``is_speed``), else a UserError naming ``name``."""
    if not is_speed(value):
        raise UserError(f"`{name}` must be a positive number of tokens/s (its TPOT target, 1 / "
                        f"speed, a positive number too), got {short_repr(value)}")
    return float(value)


def check_speeds(speeds) -> tuple[float, ...]:
    """Per-user speeds given by hand: positive numbers, fastest first, each once."""
    if isinstance(speeds, (str, bytes)) or not hasattr(speeds, "__iter__"):
        raise UserError(f"`user_speeds` must be a sequence of tokens/s, got "
                        f"{short_repr(speeds)}")
    values = tuple(speeds)
    if not values or not all(is_speed(v) for v in values):
        raise UserError(f"`user_speeds` must be one or more positive tokens/s (each one's TPOT "
                        f"target, 1 / speed, a positive number too), got {short_repr(values)}")
    return tuple(sorted(set(float(v) for v in values), reverse=True))


@dataclass
class FrontierPoint:
    """One plan's point on one rung: its best configuration, whether it reached the rung's
    target at some rate, its sustained output tokens/s per system over the steady window, the
    per-user speeds it gave, its goodput per system, what binds it and why; with several
    draws, 95% intervals (``interval``) of the first two; on a frontier, the rung's target
    speed."""

    plan: str
    configuration: str | None
    reached: bool
    tokens_per_s_per_system: float
    goodput_per_system: float
    user_tokens_per_s: UserSpeeds | None
    limited_by: str | None
    prefill_utilization: float | None
    decode_utilization: float | None
    why: str | None = None
    tokens_per_s_per_system_interval: dict | None = None
    goodput_per_system_interval: dict | None = None
    user_speed_target: float | None = None
    # Agent sessions: how long a whole session took, p50 and p90 (None for plain requests).
    session_p50_s: float | None = None
    session_p90_s: float | None = None

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)[:10]}
        if self.user_tokens_per_s is not None:
            out["user_tokens_per_s"] = self.user_tokens_per_s.to_json()
        out.update({f.name: getattr(self, f.name) for f in fields(self)[10:]
                    if getattr(self, f.name) is not None})
        return out

    @classmethod
    def from_json(cls, data: dict) -> "FrontierPoint":
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        if values.get("user_tokens_per_s") is not None:
            values["user_tokens_per_s"] = UserSpeeds.from_json(values["user_tokens_per_s"])
        return cls(**values)


def plan_point(data: ExperimentReport, plan: str) -> FrontierPoint:
    """One plan's point on one rung, from the rung's experiment report: its best
    configuration's sustained output tokens/s per system, per-user speeds, goodput and what
    binds it; over several draws, the means and 95% intervals of each draw's best's
    throughputs (the configuration, per-user speeds and what binds are the first draw's)."""
    cmp_ = data.comparison
    label = cmp_.best(plan)
    row = {c.configuration: c for c in data.final}.get(label)
    met = row is not None and row.max_rate_per_system > 0
    point = FrontierPoint(
        plan, label, met,
        row.window_output_tokens_per_s_per_system if met else 0.0,
        row.max_rate_per_system if row is not None else 0.0,
        row.user_tokens_per_s if met else None,
        *((row.limited_by, row.prefill_utilization, row.decode_utilization)
          if row is not None else (None, None, None)),
        why=next((r for r in cmp_.reasons if label and r.startswith(label + ":")), None),
        session_p50_s=row.session_p50_s if met else None,
        session_p90_s=row.session_p90_s if met else None)
    if data.replicates and met:
        # Over several draws the point is the mean of each draw's best, as the ratio pairs
        # them (the first draw's alone would sit beside an interval about another centre).
        tokens = interval([got[plan] for got in capacity_by_draw(data)], floor=0.0)
        goodput = interval([_best_rate(d, plan) for d in data.draws()], floor=0.0)
        point.tokens_per_s_per_system_interval = tokens
        point.goodput_per_system_interval = goodput
        point.tokens_per_s_per_system = tokens["mean"]
        point.goodput_per_system = goodput["mean"]
    return point


def _best_rate(draw, plan: str) -> float:
    """A draw's best configuration of ``plan``: its goodput per system (0: none)."""
    row = draw.rows().get(draw.comparison.best(plan))
    return row.max_rate_per_system if row is not None else 0.0


@dataclass
class CapacityRatio:
    """Disaggregated over colocated sustained output tokens/s per system on one rung, over
    its draws (``capacity_ratio``): the mean (``ratio``) and its 95% interval where both plans
    reached the rung on every draw; else "unbounded" (only disaggregated reached it) or None,
    with the draws where colocated (``unbounded_draws``) or neither plan reached it."""

    draws: int
    unbounded_draws: int
    neither_draws: int
    ratio: float | str | None
    interval: dict | None

    @property
    def complete(self) -> bool:
        """Both plans reached the rung on every draw."""
        return not (self.unbounded_draws or self.neither_draws)

    def to_json(self) -> dict:
        out = {"draws": self.draws, "unbounded_draws": self.unbounded_draws,
               "neither_draws": self.neither_draws}
        if self.complete:
            return {**out, "interval": self.interval, "ratio": self.ratio}
        return {**out, "ratio": self.ratio, "interval": self.interval}

    @classmethod
    def from_json(cls, data: dict) -> "CapacityRatio":
        return cls(data["draws"], data["unbounded_draws"], data["neither_draws"],
                   data.get("ratio"), data.get("interval"))


def capacity_by_draw(data: ExperimentReport) -> list[dict]:
    """Each plan's sustained output tokens/s per system on every draw of one rung (0 where
    it reached no rate)."""
    out = []
    for d in data.draws():
        rows = d.rows()
        got = {}
        for plan in PLANS:
            row = rows.get(d.comparison.best(plan))
            got[plan] = row.window_output_tokens_per_s_per_system \
                if row is not None and row.max_rate_per_system > 0 else 0.0
        out.append(got)
    return out


def capacity_swing(data: ExperimentReport, requests: list) -> Swing:
    """What one rung's draws (their ``requests``) give the capacity ratio (``draws.Swing``)."""
    by_draw = capacity_by_draw(data)
    ratio = capacity_ratio(data)
    per_plan = {plan: [got[plan] for got in by_draw] for plan in PLANS}
    undefined = None
    if ratio.unbounded_draws or ratio.neither_draws:
        undefined = (f"colocated reached no rate on {ratio.unbounded_draws + ratio.neither_draws} "
                     f"of {ratio.draws} draws, so the ratio is not defined on every draw")
    return Swing(None if undefined else ratio.interval, per_plan,
                 list(requests[:len(by_draw)]), undefined)


def capacity_ratio(data: ExperimentReport) -> CapacityRatio:
    """Disaggregated over colocated sustained output tokens/s per system on one rung, over
    its draws: the geometric mean and 95% interval (on the log scale, ``ratio_interval``)
    where both plans reached it on every draw; else
    "unbounded" (only disaggregated reached it) or "neither"."""
    draws = data.draws()
    values, unbounded, neither = [], 0, 0
    for got in capacity_by_draw(data):
        if got["colocated"] > 0:
            values.append(got["disaggregated"] / got["colocated"])
        elif got["disaggregated"] > 0:
            unbounded += 1
        else:
            neither += 1
    if unbounded or neither:
        return CapacityRatio(len(draws), unbounded, neither,
                             "unbounded" if unbounded and not values else None,
                             ratio_interval(values) if values else None)
    iv = ratio_interval(values)
    return CapacityRatio(len(draws), 0, 0, iv["mean"], iv)


def pareto(points: list[FrontierPoint]) -> list[FrontierPoint]:
    """The points no other beats on both per-user speed (p90) and output tokens/s per system,
    fastest first: along it, a faster per-user speed never gives more throughput."""
    reached = [p for p in points if p.reached]
    reached.sort(key=lambda p: (-p.user_tokens_per_s.p90, -p.tokens_per_s_per_system))
    front, best = [], -1.0
    for p in reached:
        if p.tokens_per_s_per_system > best:
            front.append(p)
            best = p.tokens_per_s_per_system
    return front


@dataclass
class Rung:
    """One rung of the ladder: its per-user speed and TPOT target, each plan's point, the
    capacity ratio and DistServe's goodput ratio at the same target (with its interval over
    several draws); read again with step times scaled, the ``phase`` scaled and by what
    ``factor``."""

    user_speed: float
    tpot_target_s: float
    plans: dict[str, FrontierPoint]
    capacity_ratio: CapacityRatio
    goodput_ratio: float | None
    goodput_ratio_interval: dict | None = None
    phase: str | None = None
    factor: float | None = None

    def to_json(self) -> dict:
        out = {} if self.phase is None else {"phase": self.phase, "factor": self.factor}
        out.update({"user_speed": self.user_speed, "tpot_target_s": self.tpot_target_s,
                    "plans": {plan: p.to_json() for plan, p in self.plans.items()},
                    "capacity_ratio": self.capacity_ratio.to_json(),
                    "goodput_ratio": self.goodput_ratio})
        if self.goodput_ratio_interval is not None:
            out["goodput_ratio_interval"] = self.goodput_ratio_interval
        return out

    @classmethod
    def from_json(cls, data: dict) -> "Rung":
        return cls(data["user_speed"], data["tpot_target_s"],
                   {plan: FrontierPoint.from_json(p) for plan, p in data["plans"].items()},
                   CapacityRatio.from_json(data["capacity_ratio"]), data.get("goodput_ratio"),
                   data.get("goodput_ratio_interval"), data.get("phase"), data.get("factor"))


def rung_row(speed: float, data: ExperimentReport) -> Rung:
    """One rung: its target, each plan's point, the capacity ratio and DistServe's goodput
    ratio at the same target."""
    over = None if data.over_replicates is None else data.over_replicates["goodput_ratio"]
    # Over several draws, the goodput ratio's centre is theirs, as its interval's is.
    goodput = over["mean"] if has_interval(over) else data.comparison.goodput_ratio
    return Rung(speed, 1.0 / speed, {plan: plan_point(data, plan) for plan in PLANS},
                capacity_ratio(data), goodput, over)


@dataclass
class Headline:
    """High-speed token capacity at one per-user speed (by default the vendor's): each
    plan's output tokens/s per system, the capacity ratio, DistServe's goodput ratio at the
    same target, each plan's configuration and why it stopped there."""

    user_speed: float
    tpot_target_s: float
    vendor: VendorSpeed | None
    capacity_per_system: dict[str, float]  # by plan
    capacity_ratio: CapacityRatio
    goodput_ratio: float | None
    goodput_ratio_interval: dict | None
    configurations: dict[str, str | None]  # by plan
    why: dict[str, str | None]  # by plan

    def to_json(self) -> dict:
        return {"user_speed": self.user_speed, "tpot_target_s": self.tpot_target_s,
                "vendor": None if self.vendor is None else {
                    "tokens_per_s": self.vendor.tokens_per_s, "source": self.vendor.source},
                "capacity_per_system": self.capacity_per_system,
                "capacity_ratio": self.capacity_ratio.to_json(),
                "goodput_ratio": self.goodput_ratio,
                "goodput_ratio_interval": self.goodput_ratio_interval,
                "configurations": self.configurations, "why": self.why}

    @classmethod
    def from_json(cls, data: dict) -> "Headline":
        vendor = data.get("vendor")
        return cls(data["user_speed"], data["tpot_target_s"],
                   None if vendor is None else VendorSpeed(vendor["tokens_per_s"],
                                                           vendor["source"]),
                   data["capacity_per_system"], CapacityRatio.from_json(data["capacity_ratio"]),
                   data.get("goodput_ratio"), data.get("goodput_ratio_interval"),
                   data["configurations"], data["why"])


def summarize(rungs: list[Rung], vendor: VendorSpeed | None, speed: float | None) -> dict:
    """Each plan's frontier and fastest reachable speed, and the headline at ``speed``: the
    ``FrontierReport`` fields ``frontier``, ``fastest_reached`` and ``headline``."""
    frontier, fastest_reached = {}, {}
    for plan in PLANS:
        # As a frontier lists them: each with its rung's target speed.
        points = [replace(r.plans[plan], user_speed_target=r.user_speed) for r in rungs]
        frontier[plan] = pareto(points)
        fastest_reached[plan] = max((p.user_tokens_per_s.p90 for p in points if p.reached),
                                    default=0.0)
    headline = None
    if speed is not None:
        rung = next(r for r in rungs if np.isclose(r.user_speed, speed))
        headline = Headline(
            speed, 1.0 / speed, vendor,
            {p: rung.plans[p].tokens_per_s_per_system for p in PLANS}, rung.capacity_ratio,
            rung.goodput_ratio, rung.goodput_ratio_interval,
            {p: rung.plans[p].configuration for p in PLANS},
            {p: rung.plans[p].why for p in PLANS})
    return {"frontier": frontier, "fastest_reached": fastest_reached, "headline": headline}


@dataclass
class FrontierReport:
    """The frontier (``api.frontier``): what ran where, the ladder's rungs, each plan's
    Pareto frontier and fastest per-user speed reached, the headline, the headline read again
    with step times scaled (``step_time_leaning``), and every rung's experiment report (by
    its speed). ``to_json()`` is ``experiment frontier --json`` and experiment.json."""

    model: str
    cluster: str
    workload: str
    requests_per_run: int
    seeds: int
    ttft_p90_s: float
    attainment: float
    stage_grid: str
    lone_decode_step_s: float
    rungs: list[Rung]
    frontier: dict[str, list[FrontierPoint]]  # by plan, fastest first
    fastest_reached: dict[str, float]  # by plan
    headline: Headline | None = None
    step_time_leaning: list[Rung] = field(default_factory=list)
    experiments: dict[str, ExperimentReport] = field(default_factory=dict)
    # With draws added until the headline's ratio was precise: the precision asked and
    # reached, and if not, why (``draws.precision_report``); every rung ran on those draws.
    precision: dict | None = None
    # With speculative decoding and ``baseline`` asked: the same frontier without it (the
    # same workload, draws, hardware and tuning), to set beside it.
    baseline: "FrontierReport | None" = None

    @property
    def footprint_unit(self) -> str:
        """What its rates are per: a system, or a footprint's unit across kinds (its
        experiments say)."""
        first = next(iter(self.experiments.values()), None)
        return first.footprint_unit if first is not None else "system"

    def to_json(self) -> dict:
        out = {"model": self.model, "cluster": self.cluster, "workload": self.workload,
               "requests_per_run": self.requests_per_run, "seeds": self.seeds,
               "ttft_p90_s": self.ttft_p90_s, "attainment": self.attainment,
               "stage_grid": self.stage_grid, "lone_decode_step_s": self.lone_decode_step_s,
               "rungs": [r.to_json() for r in self.rungs],
               "frontier": {plan: [p.to_json() for p in points]
                            for plan, points in self.frontier.items()},
               "fastest_reached": self.fastest_reached}
        if self.headline is not None:
            out["headline"] = self.headline.to_json()
        out["step_time_leaning"] = [r.to_json() for r in self.step_time_leaning]
        if self.precision is not None:
            out["precision"] = self.precision
        out["experiments"] = {k: d.to_json() for k, d in self.experiments.items()}
        if self.baseline is not None:
            out["baseline"] = self.baseline.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict) -> "FrontierReport":
        return cls(
            data["model"], data["cluster"], data["workload"], data["requests_per_run"],
            data["seeds"], data["ttft_p90_s"], data["attainment"],
            data.get("stage_grid", "full"), data["lone_decode_step_s"],
            [Rung.from_json(r) for r in data["rungs"]],
            {plan: [FrontierPoint.from_json(p) for p in points]
             for plan, points in data["frontier"].items()}, data["fastest_reached"],
            Headline.from_json(data["headline"]) if data.get("headline") else None,
            [Rung.from_json(r) for r in data.get("step_time_leaning", [])],
            {k: ExperimentReport.from_json(d) for k, d in data.get("experiments", {}).items()},
            data.get("precision"),
            cls.from_json(data["baseline"]) if data.get("baseline") else None)

    def __repr__(self) -> str:
        head = ""
        if self.headline is not None:
            ratio = self.headline.capacity_ratio.ratio
            shown = ratio if isinstance(ratio, str) or ratio is None else f"{ratio:.2f}x"
            head = (f"; at {self.headline.user_speed:,.0f} tokens/s per user, capacity ratio "
                    f"{shown}")
        return (f"FrontierReport({self.model} on {self.cluster}, workload {self.workload}, "
                f"{len(self.rungs)} rungs{head})")


def report_from_json(data: dict) -> ExperimentReport | VaryReport | FrontierReport:
    """An experiment.json of ``experiment disagg`` or ``frontier`` read back as its report: a
    frontier's (it has rungs), a varied experiment's (it has a row per value), or an
    experiment's (``rundir.read`` reads a drift experiment's too)."""
    if not isinstance(data, dict):
        raise ValueError("not a mapping")
    if "rungs" in data:
        return FrontierReport.from_json(data)
    if "sensitivity" in data:
        return VaryReport.from_json(data)
    return ExperimentReport.from_json(data)
