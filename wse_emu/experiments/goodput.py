"""The disaggregation experiment: on the same hardware, at the same token speed (a p90 TPOT
target), how many requests per second does each way of serving meet its latency targets for?

Every configuration (colocated with prefill priority, colocated with chunked prefill at a few
token budgets, disaggregated at a few prefill/decode splits) gets the same requests, arriving
faster or slower: the search looks for the highest rate at which p90 TTFT and p90 TPOT meet
their targets and at least ``attainment`` of the requests meet both, counted over the run's
steady window, with the mean TTFT not growing across it (``metrics.run_metrics``). That rate,
per system, is the headline: goodput as DistServe (OSDI'24) defines it. It runs in rounds; each
round's points are independent serving runs, handed to ``run_points`` together so that they can
run in parallel.

Besides the numbers, each configuration says what stopped it at the first rate it failed: which
target broke, how long decode tokens stalled beyond their own work (the cost of sharing a
pipeline with prefill), how busy the prefill and decode stages were, and how long prompts waited
for KV room.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields, is_dataclass, replace

import numpy as np

from wse_emu.errors import UserError
from wse_emu.experiments.intervals import interval, ratio_interval
from wse_emu.serving.caps import CapUse
from wse_emu.serving.knobs import ServingKnobs
from wse_emu.serving.metrics import RunMetrics, UserSpeeds, judged_window, on_target, run_metrics
from wse_emu.serving.policies import warm_loop
from wse_emu.serving.serve import ServeOptions, serve
from wse_emu.serving.workload import Requests
from wse_emu.util.checks import positive
from wse_emu.util.flags import flagged
from wse_emu.util.fmt import duration as time_text
from wse_emu.util.fmt import number
from wse_emu.util.memory import keep_freed_memory
from wse_emu.util.progress import Live

# A search's first round: the analytic ceiling times these (a configuration's best rate lies
# below it, at 22% to 98% of it in the experiments the README reports, so the first round
# usually brackets it within a factor of two) ...
BELOW_CEILING = (0.25, 0.5, 1.0)
# ... or, where the rate is known from a shorter run (the confirming runs), that rate times
# these (a longer run meets a little less, if anything) ...
NEAR = (0.8, 0.9, 1.0)
# ... or, with neither, a wide ladder.
BRACKET = tuple(2.0 ** k for k in range(-3, 5))
# The search stops below the start rate times LOWEST (the configuration meets its targets at no
# rate) and above it times HIGHEST (the run's requests then arrive nearly at once, so a higher
# rate would not load the cluster any more).
LOWEST, HIGHEST = 2.0 ** -14, 2.0 ** 14
MAX_ROUNDS = 12


# A run whose TTFT rises by more than this many seconds per second of arrivals across its
# steady window is not sustaining its rate: its queue grows (arrivals outpace service by about
# this share), and a longer run would miss its targets.
MAX_TTFT_SLOPE = 0.05
# ... and a run whose window's first tokens come out over more than this many times the span
# its requests arrived in has fallen behind (a burst arriving at once is the extreme).
MAX_PACE = 1.1


# The percentiles latency targets may be held at: the typical request (a planner's steady
# state, AIConfigurator's), the field's usual serving target (DistServe's), and MLPerf's.
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Targets:
    ttft_s: float = flagged(
        "time-to-first-token target at `percentile`, seconds", name="--ttft-slo",
        required=True)
    tpot_s: float = flagged(
        "time-per-output-token target at `percentile`, seconds (the token speed every "
        "configuration must reach)", name="--tpot-slo", required=True)
    # Share of requests that must meet both (None: the percentile's, 0.9 at p90). Resolved
    # when made, so a copy with another percentile keeps it: give None again to follow.
    attainment: float | None = flagged(
        "share of requests that must meet both targets (default: the share `percentile` "
        "names, 0.9 at the p90)", None)
    percentile: int = flagged(
        "the percentile of requests both targets hold at (50: the typical request, as a "
        "planner's steady state reads it; 99: MLPerf's)", 90, name="--slo-percentile",
        choices=PERCENTILES)

    def __post_init__(self):
        if type(self.percentile) is not int or self.percentile not in PERCENTILES:
            raise UserError(f"`percentile` must be one of {', '.join(map(str, PERCENTILES))}, "
                            f"got {self.percentile!r}")
        if self.attainment is None:
            object.__setattr__(self, "attainment", self.percentile / 100)
        for name in ("ttft_s", "tpot_s", "attainment"):
            positive(name, getattr(self, name))
        if self.attainment > 1:
            raise UserError(f"`attainment` must be in (0, 1], got {self.attainment}")

    @property
    def at(self) -> str:
        """The percentile as reports name it: p90."""
        return f"p{self.percentile}"

    def ttft(self, metrics: RunMetrics) -> float:
        """A run's TTFT at the targets' percentile."""
        return getattr(metrics.ttft_s, self.at)

    def tpot(self, metrics: RunMetrics) -> float:
        """A run's TPOT at the targets' percentile."""
        return getattr(metrics.tpot_s, self.at)

    def stable(self, metrics: RunMetrics) -> bool:
        """Whether a run sustained its rate over its steady window (a run without one is)."""
        slope = 0.0 if metrics.ttft_slope is None else metrics.ttft_slope
        pace = 1.0 if metrics.pace is None else metrics.pace
        return slope <= MAX_TTFT_SLOPE and pace <= MAX_PACE and not metrics.too_short

    def met(self, metrics: RunMetrics) -> bool:
        return (self.ttft(metrics) <= self.ttft_s and self.tpot(metrics) <= self.tpot_s
                and metrics.slo_attainment >= self.attainment and self.stable(metrics))

    def to_json(self) -> dict:
        """As an experiment's report states them (keys named by the percentile)."""
        return {f"ttft_{self.at}_s": self.ttft_s, f"tpot_{self.at}_s": self.tpot_s,
                "attainment": self.attainment}

    @classmethod
    def from_json(cls, data: dict) -> "Targets":
        at = next((q for q in PERCENTILES if f"ttft_p{q}_s" in data), None)
        if at is None:  # as a report with no targets was refused before percentiles
            raise KeyError("ttft_p90_s")
        return cls(data[f"ttft_p{at}_s"], data[f"tpot_p{at}_s"], data["attainment"], at)


