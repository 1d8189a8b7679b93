"""What an experiment is asked, as objects: what is served (``Load``), on what hardware
(``Hardware``, its footprint counted as ``Counting`` says), how steps are timed on compiled
wafers (``WaferTiming``), where the work runs (``Execution``), and, for the frontier, the
per-user speeds it reads (``Speeds``). ``ExperimentSpec``, ``FrontierSpec`` and
``PairingsSpec`` gather them with the targets and the search space (``comparison.Space``).

Each is a frozen dataclass checked where it is made: a value of the wrong type or out of range
raises a ``UserError`` naming the field as the Python API spells it, before any work. Each
field the command line takes is declared with its flag (``util.flags.flagged``): the
experiments' flags are generated from these declarations (``cli/spec_args.py``)."""

from __future__ import annotations

import math
import typing
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path

from wse_emu.compiler.draft import draft_model
from wse_emu.errors import UserError
from wse_emu.experiments.comparison import TUNING_REQUESTS, Space
from wse_emu.experiments.draws import (
    DEFAULT_MAX_SEEDS,
    DEFAULT_PRECISION,
    MIN_ADDED_DRAWS,
    DrawPlan,
)
from wse_emu.experiments.goodput import Targets
from wse_emu.experiments.layouts import Footprint, per_kind_text, plan_pools
from wse_emu.experiments.sensitivity import VARIABLES, parse_vary
from wse_emu.hardware.fabric import FabricSpec
from wse_emu.models.routing import Routing
from wse_emu.models.spec import ModelSpec
from wse_emu.serving.speculation import Speculation
from wse_emu.serving.tables import default_cache_dir
from wse_emu.serving.workload import MAX_DRAWS, WorkloadSpec, trace_names, workload_spec
from wse_emu.util.checks import check_fields, flag, is_number, positive, short_repr, whole
from wse_emu.util.flags import flagged
from wse_emu.util.workers import check_workers


def workload_of(workload, trace, rate=None, requests=None) -> WorkloadSpec:
    """A workload (a preset, a YAML or a WorkloadSpec) or a trace's replay, with ``rate`` and
    ``requests`` overriding its own."""
    if (workload is None) == (trace is None):
        raise UserError("give a `workload` or a `trace`, one of them")
    if rate is not None:
        positive("rate", rate)
    if requests is not None:
        whole("requests", requests, 1)
    return workload_spec(workload, trace, rate, requests)


