"""What a run directory holds, read once: the program, the simulator's counters, the results.

A serving run's metrics.json, an experiment's experiment.json and a sweep's sweep.json and
rows are read back as the typed results that wrote them (``from_json``). A simulated step's
results.json stays as written: it summarizes the run (its kernels' spans as durations, its
per-PE counters in counters.npz apart), so it does not make a ``RegionRun`` again; the
compile summary and inspect.json, which no result type writes, stay as written too."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from wse_emu.errors import UserError
from wse_emu.program import WaferProgram
from wse_emu.runtime.comparison import ExperimentReport, VaryReport
from wse_emu.runtime.frontier import FrontierReport, report_from_json
from wse_emu.runtime.metrics import ServeReport
from wse_emu.runtime.sweep import SPEC as SWEEP_SPEC
from wse_emu.runtime.sweep import SweepRow, SweepSpec, read_rows


@dataclass
class RunDir:
    path: Path
    program: WaferProgram | None = None
    counters: dict = field(default_factory=dict)  # name -> array (systems, height, width[, 4])
    results: dict = field(default_factory=dict)  # results.json of `run`
    metrics: ServeReport | None = None  # metrics.json of `serve`
    summary: dict = field(default_factory=dict)  # summary.json of `compile`
    # experiment.json of `experiment disagg` (with --vary, a VaryReport) or `frontier`
    experiment: ExperimentReport | VaryReport | FrontierReport | None = None
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
        try:
            with np.load(path / "counters.npz") as z:
                run.counters = {k: z[k] for k in z.files}
        except (OSError, ValueError) as exc:
            raise UserError(f"{path / 'counters.npz'}: unreadable ({exc})") from None
    for name, parse in (("results", None), ("metrics", ServeReport.from_json),
                        ("summary", None), ("experiment", report_from_json),
                        ("inspect", None)):
        file = path / f"{name}.json"
        if file.exists():
            setattr(run, name, _read(file, parse))
    if (path / SWEEP_SPEC).exists():
        run.sweep = _read(path / SWEEP_SPEC, SweepSpec.from_json)
        run.sweep_rows = read_rows(path)
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
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{file}: not valid JSON ({exc})") from None
    if parse is None:
        return data
    try:
        return parse(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        what = f"no {exc}" if isinstance(exc, KeyError) else " ".join(str(exc).split())
        raise UserError(f"{file}: not what wse-emu writes there ({what[:120]})") from None
