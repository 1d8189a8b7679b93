"""Per-request and per-run serving metrics: TTFT, TPOT, latency percentiles, throughput,
goodput under latency targets.

With ``steady`` the latency percentiles and the attainment count only the requests that
arrive inside the steady-state window (after the first WARMUP and before the last DRAIN share
of arrivals: the cluster filling up and emptying out are not what it sustains), and the run
reports how fast TTFT rises across that window (``ttft_slope``) and how long the window's first
tokens took to come out against how long its requests took to arrive (``pace``): a queue that
keeps growing shows as a TTFT that keeps rising and first tokens that fall behind, however good
the percentiles of a short run look.

For agent sessions the window and both checks follow the sessions' first calls. Only those
arrive open-loop; a session's later calls arrive when its earlier ones finish, so they are paced
by the service itself and would make a burst the cluster merely absorbed look steady. A window
holds every call of the sessions that started inside it, and its sessions must also finish
over no more time than they started over (``session_pace``, part of ``pace``): later sessions
that a growing load stretches finish over more. And the load of a stream of sessions builds
up for as long as a session lasts, so the window starts only once a session's length (the
median) has passed since the first began; a run whose sessions all start before that is too
short to judge (``too_short``): its numbers count every call, and it meets no target."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import njit

from wse_emu.serving.serve import ServeResult
from wse_emu.serving.workload import Requests
from wse_emu.util.fmt import duration, seconds, with_unit

WARMUP, DRAIN = 0.1, 0.1  # shares of the arrivals left out at each end of a steady window
FIFTHS = 5  # the window's arrivals are cut into this many groups to see a trend


def steady_window(arrival: np.ndarray) -> np.ndarray:
    """Requests arriving after the first WARMUP and before the last DRAIN share of arrivals
    (a boolean mask; every request when there are too few to cut)."""
    n = len(arrival)
    order = np.argsort(arrival, kind="stable")
    lo, hi = int(np.floor(WARMUP * n)), n - int(np.floor(DRAIN * n))
    mask = np.zeros(n, dtype=bool)
    mask[order[lo:hi] if hi - lo >= FIFTHS else order] = True
    return mask


def session_window(arrival: np.ndarray, session: np.ndarray, first: np.ndarray,
                   warm_until: int | None = None, phase: np.ndarray | None = None) -> np.ndarray:
    """Every call of the sessions whose first call falls in the steady window of first calls
    (for plain requests, the steady window itself); with ``warm_until``, only sessions
    starting at or after it (an empty window when none do). A workload of phases (``phase``,
    each call's) takes each phase's steady window: its first calls' middle."""
    opening = np.flatnonzero(first)
    if phase is None:
        chosen = opening[steady_window(arrival[opening])]
    else:
        parts = [opening[phase[opening] == k] for k in np.unique(phase[opening])]
        chosen = np.sort(np.concatenate([p[steady_window(arrival[p])] for p in parts]))
    if warm_until is not None:
        chosen = chosen[arrival[chosen] >= warm_until]
    return np.isin(session, session[chosen])


def ttft_trend(arrival: np.ndarray, ttft: np.ndarray) -> list[float]:
    """Mean TTFT of each fifth of the requests, in order of arrival."""
    order = np.argsort(arrival, kind="stable")
    return [float(ttft[part].mean()) for part in np.array_split(order, FIFTHS) if len(part)]


def ttft_slope(arrival_s: np.ndarray, ttft_s: np.ndarray) -> float:
    """Seconds of TTFT gained per second of arrivals (least squares). A queue fed at rate
    lambda and drained at mu < lambda grows by 1 - mu/lambda per second, and every later
    arrival waits that much longer; in steady state the slope is about 0. Requests arriving
    all at once, with TTFTs that differ, have an infinite slope."""
    span = float(arrival_s.max() - arrival_s.min()) if len(arrival_s) else 0.0
    if span <= 0:
        return float("inf") if len(ttft_s) and np.ptp(ttft_s) > 0 else 0.0
    return float(np.polyfit(arrival_s, ttft_s, 1)[0])


def pace(arrival_s: np.ndarray, first_token_s: np.ndarray) -> float:
    """The span over which a window's requests got their first tokens, per second of the span
    over which they arrived: about 1 when service keeps up, more when a queue builds, and
    unbounded for a burst that arrives at once (where a fitted slope means nothing)."""
    arrived = float(arrival_s.max() - arrival_s.min()) if len(arrival_s) else 0.0
    served = float(first_token_s.max() - first_token_s.min()) if len(first_token_s) else 0.0
    if arrived <= 0:
        return float("inf") if served > 0 else 1.0
    return served / arrived


@dataclass(frozen=True)
class Percentiles:
    """The 50th, 90th and 99th percentiles of a run's times, in seconds."""

    p50: float
    p90: float
    p99: float

    def to_json(self) -> dict:
        return {"p50": self.p50, "p90": self.p90, "p99": self.p99}

    @classmethod
    def from_json(cls, data: dict) -> "Percentiles":
        return cls(data["p50"], data["p90"], data["p99"])


@dataclass(frozen=True)
class UserSpeeds:
    """Output tokens/s per user (``user_speeds``): at the median TPOT, at the p90 TPOT, and
    the mean over users."""

    p50: float
    p90: float
    mean: float

    def to_json(self) -> dict:
        return {"p50": self.p50, "p90": self.p90, "mean": self.mean}

    @classmethod
    def from_json(cls, data: dict) -> "UserSpeeds":
        return cls(data["p50"], data["p90"], data["mean"])


QUANTILES = (50, 90, 99)  # the percentiles reported, as ``Percentiles`` holds them


def percentiles(values: np.ndarray) -> Percentiles:
    """p50, p90 and p99; infinite (a refused request's times) where the rank falls on an
    infinite value (numpy would interpolate to NaN)."""
    values = np.asarray(values, dtype=float)
    ranked = np.sort(values) if np.isinf(values).any() else None
    # The three at once: one partition of the values, each interpolated as alone (one whose
    # rank falls on an infinite value interpolates to NaN, and is replaced below).
    with np.errstate(invalid="ignore"):
        interpolated = np.percentile(values, QUANTILES)
    out = []
    for q, value in zip(QUANTILES, interpolated):
        if ranked is not None and np.isinf(ranked[int(np.ceil((len(values) - 1) * q / 100))]):
            out.append(float("inf"))
        else:
            out.append(float(value))
    return Percentiles(*out)


def user_speeds(tpot_s: np.ndarray, tokens: np.ndarray) -> UserSpeeds:
    """Output tokens/s per user (1 / TPOT) of the requests with more than one output token (a
    refused request's is 0): at the median TPOT (``p50``), at the p90 TPOT (``p90``: the speed
    at least 90% of users reach, so that a p90 TPOT target of 1/S reads as a p90 speed of S),
    and the mean over users, against which vendors quote their speeds."""
    tpot = tpot_s[tokens > 1]
    if not len(tpot):
        return UserSpeeds(0.0, 0.0, 0.0)
    q = percentiles(tpot)
    with np.errstate(divide="ignore"):
        speed = 1.0 / tpot
    return UserSpeeds(1.0 / q.p50 if q.p50 > 0 else float("inf"),
                      1.0 / q.p90 if q.p90 > 0 else float("inf"),
                      float(np.mean(speed[np.isfinite(speed)])) if np.isfinite(speed).any()
                      else 0.0)


def token_times(res: ServeResult) -> np.ndarray:
    """The cycle every output token came out at: each request's first, then each gap's (the
    gaps of one request after another, each request's in order)."""
    served = res.served() & (res.tokens > 0)
    later = np.empty(len(res.gap_cycles), dtype=np.float64)
    _later_tokens(res.gap_request, res.gap_cycles, res.first_token, later, 0.0, -1.0)
    return np.concatenate([res.first_token[served], later])


@njit(cache=True)
def _later_tokens(owner, gaps, first_token, out, begin, end) -> int:
    """Each gap's token time: its request's first token plus the request's gaps up to it,
    written to ``out`` when it has room for them (else only counted); returns how many lie in
    [begin, end]. The gaps are put in request order (stably: each request's keep their order,
    grouped in place by a counting sort), and the sums are those of one running total over
    them, less what it held before the request's first gap, so that every time is the same
    float however the requests interleaved."""
    n, requests = len(owner), len(first_token)
    at = np.zeros(requests + 1, dtype=np.int64)  # where each request's gaps begin
    for i in range(n):
        at[owner[i] + 1] += 1
    for r in range(requests):
        at[r + 1] += at[r]
    fill = at[:-1].copy()
    grouped = np.empty(n, dtype=np.float64)
    for i in range(n):  # read in order, written where the request's gaps go
        grouped[fill[owner[i]]] = gaps[i]
        fill[owner[i]] += 1
    keep = len(out) == n
    inside = 0
    total = 0.0
    for r in range(requests):
        before = total
        for k in range(at[r], at[r + 1]):
            total += grouped[k]
            t = first_token[r] + total - before
            if keep:
                out[k] = t
            if begin <= t <= end:
                inside += 1
    return inside


def window_tokens_per_s(res: ServeResult, begin: float, end: float) -> float:
    """Output tokens per second that came out between cycles ``begin`` and ``end`` (the steady
    window's first and last arrival): the rate sustained, the filling and the drain left out.
    Counted as ``token_times`` times them, without making the times."""
    if end <= begin:
        return 0.0
    first = res.first_token[res.served() & (res.tokens > 0)]
    inside = np.count_nonzero((first >= begin) & (first <= end)) + _later_tokens(
        res.gap_request, res.gap_cycles, res.first_token, np.empty(0), begin, end)
    return float(inside / ((end - begin) / res.clock_hz))


def on_target(ttft_s: np.ndarray, tpot_s: np.ndarray, window: np.ndarray, span_s: float,
              ttft_slo_s: float | None, tpot_slo_s: float | None) -> dict:
    """The metrics a run's targets decide, by their ``RunMetrics`` names: the share of the
    window's requests meeting both (``slo_attainment``) and the requests meeting both per
    second of the whole run's makespan, the drain included (``goodput_requests_per_s``); both
    None without a target (every request would count as meeting none)."""
    if ttft_slo_s is None and tpot_slo_s is None:
        return {"slo_attainment": None, "goodput_requests_per_s": None}
    ok = np.ones(len(ttft_s), dtype=bool)
    if ttft_slo_s is not None:
        ok &= ttft_s <= ttft_slo_s
    if tpot_slo_s is not None:
        ok &= tpot_s <= tpot_slo_s
    return {"slo_attainment": float(ok[window].mean()),
            "goodput_requests_per_s": float(ok.sum() / span_s) if span_s > 0 else 0.0}


# The steady window's numbers (``run_metrics(..., steady=True)``), in the order reported.
STEADY = ("window_requests", "window_s", "window_output_tokens_per_s", "ttft_by_fifth_s",
          "ttft_growth_s", "ttft_slope", "pace", "too_short")


@dataclass
class RunMetrics:
    """A serving run's metrics (``run_metrics``): latency percentiles, throughput, the share
    of requests meeting the targets; with a steady window, its numbers (None without one); for
    agent sessions, the sessions' lengths and, with a window, their pace. ``to_json()`` is
    what ``wse-emu serve --json`` prints of them (``ServeReport``)."""

    requests: int
    duration_s: float
    ttft_s: Percentiles
    tpot_s: Percentiles
    e2e_s: Percentiles
    itl_s: Percentiles  # every gap between consecutive tokens (TPOT is their mean per request)
    output_tokens_per_s: float
    requests_per_s: float
    slo_attainment: float | None  # None: the run had no targets
    goodput_requests_per_s: float | None
    user_tokens_per_s: UserSpeeds
    refused: int
    # The steady window (``steady=True``): its requests, span, output rate, TTFT trend and
    # pace, and whether the run was too short to judge.
    window_requests: int | None = None
    window_s: float | None = None
    window_output_tokens_per_s: float | None = None
    ttft_by_fifth_s: list[float] | None = None
    ttft_growth_s: float | None = None
    ttft_slope: float | None = None
    pace: float | None = None
    too_short: bool | None = None
    # Agent sessions (several calls each): their lengths, and with a window their pace.
    session_s: Percentiles | None = None
    session_pace: float | None = None

    @property
    def steady(self) -> bool:
        """Whether the run was judged over a steady window."""
        return self.window_requests is not None

    def to_json(self) -> dict:
        out = {"requests": self.requests, "duration_s": self.duration_s,
               "ttft_s": self.ttft_s.to_json(), "tpot_s": self.tpot_s.to_json(),
               "e2e_s": self.e2e_s.to_json(), "itl_s": self.itl_s.to_json(),
               "output_tokens_per_s": self.output_tokens_per_s,
               "requests_per_s": self.requests_per_s, "slo_attainment": self.slo_attainment,
               "goodput_requests_per_s": self.goodput_requests_per_s,
               "user_tokens_per_s": self.user_tokens_per_s.to_json(), "refused": self.refused}
        if self.steady:
            out.update({name: getattr(self, name) for name in STEADY})
        if self.session_s is not None:
            out["session_s"] = self.session_s.to_json()
        if self.session_pace is not None:
            out["session_pace"] = self.session_pace
        return out

    @classmethod
    def from_json(cls, data: dict) -> "RunMetrics":
        """The metrics of a report read back (a run directory's metrics.json: ``to_json``'s
        keys; others beside them are ignored)."""
        times = {name: Percentiles.from_json(data[name])
                 for name in ("ttft_s", "tpot_s", "e2e_s", "itl_s")}
        return cls(data["requests"], data["duration_s"], **times,
                   output_tokens_per_s=data["output_tokens_per_s"],
                   requests_per_s=data["requests_per_s"],
                   slo_attainment=data["slo_attainment"],
                   goodput_requests_per_s=data["goodput_requests_per_s"],
                   user_tokens_per_s=UserSpeeds.from_json(data["user_tokens_per_s"]),
                   refused=data["refused"], **{name: data.get(name) for name in STEADY},
                   session_s=Percentiles.from_json(data["session_s"])
                   if "session_s" in data else None, session_pace=data.get("session_pace"))

    def __repr__(self) -> str:
        return (f"RunMetrics({self.requests:,} requests over {seconds(self.duration_s)}, "
                f"{with_unit(self.output_tokens_per_s, 'tok/s')}, p90 TTFT "
                f"{_time(self.ttft_s.p90)}, p90 TPOT {_time(self.tpot_s.p90)}"
                + ("" if self.slo_attainment is None else f", {self.slo_attainment:.1%} on target")
                + (f", {self.refused:,} refused" if self.refused else "") + ")")


def _time(value: float) -> str:
    """A time as ``fmt.duration`` writes it; 'inf' for a refused request's."""
    return duration(value) if np.isfinite(value) else "inf"


REPORT_HEAD = ("configuration", "model", "cluster", "plan", "policy", "workload")


@dataclass
class ServeReport:
    """What ``wse-emu serve --json`` prints and keeps in a run directory's metrics.json: what
    was served where (the demo's runs name their configuration instead), the targets, the
    run's metrics and each region's numbers."""

    targets: dict  # ttft_s and tpot_s, each None when not given
    metrics: RunMetrics
    # Per region (``ServeResult.regions``): role, utilization, KV capacity and peak, ... as
    # the serving loops count them.
    regions: dict
    model: str | None = None
    cluster: str | None = None
    plan: str | None = None
    policy: str | None = None
    workload: str | None = None
    configuration: str | None = None
    # Pools named by their hardware: where each side's step times come from (a simulated
    # wafer, a roofline, a GPU database and its version), by side.
    step_times: dict | None = None
    # Speculative decoding, when the run used it (``speculation.speculation_report``).
    speculation: dict | None = None

    def to_json(self) -> dict:
        head = {name: getattr(self, name) for name in REPORT_HEAD
                if getattr(self, name) is not None}
        tail = {"step_times": self.step_times} if self.step_times else {}
        if self.speculation:
            tail["speculation"] = self.speculation
        return {**head, "targets": self.targets, **self.metrics.to_json(),
                "regions": self.regions, **tail}

    @classmethod
    def from_json(cls, data: dict) -> "ServeReport":
        return cls(data.get("targets") or {}, RunMetrics.from_json(data),
                   data.get("regions") or {}, **{name: data.get(name) for name in REPORT_HEAD},
                   step_times=data.get("step_times"), speculation=data.get("speculation"))

    def __repr__(self) -> str:
        what = self.configuration or f"{self.model} on {self.cluster}, {self.plan}"
        return f"ServeReport({what}, workload {self.workload}: {self.metrics!r})"


class _Window(NamedTuple):
    """The requests a run is judged on, and the sessions they belong to."""

    mask: np.ndarray  # the requests counted
    too_short: bool  # no session started after the warm-up (every call counted, none met)
    first: np.ndarray  # open-loop arrivals: plain requests and sessions' first calls
    index: np.ndarray  # each request's session, 0 to sessions - 1
    closed_loop: bool  # sessions of several calls
    start: np.ndarray | None  # per session, its first arrival and last finish (cycles)
    end: np.ndarray | None


def judged_window(res: ServeResult, reqs: Requests, steady: bool = True) -> _Window:
    """The requests ``run_metrics`` counts: with ``steady``, its steady window (for agent
    sessions, of sessions started once a session's length has passed); else every one."""
    n = len(res.finish)
    first = reqs.call == 0
    sessions, index = np.unique(reqs.session, return_inverse=True)
    closed_loop = len(sessions) < len(reqs)
    start = end = None
    if closed_loop:
        start = np.full(len(sessions), np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(start, index, res.arrival)
        end = np.zeros(len(sessions), dtype=np.int64)
        np.maximum.at(end, index, res.finish)
    warm_until = None
    if steady and closed_loop:
        # The load of a stream of sessions builds up for as long as a session lasts (until
        # the first ones end, every earlier session is still running): a steady window starts
        # only after that.
        warm_until = int(start.min() + np.median(end - start))
    window = session_window(res.arrival, reqs.session, first, warm_until, reqs.phase) \
        if steady else np.ones(n, dtype=bool)
    too_short = steady and not window.any()
    if too_short:  # no session started after the warm-up: judged on every call, and not met
        window = np.ones(n, dtype=bool)
    return _Window(window, too_short, first, index, closed_loop, start, end)


def _queue_signals(res: ServeResult, ttft: np.ndarray, kept: np.ndarray) -> dict:
    """The queue's trend, from the window's requests served (a refused one has no first
    token). With none served there is no trend to measure: None, and the run misses its
    targets on its refusals."""
    if not kept.any():
        return {"ttft_by_fifth_s": [], "ttft_growth_s": None, "ttft_slope": None, "pace": None}
    arrived = res.arrival[kept] / res.clock_hz
    trend = ttft_trend(arrived, ttft[kept])
    return {"ttft_by_fifth_s": trend, "ttft_growth_s": trend[-1] - trend[0],
            "ttft_slope": ttft_slope(arrived, ttft[kept]),
            "pace": pace(arrived, res.first_token[kept] / res.clock_hz)}


def run_metrics(res: ServeResult, reqs: Requests, ttft_slo_s: float | None,
                tpot_slo_s: float | None, steady: bool = False,
                judged: _Window | None = None) -> RunMetrics:
    """The run's metrics, the attainment and goodput against the targets given (None: not
    a target); with ``steady``, counted over the steady window (see the module).
    ``judged``: ``judged_window(res, reqs, steady)``, when the caller has it already."""
    ttft, tpot = res.ttft_s(), res.tpot_s()
    e2e = np.where(res.served(), (res.finish - res.arrival) / res.clock_hz, np.inf)
    span = (res.finish.max() - res.arrival.min()) / res.clock_hz
    if judged is None:
        judged = judged_window(res, reqs, steady)
    window, too_short, first, index, closed_loop, start, end = judged
    gaps = res.itl_s(window)
    served = res.served()
    out = {
        "requests": len(ttft),
        "duration_s": float(span),
        "ttft_s": percentiles(ttft[window]),
        "tpot_s": percentiles(tpot[window]),
        "e2e_s": percentiles(e2e[window]),
        # Every gap between consecutive tokens (TPOT is their mean per request): the stalls a
        # reader sees as the text pausing.
        "itl_s": percentiles(gaps if len(gaps) else np.zeros(1)),
        "output_tokens_per_s": float(res.tokens.sum() / span) if span > 0 else 0.0,
        "requests_per_s": float(len(ttft) / span) if span > 0 else 0.0,
        **on_target(ttft, tpot, window, span, ttft_slo_s, tpot_slo_s),
        "user_tokens_per_s": user_speeds(tpot[window], res.tokens[window]),
        "refused": int((~served).sum()),
    }
    if steady:
        opening = window & first
        arrived = res.arrival[opening] / res.clock_hz
        out.update({"window_requests": int(window.sum()),
                    "window_s": float(arrived.max() - arrived.min()),
                    "window_output_tokens_per_s": window_tokens_per_s(
                        res, float(res.arrival[opening].min()), float(res.arrival[opening].max())),
                    **_queue_signals(res, ttft, opening & served),
                    "too_short": too_short})
    if closed_loop:
        out["session_s"] = percentiles((end - start) / res.clock_hz)
        if steady and out["pace"] is not None:  # (None: no session served to pace)
            # Sessions must also finish at the pace they start: later sessions stretched by a
            # load that keeps growing spread their ends over more time.
            inside = np.zeros(len(start), dtype=bool)
            inside[index[window & first & served]] = True
            out["session_pace"] = pace(start[inside] / res.clock_hz, end[inside] / res.clock_hz)
            out["pace"] = max(out["pace"], out["session_pace"])
    return RunMetrics(**out)


def request_rows(res: ServeResult, reqs: Requests) -> list[list]:
    ttft, tpot = res.ttft_s(), res.tpot_s()
    return [[i, int(reqs.session[i]), int(reqs.call[i]), int(reqs.prompt_tokens[i]),
             int(res.tokens[i]), res.arrival[i] / res.clock_hz, ttft[i], tpot[i],
             (res.finish[i] - res.arrival[i]) / res.clock_hz, res.region[i],
             int(res.from_cache[i]), int(res.from_host[i]), int(res.to_host[i])]
            for i in range(len(ttft))]


REQUEST_COLUMNS = ["request", "session", "call", "prompt_tokens", "output_tokens", "arrival_s",
                   "ttft_s", "tpot_s", "e2e_s", "decode_region", "cached_tokens",
                   "restored_tokens", "parked_tokens"]
