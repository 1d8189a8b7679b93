"""Sweeps: a base configuration and axes; every combination of the axes' values is a point.

Each point is keyed by a hash of its resolved configuration, and its result is appended to
``results.jsonl`` in the sweep's directory, one line per point, as soon as it finishes (flushed
and synced), so that a sweep stopped at any moment (a crash, Ctrl-C, a killed job) resumes
where it stopped: points already there are skipped, and a line cut short by the stop is dropped.
A point that fails keeps its row, with the error, and the others go on.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from wse_emu.errors import ConfigError, UserError
from wse_emu.util.atomic import LineAppender, cannot_write, write_text
from wse_emu.util.configfile import find_named, preset_dir, read_yaml_mapping, regular_file, shown

POINTS = ("run", "serve")  # what a point measures: one simulated step, or a serving run
# What a sweep may show and draw (``metric``), by kind of point, with its label; the first is
# the default.
METRICS = {
    "run": {"tokens_per_s_pipelined": "tokens/s of one region, pipeline full",
            "tokens_per_s_cluster": "tokens/s of the cluster, every replica's pipeline full",
            "tokens_per_s_alone": "tokens/s of one micro-batch alone",
            "step_seconds": "seconds per step",
            "compute_utilization": "compute utilization",
            "expert_pe_utilization": "share of the step the expert PEs compute"},
    "serve": {"goodput_requests_per_s": "requests meeting both targets per second",
              "output_tokens_per_s": "output tokens/s",
              "slo_attainment": "share of requests meeting both targets"},
}
RESULTS = "results.jsonl"
MAX_POINTS = 10_000  # a sweep of more points is refused unless its --max-points allows them
# Settings that name a file (or a preset's): a point is keyed by what the file holds.
FILE_SETTINGS = {"model": "models", "fabric": "fabrics", "workload": "workloads"}


def headline(point: str, metric: str = "") -> tuple[str, str]:
    """(result key, label) of what a sweep of ``point``s shows: ``metric``, or the default."""
    key = metric or next(iter(METRICS[point]))
    return key, METRICS[point][key]


SPEC = "sweep.json"  # the sweep as resolved, to tell a resumed sweep from another one


@dataclass
class SweepSpec:
    name: str
    point: str  # one of POINTS
    base: dict = field(default_factory=dict)
    axes: dict = field(default_factory=dict)  # name -> values, in the order they vary
    metric: str = ""  # the number shown and drawn (one of METRICS[point]; "" for the default)

    def headline(self) -> tuple[str, str]:
        """(result key, label) of the number a row shows and a figure draws."""
        return headline(self.point, self.metric)

    def size(self) -> int:
        """How many points: the product of the axes' lengths."""
        return math.prod(len(values) for values in self.axes.values())

    def points(self) -> list[dict]:
        """Every combination of the axes' values over the base, the last axis fastest."""
        names = list(self.axes)
        return [{**self.base, **dict(zip(names, values))}
                for values in itertools.product(*(self.axes[n] for n in names))]

    def to_json(self) -> dict:
        out = {"name": self.name, "point": self.point, "base": self.base, "axes": self.axes}
        return {**out, "metric": self.metric} if self.metric else out

    @classmethod
    def from_json(cls, data: dict) -> "SweepSpec":
        """A sweep as ``to_json`` wrote it (a sweep directory's sweep.json)."""
        if data.get("point") not in POINTS or not isinstance(data.get("axes"), dict):
            raise ValueError("not a sweep wse-emu wrote (its point or its axes)")
        return cls(str(data["name"]), data["point"], data.get("base") or {}, data["axes"],
                   data.get("metric") or "")


@dataclass
class SweepRow:
    """One point's row of results.jsonl: its key, kind and configuration, and either its
    result (the numbers its command prints, by name: ``METRICS`` names the ones a sweep shows)
    or the error it failed with."""

    key: str
    point: str
    config: dict
    result: dict | None = None
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    def to_json(self) -> dict:
        out = {"key": self.key, "point": self.point, "config": self.config}
        if self.result is not None:
            out["result"] = self.result
        if self.error is not None:
            out["error"] = self.error
        return out

    @classmethod
    def from_json(cls, data: dict) -> "SweepRow":
        return cls(data["key"], str(data.get("point", "")), data.get("config") or {},
                   data.get("result"), data.get("error"))


def load_sweep(path: Path | str) -> SweepSpec:
    """A sweep YAML (a path, or a shipped sweep's name: ``sram_clock_decode``): ``version:
    1``, ``name``, ``point`` (run or serve), ``base`` (a mapping), ``axes`` (a mapping of names
    to non-empty lists) and, optionally, ``metric`` (what to show: one of
    ``METRICS[point]``)."""
    path, where = find_named("sweeps", "sweep", path)
    data = read_yaml_mapping(path)
    unknown = sorted(set(data) - {"version", "name", "point", "base", "axes", "metric"})
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(map(shown, unknown[:3]))}")
    if data.get("version") != 1:
        raise ConfigError(f"{where}: 'version' must be 1")
    point = data.get("point")
    if point not in POINTS:
        raise ConfigError(f"{where}: 'point' must be one of {', '.join(POINTS)}, got {point!r}")
    base, axes = data.get("base") or {}, data.get("axes")
    if not isinstance(base, dict):
        raise ConfigError(f"{where}: 'base' must be a mapping")
    if not isinstance(axes, dict) or not axes:
        raise ConfigError(f"{where}: 'axes' must map one or more names to lists of values")
    for name, values in axes.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}: axis {name!r} must be a non-empty list")
    metric = data.get("metric") or ""
    if metric and metric not in METRICS[point]:
        raise ConfigError(f"{where}: 'metric' of a {point} point must be one of "
                          f"{', '.join(METRICS[point])}, got {metric!r}")
    return SweepSpec(str(data.get("name") or Path(path).stem), point, base, axes, metric)


