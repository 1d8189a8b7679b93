"""A serving case: the compiled event loop on a whole trace, Llama-3.1-8B's pools with their
tables read from the cache, for each policy named, warm, the fastest of ``repeat`` runs."""

from __future__ import annotations

import time
from pathlib import Path

from wse_emu.cli.bench.case import peak_rss_mib, report


def measure(case: dict) -> dict:
    from wse_emu import api
    from wse_emu.pools.kinds.wafer import wafer_pools
    from wse_emu.serving.serve import ServeOptions, serve
    from wse_emu.serving.workload import generate, workload_spec

    program = api.compile(case["model"], case["fabric"], case["systems"])
    began = time.perf_counter()
    pools = wafer_pools(program, Path(case["cache_dir"]))
    tables_s = time.perf_counter() - began
    reqs = generate(workload_spec(trace=case["trace"]))
    policies = {}
    for policy in case["policies"]:
        options = ServeOptions.of(program.fabric, program.model, policy=policy)
        serve(reqs, pools, options)  # the loop loaded from numba's cache (or compiled), warm
        loops, calls = [], []
        for _ in range(case["repeat"]):
            began = time.perf_counter()
            result = serve(reqs, pools, options)
            calls.append(time.perf_counter() - began)
            loops.append(result.loop_s)
        policies[policy] = {"seconds": min(loops), "seconds_all": loops,
                            "serve_seconds": min(calls), "serve_seconds_all": calls,
                            "output_tokens": int(result.tokens.sum())}
    return {"policies": policies, "tables_seconds": tables_s, "requests": len(reqs),
            "peak_rss_mib": peak_rss_mib()}


if __name__ == "__main__":
    report(measure)
