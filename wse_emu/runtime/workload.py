"""Request workloads: synthetic arrivals, trace replay and agentic sessions.

A workload becomes a table of requests (numpy columns, sorted by arrival): when each arrives,
its prompt and output lengths, and for agentic sessions which session and call it is. A session
makes its calls in sequence: call i+1 arrives only after call i has finished plus a think/tool
time, so only the first call of a session has a fixed arrival; the others carry the gap.
Everything is drawn from one seeded generator: the same spec and seed give the same requests.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from wse_emu.configfile import (
    build_dataclass,
    check_version,
    load_named,
    read_text,
    require,
)
from wse_emu.errors import ConfigError

ARRIVALS = ("poisson", "gamma", "trace")
LENGTHS = ("fixed", "uniform", "lognormal", "table")
TRACE_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")


@dataclass
class LengthSpec:
    """A distribution of token counts: fixed ``value``; uniform in [low, high]; lognormal with
    ``median`` and ``sigma`` (clipped to [low, high]); or drawn from ``table`` values."""

    kind: str = "fixed"
    value: int = 128
    low: int = 1
    high: int = 131072
    median: float = 512.0
    sigma: float = 1.0
    table: list = field(default_factory=list)

    def validate(self, where: str) -> "LengthSpec":
        require(self.kind in LENGTHS, where, f"'kind' must be one of {', '.join(LENGTHS)}")
        require(self.value >= 1 and 1 <= self.low <= self.high, where,
                "lengths must be at least 1 and low <= high")
        require(self.median > 0 and self.sigma >= 0, where, "median > 0 and sigma >= 0")
        if self.kind == "table":
            require(bool(self.table) and all(isinstance(v, int) and v >= 1 for v in self.table),
                    where, "'table' must list positive integers")
        return self

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(n, self.value, dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(self.low, self.high + 1, size=n).astype(np.int64)
        if self.kind == "lognormal":
            x = rng.lognormal(np.log(self.median), self.sigma, size=n)
            return np.clip(np.rint(x), self.low, self.high).astype(np.int64)
        return rng.choice(np.asarray(self.table, dtype=np.int64), size=n)


@dataclass
class WorkloadSpec:
    name: str
    arrival: str = "poisson"  # poisson, gamma, or trace
    rate: float = 1.0  # requests (or sessions) per second
    cv: float = 1.0  # gamma arrivals: coefficient of variation of the gaps (1 = Poisson)
    requests: int = 1000  # requests, or sessions for agentic workloads
    prompt: dict = field(default_factory=dict)
    output: dict = field(default_factory=dict)
    trace: str = ""  # a CSV (arrived_at, num_prefill_tokens, num_decode_tokens)
    rate_scale: float = 1.0  # trace replay: arrivals this many times faster
    calls: int = 1  # agentic: model calls per session
    tool_tokens: dict = field(default_factory=dict)  # agentic: new tokens per later call
    think_s: float = 0.0  # agentic: think/tool time between calls
    seed: int = 0
    skip: int = 0  # trace replay: start after this many rows (another window of the trace)
    description: str = ""

    def validate(self, where: str) -> "WorkloadSpec":
        require(self.arrival in ARRIVALS, where,
                f"field 'arrival' must be one of {', '.join(ARRIVALS)}")
        require(self.rate > 0 and self.cv > 0 and self.rate_scale > 0, where,
                "'rate', 'cv' and 'rate_scale' must be positive")
        require(self.requests >= 1 and self.calls >= 1, where,
                "'requests' and 'calls' must be at least 1")
        require(self.think_s >= 0 and self.seed >= 0 and self.skip >= 0, where,
                "'think_s', 'seed' and 'skip' must be >= 0")
        require(self.arrival != "trace" or bool(self.trace), where,
                "trace arrivals need a 'trace' CSV path")
        require(self.arrival == "trace" or self.skip == 0, where,
                "'skip' applies to trace replays only (a synthetic workload draws a new seed)")
        for name in ("prompt", "output", "tool_tokens"):
            length_spec(getattr(self, name), f"{where}: field '{name}'")
        return self


def length_spec(data: dict, where: str) -> LengthSpec:
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping")
    return build_dataclass(LengthSpec, data or {}, where).validate(where)


@dataclass
class Requests:
    """One row per model call, by session then call, sessions in order of arrival;
    ``arrival_s`` is NaN for a session's later calls (they follow the call before)."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    session: np.ndarray  # session id (a plain request is a session of one call)
    call: np.ndarray  # index of the call within its session
    think_s: np.ndarray  # wait after the previous call of the session before this one

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    def digest(self) -> str:
        """A digest of every column: equal requests, equal digests."""
        h = hashlib.sha256()
        for f in dataclasses.fields(self):
            column = np.ascontiguousarray(getattr(self, f.name))
            h.update(f"{f.name}:{column.dtype}:{column.shape}".encode())
            h.update(column.tobytes())
        return h.hexdigest()

    def faster(self, factor: float) -> "Requests":
        """The same requests arriving ``factor`` times as fast (the same draws, so a rate
        search compares like with like)."""
        return Requests(self.arrival_s / factor, self.prompt_tokens, self.output_tokens,
                        self.session, self.call, self.think_s)

    def sessions(self) -> int:
        """How many sessions (plain requests) it holds: what a workload's size counts."""
        return int(np.count_nonzero(~np.isnan(self.arrival_s)))

    def offered_rate(self) -> float:
        """Sessions (plain requests) per second over the span of their arrivals."""
        first = self.arrival_s[~np.isnan(self.arrival_s)]
        span = float(first.max() - first.min()) if len(first) > 1 else 0.0
        return (len(first) - 1) / span if span > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        first = ~np.isnan(self.arrival_s)
        span = float(np.nanmax(self.arrival_s) - np.nanmin(self.arrival_s)) if first.any() else 0
        return {"requests": len(self), "sessions": self.sessions(),
                "prompt_tokens_mean": float(self.prompt_tokens.mean()),
                "output_tokens_mean": float(self.output_tokens.mean()),
                "arrival_span_s": span}


