"""``wse-emu serve``: a request workload on a compiled cluster, colocated or disaggregated."""

from __future__ import annotations

from wse_emu.api import default_cache_dir
from wse_emu.cli.compile_cmd import add_cluster_args, compile_from_args
from wse_emu.errors import UserError
from wse_emu.fmt import seconds, si, table
from wse_emu.outputs import TIMELINE_EVENTS, write_serve_outputs
from wse_emu.program import write_run_dir
from wse_emu.runtime.metrics import run_metrics
from wse_emu.runtime.regions import region_models
from wse_emu.runtime.serve import ServeOptions, kv_shortfall, serve
from wse_emu.runtime.tables import check_micro_batches
from wse_emu.runtime.workload import generate, workload_spec

SHOWN_REGIONS = 8  # regions in the printed table


def add_parser(sub, summary: str) -> None:
    p = sub.add_parser("serve", help=summary)
    p.add_argument("model", help="model preset, model YAML or Hugging Face config.json")
    add_cluster_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", help="workload preset or YAML")
    src.add_argument("--trace", help="CSV of arrived_at,num_prefill_tokens,num_decode_tokens")
    p.add_argument("--rate", type=float, help="requests per second (synthetic) or a replay "
                   "speed-up (trace)")
    p.add_argument("--requests", type=int, help="serve only the first N requests (sessions)")
    p.add_argument("--batch-limit", type=int, default=64, help="sequences per decode micro-batch")
    p.add_argument("--policy", choices=["prefill-priority", "chunked", "interleaved"],
                   default="prefill-priority", help="colocated batching policy")
    p.add_argument("--token-budget", type=int, default=512,
                   help="chunked prefill: tokens per micro-batch")
    p.add_argument("--prefill-tile", type=int, default=64,
                   help="tokens per prefill micro-batch (prompts stream through in such tiles)")
    p.add_argument("--max-running", type=int, default=0,
                   help="cap on sequences holding KV in a colocated or decode region "
                   "(default 0: none)")
    p.add_argument("--interleave", type=int, default=1,
                   help="interleaved policy: decode micro-batches per prefill tile (default 1)")
    p.add_argument("--no-prefix-cache", action="store_true",
                   help="recompute every agentic call's whole context (by default a call "
                   "reuses its session's KV while it is still cached)")
    p.add_argument("--ttft-slo", type=float, help="time-to-first-token target, seconds")
    p.add_argument("--tpot-slo", type=float, help="time-per-output-token target, seconds")
    p.add_argument("--cache-dir", help="where stage-time tables are kept "
                   "(default: $XDG_CACHE_HOME/wse-emu or ~/.cache/wse-emu)")
    p.add_argument("-o", "--output", help="run directory: requests.csv and metrics.json")
    p.add_argument("--viz", action="store_true",
                   help="draw the run directory (figures/, report.html) at the end")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args):
    check_micro_batches(args.batch_limit, args.prefill_tile, (args.token_budget,))
    for name in ("rate", "ttft_slo", "tpot_slo"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be positive, got {value}")
    if args.max_running < 0 or args.interleave < 1:
        raise UserError(f"--max-running must be at least 0 and --interleave at least 1, got "
                        f"{args.max_running} and {args.interleave}")
    if args.requests is not None and args.requests < 1:
        raise UserError(f"--requests must be at least 1, got {args.requests}")
    spec = workload_spec(args.workload, args.trace, args.rate, args.requests)
    reqs = generate(spec)
    program = compile_from_args(args)
    short = kv_shortfall(reqs, program.regions)
    if short:  # found before any table is timed
        raise UserError(short)
    regions = region_models(program, default_cache_dir(args.cache_dir))
    fabric = program.fabric
    options = ServeOptions.of(fabric, program.model, batch_limit=args.batch_limit,
                              policy=args.policy, token_budget=args.token_budget,
                              prefill_tile=args.prefill_tile, max_running=args.max_running,
                              interleave=args.interleave, prefix_cache=not args.no_prefix_cache,
                              timeline_events=TIMELINE_EVENTS if args.output else 0)
    result = serve(reqs, regions, options)
    metrics = run_metrics(result, reqs, args.ttft_slo, args.tpot_slo)
    data = {"model": program.model.name, "cluster": f"{program.systems} x {fabric.name}",
            "plan": program.options["plan"], "policy": args.policy, "workload": spec.name,
            "targets": {"ttft_s": args.ttft_slo, "tpot_s": args.tpot_slo},
            **metrics, "regions": result.regions}
    if args.output:
        write_run_dir(args.output, lambda tmp: write_serve_outputs(tmp, result, reqs, data,
                                                                   program))
    if args.json:
        return data
    rows = [[name, seconds(v["p50"]), seconds(v["p90"]), seconds(v["p99"])]
            for name, v in (("TTFT", metrics["ttft_s"]), ("TPOT", metrics["tpot_s"]),
                            ("inter-token", metrics["itl_s"]),
                            ("end to end", metrics["e2e_s"]))]
    lines = [f"{data['model']} on {data['cluster']}, {data['plan']}: workload {spec.name}, "
             f"{metrics['requests']:,} requests over {seconds(metrics['duration_s'])}",
             f"  output tokens/s      {si(metrics['output_tokens_per_s'])}",
             f"  requests/s           {metrics['requests_per_s']:.3g}",
             f"  SLO attainment       {metrics['slo_attainment']:.1%} (goodput "
             f"{metrics['goodput_requests_per_s']:.3g} requests/s)", "",
             table(["latency", "p50", "p90", "p99"], rows)]
    regs = [[name, r["role"], f"{r['stage_utilization']:.1%}",
             f"{r['kv_peak_tokens']:,} of {r['kv_capacity_tokens']:,}"]
            for name, r in list(result.regions.items())[:SHOWN_REGIONS]]
    lines += ["", table(["region", "role", "stage utilization", "KV tokens at peak"], regs)]
    hidden = len(result.regions) - SHOWN_REGIONS
    if hidden > 0:
        lines.append(f"... and {hidden} more region{'s' if hidden > 1 else ''} (every region is "
                     "in --json and in metrics.json)")
    return "\n".join(lines)
