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

from wse_emu import layer as ly
from wse_emu.errors import UserError
from wse_emu.program import WaferProgram
from wse_emu.routing import load_summary, routing_of
from wse_emu.runner import RegionRun
from wse_emu.runtime.metrics import REQUEST_COLUMNS, request_rows
from wse_emu.timeline import chrome_trace

TIMELINE_EVENTS = 200_000  # stage events kept per region for a serving run's timeline.json


def step_summary(program: WaferProgram, run: RegionRun, bounds: dict) -> dict:
    """What ``run`` prints and keeps in results.json: the step, its stages, utilization, and
    beside each stage's kernels their lower ``bounds`` (``compiler.bounds.stage_bounds``)."""
    clock = run.clock_hz
    stages = []
    for sr in run.stages:
        stage = program.stages[sr.stage]
        pes = sr.busy.size
        stages.append({
            "stage": sr.stage, "layers": stage.layers, "experts": stage.experts,
            "holds": stage.describe_layers(), "cycles": sr.cycles,
            "seconds": sr.cycles / clock, "first_tile_cycles": sr.first_tile_cycles,
            "compute_utilization": float(sr.busy.sum()) / (pes * sr.cycles) if sr.cycles else 0,
            "link_utilization": float(sr.links.sum()) / (sr.links.size * sr.cycles)
            if sr.cycles else 0,
            "kernel_cycles": {n: span[1] - span[0] for n, span in sr.kernels.items()},
            "kernel_busy_cycles": sr.kernel_busy,
            "kernel_bound_cycles_each": bounds[sr.stage],  # one layer, one token tile
            "tasks": sr.tasks, "messages": sr.messages, "reused_from": sr.reused_from,
        })
    b = run.bottleneck
    compiled_bounds = program.summary.get("bounds", {}).get(run.region, {}).get(run.step.phase)
    opts = program.options
    same = (run.step.phase == "prefill" and run.step.tokens == opts.bound_prefill_tokens) or (
        run.step.phase == "decode" and run.step.batch == opts.bound_decode_batch
        and run.step.context == opts.bound_decode_context)
    if not same:
        compiled_bounds = None  # the compiler's bounds are for another workload
    return {
        "model": program.model.name, "cluster": f"{program.systems} x {program.fabric.name}",
        "region": run.region, "engine": run.engine,
        "routing": routing_of(opts).describe() if program.model.is_moe else None,
        "step": {"phase": run.step.phase, "tokens": run.step.tokens, "batch": run.step.batch,
                 "context": run.step.context, "tiles": len(run.step.tiles()),
                 "attention_tile": attention_tile(program, run)},
        "experts": experts_summary(program, run) if program.model.is_moe else None,
        "step_cycles": run.step_cycles, "step_seconds": run.step_seconds,
        "tokens_per_s_alone": run.latency_tokens_per_s(),
        "tokens_per_s_pipelined": run.tokens_per_s(),
        "bottleneck_stage": run.stages[b].stage, "bottleneck_cycles": run.stages[b].cycles,
        "compiled_bounds": compiled_bounds,
        "compute_utilization": run.compute_utilization(),
        "link_utilization": run.link_utilization(),
        "transfer_cycles": run.transfers,
        "stages": stages, "stages_simulated": run.simulated, "wall_seconds": run.wall_seconds,
    }


def attention_tile(program: WaferProgram, run: RegionRun) -> int | None:
    """Sequences per attention tile of a decode step run with batch tiling on attention."""
    size = ly.attention_tile_of(program.options)
    return size if len(run.step.attention_tiles(size)) > 1 else None


def experts_summary(program: WaferProgram, run: RegionRun) -> dict:
    """How busy a mixture of experts' experts are in the step: the drawn loads of one layer
    (every expert resident, only the routed ones working) and the share of the step's cycles
    the expert strips' PEs compute."""
    model = program.model
    loads = load_summary(routing_of(program.options), model.num_experts,
                         model.experts_per_token, run.step.tiles()[0].new_tokens)
    experts = {op.name for op in ly.layer_ops(model) if op.kind == ly.EXPERT_GEMM}
    busy = capacity = 0.0
    for sr in run.stages:
        stage = program.stages[sr.stage]
        for k in program.stage_kernels(stage):
            if k.name in experts:
                r, st = k.rect, stage.rect
                busy += float(sr.busy[r.y - st.y:r.y1 - st.y, r.x - st.x:r.x1 - st.x].sum())
                capacity += r.area * sr.cycles
    return {**loads, "expert_pe_utilization": busy / capacity if capacity else 0.0}


def write_step_outputs(directory: Path, program: WaferProgram, run: RegionRun,
                       data: dict) -> None:
    """A step's run directory: counters.npz (per-PE busy cycles, per-link wavelets, SRAM), the
    program, results.json and a Chrome trace."""
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
    (directory / "results.json").write_text(json.dumps(data, indent=1))
    (directory / "timeline.json").write_text(json.dumps(chrome_trace(program, run)))


def write_serve_outputs(directory: Path, result, requests, data: dict,
                        program: WaferProgram | None = None) -> None:
    """requests.csv, metrics.json, timeline.json and kv_occupancy.csv (and the program, when
    given, so that the directory alone can be drawn)."""
    if program is not None:
        program.save(directory)
    with open(directory / "requests.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(REQUEST_COLUMNS)
        w.writerows(request_rows(result, requests))
    (directory / "metrics.json").write_text(json.dumps(data, indent=1))
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
