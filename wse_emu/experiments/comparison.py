"""Colocated against disaggregated serving, end to end: the layouts each plan can use, each
plan tuned knob by knob (``tuning``), each plan's best searched again on runs whose steady
window holds minutes (the confirming runs), the answer over independent draws of the workload,
and how the answer moves with one input (``sensitivity``). ``wse-emu experiment disagg`` prints
what this returns: an ``ExperimentReport`` (with ``--vary``, a ``VaryReport``), whose
``to_json()`` is its ``--json`` and the run directory's experiment.json."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np

from wse_emu.errors import UserError
from wse_emu.experiments.ceiling import ceiling_rate
from wse_emu.experiments.draws import DrawPlan, Swing, run_until_precise
from wse_emu.experiments.goodput import (
    Comparison,
    Config,
    ConfigRow,
    Outcome,
    Replicate,
    RunBook,
    Search,
    Targets,
    compare,
    outcomes,
    over_replicates,
    run_searches,
)
from wse_emu.experiments.sensitivity import VARIABLES, Applied, Variation, apply, decode_step_s
from wse_emu.experiments.tuning import Choice, Knob, Layout, config_of, tune
from wse_emu.hardware.fabric import ClusterSpec
from wse_emu.serving.knobs import KnobInfo, check_values, info, knob_info
from wse_emu.serving.metrics import DRAIN, WARMUP
from wse_emu.serving.policies import (
    POLICIES,
    ROUTERS,
    SPLIT_POLICY,
    knob_fields,
    policy_class,
)
from wse_emu.serving.serve import KV_TIERS, ServeOptions
from wse_emu.serving.tables import grid_axes
from wse_emu.serving.workload import MAX_REQUESTS, Requests, WorkloadSpec, generate, replicate
from wse_emu.util.checks import at_least_zero, check_fields, flag, one_of, short_repr, whole
from wse_emu.util.flags import flagged

# The confirming runs stop growing here (a run of this many model calls takes seconds to serve);
# the window they reach is reported.
MAX_CONFIRM_REQUESTS = 20_000


def confirm_cap(requests: Requests) -> int:
    """The most sessions a confirming run of this workload holds: MAX_CONFIRM_REQUESTS model
    calls, at the calls per session of ``requests``."""
    return max(1, MAX_CONFIRM_REQUESTS * requests.sessions() // max(1, len(requests)))


def values_of(knob: str) -> dict:
    """The metadata of a field holding the values to try of ``knob``: its declaration."""
    return {"knob": knob_info(knob)}


DEPTH_RULES = ("matched", "own")  # besides numbers: see ``Space``
# The disaggregated splits of one compiled cluster to try: every one the compiler proposes, or
# only the middle one (a first look, as the demo takes).
SPLIT_RULES = ("all", "middle")


@dataclass(frozen=True)
class Space:
    """What the experiment tunes: the copies of the model per wafer, the pipeline depths
    (layers per stage) to try every layout at ("matched": each layout of both plans at every
    depth some layout comes to by itself, so that neither plan has a depth the other lacks;
    "own": each at its own; or numbers, tried besides each layout's own), the colocated
    policies to try, and the values to try of every serving knob (one field per knob of
    ``ServingKnobs``; a single value fixes it; None leaves it to each layout's hardware);
    whether agentic calls reuse cached KV, and the router and KV tier both plans serve with
    (as ``serve``'s); how long the confirming runs' steady windows must
    be (emulated seconds; 0: no confirming runs); and the stage tables' grid ("full", or
    "quick": fewer shapes, for a first look); how many passes of coordinate ascent over the
    knobs tuning may take (``tuning.tune``: a further pass only while the last changed a
    choice); and whether every layout has its knobs tuned before the layouts are compared
    (``each_layout``); and which of the disaggregated splits a compiled cluster proposes to
    try (``splits``: "all", or "middle" for a first look). Every value is checked here, by
    name."""

    copies: tuple = flagged(
        "copies of the model per wafer, colocated (side by side in column bands; a model on "
        "one wafer only)", (1, 2, 4), reads="whole numbers", section="knobs")
    layers_per_stage: tuple | str = flagged(
        "pipeline depths (layers per stage) to try every layout of both plans at: matched, "
        "every depth some layout comes to by itself; own, each layout at its own; or these, "
        "besides its own", "matched", reads="whole numbers", words=DEPTH_RULES,
        metavar="matched|own|L1,L2", section="knobs")
    policy: tuple = flagged("colocated batching policies", tuple(POLICIES), reads="words",
                            section="knobs")
    prefix_cache: bool = flagged(
        "recompute every agentic call's whole context (by default a call reuses its "
        "session's KV while it is still cached)", True, name="--no-prefix-cache",
        reads="switch")
    router: str = flagged(
        "which region an arriving request joins, in both plans: least-busy (after the region "
        "holding its session's previous call), round-robin, or prefix (the region caching "
        "most of its leading blocks)", "least-busy", choices=ROUTERS)
    kv_tier: str = flagged(
        "where the KV the prefix cache gives up goes, in both plans: none (dropped), or host "
        "(parked in host memory, brought back over the system's link when quicker than "
        "computing it again)", "none", choices=KV_TIERS)
    window_s: float = flagged(
        "after tuning, search each plan's best again on runs long enough that the steady "
        "window holds this many emulated seconds at the rate found (0: no confirming runs)",
        120.0)
    grid: str = flagged(
        "stage tables' micro-batch shapes: full (55 per region), or quick (21, within 5% of "
        "full on Llama-3.1-8B, for a first look; sequences per micro-batch up to 64, prefill "
        "tiles up to 256 tokens)", "full", metavar="full|quick")
    rounds: int = flagged(
        "passes of the knob-by-knob tuning, a further one only while the last changed a "
        "choice (knobs that pay only together need more)", 1)
    each_layout: bool = flagged(
        "tune every layout's other knobs before comparing the layouts (as many tunings as "
        "layouts; by default the layout is one knob among the others)", False,
        reads="switch")
    splits: str = flagged(
        "the disaggregated splits of a compiled cluster to try: all the compiler proposes, "
        "or the middle one of them (a first look)", "all", choices=SPLIT_RULES)
    # The serving knobs' values to try, one field per knob of ``ServingKnobs``, in its order
    # (a test holds the two alike), each carrying its knob's declaration: the command line's
    # flag for its values is generated from it.
    prefill_tile: tuple | None = field(default=None, metadata=values_of("prefill_tile"))
    token_budget: tuple | None = field(default=None, metadata=values_of("token_budget"))
    chunk_prompts: tuple | None = field(default=None, metadata=values_of("chunk_prompts"))
    interleave: tuple | None = field(default=None, metadata=values_of("interleave"))
    max_running: tuple | None = field(default=None, metadata=values_of("max_running"))
    batch_limit: tuple | None = field(default=None, metadata=values_of("batch_limit"))

    def __post_init__(self):
        check_fields(self)  # each field of its type first: the checks below compare values
        grid_axes(self.grid, "decode")  # an unknown grid fails here, by name
        copies = check_values("copies", KnobInfo("copies", "", 1, ()), self.copies)
        object.__setattr__(self, "copies", copies)
        if self.layers_per_stage not in DEPTH_RULES:
            depths = check_values("layers_per_stage", KnobInfo("layers_per_stage", "", 1, ()),
                                  self.layers_per_stage)
            object.__setattr__(self, "layers_per_stage", depths)
        if isinstance(self.policy, str) or not hasattr(self.policy, "__iter__") \
                or not self.policy:
            raise UserError(f"`policy` must be one or more of {', '.join(POLICIES)}, got "
                            f"{short_repr(self.policy)}")
        for name in self.policy:
            policy_class(name)
        object.__setattr__(self, "policy", tuple(dict.fromkeys(self.policy)))
        for f in knob_fields():
            if getattr(self, f.name) is not None:
                values = check_values(f.name, info(f), getattr(self, f.name))
                object.__setattr__(self, f.name, values)
        flag("prefix_cache", self.prefix_cache)
        one_of("router", self.router, ROUTERS)
        one_of("kv_tier", self.kv_tier, KV_TIERS)
        if self.kv_tier != "none" and not self.prefix_cache:
            raise UserError("`kv_tier=host` keeps what the prefix cache gives up: it needs the "
                            "prefix cache (leave out `prefix_cache=False`)")
        at_least_zero("window_s", self.window_s)
        whole("rounds", self.rounds, 1)
        flag("each_layout", self.each_layout)
        if self.splits not in SPLIT_RULES:
            raise UserError(f"`splits` must be one of {', '.join(SPLIT_RULES)}, got "
                            f"{short_repr(self.splits)}")

    def knobs(self, splits: list[str], copies: list[str]) -> dict:
        """Per plan, its knobs in the order they are tuned: colocated, its policy and layout
        (copies per wafer and pipeline depth), then every knob some policy tried reads;
        disaggregated, its layout (split and depth), then the knobs of the policy a split's
        regions serve with."""
        colocated = {name for p in self.policy for name in POLICIES[p].knob_names()}
        split = set(SPLIT_POLICY.knob_names())
        tuned = [(info(f).label, f.name, getattr(self, f.name)) for f in knob_fields()]
        return {"colocated": [Knob("policy", "policy", self.policy),
                              Knob("layout", "layout", tuple(copies))]
                + [Knob(*k) for k in tuned if k[1] in colocated],
                "disaggregated": [Knob("layout", "layout", tuple(splits))]
                + [Knob(*k) for k in tuned if k[1] in split]}

    def given(self) -> dict:
        """Knob name -> the values given to try (the knobs left to each layout's hardware
        left out)."""
        return {f.name: getattr(self, f.name) for f in knob_fields()
                if getattr(self, f.name) is not None}

    def initial(self, plan: str, layout: Layout):
        """Where tuning starts on ``layout``: for a knob left to the hardware, where its
        serving engines start; for one given values, the engines' default if among them, else
        the declaration's if among them, else the first (the same start whether a list is
        given or left to the hardware)."""
        def pick(values, *usual):
            return next((u for u in usual if u in values), values[0])
        knobs = {f.name: pick(getattr(self, f.name), layout.engine_start(f.name), f.default)
                 if getattr(self, f.name) is not None else layout.knob_start(f.name)
                 for f in knob_fields()}
        policy = pick(self.policy, _ServeDefaults.policy) if plan == "colocated" \
            else SPLIT_POLICY.name
        return Choice(plan, layout.name, policy, **knobs)


_ServeDefaults = ServeOptions(clock_hz=1.0, kv_bytes_per_token=0)


@dataclass(frozen=True)
class StepTiming:
    """How both plans' steps were timed, beside their results (``wse_emu.api`` states it):
    a mixture of experts' routing, batch tiling on attention, weights stored narrower than
    the model's dtype, step times scaled, and speculative decoding (its draft, the drafted
    tokens tried and the acceptance assumed) (each None where it does not apply)."""

    routing: str | None = None
    attention_tile: int | None = None
    stored_formats: str | None = None
    step_scale: str | None = None
    speculation: dict | None = None

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class ExperimentReport:
    """An experiment's report (``disagg_experiment``): what ran where, the targets, each
    configuration tuned (``configurations``), every tuning step and search point, each plan's
    best searched again (``final``), the comparison, and over several draws each draw's
    answer and the mean and 95% interval of each. ``to_json()`` is ``experiment disagg
    --json`` and experiment.json.

    Typed to the rows people read (each configuration's row, the comparison, each draw's);
    the tuning steps, the search points (``points``, ``final_points``: the curves' data) and
    the statistics over draws (``over_replicates``: intervals whose keys depend on how many
    draws there were and whether a bracket bounds them) stay in their JSON form."""

    model: str
    cluster: str
    workload: str
    requests_per_run: int
    targets: Targets
    prefix_cache: bool
    stage_grid: str
    skipped: list[str]
    system_power_w: float
    configurations: list[ConfigRow]
    tuning: list[dict]  # per knob tuned: each value tried, its goodput, the value kept
    points: dict[str, list[dict]]  # per configuration, every tuning run (``_point``)
    final: list[ConfigRow]
    final_requests_per_run: int
    confirmed: bool  # each best searched again on runs with long steady windows
    final_points: dict[str, list[dict]]
    comparison: Comparison
    replicates: list[Replicate] | None = None  # with several draws of the workload
    over_replicates: dict | None = None
    timing: StepTiming | None = None
    value: float | None = None  # the varied input's value, in a VaryReport's runs
    # What "per system" counts: a system, or the unit of a footprint of several kinds of
    # hardware (kW, cost/h: ``experiments.layouts.Footprint``).
    footprint_unit: str = "system"
    # With draws added until the ratio was precise: the precision asked and reached, and if
    # not, why (``draws.precision_report``).
    precision: dict | None = None
    # The router and KV tier both plans served with, where not the defaults.
    serving: dict | None = None
    # Every configuration searched, by label, with its pools and options, to serve again (not
    # part of the JSON: a report read back has none).
    configs: dict = field(default_factory=dict, repr=False, compare=False)
    # Each plan's tuned choice (plan -> ``tuning.Choice``) and each draw's confirming runs
    # (the requests its ``final`` rows were searched on): what serving the same choices on
    # the same runs again needs (``search_fixed``). Not part of the JSON either.
    tuned: dict = field(default_factory=dict, repr=False, compare=False)
    confirm_runs: list = field(default_factory=list, repr=False, compare=False)

    def rows(self) -> dict[str, ConfigRow]:
        """Each plan's best searched again, by configuration (as tuned, in reports written
        before the confirming runs existed)."""
        return {c.configuration: c for c in self.final or self.configurations}

    def draws(self) -> list[Replicate]:
        """Every draw's answer (the one draw's, with one)."""
        return self.replicates or [Replicate(self.final, self.comparison)]

    def to_json(self) -> dict:
        out = {} if self.value is None else {"value": self.value}
        out.update({
            "model": self.model, "cluster": self.cluster, "workload": self.workload,
            "requests_per_run": self.requests_per_run, "targets": self.targets.to_json(),
            "prefix_cache": self.prefix_cache, "stage_grid": self.stage_grid,
            "skipped": self.skipped, "system_power_w": self.system_power_w,
            "configurations": [c.to_json() for c in self.configurations],
            "tuning": self.tuning, "points": self.points,
            "final": [c.to_json() for c in self.final],
            "final_requests_per_run": self.final_requests_per_run,
            "confirmed": self.confirmed, "final_points": self.final_points,
            "comparison": self.comparison.to_json()})
        if self.replicates is not None:
            out["replicates"] = [r.to_json() for r in self.replicates]
        if self.over_replicates is not None:
            out["over_replicates"] = self.over_replicates
        if self.timing is not None:
            out.update(self.timing.to_json())
        if self.footprint_unit != "system":
            out["footprint_unit"] = self.footprint_unit
        if self.precision is not None:
            out["precision"] = self.precision
        if self.serving is not None:
            out["serving"] = self.serving
        return out

    @classmethod
    def from_json(cls, data: dict) -> "ExperimentReport":
        """A report read back (experiment.json); the parts a report written before they
        existed lacks are empty or None."""
        timing = {f.name: data[f.name] for f in fields(StepTiming) if f.name in data}
        return cls(
            data["model"], data["cluster"], data["workload"], data["requests_per_run"],
            Targets.from_json(data["targets"]), data.get("prefix_cache", True),
            data.get("stage_grid", "full"), data.get("skipped", []),
            data.get("system_power_w", 0.0),
            [ConfigRow.from_json(c) for c in data["configurations"]], data.get("tuning", []),
            data.get("points", {}), [ConfigRow.from_json(c) for c in data.get("final", [])],
            data.get("final_requests_per_run", data["requests_per_run"]),
            data.get("confirmed", False), data.get("final_points", {}),
            Comparison.from_json(data["comparison"]),
            [Replicate.from_json(r) for r in data["replicates"]]
            if "replicates" in data else None, data.get("over_replicates"),
            StepTiming(**timing) if timing else None, data.get("value"),
            data.get("footprint_unit", "system"), data.get("precision"), data.get("serving"))

    def __repr__(self) -> str:
        cmp_ = self.comparison
        ratio = "no comparison" if not cmp_.compared else (
            "colocated met no rate" if cmp_.goodput_ratio is None
            else f"disaggregated / colocated goodput {cmp_.goodput_ratio:.2f}x")
        value = "" if self.value is None else f"at {self.value!r}, "
        return (f"ExperimentReport({value}{self.model} on {self.cluster}, workload "
                f"{self.workload}, {len(self.configurations)} configurations tuned, best "
                f"{cmp_.colocated!r} and {cmp_.disaggregated!r}: {ratio})")


@dataclass
class SensitivityRow:
    """The experiment at one value of the varied input: its TPOT target (in seconds and in
    decode steps of one sequence alone), each plan's best, their goodputs per system and the
    ratio; or, where it could not run, why (``error``)."""

    value: float
    tpot_s: float
    systems: int
    error: str | None = None
    decode_step_s: float | None = None
    tpot_in_decode_steps: float | None = None
    colocated: str | None = None
    disaggregated: str | None = None
    max_rate_per_system: dict[str, float] | None = None  # by plan
    goodput_ratio: float | None = None
    goodput_ratio_interval: dict | None = None  # over several draws (``interval``)

    def to_json(self) -> dict:
        out = {"value": self.value, "tpot_s": self.tpot_s, "systems": self.systems}
        if self.error is not None:
            return {**out, "error": self.error}
        out.update(decode_step_s=self.decode_step_s,
                   tpot_in_decode_steps=self.tpot_in_decode_steps, colocated=self.colocated,
                   disaggregated=self.disaggregated,
                   max_rate_per_system=self.max_rate_per_system,
                   goodput_ratio=self.goodput_ratio)
        if self.goodput_ratio_interval is not None:
            out["goodput_ratio_interval"] = self.goodput_ratio_interval
        return out

    @classmethod
    def from_json(cls, data: dict) -> "SensitivityRow":
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass
class VaryReport:
    """The experiment at every value of one input (``vary_experiment``): a row per value and
    each value's full report. ``to_json()`` is ``experiment disagg --vary --json``."""

    model: str | None
    workload: str | None
    fabric: str
    vary: str
    description: str
    sensitivity: list[SensitivityRow]
    runs: list[ExperimentReport]  # each with its ``value``

    def to_json(self) -> dict:
        return {"model": self.model, "workload": self.workload, "fabric": self.fabric,
                "vary": self.vary, "description": self.description,
                "sensitivity": [r.to_json() for r in self.sensitivity],
                "runs": [r.to_json() for r in self.runs]}

    @classmethod
    def from_json(cls, data: dict) -> "VaryReport":
        return cls(data.get("model"), data.get("workload"), data["fabric"], data["vary"],
                   data["description"],
                   [SensitivityRow.from_json(r) for r in data["sensitivity"]],
                   [ExperimentReport.from_json(r) for r in data.get("runs", [])])

    def __repr__(self) -> str:
        ratios = ", ".join(f"{r.value!r}: " + ("-" if r.goodput_ratio is None
                                               else f"{r.goodput_ratio:.2f}x")
                           for r in self.sensitivity)
        return (f"VaryReport({self.model} on {self.fabric}, workload {self.workload}, "
                f"{self.vary} at {len(self.sensitivity)} values; goodput ratio {ratios})")


