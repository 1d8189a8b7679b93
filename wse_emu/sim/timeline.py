"""Chrome trace (Perfetto) timelines of a run: a process per stage, with a track for the stage's
span and one track per kernel, so that no two spans on a track overlap (trace viewers need the
spans of a track to nest, and a stage's kernels run side by side)."""

from __future__ import annotations

from wse_emu.program.format import WaferProgram


def chrome_trace(program: WaferProgram, run) -> dict:
    """Stage and kernel spans of one micro-batch, in microseconds, as trace events."""
    us = 1e6 / run.clock_hz
    title = f"{program.model.name} {run.region} {run.step.phase}"
    events = []
    t = 0.0
    for i, sr in enumerate(run.stages):
        t += run.transfers[i]
        pid = sr.stage
        events += [{"name": "process_name", "ph": "M", "pid": pid,
                    "args": {"name": f"{title}: stage {sr.stage}"}},
                   {"name": "process_sort_index", "ph": "M", "pid": pid,
                    "args": {"sort_index": sr.stage}},
                   {"name": "thread_name", "ph": "M", "pid": pid, "tid": 0,
                    "args": {"name": "stage"}},
                   {"name": f"stage {sr.stage}", "ph": "X", "pid": pid, "tid": 0,
                    "ts": t * us, "dur": sr.cycles * us,
                    "args": {"cycles": sr.cycles, "reused_from": sr.reused_from}}]
        kernels = sorted(sr.kernels.items(), key=lambda kv: (kv[1][0], kv[0]))
        for tid, (name, (start, end)) in enumerate(kernels, start=1):
            events += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                        "args": {"name": name}},
                       {"name": name, "ph": "X", "pid": pid, "tid": tid,
                        "ts": (t + start) * us, "dur": max(end - start, 0) * us}]
        t += sr.first_tile_cycles if len(run.step.tiles()) > 1 else sr.cycles
    return {"traceEvents": events, "displayTimeUnit": "ns"}
