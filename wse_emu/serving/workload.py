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
import math
from array import array
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from wse_emu.errors import ConfigError
from wse_emu.serving import blocktrace, phases
from wse_emu.serving.blocktrace import PrefixBlocks
from wse_emu.util.configfile import (
    build_dataclass,
    check_version,
    find_named,
    is_preset_name,
    preset_names,
    read_yaml_mapping,
    regular_file,
    require,
)

ARRIVALS = ("poisson", "gamma", "trace", "phases")
LENGTHS = ("fixed", "uniform", "lognormal", "table")
TRACE_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
_MOST_TOKENS = int(np.iinfo(np.int64).max)  # a token count the arrays can hold
# The most model calls (requests, or sessions x calls) one workload holds, and so the most rows
# of a trace one replay reads. Serving tiny on mesh16 (prompts ~300, outputs ~60 tokens) peaked
# at 203 MB of resident memory for 10,000 requests, 434 MB for 100,000 and 2.75 GB for
# 1,000,000 (3.0 GB writing its run directory): about 2.6 KB a request over a 180 MB base, so
# this many keeps a run within a few GB (a billion would take 8 GB for each of the request
# table's six columns before any serving began).
MAX_REQUESTS = 1_000_000
# The most independent draws of a workload an experiment repeats its whole search on: each
# is one more full search (hours for a real model), and the 95% interval over draws narrows
# little past a few tens of them, while a typo of 10**6 would hold a million draws at once.
MAX_DRAWS = 100
# The longest line a trace may have: a row is three numbers (and any columns beside them); a
# file of one endless line (no newline) must not be read whole to find its first row.
MAX_TRACE_LINE = 65536
TRACES = "traces"  # the shipped traces' folder under programs/, each named by its file's stem


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
    # trace replay of a JSON-lines trace: tokens per prefix block its hash_ids name
    block_tokens: int = blocktrace.BLOCK_TOKENS
    # arrival "phases": synthetic workloads (presets or YAML paths) served one after another,
    # the first at this spec's ``rate`` and ``requests``, each later one matched to it in
    # time and in output tokens offered per second (``phases.join``)
    phases: list = field(default_factory=list)
    description: str = ""

    def validate(self, where: str) -> "WorkloadSpec":
        require(self.arrival in ARRIVALS, where,
                f"field 'arrival' must be one of {', '.join(ARRIVALS)}")
        require(self.rate > 0 and self.cv > 0 and self.rate_scale > 0, where,
                "'rate', 'cv' and 'rate_scale' must be positive")
        require(self.requests >= 1 and self.calls >= 1, where,
                "'requests' and 'calls' must be at least 1")
        require(self.requests <= MAX_REQUESTS, where,
                f"'requests' must be at most {MAX_REQUESTS:,} (the most one run holds), got "
                f"{self.requests:,}")
        require(self.requests * self.calls <= MAX_REQUESTS, where,
                f"'requests' x 'calls' must be at most {MAX_REQUESTS:,} model calls (the most "
                f"one run holds), got {self.requests:,} x {self.calls:,}")
        require(self.think_s >= 0 and self.seed >= 0 and self.skip >= 0, where,
                "'think_s', 'seed' and 'skip' must be >= 0")
        require(isinstance(self.block_tokens, int) and self.block_tokens >= 1, where,
                "'block_tokens' must be a whole number >= 1")
        require(self.arrival == "trace" or self.block_tokens == blocktrace.BLOCK_TOKENS, where,
                "'block_tokens' applies to traces with prefix blocks (JSON lines), not to a "
                "synthetic workload")
        require(self.arrival != "trace" or bool(self.trace), where,
                "trace arrivals need a 'trace': a shipped trace's name or a CSV path")
        require(self.arrival == "trace" or self.skip == 0, where,
                "'skip' applies to trace replays only (a synthetic workload draws a new seed)")
        require((self.arrival == "phases") == bool(self.phases), where,
                "'phases' (two or more workloads served one after another) goes with arrival "
                "'phases', and arrival 'phases' needs them")
        require(self.arrival != "phases" or (
            isinstance(self.phases, list) and len(self.phases) >= 2
            and all(isinstance(p, str) and p for p in self.phases)), where,
                "'phases' must list two or more workload names or YAML paths")
        require(self.arrival != "phases" or self.calls == 1, where,
                "a workload of phases takes its sessions' calls from each phase: 'calls' must "
                "be 1")
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
    # A block trace's prompts as prefix blocks (``blocktrace.PrefixBlocks``): what the prefix
    # cache may share between requests. None: a request shares only its session's context.
    blocks: PrefixBlocks | None = None
    # A workload of phases' phase of each call (``phases.join``): each phase is judged on its
    # own steady window (``metrics.session_window``). None: one workload throughout.
    phase: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    def digest(self) -> str:
        """A digest of every column: equal requests, equal digests."""
        h = hashlib.sha256()
        columns = [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)
                   if f.name not in ("blocks", "phase")]
        if self.phase is not None:
            columns.append(("phase", self.phase))
        if self.blocks is not None:
            columns += [("block_ids", self.blocks.ids), ("block_at", self.blocks.at),
                        ("block_tokens", np.int64(self.blocks.tokens))]
        for name, value in columns:
            column = np.ascontiguousarray(value)
            h.update(f"{name}:{column.dtype}:{column.shape}".encode())
            h.update(column.tobytes())
        return h.hexdigest()

    def faster(self, factor: float) -> "Requests":
        """The same requests arriving ``factor`` times as fast (the same draws, so a rate
        search compares like with like)."""
        return Requests(self.arrival_s / factor, self.prompt_tokens, self.output_tokens,
                        self.session, self.call, self.think_s, self.blocks, self.phase)

    def subset(self, keep: np.ndarray) -> "Requests":
        """The requests ``keep`` (a boolean mask) marks, in order."""
        return Requests(self.arrival_s[keep], self.prompt_tokens[keep], self.output_tokens[keep],
                        self.session[keep], self.call[keep], self.think_s[keep],
                        None if self.blocks is None else self.blocks.subset(keep),
                        None if self.phase is None else self.phase[keep])

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
    """A workload (a preset, a YAML or a WorkloadSpec, copied), or the replay of a trace (a
    shipped trace's name or a CSV path); ``rate`` overrides a preset's rate, or speeds a trace
    up; ``requests`` keeps the first so many (sessions). A whole trace (no ``requests``) is
    read here, so that a bad or too long one is refused before any work."""
    if isinstance(requests, int) and requests > MAX_REQUESTS:
        raise ConfigError(f"`requests` must be at most {MAX_REQUESTS:,} (the most one run "
                          f"holds), got {requests:,}")
    if trace:
        if requests is None:  # the whole trace: every row read now, to count them
            requests = len(read_trace(trace_path(trace))[0])
        spec = WorkloadSpec(name=Path(str(trace)).stem, arrival="trace", trace=str(trace),
                            requests=requests, rate_scale=rate or 1.0).validate(f"trace {trace}")
    else:
        spec = replace(workload) if isinstance(workload, WorkloadSpec) \
            else load_workload(workload)
        if rate is not None:
            spec.rate = rate
        if requests is not None:
            spec.requests = requests
        spec.validate(f"workload {spec.name}")
    if spec.arrival == "phases":
        phase_specs(spec)  # every phase found and checked before any work
    if spec.arrival == "trace":
        # The file found, its header and the first row replayed checked before any work (the
        # rows a window skips are read through, not kept).
        read_trace(trace_path(spec.trace), skip=spec.skip, rows=1,
                   block_tokens=spec.block_tokens)
    return spec