def disagg_experiment(setup, job) -> tuple[dict, dict]:
    """Lay the plans out, tune each plan on ``job``'s pool and compare: the report, and every
    configuration searched (label -> Config). ``setup`` (``setup.Setup``) holds what every
    run of an experiment shares: the model, the workload, the search space, the tolerance, the
    progress and the price; the layouts (``setup.layouts_of(job, probes)``: (plan, name) ->
    Layout, and why the others were skipped; ``probes`` are every set of requests a run may
    serve, for it to check against the model's positions); and the confirming runs' draws
    (``setup.longer(job)``: ``longer(draw, n)``, draw ``draw`` of the workload with ``n``
    requests). ``job`` (``setup.Job``) says on what: its draws (the first tunes; with more,
    the tuned configurations are searched again on each, and the report adds every draw's
    answer and the mean and 95% interval over all of them), its targets and cluster, and its
    book, where serving runs are kept (a frontier shares one across its targets)."""
    model, cluster, targets, space = setup.model, job.cluster, job.targets, setup.space
    tolerance, progress, price, book = setup.tolerance, setup.progress, setup.price, job.book
    requests, more_draws, draws = job.draws[0], job.draws[1:], list(job.draws)
    layouts, skipped = setup.layouts_of(job, setup.probes(job))
    fabric = cluster.fabric
    base = base_options(setup, cluster)
    names = {plan: [name for (p, name) in layouts if p == plan]
             for plan in ("colocated", "disaggregated")}
    knobs = space.knobs(names["disaggregated"], names["colocated"])
    initial = {plan: space.initial(plan, layouts[(plan, names[plan][0])])
               for plan in names if names[plan]}
    economy = (cluster.systems, fabric.system_power_w, price)
    run_points = book.run_points((layouts, base), requests, targets)

    def ceiling_of(config) -> float:  # as a factor of the requests' own rate
        return ceiling_rate(config.regions, config.options, requests) / requests.offered_rate()
    searches, steps, tuned = tune(initial, knobs, layouts, base, run_points, ceiling_of,
                                  tolerance, progress, space.rounds, space.each_layout)
    configurations = [_row(o, targets, len(s.points), *economy, requests, s.config)
                      for o, s in zip(outcomes(list(searches.values())), searches.values())]
    finals = [final(setup, job, r, tuned, layouts, base, economy, searches)
              for r in range(len(draws))]
    replicates = [Replicate(f.final, f.comparison, f.final_requests_per_run)
                  for f in finals] if more_draws else None
    report = ExperimentReport(
        model.name, f"{cluster.systems} x {fabric.name}", setup.spec.name, len(requests), targets,
        space.prefix_cache, space.grid, skipped, fabric.system_power_w, configurations,
        [_step(s, searches, cluster.systems) for s in steps],
        {s.config.label: [_point(p) for _, p in sorted(s.points.items())]
         for s in searches.values()},
        finals[0].final, finals[0].final_requests_per_run, finals[0].confirmed,
        finals[0].final_points, finals[0].comparison, replicates,
        over_replicates(replicates) if replicates else None,
        footprint_unit=getattr(cluster, "unit", "system"),
        serving={"router": space.router, "kv_tier": space.kv_tier}
        if (space.router, space.kv_tier) != ("least-busy", "none") else None,
        tuned=tuned, confirm_runs=[f.runs for f in finals])
    return report, {s.config.label: s.config for s in searches.values()}


