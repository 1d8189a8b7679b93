"""A simulation case: the cycle engine on synthetic traffic (``noc``), or the fast engine on
one step of a compiled model (``run``), each warm, the fastest of ``repeat`` runs."""

from __future__ import annotations

import time

from wse_emu.cli.bench.case import peak_rss_mib, report


def measure(case: dict) -> dict:
    out = noc(case) if case["kind"] == "noc" else step(case)
    return {**out, "peak_rss_mib": peak_rss_mib()}


def noc(case: dict) -> dict:
    from wse_emu.engines import cycle
    from wse_emu.sim.noc import generate, saturation_bound

    k = case["mesh"]
    rate = case["fraction"] * saturation_bound("uniform", k)
    msgs = generate("uniform", k, rate, case["cycles"], 1, 4, 0)
    cycle.run(k, k, 4, 8, 1, 2, msgs, 50)  # compiled and warm
    best = None
    for _ in range(case["repeat"]):
        start = time.perf_counter()
        res = cycle.run(k, k, 4, 8, 1, 2, msgs, case["cycles"])
        took = time.perf_counter() - start
        best = took if best is None else min(best, took)
    return {"seconds": best, "cycles": res.cycles, "offered_rate": rate,
            "router_cycles_per_s": res.cycles * k * k / best}


def step(case: dict) -> dict:
    from wse_emu import api
    from wse_emu.models.layer import MicroBatch
    from wse_emu.sim.runner import run_region

    program = api.compile(case["model"], case["fabric"])
    run_region(program, "mixed0", MicroBatch("decode", batch=1, context=8))  # compiled and warm
    one = MicroBatch(**case["step"])
    best = None
    for _ in range(case["repeat"]):
        start = time.perf_counter()
        run = run_region(program, "mixed0", one)
        took = time.perf_counter() - start
        best = took if best is None else min(best, took)
    return {"seconds": best, "simulated_step_s": run.step_seconds,
            "stages_simulated": run.simulated}


if __name__ == "__main__":
    report(measure)