def workload_from_dict(data: dict, source: str) -> WorkloadSpec:
    check_version(data, source)
    return build_dataclass(WorkloadSpec, data, source, skip=("version",)).validate(source)


def workload_spec(workload: "str | WorkloadSpec | None" = None,
                  trace: str | Path | None = None, rate: float | None = None,
                  requests: int | None = None) -> WorkloadSpec:
    """A workload (a preset, a YAML or a WorkloadSpec, copied), or the replay of a trace CSV;
    ``rate`` overrides a preset's rate, or speeds a trace up; ``requests`` keeps the first so
    many (sessions)."""
    if trace:
        return WorkloadSpec(name=Path(trace).stem, arrival="trace", trace=str(trace),
                            requests=requests or 10**9,
                            rate_scale=rate or 1.0).validate(f"trace {trace}")
    spec = replace(workload) if isinstance(workload, WorkloadSpec) else load_workload(workload)
    if rate is not None:
        spec.rate = rate
    if requests is not None:
        spec.requests = requests
    return spec.validate(f"workload {spec.name}")


def load_workload(name_or_path: str | Path) -> WorkloadSpec:
    """A preset under ``programs/workloads/`` or a workload YAML path."""
    return load_named("workloads", "workload", name_or_path, workload_from_dict)


def load_trace(path: str | Path, rate_scale: float = 1.0) -> tuple[np.ndarray, ...]:
    """(arrival s, prompt tokens, output tokens) from a trace CSV; bad traces raise
    ConfigError naming the file, the line and the problem."""
    path = Path(path)
    text = read_text(path)
    reader = csv.reader(text.splitlines())
    header = next(reader, None)
    if header is None or [h.strip() for h in header[:3]] != list(TRACE_COLUMNS):
        raise ConfigError(f"{path}: the first line must be the columns "
                          f"{','.join(TRACE_COLUMNS)}")
    times, prompts, outputs = [], [], []
    for line, row in enumerate(reader, start=2):
        if not row or not "".join(row).strip():
            continue
        if len(row) < 3:
            raise ConfigError(f"{path}: line {line} has {len(row)} columns, expected 3")
        try:
            t, p, o = float(row[0]), int(row[1]), int(row[2])
        except ValueError:
            raise ConfigError(f"{path}: line {line}: not numbers: {','.join(row[:3])}") from None
        if not np.isfinite(t) or t < 0 or p < 1 or o < 1:
            raise ConfigError(f"{path}: line {line}: times must be >= 0 and token counts >= 1")
        if times and t < times[-1]:
            raise ConfigError(f"{path}: line {line}: arrival {t} is before the previous one "
                              f"({times[-1]}); a trace must be sorted by time")
        times.append(t)
        prompts.append(p)
        outputs.append(o)
    if not times:
        raise ConfigError(f"{path}: no requests")
    arrivals = (np.asarray(times) - times[0]) / rate_scale
    return arrivals, np.asarray(prompts, dtype=np.int64), np.asarray(outputs, dtype=np.int64)