def base_options(setup, cluster) -> ServeOptions:
    """The serving options every configuration of an experiment starts from (its knobs set
    by each choice): the cluster's fabric, the model, and how the space and the timing ask
    both plans to serve."""
    space, timing = setup.space, setup.timing
    return ServeOptions.of(cluster.fabric, setup.model, prefix_cache=space.prefix_cache,
                           router=space.router, kv_tier=space.kv_tier,
                           acceptance=timing.acceptance, acceptance_seed=timing.acceptance_seed)


def search_fixed(setup, job, tuned: dict, runs: Requests, guess: dict) -> tuple[list, object]:
    """``tuned`` (plan -> ``tuning.Choice``, as another experiment on the same layouts tuned
    them) searched on ``runs`` as they are, started near ``guess`` (choice -> rate): their
    rows and the comparison, as ``final`` gives them."""
    cluster, targets = job.cluster, job.targets
    layouts, _ = setup.layouts_of(job, [runs])
    searches = _search_again(tuned, layouts, base_options(setup, cluster), runs, targets,
                             job.book, guess, setup.tolerance, setup.progress)
    economy = (cluster.systems, cluster.fabric.system_power_w, setup.price)
    results = outcomes(list(searches.values()))
    return ([_row(o, targets, len(s.points), *economy, runs, s.config)
             for o, s in zip(results, searches.values())],
            compare(results, targets, cluster.systems))