@dataclass(frozen=True)
class Load:
    """What is served: a ``workload`` (a preset, a YAML or a WorkloadSpec) or a ``trace``'s
    replay; ``requests`` (sessions) per tuning run (None: the workload's, at most
    ``comparison.TUNING_REQUESTS`` model calls); ``seeds`` independent draws of it, or draws
    added until the ratio's interval is within ``precision`` (``draw_plan``)."""

    workload: WorkloadSpec | Path | str | None = flagged(
        "workload preset or YAML", None, one_of="load", required=True)
    trace: Path | str | None = flagged(
        f"a shipped trace ({', '.join(trace_names())}), a CSV of "
        "arrived_at,num_prefill_tokens,num_decode_tokens, or JSON lines of timestamp (ms), "
        "input_length, output_length and hash_ids (512-token prefix blocks)", None,
        one_of="load", required=True)
    requests: int | None = flagged(
        f"requests (sessions) per tuning run (default: the workload's, at most "
        f"{TUNING_REQUESTS} model calls; agent sessions: that many per system)", None)
    seeds: int | None = flagged(
        "independent draws of the workload to repeat the whole search on (the next seeds; "
        "for a trace, the next windows of `requests` rows), exactly that many (1: no "
        "interval); default: draws added from 3 until the ratio's interval is as narrow as "
        "`precision` asks, or `max_seeds` are drawn", None)
    precision: float | None = flagged(
        f"with draws added (no `seeds`): the widest 95% interval of the ratio accepted, as a "
        f"share of the ratio on the log scale (0.1: the upper end at most 1.1 times the "
        f"centre; default {DEFAULT_PRECISION})", None)
    max_seeds: int | None = flagged(
        f"with draws added (no `seeds`): the most draws (default {DEFAULT_MAX_SEEDS}; a "
        "trace: no more windows than it holds)", None)

    def __post_init__(self):
        check_fields(self)
        if self.seeds is not None and whole("seeds", self.seeds, 1) > MAX_DRAWS:
            raise UserError(f"`seeds` must be at most {MAX_DRAWS} (draws of the workload, "
                            f"each a whole search), got {self.seeds:,}")
        for name in ("precision", "max_seeds"):
            if self.seeds is not None and getattr(self, name) is not None:
                raise UserError(f"`{name}` is for draws added until the ratio is precise; "
                                f"`seeds={self.seeds}` fixes the draws: give one of them")
        if self.precision is not None and not (is_number(self.precision)
                                               and 0 < self.precision < 1):
            raise UserError("`precision` must be a share between 0 and 1 (0.1: +-10%), got "
                            f"{short_repr(self.precision)}")
        if self.max_seeds is not None and not (
                MIN_ADDED_DRAWS <= whole("max_seeds", self.max_seeds, 1) <= MAX_DRAWS):
            raise UserError(f"`max_seeds` must be from {MIN_ADDED_DRAWS} (the draws added "
                            f"from) to {MAX_DRAWS}, got {self.max_seeds:,}")
        if self.requests is not None and whole("requests", self.requests, 1) < 2:
            raise UserError(f"`requests` must be at least 2 (a rate needs two arrivals), got "
                            f"{self.requests}")
        if (self.workload is None) == (self.trace is None):
            raise UserError("give a `workload` or a `trace`, one of them")

    def draw_plan(self) -> DrawPlan:
        """How many draws: fixed (``seeds``), or added until ``precision`` (``DrawPlan``)."""
        if self.seeds is not None:
            return DrawPlan(self.seeds, self.seeds, None)
        return DrawPlan(MIN_ADDED_DRAWS, self.max_seeds or DEFAULT_MAX_SEEDS,
                        self.precision or DEFAULT_PRECISION)

    def spec(self) -> WorkloadSpec:
        """The workload as the experiment draws it (its file read and checked)."""
        return workload_of(self.workload, self.trace, None, self.requests)


@dataclass(frozen=True)
class Counting:
    """How the footprint both plans share is counted (``layouts.Footprint``): in ``systems``;
    ``racks`` with ``units_per_rack`` (hardware name -> units one rack holds); ``kw``; or
    ``cost`` with ``prices`` (hardware name -> price of one unit for an hour)."""

    footprint: str = flagged(
        "what both plans hold equal and every result is per: systems, racks (with "
        "`units_per_rack` for every kind), kW of power (the presets'), or cost per hour (with "
        "`prices` for every kind)", "systems", metavar="systems|racks|kw|cost",
        section="pools")
    prices: dict | None = flagged(
        "price of one unit of a kind of hardware for an hour, any currency (wse3=..., "
        "trn2=... per instance, h200=... per GPU; none is invented)", None, name="--price",
        reads="per kind", metavar="NAME=PER_HOUR", section="pools")
    units_per_rack: dict | None = flagged(
        "units of a kind of hardware one rack holds (wse3=..., trn2=...; none is invented)",
        None, name="--per-rack", reads="per kind", metavar="NAME=N", section="pools")

    def __post_init__(self):
        check_fields(self)
        object.__setattr__(self, "counted", self._counted())

    def _counted(self) -> Footprint:
        given = {}
        for what, values in (("prices", self.prices), ("units_per_rack", self.units_per_rack)):
            if values is not None and not isinstance(values, dict):
                raise UserError(f"`{what}` must be a mapping of hardware names to numbers, got "
                                f"{short_repr(values)}")
            given[what] = tuple((values or {}).items())
        return Footprint(self.footprint, given["prices"], given["units_per_rack"])

    def given_for(self, names: list) -> None:
        """Refuse a number given for a kind of hardware no pool of ``names`` is on: a typo
        (h20 for h200) or a kind left out would otherwise be ignored without a word, and a
        footprint in cost or racks, counted without it, would not be what the user meant."""
        kinds = list(dict.fromkeys(n.hardware.name for n in names))
        counted = self.counted
        for what, given in (("prices", counted.prices), ("units_per_rack", counted.per_rack)):
            for name, value in given:
                if name not in kinds:
                    raise UserError(f"{per_kind_text(what, name, value)}: no pool of this "
                                    f"experiment is on {name}; its pools are on "
                                    f"{', '.join(kinds)}")

    def own(self, names: set) -> "Counting":
        """The numbers given for the kinds of hardware in ``names`` only."""
        def mine(values):
            return None if values is None else {k: v for k, v in values.items() if k in names}
        return Counting(self.footprint, mine(self.prices), mine(self.units_per_rack))