def _gaps(spec: WorkloadSpec, rng: np.random.Generator, n: int) -> np.ndarray:
    mean = 1.0 / spec.rate
    if spec.arrival == "poisson":
        return rng.exponential(mean, size=n)
    shape = 1.0 / spec.cv ** 2  # gamma gaps with the given coefficient of variation
    return rng.gamma(shape, mean / shape, size=n)


def replicate(spec: WorkloadSpec, index: int, size: int) -> WorkloadSpec:
    """The ``index``-th independent draw of a workload: the next seed for a synthetic one, the
    next window of ``size`` requests for a trace."""
    if spec.arrival == "trace":
        return replace(spec, skip=spec.skip + index * size)
    return replace(spec, seed=spec.seed + index)


def generate(spec: WorkloadSpec, base_dir: Path | None = None) -> Requests:
    """The requests of a workload (deterministic for its seed)."""
    rng = np.random.default_rng(spec.seed)
    where = f"workload {spec.name}"
    if spec.arrival == "trace":
        trace = Path(spec.trace)
        if not trace.is_absolute() and base_dir is not None:
            trace = base_dir / trace
        arrivals, prompts, outputs = load_trace(trace, spec.rate_scale)
        if spec.skip >= len(arrivals):
            raise ConfigError(f"{trace}: {len(arrivals)} requests, none left after skipping "
                              f"{spec.skip}")
        if spec.skip:
            # Another window of the trace, its clock started at its first arrival.
            arrivals, prompts, outputs = (a[spec.skip:] for a in (arrivals, prompts, outputs))
            arrivals = arrivals - arrivals[0]
        n = min(len(arrivals), spec.requests) if spec.requests else len(arrivals)
        arrivals, prompts, outputs = arrivals[:n], prompts[:n], outputs[:n]
    else:
        n = spec.requests
        arrivals = np.cumsum(_gaps(spec, rng, n))
        arrivals -= arrivals[0]
        prompts = length_spec(spec.prompt, f"{where}: prompt").draw(rng, n)
        outputs = length_spec(spec.output, f"{where}: output").draw(rng, n)
    calls = spec.calls
    if calls == 1:
        zeros = np.zeros(n, dtype=np.int64)
        return Requests(arrivals.astype(float), prompts, outputs, np.arange(n), zeros,
                        np.zeros(n))
    # Agentic sessions: call i's prompt is the whole context so far (the previous prompt, its
    # output and the new tool output).
    tools = length_spec(spec.tool_tokens or {"kind": "fixed", "value": 256},
                        f"{where}: tool_tokens").draw(rng, n * (calls - 1)).reshape(n, calls - 1)
    out_later = length_spec(spec.output, f"{where}: output").draw(
        rng, n * (calls - 1)).reshape(n, calls - 1)
    prompt = np.zeros((n, calls), dtype=np.int64)
    output = np.zeros((n, calls), dtype=np.int64)
    prompt[:, 0], output[:, 0] = prompts, outputs
    for c in range(1, calls):
        prompt[:, c] = prompt[:, c - 1] + output[:, c - 1] + tools[:, c - 1]
        output[:, c] = out_later[:, c - 1]
    arrival = np.full((n, calls), np.nan)
    arrival[:, 0] = arrivals
    think = np.full((n, calls), spec.think_s)
    think[:, 0] = 0.0
    session = np.repeat(np.arange(n), calls)
    call = np.tile(np.arange(calls), n)
    return Requests(arrival.ravel(), prompt.ravel(), output.ravel(), session, call,
                    think.ravel())
