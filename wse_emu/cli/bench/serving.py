"""``wse-emu bench serve`` and ``wse-emu bench experiment``: what serving costs.

``serve`` times the serving loop on the 19,366-request conversation trace, Llama-3.1-8B on one
WSE-3, its stage tables cached (the first child process times and caches them; the measured
one reads them back), for every colocated policy, and the whole ``wse-emu serve`` command.
``experiment`` runs the README's one-wafer chat-trace experiment at one TPOT target with
three draws as the command line does, first with no stage table cached (a fresh cache
folder), then again with them cached, and reports each run's wall time and the largest
resident memory of any of its processes.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from wse_emu.cli.bench.case import child
from wse_emu.errors import UserError
from wse_emu.serving.workload import trace_path
from wse_emu.util.cachedir import user_cache_dir

DEFAULT_TRACE = "azure-conv"  # the conversation trace shipped with wse-emu, by its name
SERVE_GOAL_S = 0.5  # the loop's time on the whole trace, once its tables are cached
SERVE_COMMAND_GOAL_S = 1.5  # the whole wse-emu serve, start-up included, tables cached
EXPERIMENT_GOALS_S = {"cold": 4 * 60.0, "cached": 5 * 60.0}
PEAK_MEMORY_GOAL_MIB = 4096


def _trace(args) -> str:
    """The trace the runs replay, a shipped trace's name or a CSV path, as the command line
    takes it (a name keeps the commands reported free of this machine's paths)."""
    trace = args.trace or DEFAULT_TRACE
    if not trace_path(trace).is_file():
        raise UserError(f"no trace at {trace}: give one with --trace")
    return trace


def run_serve(args) -> dict:
    from wse_emu.serving.policies import POLICIES

    case = {"model": "llama-3.1-8b", "fabric": "wse3", "systems": 1,
            "trace": str(_trace(args)), "cache_dir": str(user_cache_dir()),
            "policies": list(POLICIES), "repeat": max(1, args.repeat)}
    child("serve_case", {**case, "policies": case["policies"][:1], "repeat": 1})
    measured = child("serve_case", case)
    headline = measured["policies"][case["policies"][0]]["seconds"]
    command = [sys.executable, "-m", "wse_emu.cli.main", "--quiet", "serve", case["model"],
               "--fabric", case["fabric"], "--trace", case["trace"], "--cache-dir",
               case["cache_dir"], "--json"]
    whole = [child("timed", command) for _ in range(case["repeat"])]
    if any(run["returncode"] != 0 for run in whole):
        raise RuntimeError(f"benchmark command failed:\n{whole[-1]['stderr']}")
    command_s = min(run["seconds"] for run in whole)
    return {"benchmark": "serve",
            "case": {k: v for k, v in case.items() if k not in ("cache_dir", "repeat")},
            "what": "wall time of the compiled event loop serving the whole trace, the "
                    "fastest of --repeat runs (serve_seconds: the whole serve() call, its "
                    "checks, the loop's state made and its result read back; "
                    "command_seconds: the whole command, start-up and compile included)",
            "seconds": headline, **measured,
            "command": "wse-emu serve llama-3.1-8b --fabric wse3 --trace TRACE (tables cached)",
            "command_seconds": command_s,
            "command_beside": [run["beside"] for run in whole],
            "goal": {"seconds": SERVE_GOAL_S, "command_seconds": SERVE_COMMAND_GOAL_S,
                     "peak_rss_mib": PEAK_MEMORY_GOAL_MIB},
            "goal_met": headline < SERVE_GOAL_S and command_s < SERVE_COMMAND_GOAL_S
            and measured["peak_rss_mib"] < PEAK_MEMORY_GOAL_MIB}


def experiment_command(trace: str, cache_dir: Path) -> list[str]:
    """The README's one-wafer chat-trace experiment at one target, three draws."""
    return [sys.executable, "-m", "wse_emu.cli.main", "--quiet", "experiment", "disagg",
            "llama-3.1-8b", "--fabric", "wse3", "--trace", str(trace), "--ttft-slo", "1",
            "--tpot-slo", "0.005", "--seeds", "3", "--cache-dir", str(cache_dir), "--json"]


def run_experiment(args) -> dict:
    trace = _trace(args)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="wse-emu-bench-") as fresh:
        for kind in ("cold", "cached"):
            runs[kind] = _timed(experiment_command(trace, Path(fresh)))
    report = runs["cached"].pop("report")
    runs["cold"].pop("report")
    comparison = report.get("comparison", {})
    return {"benchmark": "experiment", "command": " ".join(experiment_command(
                trace, Path("CACHE"))[2:]).replace("wse_emu.cli.main", "wse-emu"),
            "runs": runs, "goodput_ratio": comparison.get("goodput_ratio"),
            "over_replicates": report.get("over_replicates", {}).get("goodput_ratio"),
            "goal": {**{f"{k}_seconds": v for k, v in EXPERIMENT_GOALS_S.items()},
                     "peak_rss_mib": PEAK_MEMORY_GOAL_MIB},
            "goal_met": all(runs[k]["seconds"] < EXPERIMENT_GOALS_S[k]
                            and runs[k]["peak_rss_mib"] < PEAK_MEMORY_GOAL_MIB for k in runs)}


FRONTIER_GOAL_S = 2 * 60.0  # cold, on the quick grid


def frontier_command(trace: str, cache_dir: Path) -> list[str]:
    """The frontier of Llama-3.1-8B on one WSE-3 on the chat trace, quick grid, one draw."""
    return [sys.executable, "-m", "wse_emu.cli.main", "--quiet", "experiment", "frontier",
            "llama-3.1-8b", "--fabric", "wse3", "--trace", str(trace), "--ttft-slo", "1",
            "--grid", "quick", "--seeds", "1", "--cache-dir", str(cache_dir), "--json"]


def run_frontier(args) -> dict:
    """The frontier from nothing cached: every layout compiled and its tables timed, every
    rung tuned and confirmed, the headline read at the vendor's speed and again with the step
    times scaled."""
    trace = _trace(args)
    with tempfile.TemporaryDirectory(prefix="wse-emu-bench-") as fresh:
        run = _timed(frontier_command(trace, Path(fresh)))
    report = run.pop("report")
    head = report.get("headline", {})
    return {"benchmark": "frontier", "command": " ".join(frontier_command(
                trace, Path("CACHE"))[2:]).replace("wse_emu.cli.main", "wse-emu"),
            "cold": run, "rungs": len(report.get("rungs", [])),
            "capacity_ratio": head.get("capacity_ratio", {}).get("ratio"),
            "goal": {"cold_seconds": FRONTIER_GOAL_S, "peak_rss_mib": PEAK_MEMORY_GOAL_MIB},
            "goal_met": run["seconds"] < FRONTIER_GOAL_S
            and run["peak_rss_mib"] < PEAK_MEMORY_GOAL_MIB}


def _timed(command: list[str]) -> dict:
    """``command`` (its JSON report on stdout) run once to its end: its wall time, the largest
    resident memory of its processes, what ran beside it, and its report."""
    run = child("timed", command)
    if run["returncode"] != 0:
        raise RuntimeError(f"benchmark command failed:\n{run['stderr']}")
    return {"seconds": run["seconds"], "runs": 1, "peak_rss_mib": run["peak_rss_mib"],
            "beside": run["beside"], "report": json.loads(run["stdout"])}