@dataclass(frozen=True)
class Hardware:
    """Where both plans run: ``fabric`` (default wse3) x ``systems`` (default 1), one compiled
    cluster; or pools named by their hardware (``pools.names``; ``experiments.layouts``): a
    split with prefill on ``prefill_pool`` and decode on ``decode_pool`` against colocated
    serving in the same footprint on each kind of the split (or on ``pool``), or every split
    of ``split_pool`` against colocated serving on all of it, the footprint counted as
    ``counting`` says."""

    fabric: FabricSpec | Path | str | None = None  # the command line's --fabric and --set
    systems: int | None = flagged("systems (wafers) in the cluster (default 1)", None)
    pool: str | None = flagged(
        "colocated serving on POOL, in the split's footprint (default: each kind of hardware "
        "in the split, the better tuned)", None, metavar="POOL", section="pools")
    prefill_pool: str | None = flagged(
        "the split's prefill on POOL: a fabric (wse3, or wse3x4 for four systems), an "
        "accelerator timed by its roofline (trn2, trn2x2), or their YAML; or GPUs timed from "
        "AIConfigurator's measured data (h200x8; h200x8tp2 for two per copy, else every "
        "degree; the gpu extra)", None, metavar="POOL", section="pools")
    decode_pool: str | None = flagged(
        "the split's decode on POOL (as `prefill_pool`)", None, metavar="POOL",
        section="pools")
    split_pool: str | None = flagged(
        "every split of POOL's units between prefill and decode (h200x8: 1 to 7 GPUs of "
        "prefill), against colocated serving on all of it", None, metavar="POOL",
        section="pools")
    counting: Counting = field(default_factory=Counting)

    def __post_init__(self):
        check_fields(self)
        counted = self.counting.counted
        plans = plan_pools(self.pool, self.prefill_pool, self.decode_pool, self.split_pool,
                           counted)
        if plans is None:
            if counted != Footprint():
                raise UserError("`footprint`, `prices` and `units_per_rack` are for pools "
                                "named by their hardware; one compiled cluster counts its "
                                "systems")
            if self.systems is not None:
                whole("systems", self.systems, 1)
            named = None
        else:
            splits, colocated = plans
            self.counting.given_for([n for pair in splits for n in pair] + colocated)
            if self.fabric is not None or self.systems is not None:
                raise UserError("`fabric` and `systems` describe one compiled cluster; pools "
                                "named by their hardware say both")
            named = (*plans, counted)
        # (splits, colocated, footprint) of pools named by their hardware; None for a cluster.
        object.__setattr__(self, "named", named)


DRAFT_TOKENS = (2, 4, 8)  # drafted tokens per verify step tried by default
DRAFT_STRIPS = (1.0,)  # the draft's strip: the narrowest that holds it, by default