def load_workload(name_or_path: str | Path) -> WorkloadSpec:
    """A preset under ``programs/workloads/`` or a workload YAML path. A trace it names by a
    relative path is found beside the YAML (wherever the command runs); by name, shipped."""
    path, source = find_named("workloads", "workload", name_or_path)
    spec = workload_from_dict(read_yaml_mapping(path), source)
    if spec.trace and not any(is_preset_name(TRACES, spec.trace, suffix)
                              for suffix in (".csv", blocktrace.SUFFIX)):
        spec.trace = str(path.parent / spec.trace)  # an absolute trace path stays as it is
    # A phase named by a relative path is found beside the YAML, as a trace is.
    spec.phases = [str(path.parent / p) if (path.parent / p).is_file() else p
                   for p in spec.phases]
    return spec


def trace_names() -> list[str]:
    """The shipped traces' names (``programs/traces/*.csv`` and ``*.jsonl``)."""
    return sorted(preset_names(TRACES, ".csv") + preset_names(TRACES, blocktrace.SUFFIX))


def trace_path(name_or_path: str | Path, base: Path | None = None) -> Path:
    """The trace a name or path names: a shipped trace (``azure-conv``, a CSV;
    ``mooncake-conv``, JSON lines) or a path of either kind, relative to ``base`` when given;
    an unknown name lists the shipped traces."""
    text = str(name_or_path)
    if is_preset_name(TRACES, text, blocktrace.SUFFIX):
        return find_named(TRACES, "trace", text, blocktrace.SUFFIX)[0]
    if Path(text).suffix == blocktrace.SUFFIX:
        return Path(text) if base is None else Path(base) / text
    try:
        return find_named(TRACES, "trace", name_or_path, ".csv", base)[0]
    except ConfigError:
        raise ConfigError(f"unknown trace '{text}': choose one of {', '.join(trace_names())} "
                          "or give a CSV or JSON-lines path") from None


