"""What a run directory holds, read once: the program, the simulator's counters, the results.

A serving run's metrics.json, an experiment's experiment.json and a sweep's sweep.json and
rows are read back as the typed results that wrote them (``from_json``). A simulated step's
results.json stays as written: it summarizes the run (its kernels' spans as durations, its
per-PE counters in counters.npz apart), so it does not make a ``RegionRun`` again; the
compile summary and inspect.json, which no result type writes, stay as written too.

Every number of every JSON file read (and of every sweep row) is checked first
(``check_numbers``): a count, rate, latency or throughput that no run can have (negative, NaN,
infinite where infinity means nothing, a share over 100%) is refused by file and field, so an
edited or damaged file is never drawn as a result."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from wse_emu.errors import UserError
from wse_emu.experiments.comparison import ExperimentReport, VaryReport
from wse_emu.experiments.drift import DriftReport
from wse_emu.experiments.frontier import FrontierReport, report_from_json
from wse_emu.program.format import WaferProgram
from wse_emu.serving.metrics import ServeReport
from wse_emu.sweeps.sweep import RESULTS as SWEEP_RESULTS
from wse_emu.sweeps.sweep import SPEC as SWEEP_SPEC
from wse_emu.sweeps.sweep import SweepRow, SweepSpec, read_rows
from wse_emu.util.configfile import regular_file


@dataclass
class RunDir:
    path: Path
    program: WaferProgram | None = None
    counters: dict = field(default_factory=dict)  # name -> array (systems, height, width[, 4])
    results: dict = field(default_factory=dict)  # results.json of `run`
    metrics: ServeReport | None = None  # metrics.json of `serve`
    summary: dict = field(default_factory=dict)  # summary.json of `compile`
    # experiment.json of `experiment disagg` (with --vary, a VaryReport), `frontier` or `drift`
    experiment: ExperimentReport | VaryReport | FrontierReport | DriftReport | None = None
    sweep: SweepSpec | None = None  # sweep.json of `sweep`
    sweep_rows: list[SweepRow] = field(default_factory=list)  # its results.jsonl
    inspect: dict = field(default_factory=dict)  # inspect.json of `inspect`

    @property
    def kind(self) -> str:
        if self.inspect:
            return "inspect"
        if self.sweep is not None:
            return "sweep"
        if self.experiment is not None:
            return "experiment"
        if self.metrics is not None:
            return "serve"
        if self.results:
            return "run"
        return "compile"


def load_run(path: str | Path) -> RunDir:
    """Read a run directory written by ``inspect``, ``compile``, ``run``, ``serve``,
    ``experiment`` or ``sweep`` with ``-o``."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path}: not a run directory")
    run = RunDir(path)
    if (path / "program.json").exists():
        run.program = WaferProgram.load(path)
    if (path / "counters.npz").exists():
        regular_file(path / "counters.npz")
        try:
            with np.load(path / "counters.npz") as z:
                run.counters = {k: z[k] for k in z.files}
        except (OSError, ValueError) as exc:
            raise UserError(f"{path / 'counters.npz'}: unreadable ({exc})") from None
    for name, parse in (("results", None), ("metrics", ServeReport.from_json),
                        ("summary", None), ("experiment", _experiment),
                        ("inspect", None)):
        file = path / f"{name}.json"
        if file.exists():
            setattr(run, name, _read(file, parse))
    if (path / SWEEP_SPEC).exists():
        run.sweep = _read(path / SWEEP_SPEC, SweepSpec.from_json)
        run.sweep_rows = read_rows(path)
        for row in run.sweep_rows:
            check_numbers(row.to_json(), f"{path / SWEEP_RESULTS}: the row of point {row.key}")
    if (run.program is None and run.metrics is None and run.experiment is None
            and run.sweep is None and not run.inspect):
        raise UserError(f"{path}: nothing to draw (no program.json, metrics.json, "
                        "experiment.json, sweep.json or inspect.json): write one with 'wse-emu "
                        "compile -o', 'run -o', 'serve -o', 'experiment disagg -o', 'sweep -o' "
                        "or 'inspect -o'")
    return run


def _read(file: Path, parse=None):
    """A JSON file of the run directory, as ``parse`` reads it (or as written); one clear
    error for a file that is not JSON or not what wse-emu writes there."""
    regular_file(file)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{file}: not valid JSON ({exc})") from None
    check_numbers(data, file)
    if parse is None:
        return data
    try:
        return parse(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        what = f"no {exc}" if isinstance(exc, KeyError) else " ".join(str(exc).split())
        raise UserError(f"{file}: not what wse-emu writes there ({what[:120]})") from None


# The numbers a run writes that may fall as well as rise: a trend of TTFT over the run, and
# the low end of an interval over draws (its mean less its half width).
SIGNED = frozenset({"ttft_slope", "ttft_growth_s", "low"})
# Where a run writes infinity, meaning "never" or "unbounded": a latency percentile that falls
# on a refused request, the TTFT slope and pace of requests arriving at once, the speed of a
# user whose tokens came with no gap. Anywhere else an infinite number is impossible.
UNBOUNDED = re.compile(r"(ttft|tpot|itl|e2e)(_p\d\d)?_s(\.p\d\d)?|ttft_slope|pace"
                       r"|user_tokens_per_s\.p\d\d")
# Shares, at most 1 (100%).
FRACTION = re.compile(r"(.*_)?(attainment|utilization)|.*_share")
# Inputs written beside the results, checked by their own readers when drawn (a model's or a
# fabric's fields): only NaN and infinity are looked for in them.
INPUTS = frozenset({"model_spec", "fabric_spec"})
SLACK = 1e-9  # rounding: a stall summed to -5e-17 s is none, a share of 1 + 2e-16 is 1
STATS = frozenset({"p50", "p90", "p99", "mean"})  # named with what they summarize


def check_numbers(data, source) -> None:
    """Refuse, naming ``source`` (the file) and the field, a number in ``data`` (JSON as read)
    that no run writes: NaN, minus infinity, plus infinity outside ``UNBOUNDED``, a negative
    one outside ``SIGNED`` (counts, rates, latencies, throughputs, bytes, cycles), or a share
    (``FRACTION``) over 100%."""
    stack = [(data, "", "", False)]
    while stack:
        value, path, name, free = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                key = str(key)
                field = f"{name}.{key}" if key in STATS and name else key
                stack.append((item, f"{path}.{key}" if path else key, field,
                              free or key in INPUTS))
            continue
        if isinstance(value, list):
            stack += [(item, f"{path}[{i}]", name, free) for i, item in enumerate(value)]
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        problem = _impossible(value, name, free)
        if problem:
            raise UserError(f"{source}: {path or 'the value'} is {problem}, which no run "
                            "writes (the file was edited or damaged): write it again")


def _impossible(value, name: str, free: bool) -> str | None:
    """What is wrong with ``value`` as the field ``name`` (None if nothing)."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if value == -math.inf or (value == math.inf and not UNBOUNDED.fullmatch(name)):
        return "infinite"
    if free:
        return None
    if value < -SLACK and name not in SIGNED:
        return f"negative ({value:g})"
    if value > 1 + SLACK and FRACTION.fullmatch(name):
        return f"{value:.0%}, over 100%"
    return None


def _experiment(data: dict):
    """Any experiment.json read back as its report: a drift experiment's (it names the
    workload both plans were tuned on), else as ``frontier.report_from_json`` reads it."""
    if isinstance(data, dict) and "tuned_on" in data:
        return DriftReport.from_json(data)
    return report_from_json(data)