@dataclass(frozen=True)
class WaferTiming:
    """How steps are timed on compiled wafers, the same for both plans: a mixture of experts'
    ``routing``, batch tiling on attention (``attention_tile``, 0: none), and speculative
    decoding: a ``draft`` compiled beside the target in every layout of both plans, each
    layout tried at each of ``draft_tokens`` (tokens drafted per verify step, as a layout of
    its own, so both plans are tuned over them alike), on a strip of each of ``draft_strips``
    widths (multiples of the narrowest that holds the draft; each a layout of its own too),
    each drafted token accepted with probability ``acceptance`` (or as a table of measured
    means per count says), the acceptances drawn from ``acceptance_seed``."""

    routing: Routing = Routing()  # the command line's --routing and --routing-seed
    attention_tile: int = flagged(
        "batch tiling on attention in both plans' decode steps: attention takes B sequences "
        "at a time, the MLP or experts the whole micro-batch (0: off)", 0, metavar="B")
    draft: str | None = flagged(
        "speculative decoding's draft, compiled beside the target in every layout of both "
        "plans: a model preset, YAML or config.json of the target's vocabulary, or mtp (a "
        "one-layer head of the target's architecture)", None, metavar="MODEL|mtp")
    draft_tokens: Sequence[int] = flagged(
        "with a `draft`: tokens it proposes per verify step, each count tried as a layout of "
        "both plans", DRAFT_TOKENS, reads="whole numbers", metavar="K1,K2,...")
    acceptance: float | str | None = flagged(
        "with a `draft`: the probability that each drafted token is accepted, or a CSV of "
        "draft_tokens,mean_tokens_per_step measured (an input, never assumed)", None,
        metavar="A|CSV")
    acceptance_seed: int = flagged("seed of the acceptances drawn", 0)
    draft_strips: Sequence[float] = flagged(
        "with a `draft`: its strip's widths to try, as multiples of the narrowest that holds "
        "it in each layout (1: that one), each width a layout of both plans", DRAFT_STRIPS,
        reads="numbers", metavar="W1,W2,...")

    def __post_init__(self):
        check_fields(self)
        whole("attention_tile", self.attention_tile, 0)
        strips = self.draft_strips
        if isinstance(strips, (str, bytes)) or not hasattr(strips, "__iter__") or not strips:
            raise UserError(f"`draft_strips` must be one or more numbers of 1 or more, got "
                            f"{short_repr(strips)}")
        for w in strips:
            if not is_number(w) or not 1 <= w < math.inf:
                raise UserError(f"`draft_strips` must be numbers of 1 or more (multiples of "
                                f"the narrowest strip), got {short_repr(w)}")
        object.__setattr__(self, "draft_strips", tuple(dict.fromkeys(float(w) for w in strips)))
        whole("acceptance_seed", self.acceptance_seed, 0)
        counts = self.draft_tokens
        if isinstance(counts, (str, bytes)) or not hasattr(counts, "__iter__") or not counts:
            raise UserError(f"`draft_tokens` must be one or more whole numbers, got "
                            f"{short_repr(counts)}")
        object.__setattr__(self, "draft_tokens", tuple(dict.fromkeys(counts)))
        if (self.draft is None) != (self.acceptance is None):
            raise UserError("speculative decoding takes a `draft` and its `acceptance` "
                            "together: the acceptance is an input, never assumed")
        if self.draft is None and (self.draft_tokens != DRAFT_TOKENS or self.acceptance_seed
                                   or self.draft_strips != DRAFT_STRIPS):
            raise UserError("`draft_tokens`, `draft_strips` and `acceptance_seed` are for "
                            "speculative decoding: give a `draft` too (without one they would "
                            "be ignored)")
        if self.draft is not None:
            for k in self.draft_tokens:  # each count, and the acceptance at it, checked
                Speculation.of(k, self.acceptance, self.acceptance_seed)

    def check_for(self, model: ModelSpec, hardware: Hardware) -> None:
        """Refuse what does not apply: routing on a dense model, any of it on pools named by
        their hardware (they time their steps themselves)."""
        if not model.is_moe and self.routing != Routing():
            raise UserError(f"`routing` applies to a mixture of experts; {model.name} is dense")
        if hardware.named is not None and self != WaferTiming():
            raise UserError("`routing`, `attention_tile` and a `draft` are for compiled "
                            "wafers; pools named by their hardware time their steps "
                            "themselves")
        if self.draft is not None:
            draft_model(model, self.draft)  # a name not found, or another vocabulary, now