def load_trace(path: str | Path, rate_scale: float = 1.0) -> tuple[np.ndarray, ...]:
    """(arrival s, prompt tokens, output tokens) of every row of a trace CSV (a path, or a
    shipped trace's name); bad traces raise ConfigError naming the file, the line and the
    problem, and a trace of more than MAX_REQUESTS rows is refused."""
    return read_trace(trace_path(path), rate_scale=rate_scale)[:3]


# The rows of traces read in this process, by the file as it was (path, inode, size,
# modification time) and the rows skipped: a command reads its trace more than once (to count
# it, to check it, to replay it); a read that went as far as another asks, or to the end,
# answers it with the rows that read would have kept.
_READ: dict[tuple, "_Rows"] = {}
_READ_KEPT = 8


@dataclass(frozen=True)
class _Rows:
    """What one read of a trace kept: the rows after ``skip`` (at most ``wanted``), the
    trace's first arrival, and the data rows read (skipped ones included)."""

    times: np.ndarray
    prompts: np.ndarray
    outputs: np.ndarray
    first: float | None
    seen: int
    wanted: int
    blocks: list | None = None  # a block trace's kept rows' hash ids
    def answers(self, wanted: int) -> bool:
        """Whether a read keeping at most ``wanted`` rows would keep the first of these: it
        asks for no more than this one did, or this one ran out of rows before."""
        return wanted <= self.wanted or len(self.times) < self.wanted


def read_trace(path: Path, rate_scale: float = 1.0, skip: int = 0, rows: int | None = None,
               block_tokens: int = blocktrace.BLOCK_TOKENS) -> tuple:
    """(arrival s, prompt tokens, output tokens, prefix blocks) of rows ``skip`` to ``skip +
    rows`` of a trace (every row after ``skip`` when ``rows`` is None, at most MAX_REQUESTS of
    them), its clock started at the first row kept: a CSV, its prefix blocks None, or JSON
    lines (``blocktrace``), its blocks of ``block_tokens`` tokens. The file is read row by row
    and no further than the last row wanted: a long trace costs what is kept of it. Every row
    read is checked (header, numbers, times in order), with its line."""
    path = regular_file(path)
    wanted = MAX_REQUESTS + 1 if rows is None else rows  # one more: to see there are more
    try:
        st = path.stat()
        key = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns, skip, block_tokens)
    except OSError:
        key = None  # read it, and let the read say what is wrong
    kept = _READ.get(key)
    if kept is None or not kept.answers(wanted):
        kept = _read_rows(path, skip, wanted, block_tokens)
        if key is not None:
            if len(_READ) >= _READ_KEPT:
                _READ.clear()
            _READ[key] = kept
    times = kept.times[:wanted]
    if rows is None and len(times) > MAX_REQUESTS:
        after = f" after skipping {skip:,}" if skip else ""
        raise ConfigError(f"{path}: more than {MAX_REQUESTS:,} rows to replay{after}, the most "
                          "one run holds: replay its first rows with `requests`")
    if not kept.seen:
        raise ConfigError(f"{path}: no requests")
    if not len(times):
        raise ConfigError(f"{path}: {kept.seen} requests, none left after skipping {skip}")
    # As the whole trace's clock, then the window's: the same floats a window always had.
    arrivals = (times - kept.first) / rate_scale
    if skip:
        arrivals = arrivals - arrivals[0]
    blocks = None if kept.blocks is None else \
        blocktrace.numbered(kept.blocks[:wanted], block_tokens)
    return (arrivals, kept.prompts[:wanted].copy(), kept.outputs[:wanted].copy(), blocks)


