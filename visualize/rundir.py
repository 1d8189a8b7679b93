"""What a run directory holds, read once: the program, the simulator's counters, the results."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from wse_emu.errors import UserError
from wse_emu.program import WaferProgram
from wse_emu.runtime.sweep import SPEC as SWEEP_SPEC
from wse_emu.runtime.sweep import read_rows


@dataclass
class RunDir:
    path: Path
    program: WaferProgram | None = None
    counters: dict = field(default_factory=dict)  # name -> array (systems, height, width[, 4])
    results: dict = field(default_factory=dict)  # results.json of `run`
    metrics: dict = field(default_factory=dict)  # metrics.json of `serve`
    summary: dict = field(default_factory=dict)  # summary.json of `compile`
    experiment: dict = field(default_factory=dict)  # experiment.json of `experiment disagg`
    sweep: dict = field(default_factory=dict)  # sweep.json of `sweep`, with its rows
    inspect: dict = field(default_factory=dict)  # inspect.json of `inspect`

    @property
    def kind(self) -> str:
        if self.inspect:
            return "inspect"
        if self.sweep:
            return "sweep"
        if self.experiment:
            return "experiment"
        if self.metrics:
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
    for name in ("results", "metrics", "summary", "experiment", "inspect"):
        file = path / f"{name}.json"
        if file.exists():
            try:
                setattr(run, name, json.loads(file.read_text(encoding="utf-8")))
            except (OSError, ValueError) as exc:
                raise UserError(f"{file}: not valid JSON ({exc})") from None
    if (path / SWEEP_SPEC).exists():
        try:
            run.sweep = {**json.loads((path / SWEEP_SPEC).read_text(encoding="utf-8")),
                         "rows": read_rows(path)}
        except (OSError, ValueError) as exc:
            raise UserError(f"{path / SWEEP_SPEC}: not valid JSON ({exc})") from None
    if (run.program is None and not run.metrics and not run.experiment and not run.sweep
            and not run.inspect):
        raise UserError(f"{path}: nothing to draw (no program.json, metrics.json, "
                        "experiment.json, sweep.json or inspect.json): write one with 'wse-emu "
                        "compile -o', 'run -o', 'serve -o', 'experiment disagg -o', 'sweep -o' "
                        "or 'inspect -o'")
    return run
