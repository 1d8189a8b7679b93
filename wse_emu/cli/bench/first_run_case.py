"""A first-run case: what a process waits for before its first timed step and its first
serving run, as the progress lines name them (the simulation engines; the serving loop and
every policy's dispatch), each timed in turn. Run with an empty Numba cache folder it is the
wait once after install; run again with that folder, the load from Numba's cache."""

from __future__ import annotations

import time

from wse_emu.cli.bench.case import peak_rss_mib, report


def measure(case: dict) -> dict:
    from wse_emu.serving.policies import warm_loop
    from wse_emu.sim.warm import warm_engine

    steps = {"the fast engine": lambda: warm_engine("fast"),
             "the cycle engine": lambda: warm_engine("cycle"),
             "the serving loop and every policy's dispatch": warm_loop}
    seconds = {}
    for name, step in steps.items():
        began = time.perf_counter()
        step()
        seconds[name] = time.perf_counter() - began
    return {"seconds": seconds, "peak_rss_mib": peak_rss_mib()}


if __name__ == "__main__":
    report(measure)
