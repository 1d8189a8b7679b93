"""Chrome trace (Perfetto) timelines of a run: one track per stage, with its kernels."""

from __future__ import annotations

from wse_emu.program import WaferProgram


def chrome_trace(program: WaferProgram, run) -> dict:
    """Stage and kernel spans of one micro-batch, in microseconds, as trace events."""
    us = 1e6 / run.clock_hz
    events = [{"name": "process_name", "ph": "M", "pid": 0,
               "args": {"name": f"{program.model.name} {run.region} {run.step.phase}"}}]
    t = 0.0
    for i, sr in enumerate(run.stages):
        t += run.transfers[i]
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": sr.stage,
                       "args": {"name": f"stage {sr.stage}"}})
        events.append({"name": f"stage {sr.stage}", "ph": "X", "pid": 0, "tid": sr.stage,
                       "ts": t * us, "dur": sr.cycles * us,
                       "args": {"cycles": sr.cycles, "reused_from": sr.reused_from}})
        for name, (start, end) in sorted(sr.kernels.items(), key=lambda kv: kv[1][0]):
            events.append({"name": name, "ph": "X", "pid": 0, "tid": sr.stage,
                           "ts": (t + start) * us, "dur": max(end - start, 0) * us})
        t += sr.first_tile_cycles if len(run.step.tiles()) > 1 else sr.cycles
    return {"traceEvents": events, "displayTimeUnit": "ns"}
