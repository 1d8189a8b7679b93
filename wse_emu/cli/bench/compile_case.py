"""A compile case: the fastest of ``repeat`` compiles of a model onto a cluster, each with
nothing remembered from the one before (the placements annealed), and none read back from the
compiled programs kept between processes (``compiler.cache``): the compiler itself, timed."""

from __future__ import annotations

import time

from wse_emu import api
from wse_emu.cli.bench.case import peak_rss_mib, report
from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.options import compile_options
from wse_emu.compiler.placement import forget_annealed
from wse_emu.hardware.fabric import ClusterSpec


def measure(case: dict) -> dict:
    model, fabric = api.load_model(case["model"]), api.load_fabric(case["fabric"])
    cluster, options = ClusterSpec(fabric, case["systems"]), compile_options(plan=case["plan"])
    times = []
    for _ in range(case["repeat"]):
        forget_annealed()
        start = time.perf_counter()
        # What ``api.compile`` does when the cache does not hold the program.
        program = compile_model(model, cluster, options)
        times.append(time.perf_counter() - start)
    return {"seconds": min(times), "seconds_all": times, "peak_rss_mib": peak_rss_mib(),
            "stages": len(program.stages), "regions": len(program.regions)}


if __name__ == "__main__":
    report(measure)