def _read_rows(path: Path, skip: int, wanted: int, block_tokens: int) -> _Rows:
    """Read ``path`` up to its ``wanted``-th row after ``skip`` (or its end), each row
    checked."""
    if path.suffix == blocktrace.SUFFIX:
        return _read_block_rows(path, skip, wanted, block_tokens)
    try:
        # utf-8-sig: a trace saved by a spreadsheet program may begin with a byte-order mark.
        with open(path, encoding="utf-8-sig", newline="") as fh:
            lines = _bounded_lines(fh, path)
            reader = csv.reader(lines)
            header = next(reader, None)
            if header is None or [h.strip() for h in header[:3]] != list(TRACE_COLUMNS):
                raise ConfigError(f"{path}: the first line must be the columns "
                                  f"{','.join(TRACE_COLUMNS)}")
            return _window(_csv_rows(reader, path), skip, wanted, blocks=False)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        # Text is decoded ahead of the rows parsed: the bad byte is somewhere after them.
        raise ConfigError(f"{path}: not UTF-8 text (a bad byte after line "
                          f"{reader.line_num})") from None
    except csv.Error as exc:
        raise ConfigError(f"{path}: line {reader.line_num}: {exc}") from None


def _csv_rows(reader, path: Path):
    """Each data row of a trace CSV's ``reader``, checked: (arrival, prompt, output, None)."""
    last = None
    for row in reader:
        if not row or not "".join(row).strip():
            continue
        t, p, o = _trace_row(path, reader.line_num, row, last)
        last = t
        yield t, p, o, None


def _read_block_rows(path: Path, skip: int, wanted: int, block_tokens: int) -> _Rows:
    """``_read_rows`` of a JSON-lines trace (``blocktrace``)."""
    try:
        with open(path, encoding="utf-8-sig") as fh:
            rows = blocktrace.parsed_rows(enumerate(_bounded_lines(fh, path), 1), path,
                                          block_tokens)
            return _window(rows, skip, wanted, blocks=True)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None


def _window(rows, skip: int, wanted: int, blocks: bool) -> _Rows:
    """The rows after ``skip``, at most ``wanted``, of ``rows`` (checked (arrival, prompt,
    output, hash ids) tuples), asking for no row past the last wanted; with ``blocks``,
    their hash ids kept too."""
    times, prompts, outputs = array("d"), array("q"), array("q")
    kept: list = []
    first = None  # the trace's first arrival
    seen = 0  # data rows read, skipped ones included
    while len(times) < wanted:
        row = next(rows, None)
        if row is None:
            break
        t, p, o, ids = row
        first = t if first is None else first
        seen += 1
        if seen > skip:
            times.append(t)
            prompts.append(p)
            outputs.append(o)
            kept.append(ids)
    return _Rows(np.frombuffer(times, dtype=np.float64).copy(),
                 np.frombuffer(prompts, dtype=np.int64).copy(),
                 np.frombuffer(outputs, dtype=np.int64).copy(), first, seen, wanted,
                 kept if blocks else None)