@dataclass
class Final:
    """Each plan's tuned configuration searched again on one draw (``final``)."""

    final: list[ConfigRow]
    final_requests_per_run: int
    confirmed: bool
    final_points: dict[str, list[dict]]
    comparison: Comparison
    runs: Requests  # what the rows were searched on


def final(setup, job, draw: int, tuned: dict, layouts: dict, base: ServeOptions, economy,
          tuning: dict) -> Final:
    """Each plan's tuned configuration on draw ``draw`` of ``job``'s: searched again on runs
    long enough for a steady window of the space's ``window_s`` at the rates found (the
    confirming runs, ``setup.longer``: sized by the rates tuning found, and lengthened while
    the rates they find leave the window short), or, without them, as tuning left it
    (``tuning``: the first draw's searches) or searched on this draw's requests. Returns its
    rows and the comparison."""
    requests, targets, book = job.draws[draw], job.targets, job.book
    tolerance, progress, longer = setup.tolerance, setup.progress, setup.longer(job)
    window = setup.space.window_s
    guess = {c: _rate_of(tuning, c) for c in tuned.values()}  # requests (sessions) per s
    if window <= 0 and draw == 0:
        searches, runs = {c: tuning[c] for c in tuned.values()}, requests
    else:
        # Run sizes count sessions, as the rates do; ``cap`` keeps their model calls in bounds.
        n, cap = requests.sessions(), confirm_cap(requests)
        for _ in range(3):
            if window > 0:
                # The steady window is the middle of the arrivals (``metrics.steady_window``).
                wanted = int(np.ceil(max(guess.values()) * window / (1 - WARMUP - DRAIN)))
                n = max(n, min(cap, wanted))
                runs = longer(draw, n)
            else:
                runs = requests
            searches = _search_again(tuned, layouts, base, runs, targets, book, guess,
                                     tolerance, progress)
            reached = [s.points[s.best].metrics.window_s for s in searches.values()
                       if s.best is not None]
            longest = window <= 0 or runs.sessions() < n or n >= cap
            if longest or min(reached, default=window) >= 0.9 * window:
                break
            guess = {c: _rate_of(searches, c) or guess[c] for c in tuned.values()}
    results = outcomes(list(searches.values()))
    return Final([_row(o, targets, len(s.points), *economy, runs, s.config)
                  for o, s in zip(results, searches.values())], len(runs), window > 0,
                 {s.config.label: [_point(p) for _, p in sorted(s.points.items())]
                  for s in searches.values()}, compare(results, targets, economy[0]), runs)


