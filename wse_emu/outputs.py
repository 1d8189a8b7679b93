"""What a run directory holds, written: a simulated step's counters, summary and trace; a
serving run's per-request rows, metrics, timeline and KV occupancy; generated logits.

Every writer puts its files in the directory it is given; ``program.write_run_dir`` gives it a
temporary one and renames it into place only once all is written."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np

from wse_emu.errors import UserError
from wse_emu.program import WaferProgram
from wse_emu.runner import RegionRun
from wse_emu.runtime.metrics import REQUEST_COLUMNS, ServeReport, request_rows
from wse_emu.timeline import chrome_trace

TIMELINE_EVENTS = 200_000  # stage events kept per region for a serving run's timeline.json


def write_step_outputs(directory: Path, program: WaferProgram, run: RegionRun) -> None:
    """A step's run directory: counters.npz (per-PE busy cycles, per-link wavelets, SRAM), the
    program, results.json (``run.to_json()``) and a Chrome trace."""
    shape = (program.systems, program.fabric.height, program.fabric.width)
    busy = np.zeros(shape, dtype=np.int64)
    links = np.zeros(shape + (4,), dtype=np.int64)
    for sr in run.stages:
        r = program.stages[sr.stage].rect
        busy[r.system, r.y:r.y1, r.x:r.x1] = sr.busy
        links[r.system, r.y:r.y1, r.x:r.x1] = sr.links
    sram = {f"sram_{k[5:]}": v for k, v in program.arrays.items() if k.startswith("sram_")}
    np.savez_compressed(directory / "counters.npz", pe_busy_cycles=busy,
                        link_wavelets_nesw=links, **sram)
    program.save(directory)  # so that the run directory alone can be drawn
    (directory / "results.json").write_text(json.dumps(run.to_json(), indent=1))
    (directory / "timeline.json").write_text(json.dumps(chrome_trace(program, run)))


def write_serve_outputs(directory: Path, result, requests, report: ServeReport,
                        program: WaferProgram | None = None) -> None:
    """requests.csv, metrics.json (``report.to_json()``), timeline.json and kv_occupancy.csv
    (and the program, when given, so that the directory alone can be drawn)."""
    if program is not None:
        program.save(directory)
    with open(directory / "requests.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(REQUEST_COLUMNS)
        w.writerows(request_rows(result, requests))
    (directory / "metrics.json").write_text(json.dumps(report.to_json(), indent=1))
    (directory / "timeline.json").write_text(json.dumps(result.timeline))
    with open(directory / "kv_occupancy.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["region", "time_s", "kv_tokens"])
        for name, trace in result.kv_traces.items():
            w.writerows([name, t / result.clock_hz, int(k)] for t, k in trace.tolist())


def save_logits(path: str, logits: np.ndarray) -> None:
    """Written under a temporary name and renamed, so a failure leaves no half file."""
    target = Path(path)
    partial = target.with_name(target.name + ".partial")
    try:
        with open(partial, "wb") as fh:
            np.save(fh, logits.astype(np.float32))
        os.replace(partial, target)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