@dataclass(frozen=True)
class Execution:
    """Where the work runs: a dask ``scheduler``'s address, else ``workers`` local processes
    (0: one per core; 1: none, run here; without dask they are started fresh, so a script
    with ``workers`` other than 1 needs the usual ``if __name__ == "__main__":`` guard); stage
    tables and the layouts' programs kept in ``cache_dir`` (None: the user's cache);
    ``progress(text)`` told of each step of the work."""

    scheduler: str | None = flagged(
        "dask scheduler address (default: local worker processes)", None, one_of="where")
    workers: int = flagged("local worker processes (0: one per core; 1: none, run here)", 0,
                           one_of="where")
    cache_dir: Path | str | None = flagged(
        "where stage-time tables and the layouts' compiled programs are kept (default: "
        "the user's cache)", None)
    progress: Callable | None = None  # the command line's progress lines

    def __post_init__(self):
        check_fields(self)
        check_workers(self.workers)
        object.__setattr__(self, "cache", default_cache_dir(self.cache_dir))


@dataclass(frozen=True)
class Speeds:
    """The per-user speeds a frontier reads: its ladder (``user_speeds``, tokens/s per user;
    None: from a little slower than a lone sequence's decode step to 50), the headline's speed
    (``user_speed``; None: the model's published vendor speed), and the factors on the prefill
    and on the decode step times at which the headline is read again (``step_scales``; empty:
    not read)."""

    user_speeds: Sequence[float] | None = flagged(
        "per-user speeds to aim at, output tokens/s (each a p90 TPOT target of 1/S; default: "
        "a ladder from a little slower than a lone sequence's decode step to 50, with "
        "`user_speed` among them)", None, reads="numbers", metavar="S1,S2,...")
    user_speed: float | None = flagged(
        "where to read the headline, output tokens/s per user (default: the model's "
        "published vendor speed, programs/vendor_speeds.yaml)", None)
    step_scales: Sequence[float] = flagged(
        "read the headline again with the prefill, then the decode, step times times each "
        "factor, the hardware unchanged (none: not)", (0.7, 1.3), reads="numbers",
        metavar="F1,F2|none")

    def __post_init__(self):
        from wse_emu.experiments.frontier import check_speed, check_speeds

        check_fields(self)
        if self.user_speeds is not None:
            object.__setattr__(self, "user_speeds", check_speeds(self.user_speeds))
        if self.user_speed is not None:
            check_speed("user_speed", self.user_speed)
        scales = self.step_scales
        if isinstance(scales, (str, bytes)) or not hasattr(scales, "__iter__"):
            raise UserError(f"`step_scales` must be a sequence of factors, got "
                            f"{short_repr(scales)}")
        object.__setattr__(self, "step_scales", tuple(scales))
        for f in self.step_scales:
            positive("step_scales", f)


TOLERANCE = dict(help="stop a rate search when the failed rate is within this share of the "
                 "met one")
# A frontier's targets: a TTFT target and the share of requests meeting it and each rung's.
FRONTIER_TTFT = dict(help="time-to-first-token target at the p90, seconds", name="--ttft-slo",
                     required=True)
FRONTIER_ATTAINMENT = dict(help="share of requests that must meet both targets (default 0.9)")


def check_tolerance(tolerance) -> None:
    if not is_number(tolerance) or not 0 < tolerance < 1:
        raise UserError(f"`tolerance` must be between 0 and 1, got {short_repr(tolerance)}")


