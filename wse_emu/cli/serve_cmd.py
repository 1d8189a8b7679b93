"""``wse-emu serve``: a request workload on a compiled cluster, colocated or disaggregated."""

from __future__ import annotations

from wse_emu import api
from wse_emu.cli.compile_cmd import add_cluster_args, compile_from_args, model_from_args
from wse_emu.cli.knob_args import add_serving_args, serving_settings
from wse_emu.errors import UserError
from wse_emu.rundir.directory import write_run_dir
from wse_emu.rundir.write import TIMELINE_EVENTS, write_serve_outputs
from wse_emu.serving.blocktrace import shareable_tokens
from wse_emu.serving.metrics import ServeReport
from wse_emu.serving.workload import trace_names
from wse_emu.util.fmt import narrow_table, number, seconds, si

SHOWN_REGIONS = 8  # regions in the printed table


def add_parser(sub, summary: str) -> None:
    p = sub.add_parser("serve", help=summary)
    p.add_argument("model", help="model preset, model YAML or Hugging Face config.json")
    add_cluster_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", help="workload preset or YAML")
    src.add_argument("--trace", help=f"a shipped trace ({', '.join(trace_names())}), a CSV "
                     "of arrived_at,num_prefill_tokens,num_decode_tokens, or JSON lines of "
                     "timestamp (ms), input_length, output_length and hash_ids (prefix blocks "
                     "of 512 tokens; another size: a workload YAML's block_tokens)")
    p.add_argument("--rate", type=float, help="requests per second (synthetic) or a replay "
                   "speed-up (trace)")
    p.add_argument("--requests", type=int, help="serve only the first N requests (sessions)")
    add_serving_args(p)
    p.add_argument("--ttft-slo", dest="ttft_s", type=float,
                   help="time-to-first-token target, seconds")
    p.add_argument("--tpot-slo", dest="tpot_s", type=float,
                   help="time-per-output-token target, seconds")
    p.add_argument("--cache-dir", help="where stage-time tables are kept "
                   "(default: $XDG_CACHE_HOME/wse-emu or ~/.cache/wse-emu)")
    p.add_argument("-o", "--output", help="run directory: requests.csv and metrics.json")
    p.add_argument("--viz", action="store_true",
                   help="draw the run directory (figures/, report.html) at the end")
    p.add_argument("--json", action="store_true")
    pools = p.add_argument_group("pools named by their hardware (instead of --fabric, --systems "
                                 "and --plan)")
    pools.add_argument("--pool", metavar="POOL",
                       help="colocated on POOL (as --prefill-pool names it)")
    pools.add_argument("--prefill-pool", metavar="POOL",
                       help="prefill on POOL: a fabric (wse3, or wse3x4 for four systems), an "
                            "accelerator timed by its roofline (trn2, trn2x2), or their YAML; or "
                            "GPUs timed from AIConfigurator's measured data (h200x8, h200x8tp2 "
                            "for two per copy; the gpu extra)")
    pools.add_argument("--decode-pool", metavar="POOL", help="decode on POOL (as --prefill-pool)")
    p.set_defaults(func=run, writes_run_dir=True)


# The flags that describe one compiled cluster, with their defaults: pools named by their
# hardware take none of them.
CLUSTER_DEFAULTS = {"fabric": "wse3", "fabric_set": [], "systems": 1, "plan": "colocated",
                    "prefill_share": None, "prefill_systems": None, "region": None,
                    "layers_per_stage": None, "draft": None}


def check_pool_args(args) -> None:
    """Pools named by their hardware: --pool alone, or --prefill-pool with --decode-pool, and
    none of the flags that describe one compiled cluster."""
    if args.pool is not None and (args.prefill_pool or args.decode_pool):
        raise UserError("--pool (colocated) does not go with --prefill-pool or --decode-pool")
    if args.pool is None and (args.prefill_pool is None) != (args.decode_pool is None):
        raise UserError("--prefill-pool and --decode-pool go together")
    given = [name for name, default in CLUSTER_DEFAULTS.items()
             if getattr(args, name) != default]
    if given:
        flag = "--" + given[0].replace("_", "-").replace("fabric-set", "set")
        raise UserError(f"{flag} describes one compiled cluster; with --pool, --prefill-pool "
                        "or --decode-pool the pools name the hardware")


def run(args):
    settings = serving_settings(args)
    if any(p is not None for p in (args.pool, args.prefill_pool, args.decode_pool)):
        return run_pools(args, settings)
    # Every option is checked before anything is compiled or timed.
    api.check_serving(workload=args.workload, trace=args.trace, rate=args.rate,
                      requests=args.requests, ttft_s=args.ttft_s, tpot_s=args.tpot_s,
                      cache_dir=args.cache_dir, **settings)
    if args.draft is not None and not args.draft_tokens:  # before the draft is compiled
        raise UserError("--draft compiles a draft beside the target: give --draft-tokens and "
                        "--acceptance to speculate with it")
    program = compile_from_args(args)
    served = api.serve(
        program, args.workload, trace=args.trace, rate=args.rate, requests=args.requests,
        cache_dir=args.cache_dir, ttft_s=args.ttft_s, tpot_s=args.tpot_s,
        timeline_events=TIMELINE_EVENTS if args.output else 0, **settings)
    if args.output:
        write_run_dir(args.output, lambda tmp: write_serve_outputs(
            tmp, served.result, served.requests, served.report, program))
    if args.json:
        return served.report.to_json()
    return render(served.report, served.result, served.metrics)


