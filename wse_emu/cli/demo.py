"""``wse-emu demo``: the main job end to end on embedded defaults.

For now it compiles Llama-3.1-8B onto one WSE-3, colocated and disaggregated, and prints both
compile summaries side by side with what changes between them.
"""

from __future__ import annotations

from compiler.mapper import compile_model
from compiler.options import CompileOptions
from wse_emu.cli.compile_cmd import render
from wse_emu.cli.fmt import seconds, si, table
from wse_emu.fabric import ClusterSpec, load_fabric
from wse_emu.model import load_model

DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_FABRIC = "wse3"


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="compile the default model, colocated and disaggregated")
    p.add_argument("--json", action="store_true", help="machine-readable summaries on stdout")
    p.set_defaults(func=run)


def run(args):
    model = load_model(DEFAULT_MODEL)
    cluster = ClusterSpec(load_fabric(DEFAULT_FABRIC), 1)
    programs = {plan: compile_model(model, cluster, CompileOptions(plan=plan))
                for plan in ("colocated", "disaggregated")}
    if args.json:
        return {plan: p.summary for plan, p in programs.items()}
    rows = []
    for plan, p in programs.items():
        for r in p.summary["regions"]:
            rows.append([plan, r["name"], f"{r['pes']:,}", r["stages"],
                         f"{r['kv_capacity_tokens']:,}",
                         seconds(r["bounds"]["prefill"]["pipeline_latency_s"]),
                         seconds(r["bounds"]["decode"]["pipeline_latency_s"]),
                         si(r["bounds"]["decode"]["max_tokens_per_s"])])
    parts = [render(p) for p in programs.values()]
    parts.append("Colocated versus disaggregated on the same wafer\n" + table(
        ["plan", "region", "PEs", "stages", "KV tokens", "prefill latency", "decode latency",
         "decode tok/s"], rows, "llrrrrrr"))
    parts.append("Bounds come from the compiler; cycle-level runs of these programs come with "
                 "the simulator.")
    return "\n\n".join(parts)