def point_key(point: str, config: dict) -> str:
    """The hash a point's row is known by: of its kind and its resolved configuration, a
    model, fabric or workload file by what it holds (a file edited since is another point; the
    same file under another path is the same point)."""
    resolved = {k: _content(FILE_SETTINGS[k], v) if k in FILE_SETTINGS else v
                for k, v in config.items()}
    text = json.dumps({"point": point, "config": resolved}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _content(kind: str, value):
    """``value`` as a point's key sees it: a file's (or a preset's) contents' digest."""
    if not isinstance(value, str):
        return value
    for path in (Path(value), preset_dir(kind) / f"{value}.yaml"):
        try:
            if path.is_file():
                return {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        except OSError:
            continue
    return value


def check_size(spec: SweepSpec, max_points: int | None) -> None:
    """Refuse a sweep of more points than ``max_points`` (by default ``MAX_POINTS``)."""
    limit = MAX_POINTS if max_points is None else max_points
    if spec.size() > limit:
        sizes = " x ".join(str(len(v)) for v in spec.axes.values())
        raise UserError(f"sweep {spec.name} has {spec.size():,} points ({sizes}), more than "
                        f"{limit:,}: give `max_points` to allow them")


def claim_directory(spec: SweepSpec, directory: Path) -> None:
    """Create the sweep's directory (or find it there, holding this sweep's results), before
    any point runs."""
    marker = directory / SPEC
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if marker.exists():
            if json.loads(regular_file(marker).read_text()) != spec.to_json():
                raise UserError(f"{directory} holds another sweep's results: choose another -o")
        else:
            write_text(marker, json.dumps(spec.to_json(), indent=1))
    except OSError as exc:
        raise UserError(f"cannot use {directory} for the sweep's results: "
                        f"{exc.strerror or exc}") from None
    except ValueError:
        raise UserError(f"{marker} is damaged: choose another -o") from None


def read_rows(directory: Path) -> list[SweepRow]:
    """The rows written so far (a last line cut short by a stop, or one that is not a row,
    is left out)."""
    path = directory / RESULTS
    if not path.exists():
        return []
    rows = []
    for line in regular_file(path).read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("key"), str):
            rows.append(SweepRow.from_json(row))
    return rows


def _open_results(directory: Path) -> LineAppender:
    """The results file for appending whole lines, without the partial line a stop may have
    left."""
    path = directory / RESULTS
    try:
        if path.exists():
            data = path.read_bytes()
            end = data.rfind(b"\n") + 1
            if end < len(data):
                with open(path, "r+b") as fh:
                    fh.truncate(end)
    except OSError as exc:
        raise cannot_write(path, exc) from None
    return LineAppender(path)


def run_sweep(spec: SweepSpec, directory: Path, pool, evaluate, progress=None,
              max_points: int | None = None) -> list[SweepRow]:
    """Run the points of ``spec`` not yet in ``directory`` on ``pool`` (``pool.imap``):
    ``evaluate(point, config)`` returns a point's result (its numbers by name) or raises.
    Returns every row, in the order of the sweep's points. A point whose row holds an error is
    run again. (The settings are ``evaluate``'s to check: ``wse_emu.api.sweep`` checks them
    before this.)"""
    check_size(spec, max_points)
    claim_directory(spec, directory)
    configs = spec.points()
    keys = [point_key(spec.point, c) for c in configs]
    done = {row.key for row in read_rows(directory) if not row.failed}
    pending = [(spec.point, c) for k, c in zip(keys, configs) if k not in done]
    total, finished = len(configs), len(configs) - len(pending)
    with _open_results(directory) as out:
        for row in pool.imap(evaluate_row, [(evaluate, p, c) for p, c in pending]):
            out.write_line(json.dumps(row.to_json()))  # synced, whole or cut back
            finished += 1
            if progress:
                progress(finished, total)
    by_key = {row.key: row for row in read_rows(directory)}
    return [by_key[k] for k in keys if k in by_key]


def evaluate_row(evaluate, point: str, config: dict) -> SweepRow:
    """One point's row: its key, configuration and result, or the error it failed with."""
    row = SweepRow(point_key(point, config), point, config)
    try:
        row.result = evaluate(point, config)
    except Exception as exc:  # noqa: BLE001 - one point's failure must not stop the others
        kind = "" if isinstance(exc, UserError) else f"{type(exc).__name__}: "
        row.error = kind + " ".join(str(exc).split())
    return row
