"""``wse-emu run``: one prefill or decode step of a compiled program on the simulator."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from wse_emu import api
from wse_emu.cli.compile_cmd import add_cluster_args, compile_from_args
from wse_emu.errors import UserError
from wse_emu.models.routing import Routing, routing_for, routing_of
from wse_emu.program.format import WaferProgram
from wse_emu.rundir.directory import write_run_dir
from wse_emu.rundir.write import write_handoff, write_step_outputs
from wse_emu.sim.runner import (
    DEFAULT_PREFILL_TILES,
    RegionRun,
)
from wse_emu.util.fmt import seconds, si, table
from wse_emu.util.progress import Phase


def add_parser(sub, summary: str) -> None:
    p = sub.add_parser("run", help=summary)
    p.add_argument("target", help="a run directory from 'wse-emu compile -o', or a MODEL to "
                   "compile first with the cluster options below")
    add_cluster_args(p)
    p.add_argument("--phase", choices=["prefill", "decode", "handoff"], default="decode",
                   help="handoff: move a prompt's KV cache from a prefill to a decode region")
    p.add_argument("--tokens", type=int, default=4096, help="prefill: prompt tokens S")
    p.add_argument("--tiles", type=int, default=DEFAULT_PREFILL_TILES,
                   help="prefill: token tiles streamed through each stage")
    p.add_argument("--batch", type=int, default=1, help="decode: sequences B")
    p.add_argument("--context", type=int, default=4096, help="decode: cached tokens L")
    p.add_argument("--draft-tokens", type=int, default=0, metavar="K",
                   help="decode: time speculative decoding's verify step, each sequence's "
                   "next token and K drafted after it (K+1 tokens per sequence)")
    p.add_argument("--engine", choices=["fast", "cycle"], default="fast")
    p.add_argument("--region-name", dest="run_region", metavar="NAME",
                   help="region to run (default: the first of the phase's role)")
    p.add_argument("--no-reuse", action="store_true",
                   help="simulate every stage, not one per distinct shape")
    p.add_argument("-o", "--output", help="write per-PE and per-link counters, results and a "
                   "timeline to this run directory")
    p.add_argument("--viz", action="store_true",
                   help="draw the run directory (figures/, report.html) at the end")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run, writes_run_dir=True)


def load_or_compile(args) -> WaferProgram:
    target = Path(args.target)
    if target.is_dir() and (target / "program.json").exists():
        return with_step_options(WaferProgram.load(target), args)
    if target.is_dir():
        raise UserError(f"{target}: no program.json (compile one with 'wse-emu compile -o')")
    args.model = args.target
    return compile_from_args(args)


def with_step_options(program: WaferProgram, args) -> WaferProgram:
    """A compiled program timed under the routing and the attention tiles the flags state
    (neither moves a weight, so a run directory's program takes them as it is)."""
    for flag, field in (("--weight-format", "weight_format"),
                        ("--expert-weight-format", "expert_weight_format")):
        given = getattr(args, field)
        if given is not None and given != getattr(program.model.storage, field):
            raise UserError(f"{flag} {given}: the program in {args.target} stores its weights "
                            f"as {getattr(program.model.storage, field)}; compile it again with "
                            f"{flag} {given}")
    changed = {}
    if routing_for(program.model, args.routing, args.routing_seed) != Routing():
        changed.update(routing=args.routing, routing_seed=args.routing_seed)
    if args.attention_tile is not None:
        changed["attention_tile"] = args.attention_tile
    if changed:  # checked as the options check them, by name
        program.options = replace(program.options, **changed)
    return program


def run_handoff(args, program: WaferProgram):
    h = api.handoff(program, args.tokens, args.run_region)
    if args.output:
        write_run_dir(args.output, lambda tmp: write_handoff(tmp, program, h))
    if args.json:
        return h.to_json()
    route = "the off-wafer link" if h.offwafer else "the wafer's fabric"
    return (f"{h.model}: KV cache of a {h.tokens}-token prompt, {h.kv_bytes / 1e6:.1f} MB, "
            f"from {h.prefill_region} to {h.decode_region} over {route}\n"
            f"  {h.cycles:,} cycles = {seconds(h.seconds)} "
            f"({si(h.kv_bytes / h.seconds, 'B/s')})")


def run(args):
    if args.attention_tile and args.phase != "decode":
        raise UserError(f"--attention-tile tiles a decode step's attention; a {args.phase} step "
                        "has none to tile (--tiles splits a prefill)")
    if args.draft_tokens and args.phase != "decode":
        raise UserError(f"--draft-tokens times a decode's verify step; a {args.phase} step "
                        "verifies no drafted tokens")
    program = load_or_compile(args)
    if args.phase == "handoff":
        return run_handoff(args, program)
    bar = None

    def progress(done, total):
        nonlocal bar
        bar = bar or Phase(f"simulating the {args.phase} step's stages", total)
        bar.update(done)
    result = api.run(program, args.phase, batch=args.batch, context=args.context,
                     tokens=args.tokens, tiles=args.tiles, draft_tokens=args.draft_tokens,
                     region=args.run_region,
                     engine=args.engine, reuse=not args.no_reuse, progress=progress)
    if args.output:
        write_run_dir(args.output, lambda tmp: write_step_outputs(tmp, program, result))
    if args.json:
        return result.to_json()
    return render(result, args.output)


def render(run: RegionRun, output: str | None) -> str:
    program = run.program
    routing = routing_of(program.options).describe() if program.model.is_moe else None
    slowest = run.stages[run.bottleneck]
    lines = [
        f"{program.model.name} on {program.systems} x {program.fabric.name}, region "
        f"{run.region}: {run.describe()}, {run.engine} engine"
        + (f", {routing}" if routing else ""),
        f"  step                 {run.step_cycles:,.0f} cycles = {seconds(run.step_seconds)}",
        f"  tokens/s             {si(run.latency_tokens_per_s())} for one micro-batch alone, "
        f"{si(run.tokens_per_s())} with the pipeline full"
        + (" (every token checked, accepted or not)" if run.step.drafted else ""),
        f"  bottleneck           stage {slowest.stage}: {slowest.cycles:,} cycles",
        *([f"  beside a draft       {program.draft.model.name} on a strip of "
           f"{program.summary['draft']['strip_columns']} columns; the step is the target's "
           "alone (serve times the draft's steps with it)"] if program.draft else []),
        f"  utilization          compute {run.compute_utilization():.1%}, links "
        f"{run.link_utilization():.1%}",
        f"  simulated            {run.simulated} distinct stage shapes of "
        f"{len(run.stages)} (the others repeat one of them)",
    ]
    ex = run.experts()
    if ex:
        lines.append(f"  experts              {ex['active_experts']} of {ex['experts']} receive "
                     f"tokens in a layer (busiest {ex['busiest_tokens']}, mean "
                     f"{ex['mean_tokens_per_active_expert']:.1f}); expert PEs compute "
                     f"{ex['expert_pe_utilization']:.1%} of the step")
    cb = run.compiled_bounds()
    if cb:
        lines.append(f"  compiler's bounds    {cb['workload']}: pipeline latency >= "
                     f"{seconds(cb['pipeline_latency_s'])}, slowest stage >= "
                     f"{cb['bottleneck_cycles']:,.0f} cycles")
    rows = []
    stages = run.stages
    shown = stages if len(stages) <= 8 else stages[:3] + [None] + stages[-3:]
    for s in shown:
        if s is None:
            rows.append(["..."] + [""] * 5)
            continue
        busiest = max(s.kernel_busy, key=s.kernel_busy.get)
        rows.append([s.stage, program.stages[s.stage].describe_layers(), f"{s.cycles:,}",
                     f"{s.compute_utilization():.1%}", busiest,
                     "" if s.reused_from is None else f"= stage {s.reused_from}"])
    lines += ["", table(["stage", "layers", "cycles", "compute util", "busiest kernel",
                         "timed as"], rows, "lrrrll")]
    if output:
        lines += ["", f"wrote {output}{os.sep} (results.json, counters.npz, timeline.json, "
                  "program.json, program.npz)"]
    return "\n".join(lines)