@dataclass(frozen=True)
class ExperimentSpec:
    """Colocated against disaggregated serving of ``model`` (a ModelSpec, a preset, a model
    YAML or a Hugging Face config.json) under ``load``: both plans tuned over ``space``, each
    plan's best confirmed on long runs, judged against ``targets``; or, with ``vary``
    (``NAME=V1,V2,...``), the same at each value of one input. ``tolerance``: the rate
    search's relative precision; ``price_per_system_hour``: for the cost per token of one
    compiled cluster."""

    model: ModelSpec | Path | str
    load: Load
    targets: Targets
    hardware: Hardware = field(default_factory=Hardware)
    space: Space = field(default_factory=Space)
    execution: Execution = field(default_factory=Execution)
    timing: WaferTiming = field(default_factory=WaferTiming)
    tolerance: float = flagged(default=0.05, **TOLERANCE)
    price_per_system_hour: float | None = flagged(
        "price of one system for an hour (any currency): adds the cost per million output "
        "tokens at each plan's best (no default: none is published)", None)
    vary: str | None = flagged(
        "repeat the experiment at each value of one input and report how the ratio moves: "
        + "; ".join(f"{k}: {v}" for k, v in VARIABLES.items()), None,
        metavar="NAME=V1,V2,...")

    def __post_init__(self):
        check_fields(self)
        check_tolerance(self.tolerance)
        if self.price_per_system_hour is not None:
            positive("price_per_system_hour", self.price_per_system_hour)
            if self.hardware.named is not None:
                raise UserError("`price_per_system_hour` is for one compiled cluster; pools "
                                "named by their hardware take `prices` per kind, with "
                                "footprint 'cost'")
        variation = None if self.vary is None else parse_vary(self.vary)
        if variation is not None and self.hardware.named is not None:
            raise UserError("`vary` is for one compiled cluster, not for pools named by their "
                            "hardware")
        object.__setattr__(self, "variation", variation)


@dataclass(frozen=True)
class FrontierSpec:
    """Each plan's frontier of output tokens/s per system against tokens/s per user: every
    rung of ``speeds``' ladder is an experiment at a TTFT target ``ttft_s`` and a p90 TPOT
    target of 1/speed, ``attainment`` of the requests meeting both (None: 0.9). The other
    fields are ``ExperimentSpec``'s."""

    model: ModelSpec | Path | str
    load: Load
    ttft_s: float = flagged(**FRONTIER_TTFT)
    attainment: float | None = flagged(default=None, **FRONTIER_ATTAINMENT)
    speeds: Speeds = field(default_factory=Speeds)
    hardware: Hardware = field(default_factory=Hardware)
    space: Space = field(default_factory=Space)
    execution: Execution = field(default_factory=Execution)
    timing: WaferTiming = field(default_factory=WaferTiming)
    tolerance: float = flagged(default=0.05, **TOLERANCE)
    baseline: bool = flagged(
        "with a `draft`: also the same frontier without speculative decoding (the same "
        "workload, draws, hardware and tuning), reported and drawn beside it", False,
        reads="switch")

    def __post_init__(self):
        check_fields(self)
        flag("baseline", self.baseline)
        if self.baseline and self.timing.draft is None:
            raise UserError("`baseline` sets the frontier without speculative decoding beside "
                            "the one with it: give a `draft` (and its `acceptance`) too")
        # Checked as the rungs' targets will be, before any work.
        object.__setattr__(self, "attainment", Targets(self.ttft_s, 1.0, self.attainment)
                           .attainment)
        check_tolerance(self.tolerance)

    def targets(self, speed: float) -> Targets:
        """The targets of the rung at ``speed`` tokens/s per user."""
        return Targets(self.ttft_s, 1.0 / speed, self.attainment)

    def without_speculation(self) -> "FrontierSpec":
        """The same frontier with no draft (its other timing kept): the baseline."""
        timing = self.timing
        return replace(self, baseline=False, timing=WaferTiming(timing.routing,
                                                                timing.attention_tile))