def _search_again(tuned: dict, layouts: dict, base: ServeOptions, runs: Requests,
                  targets: Targets, book: RunBook, guess: dict, tolerance: float,
                  progress) -> dict:
    """The tuned configurations' rate searches on ``runs``, started near ``guess``."""
    run_points = book.run_points((layouts, base), runs, targets)
    searches = {}
    for c in tuned.values():
        config = config_of(c, layouts, base)
        searches[c] = Search(config, start=guess[c] / runs.offered_rate() if guess[c] else None,
                             ceiling=ceiling_rate(config.regions, config.options, runs)
                             / runs.offered_rate())
    run_searches(searches, run_points, tolerance=tolerance, progress=progress,
                 label="searching the best again")
    return searches


def _rate_of(searches: dict, choice) -> float:
    s = searches[choice]
    return s.points[s.best].rate if s.best is not None else 0.0


def _step(step, searches: dict, systems: int) -> dict:
    """A tuning step as reported: each value tried and its goodput per system."""
    def rate(c):
        return _rate_of(searches, c) / (searches[c].config.footprint or systems)
    return {"plan": step.plan, **({"line": step.line} if step.line else {}),
            "knob": step.knob,
            "tried": [{"value": v, "configuration": c.label, "max_rate_per_system": rate(c)}
                      for v, c in step.tried],
            "chosen": step.chosen.label, "chosen_value": next(
                v for v, c in step.tried if c == step.chosen),
            "before_per_system": rate(step.before) if step.before else None,
            "after_per_system": rate(step.chosen)}