def run_pools(args, settings: dict):
    check_pool_args(args)
    model = model_from_args(args)
    sides = args.pool if args.pool is not None else {"prefill": args.prefill_pool,
                                                      "decode": args.decode_pool}
    served = api.serve_pools(
        model, args.workload, sides=sides, trace=args.trace, rate=args.rate,
        requests=args.requests, cache_dir=args.cache_dir, ttft_s=args.ttft_s,
        tpot_s=args.tpot_s, timeline_events=TIMELINE_EVENTS if args.output else 0, **settings)
    report = served.report
    if args.output:  # no compiled program to save: the serving outputs alone
        write_run_dir(args.output, lambda tmp: write_serve_outputs(
            tmp, served.result, served.requests, report))
    if args.json:
        return report.to_json()
    text = render(report, served.result, served.metrics).split("\n")
    return "\n".join(text[:1] + [f"  {label:<20} {source}"
                                 for label, source in report.step_times.items()] + text[1:])


def _cache_and_refusals(result, metrics) -> list[str]:
    """The lines on what the prefix cache served (when it served anything) and on requests no
    region could hold (when there were any)."""
    lines = []
    reused = sum(r.get("prefix_reused_tokens", 0) for r in result.regions.values())
    if reused:
        prompts = int(result.requests.prompt_tokens.sum())
        blocks = result.requests.blocks
        bound = "" if blocks is None else (
            f"; an unbounded one, "
            f"{shareable_tokens(blocks, result.requests.prompt_tokens) / prompts:.1%}")
        lines.append(f"  prompt tokens        {si(prompts)}, {si(reused)} of them "
                     f"({reused / prompts:.1%}) served from the prefix cache{bound}")
        restored = sum(r.get("prefix_restored_tokens", 0) for r in result.regions.values())
        if restored:
            lines.append(f"  host tier            {si(restored)} of those brought back from "
                         "host memory first")
    if metrics.refused:
        lines.append(f"  refused              {metrics.refused:,} requests no region can hold "
                     "(KV room): they miss every target")
    return lines


def render(report: ServeReport, result, metrics) -> str:
    rows = [[name, seconds(v.p50), seconds(v.p90), seconds(v.p99)]
            for name, v in (("TTFT", metrics.ttft_s), ("TPOT", metrics.tpot_s),
                            ("inter-token", metrics.itl_s), ("end to end", metrics.e2e_s))]
    lines = [f"{report.model} on {report.cluster}, {report.plan}: workload {report.workload}, "
             f"{metrics.requests:,} requests over {seconds(metrics.duration_s)}",
             f"  output tokens/s      {si(metrics.output_tokens_per_s)}",
             f"  requests/s           {number(metrics.requests_per_s)}",
             *_cache_and_refusals(result, metrics),
             "  SLO attainment       no targets given (--ttft-slo, --tpot-slo)"
             if metrics.slo_attainment is None else
             f"  SLO attainment       {metrics.slo_attainment:.1%} (goodput "
             f"{number(metrics.goodput_requests_per_s)} requests/s)", "",
             narrow_table(["latency", "p50", "p90", "p99"], rows)]
    spec = report.speculation
    if spec:
        alone = spec["step_alone"]
        lines[1:1] = [
            f"  speculation          draft {spec['draft']}, {spec['draft_tokens']} drafted "
            f"tokens per verify step, each accepted with probability {spec['acceptance']:.3g}: "
            + (f"{spec['tokens_per_step']:.2f} tokens per step"
               if spec["tokens_per_step"] is not None else "no verify step served")
            + f" (expected {spec['tokens_per_step_expected']:.2f})",
            f"  one verify round     {seconds(alone['draft_s'] + alone['verify_s'])} alone at "
            f"batch 1, context {alone['context']:,} (the draft's steps "
            f"{alone['draft_share']:.0%}); the draft takes {spec['draft_strip_columns']} "
            f"columns, {spec['draft_share_of_wafer_pes']:.1%} of the PEs"]
        shares = list(spec["draft_share_of_decode"].values())
        if shares:  # none when no verify step was served
            lines.insert(3, "  the draft's share    " + (
                f"{shares[0]:.0%}" if len(shares) == 1 else
                f"{min(shares):.0%} to {max(shares):.0%}")
                + " of the decode stage-time over the run")
    regs = [[name, r["role"], f"{r['stage_utilization']:.1%}",
             f"{r['kv_peak_tokens']:,} of {r['kv_capacity_tokens']:,}"]
            for name, r in list(result.regions.items())[:SHOWN_REGIONS]]
    lines += ["", narrow_table(["region", "role", "stage utilization", "KV tokens at peak"],
                               regs)]
    hidden = len(result.regions) - SHOWN_REGIONS
    if hidden > 0:
        lines.append(f"... and {hidden} more region{'s' if hidden > 1 else ''} (every region is "
                     "in --json and in metrics.json)")
    return "\n".join(lines)