@dataclass(frozen=True)
class PairingsSpec:
    """A frontier for every pairing of ``kinds`` (pool names: ``wse3``, ``trn2``, ``h200x8``;
    prefill on one, decode on another or the same), each against colocated serving on its
    kinds in its footprint (``counting``). The speeds' step-time factors are not read (each
    frontier can add them)."""

    model: ModelSpec | Path | str
    load: Load
    kinds: Sequence[str] = flagged(
        "kinds of hardware to pair, named as a split's pools are (wse3,trn2; h200x8 with "
        "the gpu extra)", reads="words", metavar="POOL,POOL,...", required=True)
    ttft_s: float = flagged(**FRONTIER_TTFT)
    attainment: float | None = flagged(default=None, **FRONTIER_ATTAINMENT)
    speeds: Speeds = field(default_factory=lambda: Speeds(step_scales=()))
    counting: Counting = field(default_factory=Counting)
    space: Space = field(default_factory=Space)
    execution: Execution = field(default_factory=Execution)
    tolerance: float = flagged(default=0.05, **TOLERANCE)

    def __post_init__(self):
        from wse_emu.pools.names import parse_pool

        check_fields(self)
        if self.speeds.step_scales:
            raise UserError("`step_scales` are read by one frontier (experiment frontier), "
                            "not by the pairings")
        kinds = tuple(dict.fromkeys(self.kinds))
        if not kinds:
            raise UserError("`kinds` must be one or more pool names, got none")
        object.__setattr__(self, "kinds", kinds)
        names = {k: parse_pool(k) for k in kinds}  # named wrongly: refused before any work
        # Numbers per kind of hardware, checked against every kind before any pairing runs: a
        # pairing takes those of its own kinds, so one missing or misnamed would otherwise
        # only leave some pairings skipped, after the others' work.
        self.counting.given_for(list(names.values()))
        if self.counting.counted.kind in ("cost", "racks"):
            for name in names.values():
                self.counting.counted.of([name])
        object.__setattr__(self, "names", names)
        FrontierSpec(self.model, self.load, self.ttft_s, self.attainment, tolerance=self
                     .tolerance, execution=self.execution)  # the same checks, before any work

    def pairing(self, prefill: str, decode: str) -> FrontierSpec:
        """The frontier of prefill on ``prefill`` and decode on ``decode``."""
        on = {self.names[prefill].hardware.name, self.names[decode].hardware.name}
        hardware = Hardware(prefill_pool=prefill, decode_pool=decode,
                            counting=self.counting.own(on))
        return FrontierSpec(self.model, self.load, self.ttft_s, self.attainment,
                            Speeds(self.speeds.user_speeds, self.speeds.user_speed, ()),
                            hardware, self.space, self.execution, tolerance=self.tolerance)


# The parts a spec is made of: a flat field name belongs to exactly one of them (or to the spec
# itself), which is what lets ``from_flat`` place it.
PARTS = (Load, Targets, Hardware, Counting, Space, Execution, WaferTiming, Speeds)


def from_flat(cls, **values):
    """A spec (or a part) of class ``cls`` from values given by their fields' names, each
    placed in the part that declares it (``from_flat(ExperimentSpec, model="tiny",
    workload="chat", ttft_s=1, tpot_s=0.005, fabric="mesh16")``), a part's other fields as
    its default has them (a pairings' ``speeds`` keep no step scales); a name no part
    declares is refused with the names that are."""
    left = dict(values)
    spec = _placed(cls, None, left)
    if left:
        raise UserError(f"`{next(iter(left))}` is not a field of {cls.__name__} (its fields: "
                        f"{', '.join(sorted(flat_names(cls)))})")
    return spec


def _placed(cls, start, left: dict):
    """A ``cls`` made of the values in ``left`` it declares (taken out of it), its other
    fields those of ``start`` (None: its defaults)."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in fields(cls):
        part = hints.get(f.name)
        if f.name in left:
            kwargs[f.name] = left.pop(f.name)
        elif part in PARTS and any(k in flat_names(part) for k in left):
            inner = (getattr(start, f.name) if start is not None
                     else None if f.default_factory is MISSING else f.default_factory())
            kwargs[f.name] = _placed(part, inner, left)
        elif start is not None:
            kwargs[f.name] = getattr(start, f.name)
    return cls(**kwargs)


def flat_names(cls) -> set:
    """Every flat name ``cls`` takes: its fields' and its parts', all the way down."""
    hints = typing.get_type_hints(cls)
    names = set()
    for f in fields(cls):
        names |= flat_names(hints[f.name]) if hints.get(f.name) in PARTS else {f.name}
    return names


__all__ = ["Counting", "Execution", "ExperimentSpec", "FrontierSpec", "Hardware", "Load",
           "PairingsSpec", "Speeds", "WaferTiming", "default_cache_dir", "flat_names", "from_flat",
           "workload_of"]