@dataclass
class Config:
    """One way of serving on the cluster."""

    plan: str  # colocated or disaggregated
    knob: str  # its policy or split, as shown: "prefill priority", "chunked 256", "share 0.5"
    regions: list  # its pools
    options: ServeOptions
    footprint: float | None = None  # what it takes (None: the cluster's systems)

    @property
    def label(self) -> str:
        return f"{self.plan}, {self.knob}"


@dataclass(frozen=True)
class Pressure:
    """Where a run's time went (``_pressure``): prefill and decode stage utilization (mean
    over the regions serving the phase), decode work and stall per output token, the KV
    peak's share of capacity, and the largest share of the run a region's admission waited
    for KV room."""

    prefill_utilization: float
    decode_utilization: float
    decode_stall_per_token_s: float
    decode_work_per_token_s: float
    kv_peak_share: float
    kv_blocked_share: float


@dataclass
class Point:
    """One serving run at one rate (requests, or sessions, per second), judged: its metrics
    (the attainment and goodput against the targets) and where its time went."""

    rate: float
    met: bool
    metrics: RunMetrics | None
    pressure: Pressure | None = None


@dataclass
class Run:
    """One serving run at one rate, before any target judges it: its metrics that no target
    decides, where its time went, and what the targets are checked on (per request, its TTFT
    and TPOT and whether it is in the steady window). One run serves every target of a
    frontier's ladder."""

    rate: float
    metrics: RunMetrics
    pressure: Pressure
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    window: np.ndarray
    span_s: float
    caps: CapUse = field(default_factory=CapUse)  # what its caps decided


def serve_run(config: Config, requests: Requests, factor: float) -> Run:
    """Serve ``requests`` arriving ``factor`` times as fast as generated. A request no region
    of the configuration can hold is refused, and misses every target."""
    # An experiment serves run after run in one process, each allocating and freeing alike:
    # the next reuses this one's pages rather than faulting fresh ones in (``util.memory``).
    keep_freed_memory()
    reqs = requests.faster(factor)
    result = serve(reqs, config.regions, config.options, refuse=True)
    judged = judged_window(result, reqs)  # the metrics' window, and the run's to judge by
    metrics = run_metrics(result, reqs, None, None, steady=True, judged=judged)
    return Run(requests.offered_rate() * factor, metrics,
               _pressure(result.regions, metrics.duration_s), result.ttft_s(), result.tpot_s(),
               judged.mask, metrics.duration_s, result.caps)


