"""``wse-emu demo``: the main job end to end on embedded defaults.

Compiles Llama-3.1-8B onto one WSE-3, colocated and disaggregated, prints both compile
summaries, then simulates one decode step (batch 1, context 4096) on the colocated region and
on the disaggregated decode region, side by side with the compiler's bounds.
"""

from __future__ import annotations

from compiler.mapper import compile_model
from compiler.options import CompileOptions
from wse_emu.cli.compile_cmd import render
from wse_emu.cli.fmt import seconds, si, table
from wse_emu.fabric import ClusterSpec, load_fabric
from wse_emu.kernels.stage import Step
from wse_emu.model import load_model
from wse_emu.runner import run_region

DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_FABRIC = "wse3"
DECODE = Step("decode", batch=1, context=4096)


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="compile the default model both ways and time a decode step")
    p.add_argument("--json", action="store_true", help="machine-readable summaries on stdout")
    p.set_defaults(func=run)


def run(args):
    model = load_model(DEFAULT_MODEL)
    cluster = ClusterSpec(load_fabric(DEFAULT_FABRIC), 1)
    programs = {plan: compile_model(model, cluster, CompileOptions(plan=plan))
                for plan in ("colocated", "disaggregated")}
    runs = {"colocated": run_region(programs["colocated"], "mixed0", DECODE),
            "disaggregated": run_region(programs["disaggregated"], "decode0", DECODE)}
    if args.json:
        return {plan: {"compile": p.summary,
                       "decode_step": {"region": runs[plan].region,
                                       "step_seconds": runs[plan].step_seconds,
                                       "tokens_per_s_alone": runs[plan].latency_tokens_per_s(),
                                       "tokens_per_s_pipelined": runs[plan].tokens_per_s()}}
                for plan, p in programs.items()}
    rows = []
    for plan, p in programs.items():
        for r in p.summary["regions"]:
            rows.append([plan, r["name"], f"{r['pes']:,}", r["stages"],
                         f"{r['kv_capacity_tokens']:,}",
                         seconds(r["bounds"]["prefill"]["pipeline_latency_s"]),
                         seconds(r["bounds"]["decode"]["pipeline_latency_s"])])
    sim = []
    for plan, run_ in runs.items():
        bound = programs[plan].summary["bounds"][run_.region]["decode"]
        sim.append([plan, run_.region, seconds(run_.step_seconds),
                    seconds(bound["pipeline_latency_s"]), si(run_.latency_tokens_per_s()),
                    si(run_.tokens_per_s()), f"{run_.compute_utilization():.1%}"])
    parts = [render(p) for p in programs.values()]
    parts.append("Colocated versus disaggregated on the same wafer (compiler's lower bounds)\n"
                 + table(["plan", "region", "PEs", "stages", "KV tokens", "prefill latency",
                          "decode latency"], rows, "llrrrrr"))
    parts.append("One decode step (batch 1, context 4096) on the fast engine\n" + table(
        ["plan", "region", "step", "bound", "tok/s alone", "tok/s pipelined", "compute util"],
        sim, "llrrrrr"))
    return "\n\n".join(parts)