def _bounded_lines(fh, path: Path):
    """The lines of ``fh``, each refused past MAX_TRACE_LINE characters before it is held."""
    number = 0
    while True:
        line = fh.readline(MAX_TRACE_LINE + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_TRACE_LINE:
            raise ConfigError(f"{path}: line {number} is longer than {MAX_TRACE_LINE:,} "
                              "characters; a trace row is a few numbers")
        yield line


def _trace_row(path: Path, line: int, row: list, last: float | None) -> tuple:
    """(arrival, prompt, output) of one row, checked: numbers, in range, in time order."""
    if len(row) < 3:
        raise ConfigError(f"{path}: line {line} has {len(row)} columns, expected 3")
    try:
        t, p, o = float(row[0]), int(row[1]), int(row[2])
    except ValueError:
        raise ConfigError(f"{path}: line {line}: not numbers: {','.join(row[:3])}") from None
    # Python's own checks: this runs once a row, where numpy's cost a microsecond each.
    if not math.isfinite(t) or t < 0 or p < 1 or o < 1:
        raise ConfigError(f"{path}: line {line}: times must be >= 0 and token counts >= 1")
    if max(p, o) > _MOST_TOKENS:
        raise ConfigError(f"{path}: line {line}: a token count beyond any model's")
    if last is not None and t < last:
        raise ConfigError(f"{path}: line {line}: arrival {t} is before the previous one "
                          f"({last}); a trace must be sorted by time")
    return t, p, o


def phase_specs(spec: WorkloadSpec) -> list[WorkloadSpec]:
    """The phases of a workload of arrival ``phases``, as its draw takes them: the first at the
    spec's ``rate`` and ``requests``, each at its own seed plus the spec's (so that draw i of
    the mixture draws each phase as draw i of it alone would). A phase is a synthetic
    workload: a trace, or phases within phases, are refused by name."""
    out = []
    for k, name in enumerate(spec.phases):
        phase = load_workload(name)
        require(phase.arrival in ("poisson", "gamma"), f"workload {spec.name}",
                f"phase '{name}' has arrival '{phase.arrival}': a phase must be a synthetic "
                "workload (poisson or gamma arrivals)")
        phase = replace(phase, seed=phase.seed + spec.seed)
        out.append(replace(phase, rate=spec.rate, requests=spec.requests) if k == 0 else phase)
    return out


def _phased(spec: WorkloadSpec) -> Requests:
    """The phases' requests one after another (``phases.join``), each later phase the
    sessions that match the first in output tokens and time (``phases.matched``), drawn
    larger until it holds them."""
    first, *later = phase_specs(spec)
    parts = [generate(first)]
    for phase in later:
        part, size = None, phase.requests
        while part is None:
            require(size * phase.calls <= MAX_REQUESTS, f"workload {spec.name}",
                    f"phase '{phase.name}' needs more than {MAX_REQUESTS:,} model calls to "
                    f"offer as many output tokens as the first phase")
            part = phases.matched(parts[0], generate(replace(phase, requests=size)))
            size *= 2
        parts.append(part)
    joined = phases.join(parts)
    require(len(joined) <= MAX_REQUESTS, f"workload {spec.name}",
            f"{len(joined):,} model calls: more than {MAX_REQUESTS:,}, the most one run holds")
    return joined


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
    """The requests of a workload (deterministic for its seed); a trace it names by a
    relative path is found under ``base_dir`` when given."""
    rng = np.random.default_rng(spec.seed)
    where = f"workload {spec.name}"
    # Checked again here, before anything is drawn: a spec need not have been validated.
    require(spec.requests * spec.calls <= MAX_REQUESTS, where,
            f"{spec.requests:,} x {spec.calls:,} calls: more than {MAX_REQUESTS:,} model calls, "
            "the most one run holds")
    if spec.arrival == "phases":
        return _phased(spec)
    if spec.arrival == "trace":
        # Rows skip to skip + requests, read no further (requests 0: every row after skip);
        # another window's clock starts at its first arrival.
        arrivals, prompts, outputs, blocks = read_trace(
            trace_path(spec.trace, base_dir), spec.rate_scale, spec.skip, spec.requests or None,
            spec.block_tokens)
        require(blocks is None or spec.calls == 1, where,
                "a trace with prefix blocks (hash_ids) replays its own requests, each sharing "
                "what its blocks say: 'calls' must be 1")
        require(blocks is not None or spec.block_tokens == blocktrace.BLOCK_TOKENS, where,
                "'block_tokens' applies to traces with prefix blocks (JSON lines); this one "
                "has none")
        n = len(arrivals)
        require(n * spec.calls <= MAX_REQUESTS, where,
                f"{n:,} x {spec.calls:,} calls: more than {MAX_REQUESTS:,} model calls, the "
                "most one run holds")
    else:
        n, blocks = spec.requests, None
        arrivals = np.cumsum(_gaps(spec, rng, n))
        arrivals -= arrivals[0]
        prompts = length_spec(spec.prompt, f"{where}: prompt").draw(rng, n)
        outputs = length_spec(spec.output, f"{where}: output").draw(rng, n)
    calls = spec.calls
    if calls == 1:
        zeros = np.zeros(n, dtype=np.int64)
        return Requests(arrivals.astype(float), prompts, outputs, np.arange(n), zeros,
                        np.zeros(n), blocks)
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
