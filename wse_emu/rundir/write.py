"""What a run directory holds, written: a simulated step's counters, summary and trace; a
serving run's per-request rows, metrics, timeline and KV occupancy; generated logits.

Every writer puts its files in the directory it is given; ``directory.write_run_dir`` gives it
a temporary one and renames it into place only once all is written. Each file is written whole
or not at all too (``wse_emu.util.atomic``), so a directory filled some other way never holds a
half-written one under its name, and a full disk is one line naming the file."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import yaml

from wse_emu.program.format import WaferProgram
from wse_emu.serving.metrics import REQUEST_COLUMNS, ServeReport, request_rows
from wse_emu.sim.runner import HandoffRun, RegionRun
from wse_emu.sim.timeline import chrome_trace
from wse_emu.util.atomic import replacing, write_text

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
    with replacing(directory / "counters.npz") as fh:
        np.savez_compressed(fh, pe_busy_cycles=busy, link_wavelets_nesw=links, **sram)
    program.save(directory)  # so that the run directory alone can be drawn
    write_text(directory / "results.json", json.dumps(run.to_json(), indent=1))
    write_text(directory / "timeline.json", json.dumps(chrome_trace(program, run)))


def write_serve_outputs(directory: Path, result, requests, report: ServeReport,
                        program: WaferProgram | None = None) -> None:
    """requests.csv, metrics.json (``report.to_json()``), timeline.json and kv_occupancy.csv
    (and the program, when given, so that the directory alone can be drawn)."""
    if program is not None:
        program.save(directory)
    with replacing(directory / "requests.csv", text=True, newline="") as fh:
        w = csv.writer(fh)
        w.writerow(REQUEST_COLUMNS)
        w.writerows(request_rows(result, requests))
    write_text(directory / "metrics.json", json.dumps(report.to_json(), indent=1))
    write_text(directory / "timeline.json", json.dumps(result.timeline))
    with replacing(directory / "kv_occupancy.csv", text=True, newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["region", "time_s", "kv_tokens"])
        for name, trace in result.kv_traces.items():
            w.writerows([name, t / result.clock_hz, int(k)] for t, k in trace.tolist())


def save_logits(path: str, logits: np.ndarray) -> None:
    """Written under a temporary name and renamed, so a failure leaves no half file."""
    with replacing(path) as fh:
        np.save(fh, logits.astype(np.float32))


def write_compiled(directory: Path, program: WaferProgram) -> None:
    """A compiled program's run directory: the program, the configuration it was compiled
    from as resolved (config.yaml: enough to compile it again) and its summary."""
    resolved = {"command": "compile", "model": program.model.to_dict(),
                "fabric": program.fabric.to_dict(), "systems": program.systems,
                "options": program.options.to_dict()}
    program.save(directory)
    write_text(directory / "config.yaml", yaml.safe_dump(resolved, sort_keys=False))
    write_text(directory / "summary.json", json.dumps(program.summary, indent=1))


def write_handoff(directory: Path, program: WaferProgram, handoff: HandoffRun) -> None:
    """A KV handoff's run directory: the program (so that it alone can be drawn), the
    results and, on one wafer, the wavelets each link carried."""
    program.save(directory)
    write_text(directory / "results.json", json.dumps(handoff.to_json(), indent=1))
    if handoff.links is not None:
        with replacing(directory / "counters.npz") as fh:
            np.savez_compressed(fh, link_wavelets_nesw=handoff.links)


def write_json(directory: Path, name: str, data: dict) -> None:
    """A report's JSON (experiment.json, pairings.json, inspect.json) in its run directory."""
    write_text(directory / name, json.dumps(data, indent=1))