def _point(p) -> dict:
    """One serving run of the search, for curves: its rate and what it achieved."""
    m = p.metrics
    return {"rate_per_s": p.rate, "met": p.met, "ttft_p90_s": m.ttft_s.p90,
            "tpot_p90_s": m.tpot_s.p90, "itl_p90_s": m.itl_s.p90,
            # At the other percentiles targets may be held at (``Targets.percentile``).
            **{f"{name}_p{q}_s": getattr(getattr(m, f"{name}_s"), f"p{q}")
               for name in ("ttft", "tpot") for q in (50, 99)},
            "slo_attainment": m.slo_attainment,
            "ttft_growth_s": m.ttft_growth_s, "ttft_slope": m.ttft_slope,
            "pace": m.pace, "output_tokens_per_s": m.output_tokens_per_s,
            "window_output_tokens_per_s": m.window_output_tokens_per_s,
            "user_tokens_per_s": m.user_tokens_per_s.to_json(), "refused": m.refused,
            "goodput_requests_per_s": m.goodput_requests_per_s}


def economics(tokens_per_s: float, systems: int, power_w: float,
              price: float | None) -> dict:
    """Energy per output token (the systems' wall power over their output rate) and, given a
    price per system-hour, cost per million output tokens."""
    out = {}
    if tokens_per_s > 0 and power_w > 0:
        out["energy_per_output_token_j"] = systems * power_w / tokens_per_s
    if tokens_per_s > 0 and price is not None:
        out["cost_per_million_output_tokens"] = systems * price / 3600 / tokens_per_s * 1e6
    return out


