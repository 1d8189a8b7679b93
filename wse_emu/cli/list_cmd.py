"""``wse-emu list``: the shipped model, fabric, accelerator and workload presets, and the
shipped request traces."""

from __future__ import annotations

from wse_emu.hardware.accelerator import load_accelerator
from wse_emu.hardware.fabric import load_fabric
from wse_emu.models.load import load_model
from wse_emu.serving.workload import generate, load_workload, trace_names, workload_spec
from wse_emu.util.configfile import preset_names
from wse_emu.util.fmt import count, table


def add_parser(sub, summary: str) -> None:
    p = sub.add_parser("list", help=summary)
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.set_defaults(func=run)


def run(args):
    models = [load_model(n) for n in preset_names("models")]
    fabrics = [load_fabric(n) for n in preset_names("fabrics")]
    accelerators = [load_accelerator(n) for n in preset_names("accelerators")]
    workloads = [load_workload(n) for n in preset_names("workloads")]
    traces = {name: generate(workload_spec(trace=name)).summary() for name in trace_names()}
    if args.json:
        return {"models": [m.to_dict() | {"params": m.params(), "active_params": m.active_params()}
                           for m in models],
                "fabrics": [f.to_dict() for f in fabrics],
                "accelerators": [a.to_dict() for a in accelerators],
                "workloads": [w.__dict__ | generate(w).summary() for w in workloads],
                "traces": [{"name": name, "file": f"{name}.csv"} | summary
                           for name, summary in traces.items()]}
    mrows = [[m.name, m.family, count(m.params()),
              count(m.active_params()) if m.is_moe else "",
              f"{m.experts.top_k} of {m.experts.count}" if m.is_moe else "", m.num_layers,
              m.hidden_size, f"{m.attention.num_heads}/{m.attention.num_kv_heads}",
              "tied" if m.tie_embeddings else ""]
             for m in models]
    frows = [[f.name, f"{f.width} x {f.height}", f"{f.pes:,}", f"{f.sram_bytes_total / 1e9:.1f} GB",
              f.fp16_flops_per_cycle, f"{f.clock_hz / 1e9:g} GHz"] for f in fabrics]
    arows = [[a.name, f"{a.devices} x {a.device}", f"{a.tensor_parallel}",
              f"{a.bf16_flops_per_s / 1e12:,.0f}", f"{a.memory_bytes / 2**30:.0f} GiB",
              f"{a.memory_bytes_per_s / 1e12:g} TB/s"] for a in accelerators]
    wrows = []
    for w in workloads:
        s = generate(w).summary()
        wrows.append([w.name, w.arrival, f"{w.rate:g}/s", s["requests"],
                      f"{s['prompt_tokens_mean']:.0f}", f"{s['output_tokens_mean']:.0f}",
                      w.description if len(w.description) <= 60
                      else w.description[:57] + "..."])
    trows = [[name, f"{s['requests']:,}", f"{s['arrival_span_s']:,.0f} s",
              f"{(s['requests'] - 1) / s['arrival_span_s']:.2f}/s" if s["arrival_span_s"] else "",
              f"{s['prompt_tokens_mean']:.0f}", f"{s['output_tokens_mean']:.0f}"]
             for name, s in traces.items()]
    return (table(["model", "family", "params", "per token", "experts", "layers", "hidden",
                   "heads/kv", "embeddings"], mrows, "llrrrrrrl") + "\n\n" +
            table(["fabric", "PEs", "count", "SRAM", "FP16 FLOP/cyc", "clock"], frows) + "\n\n" +
            table(["accelerator", "chips", "per copy", "BF16 TFLOP/s per chip", "HBM per chip",
                   "HBM bandwidth"], arows) + "\n\n" +
            table(["workload", "arrivals", "rate", "calls", "prompt mean", "output mean",
                   "description"], wrows, "llrrrrl") + "\n\n" +
            table(["trace", "requests", "span", "rate", "prompt mean", "output mean"], trows,
                  "lrrrrr"))
