"""``wse-emu bench``: speed and memory targets, measured and reported as JSON.

Each case runs in a fresh Python process so that its peak resident memory is its own; the
child reports the wall time of the measured call (imports and loading excluded) and its peak
RSS. Goals are printed beside the measurements, never asserted here.
"""

from __future__ import annotations

import json
import subprocess
import sys

COMPILE_CASES = [
    {"model": "llama-3.1-8b", "fabric": "wse3", "systems": 1, "plan": "colocated", "goal_s": 2.0},
    {"model": "llama-3.1-8b", "fabric": "wse3", "systems": 1, "plan": "disaggregated",
     "goal_s": None},
    {"model": "llama-3.1-70b", "fabric": "wse3", "systems": 4, "plan": "colocated",
     "goal_s": 5.0},
]

CHILD = r"""
import json, resource, sys, time
from compiler.mapper import compile_model
from compiler.options import CompileOptions
from wse_emu.fabric import ClusterSpec, load_fabric
from wse_emu.model import load_model
case = json.loads(sys.argv[1])
model = load_model(case["model"])
cluster = ClusterSpec(load_fabric(case["fabric"]), case["systems"])
times = []
for _ in range(case["repeat"]):
    start = time.perf_counter()
    program = compile_model(model, cluster, CompileOptions(plan=case["plan"]))
    times.append(time.perf_counter() - start)
print(json.dumps({"seconds": min(times), "seconds_all": times,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "stages": len(program.stages), "regions": len(program.regions)}))
"""


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="speed and memory benchmarks (JSON)")
    p.add_argument("target", choices=["compile"], help="what to benchmark")
    p.add_argument("--repeat", type=int, default=3, help="runs per case; the fastest counts")
    p.add_argument("--json", action="store_true", help="accepted for symmetry; output is JSON")
    p.set_defaults(func=run, always_json=True)


def run(args) -> dict:
    results = []
    for case in COMPILE_CASES:
        payload = json.dumps({**case, "repeat": max(1, args.repeat)})
        proc = subprocess.run([sys.executable, "-c", CHILD, payload], capture_output=True,
                              text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"benchmark case {case} failed:\n{proc.stderr}")
        measured = json.loads(proc.stdout.strip().splitlines()[-1])
        goal = case["goal_s"]
        results.append({**{k: v for k, v in case.items() if k != "goal_s"}, **measured,
                        "goal_seconds": goal,
                        "goal_met": None if goal is None else measured["seconds"] < goal})
    return {"benchmark": "compile", "repeat": args.repeat, "cases": results}