def judge(run: Run, targets: Targets) -> Point:
    """The run against ``targets``: its metrics with the attainment and goodput they decide."""
    metrics = replace(run.metrics, **on_target(run.ttft_s, run.tpot_s, run.window, run.span_s,
                                               targets.ttft_s, targets.tpot_s))
    return Point(run.rate, targets.met(metrics), metrics, run.pressure)


def evaluate(config: Config, requests: Requests, factor: float, targets: Targets) -> Point:
    """Serve ``requests`` arriving ``factor`` times as fast as generated, judged on
    ``targets``."""
    return judge(serve_run(config, requests, factor), targets)


class RunBook:
    """The serving runs of an experiment, kept by what they served (the requests, the layouts
    and options, the configuration and the rate): judged against another target, a run is not
    served again; nor is one its caps prove the same as a run served already (``caps``: a
    configuration alike in all but its running cap and batch limit, at the same rate, whose
    caps never stopped anything the other's would not). ``run_points`` gives what
    ``run_searches`` calls."""

    def __init__(self, pool, serve_job):
        self.pool, self.serve_job = pool, serve_job  # serve_job(*shared, *job) -> Run
        self.runs: dict = {}
        self.alike: dict = {}  # (shared key, job less its caps) -> [(caps, Run)]
        self.bound: dict = {}  # shared key -> (shared, bound function); keeps shared alive

    def run_points(self, shared: tuple, requests: Requests, targets: Targets):
        """``run_points(jobs, done=None)``: each job (a configuration and a factor) judged on
        ``targets``, served as ``serve_job(*shared, requests, *job)`` unless served before."""
        # Options (dataclasses) by value, so that every target's experiment shares them;
        # layouts by identity (``bound`` keeps them alive).
        key = (tuple(repr(x) if is_dataclass(x) else id(x) for x in shared), requests.digest())
        if key not in self.bound:
            self.bound[key] = ((shared, requests),
                               self.pool.bind(self.serve_job, (*shared, requests)))
        serve_jobs = self.bound[key][1]

        def run_points(jobs, done=None):
            todo = [job for job in dict.fromkeys(jobs) if (key, job) not in self.runs]
            finished = len(jobs) - len(todo)
            # The loosest caps of each family first: their runs may stand for the others'.
            for wave in loosest_first(todo):
                left = [job for job in wave if not self._stand_in(key, job)]
                if len(left) < len(wave):
                    finished += len(wave) - len(left)
                    if done is not None:
                        done(finished)
                if not left:
                    continue
                if self.pool.parallel:
                    # Compiled here once, a line saying so, for the workers to load.
                    warm_loop()
                counted = None if done is None else (
                    lambda count, before=finished: done(before + count))
                for job, run in zip(left, serve_jobs(left, done=counted)):
                    self._keep(key, job, run)
                finished += len(left)
            if done is not None and jobs and not todo:
                done(len(jobs))
            return [judge(self.runs[(key, job)], targets) for job in jobs]
        return run_points

    def _keep(self, key, job, run: Run) -> None:
        self.runs[(key, job)] = run
        family, caps = split_caps(job)
        if caps is not None:
            self.alike.setdefault((key, family), []).append((caps, run))

    def _stand_in(self, key, job) -> bool:
        """Whether a run served already is proven the same as ``job``'s by its caps (kept as
        ``job``'s if so)."""
        family, caps = split_caps(job)
        if caps is None:
            return False
        for ran, run in self.alike.get((key, family), ()):
            if run.caps.same_under(ran, caps):
                self.runs[(key, job)] = run
                return True
        return False


def split_caps(job: tuple) -> tuple:
    """A (configuration, factor) job less its caps (the configuration's running cap and batch
    limit set to fixed values, so that jobs alike in all else share it), and its caps (None:
    a configuration without serving knobs, which nothing stands in for)."""
    choice, factor = job
    if not isinstance(choice, ServingKnobs):
        return job, None
    return ((replace(choice, max_running=0, batch_limit=1), factor),
            (choice.max_running, choice.batch_limit))