def _row(r: Outcome, targets: Targets, runs: int, systems: int = 1, power_w: float = 0.0,
         price: float | None = None, requests: Requests | None = None,
         config: Config | None = None) -> ConfigRow:
    systems = r.footprint or systems  # per unit of its own footprint, where layouts differ
    row = ConfigRow(r.label, r.plan, r.knob, runs, r.limit(targets))
    if r.best is not None:
        m, p = r.best.metrics, r.best.pressure
        row = replace(
            row, max_rate_per_s=r.best.rate, max_rate_per_system=r.best.rate / systems,
            # The search's bracket: the true highest rate lies below the next one.
            failed_rate_per_system=(r.failed.rate / systems if r.failed is not None
                                    else None),
            goodput_requests_per_s=r.goodput, output_tokens_per_s=r.tokens_per_s,
            output_tokens_per_s_per_system=r.tokens_per_s / systems,
            window_output_tokens_per_s_per_system=r.window_tokens_per_s / systems,
            user_tokens_per_s=m.user_tokens_per_s, refused=m.refused,
            window_requests=m.window_requests, window_s=m.window_s,
            ttft_growth_s=m.ttft_growth_s, ttft_slope=m.ttft_slope, pace=m.pace,
            ttft_p90_s=m.ttft_s.p90, tpot_p90_s=m.tpot_s.p90, itl_p90_s=m.itl_s.p90,
            ttft_p50_s=m.ttft_s.p50, tpot_p50_s=m.tpot_s.p50, ttft_p99_s=m.ttft_s.p99,
            tpot_p99_s=m.tpot_s.p99, slo_attainment=m.slo_attainment,
            session_p50_s=m.session_s.p50 if m.session_s is not None else None,
            session_p90_s=m.session_s.p90 if m.session_s is not None else None,
            decode_stall_per_token_s=p.decode_stall_per_token_s,
            prefill_utilization=p.prefill_utilization,
            decode_utilization=p.decode_utilization, kv_peak_share=p.kv_peak_share,
            **economics(r.tokens_per_s, systems, power_w, price))
    if config is not None and requests is not None:
        # At 100% busy stages: how close the configuration's best rate comes.
        ceiling = ceiling_rate(config.regions, config.options, requests)
        row = replace(row, ceiling_rate_per_s=ceiling, ceiling_rate_per_system=ceiling / systems,
                      share_of_ceiling=row.max_rate_per_s / ceiling)
    return row


def vary_experiment(variation: Variation, setup, job, draws_for=None,
                    plan: DrawPlan | None = None) -> VaryReport:
    """``setup.run(job)`` at every value of ``variation``, the value applied to the job's
    draws, targets and cluster, to a confirming run's requests and as a ``StepScale`` on the
    stage tables: each value's full report, and a row per value with the best of each plan,
    their ratio and the TPOT target in decode steps. A value the experiment cannot run (too
    few systems for a split) keeps its row, with why. ``draws_for(systems)``, if given, draws
    the tuning runs' requests afresh for a value's number of systems (agent sessions need
    more on more systems: ``tuning_requests``); otherwise every value starts from the job's
    draws. With ``plan`` (``draws.DrawPlan``), each value runs on as many of them as its
    ratio's precision asks (``draws.run_until_precise``); without, on all."""
    draws, targets, cluster = job.draws, job.targets, job.cluster
    rows, runs = [], []
    for value in variation.values:
        base = draws
        if draws_for is not None:
            base = draws_for(apply(variation, value, draws[0], targets, cluster.systems)[2])
        varied = [apply(variation, value, d, targets, cluster.systems) for d in base]
        v_targets, systems, scale = varied[0][1], varied[0][2], varied[0][3]
        row = SensitivityRow(value, v_targets.tpot_s, systems)
        at_value = replace(job, targets=v_targets, cluster=ClusterSpec(cluster.fabric, systems),
                           transform=Applied(variation, value, targets, cluster.systems),
                           scale=scale)
        requests = [v[0] for v in varied]
        try:
            (data, configs), precision = run_until_precise(
                plan or DrawPlan(len(requests), len(requests), None),
                lambda n: setup.run(replace(at_value, draws=requests[:n])),
                lambda result: experiment_swing(result[0], requests), setup.progress)
            data.precision = precision if precision["asked"] is not None else None
        except UserError as exc:
            rows.append(replace(row, error=str(exc)))
            continue
        # One sequence's decode step on a colocated region (any region, if none compiled).
        unit = next((c for c in configs.values() if c.plan == "colocated"),
                    next(iter(configs.values())))
        spec = unit.options.speculation()
        step = decode_step_s(unit.regions, varied[0][0], cluster.fabric.clock_hz,
                             spec.mean_tokens_per_step if spec is not None else 1.0)
        cmp_ = data.comparison
        rows.append(replace(
            row, decode_step_s=step, tpot_in_decode_steps=v_targets.tpot_s / step,
            colocated=cmp_.colocated, disaggregated=cmp_.disaggregated,
            max_rate_per_system=cmp_.max_rate_per_system, goodput_ratio=cmp_.goodput_ratio,
            goodput_ratio_interval=None if data.over_replicates is None
            else data.over_replicates["goodput_ratio"]))
        runs.append(replace(data, value=value))
    first = runs[0] if runs else None
    return VaryReport(first and first.model, first and first.workload, cluster.fabric.name,
                      variation.name, VARIABLES[variation.name], rows, runs)