def _looser(a: tuple | None, b: tuple | None) -> bool:
    """Whether caps ``a`` (running cap, batch limit) stop no more than caps ``b`` do, and
    differ from them."""
    if a is None or b is None:
        return False
    running = a[0] == 0 or (b[0] != 0 and a[0] >= b[0])
    return a != b and running and a[1] >= b[1]


def loosest_first(jobs: list) -> list[list]:
    """``jobs`` in two waves: those no other job of their family (``split_caps``) is looser
    than, then the rest, which the first wave's runs may stand for."""
    split = {job: split_caps(job) for job in jobs}
    caps = {}
    for family, cap in split.values():
        caps.setdefault(family, []).append(cap)
    tighter = {job for job, (family, cap) in split.items()
               if any(_looser(other, cap) for other in caps[family])}
    waves = ([job for job in jobs if job not in tighter], [job for job in jobs if job in tighter])
    return [wave for wave in waves if wave]


def _pressure(regions: dict, duration_s: float) -> Pressure:
    """Where the time went: prefill and decode stage utilization (mean over the regions that
    serve the phase), decode work and stall per output token, the KV peak share, and the
    largest share of the run any region's admission waited for KV room. No regions: every
    request was refused (none fits any region's KV), so nothing ran."""
    if not regions:
        return Pressure(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    pre = [r["prefill_utilization"] for r in regions.values() if r["role"] != "decode"]
    dec = [r["decode_utilization"] for r in regions.values() if r["role"] != "prefill"]
    tokens = sum(r["decode_tokens"] for r in regions.values())
    stall = sum(r["decode_stall_s"] for r in regions.values())
    work = sum(r["decode_work_s"] for r in regions.values())
    kv = [r["kv_peak_tokens"] / r["kv_capacity_tokens"] for r in regions.values()
          if r["role"] != "prefill"]
    return Pressure(float(np.mean(pre)), float(np.mean(dec)),
                    # Rounded to the nanosecond: the stall is a difference of large sums.
                    max(round(stall / tokens, 9), 0.0) if tokens else 0.0,
                    work / tokens if tokens else 0.0, max(kv),
                    max(r["kv_blocked_s"] for r in regions.values()) / max(duration_s, 1e-12))


@dataclass
class Search:
    """The rate search of one configuration: the highest rate met, the lowest failed above it.
    Rates are factors of the requests' own rate."""

    config: Config
    points: dict = field(default_factory=dict)  # factor -> Point
    start: float | None = None  # the highest factor met on shorter runs, if known
    ceiling: float | None = None  # the factor at the configuration's analytic ceiling

    @property
    def best(self) -> float | None:
        """The highest factor met below every failed one."""
        ceiling = self.failed
        met = [f for f, p in self.points.items() if p.met and (ceiling is None or f < ceiling)]
        return max(met) if met else None

    @property
    def failed(self) -> float | None:
        failed = [f for f, p in self.points.items() if not p.met]
        return min(failed) if failed else None

    def proposals(self, per_round: int, tolerance: float) -> list[float]:
        """The factors to try next (none once the bracket is within ``tolerance``)."""
        if not self.points:
            if self.start:
                return [self.start * m for m in NEAR]
            if self.ceiling and np.isfinite(self.ceiling):
                return [self.ceiling * m for m in BELOW_CEILING]
            return list(BRACKET)
        lo, hi = self.best, self.failed
        if hi is None:  # everything met: go higher, unless already at the ceiling
            top = max(self.points)
            if top >= HIGHEST:
                return []
            return [top * 2.0 ** (k + 1) for k in range(per_round)]
        if lo is None:  # nothing met: go lower, unless already at the floor
            bottom = min(self.points)
            if bottom <= LOWEST:
                return []
            return [bottom * 2.0 ** -(k + 1) for k in range(per_round)]
        if hi / lo <= 1 + tolerance:
            return []
        step = (hi / lo) ** (1.0 / (per_round + 1))  # evenly spaced in log inside (lo, hi)
        return [lo * step ** (k + 1) for k in range(per_round)]


def run_searches(searches: dict, run_points, per_round: int = 3, tolerance: float = 0.05,
                 progress=None, label: str = "searching") -> None:
    """Advance every search of ``searches`` (key -> Search) to its answer, in rounds whose runs
    are independent: ``run_points(jobs, done)`` evaluates a list of (key, factor), calling
    ``done(count)`` as each finishes. ``progress(text)`` hears of every run finished, with the
    time left at the pace measured so far."""
    for round_ in range(MAX_ROUNDS):
        jobs = [(key, f) for key, s in searches.items()
                for f in s.proposals(per_round, tolerance) if f not in s.points]
        if not jobs:
            break
        if progress is None:
            points = run_points(jobs)
        else:
            began = time.monotonic()
            what = f"{label}: round {round_ + 1}"
            progress(Live(f"{what}, 0 of {len(jobs)} runs done", 0.0, began))

            def done(count: int, what=what, began=began, total=len(jobs)) -> None:
                # The time left is worked out again whenever the line is shown (``Live``).
                progress(Live(f"{what}, {count} of {total} runs done", count / total, began))
            points = run_points(jobs, done=done)
        for (key, f), point in zip(jobs, points):
            searches[key].points[f] = point


@dataclass
class Outcome:
    """A configuration's answer: its best point and the first point it failed at."""

    label: str
    plan: str
    knob: str
    best: Point | None
    failed: Point | None
    footprint: float | None = None  # its configuration's (None: the cluster's systems)

    @property
    def max_rate(self) -> float:
        """The highest rate met (requests, or sessions, per second): goodput as DistServe
        defines it, the rate a cluster sustains with the targets met."""
        return self.best.rate if self.best else 0.0

    @property
    def goodput(self) -> float:
        """Requests that met both targets per second of the best run's makespan (the drain
        included): a secondary number."""
        return self.best.metrics.goodput_requests_per_s if self.best else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.best.metrics.output_tokens_per_s if self.best else 0.0

    @property
    def window_tokens_per_s(self) -> float:
        """Output tokens/s at the best rate over its steady window (the filling and the drain
        left out): what the configuration sustains."""
        return self.best.metrics.window_output_tokens_per_s if self.best else 0.0

    def limit(self, targets: Targets) -> str:
        """What broke at the first failed rate, in a few words."""
        if self.failed is None:
            return "met every rate tried (more requests per run would load it further)"
        m = self.failed.metrics
        if m.too_short:
            return ("a run too short to judge (every session started before a session's "
                    "length had passed: run more requests)")
        share = 100 * m.refused / m.requests
        refused = (f"{m.refused:,} of its requests ({_percent(share)}) "
                   f"need{'s' if m.refused == 1 else ''} more KV cache than any of its "
                   "regions holds") if m.refused else ""
        if m.refused and m.refused / m.requests > 1 - targets.attainment:
            # What binds it is room, at any rate: more of its requests are refused than the
            # attainment allows to miss.
            return f"KV room: {refused}, refused at any rate"
        broke = [name for name, value, target in
                 ((f"{targets.at} TTFT", targets.ttft(m), targets.ttft_s),
                  (f"{targets.at} TPOT", targets.tpot(m), targets.tpot_s)) if value > target]
        if m.slo_attainment < targets.attainment:
            broke.append(f"attainment ({m.slo_attainment:.1%} < {targets.attainment:.0%}"
                         + (f"; {refused}" if refused else "") + ")")
        if not targets.stable(m):
            if m.pace is not None and m.pace > MAX_PACE:
                broke.append(f"a growing queue (first tokens spread over {_plain(m.pace)}x the "
                             "span of arrivals)")
            else:
                broke.append(f"a growing queue (TTFT rising {_plain(m.ttft_slope, 2)} s per s "
                             "of arrivals)")
        return " and ".join(broke)


def outcomes(searches: list[Search]) -> list[Outcome]:
    out = []
    for s in searches:
        best, failed = s.best, s.failed
        out.append(Outcome(s.config.label, s.config.plan, s.config.knob,
                           s.points[best] if best is not None else None,
                           s.points[failed] if failed is not None else None,
                           s.config.footprint))
    return out


def _percent(share: float) -> str:
    """A share in percent as a reason says it, to two figures and never in exponent form:
    "100%", "39%", "7.2%", "0.5%"."""
    return f"{share:.0f}%" if share >= 10 else f"{share:.2g}%"


# A configuration's numbers at its best rate, in the order its row reports them.
AT_BEST = ("failed_rate_per_system", "goodput_requests_per_s", "output_tokens_per_s",
           "output_tokens_per_s_per_system", "window_output_tokens_per_s_per_system",
           "user_tokens_per_s", "refused", "window_requests", "window_s", "ttft_growth_s",
           "ttft_slope", "pace", "ttft_p90_s", "tpot_p90_s", "itl_p90_s", "slo_attainment",
           "decode_stall_per_token_s", "prefill_utilization", "decode_utilization",
           "kv_peak_share")
ECONOMICS = ("energy_per_output_token_j", "cost_per_million_output_tokens")
# Latencies at the other percentiles targets may be held at (reports from before lack them),
# and, for agent sessions, how long a whole session took.
OTHER_PERCENTILES = ("ttft_p50_s", "tpot_p50_s", "ttft_p99_s", "tpot_p99_s", "session_p50_s",
                     "session_p90_s")
CEILING = ("ceiling_rate_per_s", "ceiling_rate_per_system", "share_of_ceiling")


@dataclass
class ConfigRow:
    """One configuration's row of an experiment's report: its highest rate meeting the
    targets (goodput as DistServe defines it, per second and per system), what it achieved
    at that rate, what broke at the next, and how close it came to its analytic ceiling.
    The numbers at its best rate are None when it met its targets at no rate tried
    (``met_some_rate``); energy and cost only where they can be stated; the ceiling only
    where the configuration was at hand."""

    configuration: str  # "colocated, 2 copies, interleaved 2:1, tile 16, batch 64"
    plan: str
    knob: str
    runs: int  # serving runs its rate search took
    limited_by: str  # what broke at the first rate it failed
    max_rate_per_s: float = 0.0
    max_rate_per_system: float = 0.0
    failed_rate_per_system: float | None = None  # the search's bracket: it failed here
    goodput_requests_per_s: float | None = None  # on target per second of the makespan
    output_tokens_per_s: float | None = None
    output_tokens_per_s_per_system: float | None = None
    window_output_tokens_per_s_per_system: float | None = None
    user_tokens_per_s: UserSpeeds | None = None
    refused: int | None = None
    window_requests: int | None = None
    window_s: float | None = None
    ttft_growth_s: float | None = None
    ttft_slope: float | None = None
    pace: float | None = None
    ttft_p90_s: float | None = None
    tpot_p90_s: float | None = None
    itl_p90_s: float | None = None
    # At the other percentiles targets may be held at (``Targets.percentile``; written only
    # where known: ``OTHER_PERCENTILES``).
    ttft_p50_s: float | None = None
    tpot_p50_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None
    # Agent sessions (several calls each): from a session's first call to its last token.
    session_p50_s: float | None = None
    session_p90_s: float | None = None
    slo_attainment: float | None = None
    decode_stall_per_token_s: float | None = None
    prefill_utilization: float | None = None
    decode_utilization: float | None = None
    kv_peak_share: float | None = None
    energy_per_output_token_j: float | None = None
    cost_per_million_output_tokens: float | None = None
    ceiling_rate_per_s: float | None = None
    ceiling_rate_per_system: float | None = None
    share_of_ceiling: float | None = None

    @property
    def met_some_rate(self) -> bool:
        """Whether the configuration met its targets at some rate tried."""
        return self.goodput_requests_per_s is not None

    def to_json(self) -> dict:
        out = {"configuration": self.configuration, "plan": self.plan, "knob": self.knob,
               "runs": self.runs, "limited_by": self.limited_by,
               "max_rate_per_s": self.max_rate_per_s,
               "max_rate_per_system": self.max_rate_per_system}
        if self.met_some_rate:
            out.update({name: getattr(self, name) for name in AT_BEST})
            out["user_tokens_per_s"] = self.user_tokens_per_s.to_json()
            out.update({name: getattr(self, name) for name in ECONOMICS + OTHER_PERCENTILES
                        if getattr(self, name) is not None})
        if self.ceiling_rate_per_s is not None:
            out.update({name: getattr(self, name) for name in CEILING})
        return out

    @classmethod
    def from_json(cls, data: dict) -> "ConfigRow":
        """A row read back from a report (a field a report written before it existed lacks
        is None)."""
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        if values.get("user_tokens_per_s") is not None:
            values["user_tokens_per_s"] = UserSpeeds.from_json(values["user_tokens_per_s"])
        return cls(**values)


@dataclass
class Comparison:
    """The best of each plan (by its highest rate met, per system) and, when both plans have
    one, their numbers side by side (per plan), the ratios disaggregated / colocated (None
    where colocated met no rate), the split and why each stopped where it did."""

    colocated: str | None  # the label of each plan's best configuration
    disaggregated: str | None
    max_rate_per_system: dict[str, float] | None = None
    tokens_per_s_per_system: dict[str, float] | None = None
    window_tokens_per_s_per_system: dict[str, float] | None = None
    goodput_ratio: float | None = None
    tokens_per_s_ratio: float | None = None
    window_tokens_per_s_ratio: float | None = None
    on_target_per_makespan_ratio: float | None = None
    split: str | None = None
    # A configuration that met every rate tried has no ceiling found: its rate is a floor.
    ceiling_found: dict[str, bool] | None = None
    reasons: list[str] = field(default_factory=list)

    @property
    def compared(self) -> bool:
        """Whether both plans have a best configuration to compare."""
        return self.colocated is not None and self.disaggregated is not None

    def best(self, plan: str) -> str | None:
        return self.colocated if plan == "colocated" else self.disaggregated

    def to_json(self) -> dict:
        out = {"colocated": self.colocated, "disaggregated": self.disaggregated}
        if self.compared:
            out.update({f.name: getattr(self, f.name) for f in fields(self)[2:]})
        return out

    @classmethod
    def from_json(cls, data: dict) -> "Comparison":
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass
class Replicate:
    """One independent draw of the workload's answer: its configurations' rows, the
    comparison, and the requests per confirming run."""

    configurations: list[ConfigRow]
    comparison: Comparison
    requests_per_run: int | None = None

    def rows(self) -> dict[str, ConfigRow]:
        return {c.configuration: c for c in self.configurations}

    def to_json(self) -> dict:
        return {"configurations": [c.to_json() for c in self.configurations],
                "comparison": self.comparison.to_json(), "requests_per_run":
                self.requests_per_run}

    @classmethod
    def from_json(cls, data: dict) -> "Replicate":
        return cls([ConfigRow.from_json(c) for c in data["configurations"]],
                   Comparison.from_json(data["comparison"]), data.get("requests_per_run"))


def compare(results: list[Outcome], targets: Targets, systems: int = 1) -> Comparison:
    """The best of each plan by its highest rate met (per system: both plans have the
    cluster's ``systems``), the ratio disaggregated/colocated, and why."""
    best = {}
    for plan in ("colocated", "disaggregated"):
        mine = [r for r in results if r.plan == plan]
        if mine:
            best[plan] = max(mine, key=lambda r: (r.max_rate / (r.footprint or 1),
                                                  r.tokens_per_s / (r.footprint or 1)))
    col, dis = best.get("colocated"), best.get("disaggregated")
    if not (col and dis):
        return Comparison(col.label if col else None, dis.label if dis else None)
    # Per unit of each one's footprint: where the plans' footprints differ (whole units of
    # several kinds), the ratios are of these.
    c, d = col.footprint or systems, dis.footprint or systems
    return Comparison(
        col.label, dis.label,
        max_rate_per_system={"colocated": col.max_rate / c,
                             "disaggregated": dis.max_rate / d},
        tokens_per_s_per_system={"colocated": col.tokens_per_s / c,
                                 "disaggregated": dis.tokens_per_s / d},
        window_tokens_per_s_per_system={"colocated": col.window_tokens_per_s / c,
                                        "disaggregated": dis.window_tokens_per_s / d},
        goodput_ratio=_ratio(dis.max_rate / d, col.max_rate / c),
        tokens_per_s_ratio=_ratio(dis.tokens_per_s / d, col.tokens_per_s / c),
        window_tokens_per_s_ratio=_ratio(dis.window_tokens_per_s / d,
                                         col.window_tokens_per_s / c),
        on_target_per_makespan_ratio=_ratio(dis.goodput / d, col.goodput / c),
        split=dis.knob,
        ceiling_found={"colocated": col.failed is not None,
                       "disaggregated": dis.failed is not None},
        reasons=[_reason(col, targets), _reason(dis, targets)])


def over_replicates(replicates: list[Replicate]) -> dict:
    """Each configuration's goodput per system and the plans' ratios, over the replicates
    (every draw's configurations and comparison). Goodputs and the goodput ratio are
    bracketed by the rate searches' steps (``interval``'s bounds)."""
    # Configurations searched on every draw (the tuned ones, when only the first was tuned).
    labels = [c.configuration for c in replicates[0].configurations
              if all(c.configuration in r.rows() for r in replicates)]
    rows = []
    for label in labels:
        mine = [r.rows()[label] for r in replicates]
        rows.append({"configuration": label,
                     "max_rate_per_system": interval(
                         [c.max_rate_per_system for c in mine],
                         upper=[c.failed_rate_per_system for c in mine], floor=0.0),
                     "output_tokens_per_s_per_system": interval(
                         (c.output_tokens_per_s_per_system or 0.0 for c in mine), floor=0.0),
                     "window_output_tokens_per_s_per_system": interval(
                         (c.window_output_tokens_per_s_per_system or 0.0 for c in mine),
                         floor=0.0)})
    return {"replicates": len(replicates), "configurations": rows,
            "goodput_ratio": ratio_interval(
                [r.comparison.goodput_ratio for r in replicates],
                [_ratio_bound(r, low=True) for r in replicates],
                [_ratio_bound(r, low=False) for r in replicates]),
            "tokens_per_s_ratio": ratio_interval(r.comparison.tokens_per_s_ratio
                                                 for r in replicates),
            "window_tokens_per_s_ratio": ratio_interval(
                r.comparison.window_tokens_per_s_ratio for r in replicates)}


def _ratio_bound(replicate: Replicate, low: bool) -> float | None:
    """The lowest (``low``) or highest goodput ratio a draw's rate brackets allow: one plan at
    its highest rate met, the other at the next rate that failed (None when that search found
    no failing rate)."""
    cmp_ = replicate.comparison
    if cmp_.goodput_ratio is None:
        return None
    rows = replicate.rows()
    col, dis = rows[cmp_.colocated], rows[cmp_.disaggregated]
    if low:
        failed = col.failed_rate_per_system
        return None if failed is None else _ratio(dis.max_rate_per_system, failed)
    failed = dis.failed_rate_per_system
    return None if failed is None else _ratio(failed, col.max_rate_per_system)


def _ratio(a: float, b: float) -> float | None:
    """a / b, or None when b is 0 (no colocated rate met the targets)."""
    return a / b if b > 0 else None


def _reason(r: Outcome, targets: Targets) -> str:
    """One sentence on what limits a configuration, from its first failed point's numbers."""
    if r.failed is None:
        return f"{r.label}: met its targets at every rate tried"
    m, p = r.failed.metrics, r.failed.pressure
    parts = [f"{r.label}: at {_plain(r.failed.rate)}/s it missed {r.limit(targets)}"]
    if m.too_short:
        return "; ".join(parts)
    stall, work, tpot = p.decode_stall_per_token_s, p.decode_work_per_token_s, targets.tpot(m)
    if work > 0 and tpot > 1.5 * work:
        behind = ("prefill and other micro-batches" if r.plan == "colocated"
                  else "other decode micro-batches")
        parts.append(f"{targets.at} TPOT {time_text(tpot)} against {time_text(work)} of "
                     f"decode work per token: tokens waited behind {behind} "
                     f"({time_text(stall)} per token on average)")
    parts.append(f"prefill stages {p.prefill_utilization:.0%} busy, decode stages "
                 f"{p.decode_utilization:.0%}")
    if p.kv_blocked_share > 0.01:
        parts.append(f"admission waited for KV room {p.kv_blocked_share:.0%} of the time "
                     f"(KV peak {p.kv_peak_share:.0%} of capacity)")
    return "; ".join(parts)


def _plain(value: float, digits: int = 3) -> str:
    """A number in a sentence, as ``fmt.number`` writes it (5.18 k, 0.046); 'inf' as is."""
    return number(value, digits) if math.isfinite(value) else f"{value}"