def experiment_swing(data: ExperimentReport, requests: list) -> Swing:
    """What ``data``'s draws (their ``requests``) give its headline, the goodput ratio:
    its interval, each plan's goodput per system on every draw, and why it has no ratio on
    every draw, if it has not."""
    draws = data.draws()
    per_plan = {}
    for plan in ("colocated", "disaggregated"):
        per_plan[plan] = [getattr(d.rows().get(d.comparison.best(plan)),
                                  "max_rate_per_system", None) for d in draws]
    missing = sum(d.comparison.goodput_ratio is None for d in draws)
    undefined = None if not missing else (
        f"colocated met the targets at no rate on {missing} of {len(draws)} draws, so the "
        "ratio is not defined on every draw")
    over = data.over_replicates
    interval = over["goodput_ratio"] if over else None
    return Swing(None if missing else interval, per_plan, list(requests[:len(draws)]),
                 undefined)


TUNING_REQUESTS = 1000  # per tuning run: enough to load a cluster, few for a search of many


def tuning_requests(spec: WorkloadSpec, systems: int) -> int:
    """Requests (sessions) per tuning run: the workload's own count, at most TUNING_REQUESTS
    model calls. Agent sessions get that many per system: their load builds up for a
    session's length before a steady window can start (``metrics``), and a cluster of N systems
    runs N times the sessions at once, so a run must hold N times as many to get there."""
    if spec.calls > 1:
        return min(spec.requests, max(TUNING_REQUESTS // spec.calls, 1)) * systems
    return min(spec.requests, TUNING_REQUESTS)


def workload_draws(spec: WorkloadSpec, seeds: int) -> list[Requests]:
    """``seeds`` independent draws of a workload: its next seeds, or a trace's next windows."""
    draws = [generate(replicate(spec, r, spec.requests)) for r in range(seeds)]
    for draw in draws:
        if draw.offered_rate() <= 0:
            raise UserError(f"workload {spec.name}: its first arrivals all come at one instant, "
                            "so it has no rate to scale; give it at least two distinct arrival "
                            "times")
    return draws


def unchanged(requests: Requests) -> Requests:
    return requests


@dataclass(frozen=True)
class LongerDraws:
    """``longer(draw, n)`` for the confirming runs: draw ``draw`` of the workload with ``n``
    requests (a trace's windows share its ``rows``, one window per draw), through
    ``transform``."""

    spec: WorkloadSpec
    seeds: int
    transform: object = unchanged
    rows: int | None = None  # a trace's rows after its first window's start; None: synthetic

    def __call__(self, draw: int, n: int) -> Requests:
        if self.rows is not None:
            n = min(n, self.rows // self.seeds)
        return self.transform(generate(replace(replicate(self.spec, draw, n), requests=n)))


def trace_windows(spec: WorkloadSpec, most: int) -> int:
    """How many windows of ``spec.requests`` rows a trace holds after its first window's
    start, counted no further than ``most``."""
    rows = len(generate(replace(spec, requests=min(most * spec.requests, MAX_REQUESTS))))
    return rows // spec.requests


def longer_draws(spec: WorkloadSpec, seeds: int, transform=unchanged) -> LongerDraws:
    """The confirming runs' draws of ``spec`` (``LongerDraws``)."""
    # A trace's rows after its first window's start, counted no further than the draws can
    # take (a confirming run holds at most MAX_CONFIRM_REQUESTS): a long trace is not read
    # whole to learn its length.
    most = min(seeds * MAX_CONFIRM_REQUESTS, MAX_REQUESTS)
    rows = len(generate(replace(spec, requests=most))) if spec.arrival == "trace" else None
    return LongerDraws(spec, seeds, transform, rows)


def describe_draws(spec: WorkloadSpec, data: ExperimentReport) -> str:
    """What the replicates of ``data`` (the report) were."""
    sizes = sorted({r.requests_per_run for r in data.replicates})
    size = f"{sizes[0]:,}" if len(sizes) == 1 else f"{sizes[0]:,} to {sizes[-1]:,}"
    if spec.arrival == "trace":
        return f"windows of {size} requests of the trace, one after another"
    return f"seeds {spec.seed} to {spec.seed + len(data.replicates) - 1}"
