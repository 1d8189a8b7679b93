"""``wse-emu demo``: the main job end to end on embedded defaults.

Compiles Llama-3.1-8B onto one WSE-3, colocated and disaggregated, prints both compile
summaries, then simulates one decode step (batch 1, context 4096) on the colocated region and
on the disaggregated decode region, side by side with the compiler's bounds. It ends with the
disaggregation experiment on a chat-like workload at two per-user speeds: at a p90 TPOT of 5
ms, each configuration at the highest request rate that meets the latency targets (goodput);
at the model's published vendor speed, each plan's output tokens/s per system with 90% of
requests that fast (high-speed token capacity, the README's headline); and both ratios.
Every run is written as a run directory under ``--output``, drawn, and gathered into one
report.html. Last, a tiny model computes through its tiles on a 16x16 mesh, both ways, to show
that the tokens agree.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

from wse_emu import api
from wse_emu.cli.compile_cmd import render
from wse_emu.cli.experiment_cmd import render as render_experiment
from wse_emu.cli.main import in_flags
from wse_emu.errors import UserError
from wse_emu.experiments.comparison import ExperimentReport, Space
from wse_emu.experiments.draws import precision_text
from wse_emu.experiments.frontier import Rung, vendor_speed
from wse_emu.experiments.goodput import Targets
from wse_emu.experiments.intervals import has_interval
from wse_emu.experiments.spec import Execution, FrontierSpec, Hardware, Load, Speeds
from wse_emu.experiments.wafer_layouts import proposed_splits
from wse_emu.hardware.fabric import ClusterSpec, load_fabric
from wse_emu.models.layer import MicroBatch
from wse_emu.models.load import load_model
from wse_emu.rundir.directory import check_parent
from wse_emu.rundir.write import (
    TIMELINE_EVENTS,
    write_json,
    write_serve_outputs,
    write_step_outputs,
)
from wse_emu.serving.metrics import ServeReport, run_metrics
from wse_emu.serving.serve import serve
from wse_emu.serving.tables import default_cache_dir, grid_axes, table_path
from wse_emu.serving.workload import generate, workload_from_dict
from wse_emu.sim.functional.generate import DEFAULT_PREFILL_TILE
from wse_emu.sim.functional.timing import generation_time
from wse_emu.util.atomic import write_text
from wse_emu.util.fmt import narrow_table, number, seconds, si
from wse_emu.util.progress import clear, status
from wse_emu.visualize.report import write_report
from wse_emu.visualize.rundraw import draw_run
from wse_emu.visualize.serving import read_requests, tpot_side_by_side

DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_FABRIC = "wse3"
DECODE = MicroBatch("decode", batch=1, context=4096)
# Chat-like requests (lengths around the medians of the Azure 2023 conversation trace), few
# enough for the experiment to finish in minutes.
WORKLOAD = {"name": "demo-chat", "arrival": "poisson", "rate": 5.0, "requests": 300, "seed": 0,
            "prompt": {"kind": "lognormal", "median": 1020, "sigma": 0.8, "low": 16,
                       "high": 8192},
            "output": {"kind": "lognormal", "median": 129, "sigma": 0.9, "low": 1,
                       "high": 1000}}
# The README's targets: p90 TTFT 1 s; p90 TPOT 5 ms (200 tokens/s per user) for goodput, as
# DistServe reads a comparison; and the model's published vendor speed for high-speed token
# capacity, the frontier's headline (``experiments.frontier``).
TARGETS = Targets(ttft_s=1.0, tpot_s=0.005)
# A first look, done in about three minutes on two cores with nothing cached: both plans on one
# layout each (colocated with one copy of the model, disaggregated at the middle split the
# compiler proposes, each at the pipeline depth the compiler gives it), tuned over fewer values
# than ``experiment disagg`` tries by default (no running cap and a batch limit of 64 for both:
# on this workload the other values made no difference to either plan), their stage tables
# timed over the quick grid, and confirmed on runs whose steady windows hold a minute.
# ``experiment disagg`` searches every layout on the full grid.
SPACE = Space(copies=(1,), prefill_tile=(16, 64, 256), token_budget=(64, 256), interleave=(1, 2),
              max_running=(0,), batch_limit=(64,), window_s=60.0, grid="quick",
              splits="middle", layers_per_stage="own")
# The functional part: a model small enough to compute through every tile in a second.
FUNCTIONAL = {"model": "tiny", "fabric": "mesh16", "region": (8, 8), "prompt": [1, 2, 3, 4, 5],
              "new_tokens": 8}


PLAN = ("wse-emu demo: Llama-3.1-8B on one WSE-3, colocated and disaggregated. It compiles "
        "both layouts, simulates a decode step of each, runs a quick disaggregation experiment "
        "(one layout per plan, stage tables on the quick grid; both plans tuned, then each "
        "plan's best searched again on longer runs) at 5 ms per token and at the vendor's "
        "speed, computes a tiny model through the tiles, "
        "and draws a report: about three minutes on two cores with nothing cached. "
        "wse-emu experiment disagg searches every layout on the full grid.")
MARKER = ".wse-emu-demo"  # marks a directory as the demo's own, so a new demo may replace it
# The report's figures: (run, figure, caption).
GALLERY = (
    ("colocated-decode", "map_placement",
     "Colocated: where each pipeline stage sits on the wafer (one pixel per PE)"),
    ("colocated-decode", "map_sram_total", "Colocated: share of each PE's SRAM in use"),
    ("colocated-decode", "map_compute",
     "Colocated decode step: each PE's busy cycles over its stage's cycles"),
    ("colocated-decode", "map_links_max",
     "Colocated decode step: wavelets per cycle on each PE's busiest link"),
    ("disaggregated-decode", "map_placement",
     "Disaggregated: the prefill and decode regions and their stages"),
    ("disaggregated-decode", "map_compute",
     "Disaggregated decode step: each PE's busy cycles over its stage's cycles"),
    ("colocated-decode", "roofline", "Roofline of one layer's ops, prefill and decode"),
    ("experiment", "throughput_vs_tpot",
     "The experiment: output tokens/s against p90 TPOT, each plan's best"),
    ("experiment", "attainment_vs_rate",
     "The experiment: share of requests meeting both targets against request rate"),
    ("experiment", "tpot_side_by_side",
     "TPOT over time, each plan's best side by side at twice colocated's best rate"),
    ("colocated-serve", "pipeline", "A window of the colocated pipeline, stage by stage"),
    ("disaggregated-serve", "pipeline",
     "A window of the disaggregated pipelines, stage by stage"))


def add_parser(sub, summary: str) -> None:
    p = sub.add_parser("demo", help=summary)
    p.add_argument("--json", action="store_true", help="machine-readable summaries on stdout")
    p.add_argument("--cache-dir", help="where stage-time tables are kept")
    p.add_argument("-o", "--output", default="wse-emu-demo",
                   help="where the demo's runs and report.html go (default ./wse-emu-demo)")
    p.set_defaults(func=run)


def run(args):
    out = Path(args.output)
    here = Path.cwd().resolve()
    if out.resolve() in (here, *here.parents):
        raise UserError(f"-o {out} would replace the directory the demo runs in: choose another")
    if out.exists() and not (out / MARKER).exists() and (not out.is_dir()
                                                         or any(out.iterdir())):
        raise UserError(f"{out} exists and is not an earlier demo's output: choose another -o")
    check_parent(out)  # before any work, not after it
    # Each section is printed as soon as it is ready (with --json, everything at the end).
    show = (lambda text: None) if args.json else _show
    show(PLAN)
    model = load_model(DEFAULT_MODEL)
    cluster = ClusterSpec(load_fabric(DEFAULT_FABRIC), 1)
    status("compiling Llama-3.1-8B onto one WSE-3, colocated and disaggregated")
    programs = {plan: api.compile(model, cluster.fabric, cluster.systems, plan=plan)
                for plan in ("colocated", "disaggregated")}
    show(_compiled(programs))
    status("simulating one decode step of each plan")
    runs, cpu = {}, {}
    for plan, region in (("colocated", "mixed0"), ("disaggregated", "decode0")):
        began = time.process_time()  # every thread's: the stages run on several
        runs[plan] = api.run(programs[plan], "decode", batch=DECODE.batch,
                             context=DECODE.context, region=region)
        cpu[plan] = time.process_time() - began
    show(_decode_steps(programs, runs))
    cache = default_cache_dir(args.cache_dir)
    show(_table_estimate(model, cluster, programs, min(cpu.values()), cache))
    exp, fast, side, precision = _experiment(model, cluster, cache)
    show("The disaggregation experiment (wse-emu experiment disagg)\n" + render_experiment(exp))
    show(_answer(exp, fast) + (f"\n  {precision}" if precision else ""))
    status("drawing the report")
    report = _write_runs(out, programs, runs, exp, fast, side)
    status("computing a tiny model through the tiles")
    generated = _generate()
    if args.json:
        steps = {plan: {"region": r.region, "step_seconds": r.step_seconds,
                        "tokens_per_s_alone": r.latency_tokens_per_s(),
                        "tokens_per_s_pipelined": r.tokens_per_s()} for plan, r in runs.items()}
        return {"compile": {plan: p.summary for plan, p in programs.items()},
                "decode_step": steps, "experiment": exp.to_json(),
                "at_vendor_speed": None if fast is None else fast.to_json(),
                "generate": generated,
                "report": str(report)}
    f = FUNCTIONAL
    show(f"Computed through the tiles (wse-emu generate): {f['model']} with random "
         f"weights, {'x'.join(map(str, f['region']))} regions of {f['fabric']}, prompt "
         f"{','.join(map(str, f['prompt']))}\n" + narrow_table(
             ["plan", "regions", "generated ids", "first token", "then per token"],
             [[g["plan"], g["regions"], ",".join(map(str, g["generated_ids"])),
               seconds(g["first_token_s"]), seconds(g["per_token_s"])]
              for g in generated], "lllrr"))
    return f"report: {report} (figures of every run in {out}{os.sep})"


def _show(text: str) -> None:
    clear()
    print(in_flags(text, {}) + "\n", flush=True)  # the library's `names` as plain names


def _compiled(programs: dict) -> str:
    rows = []
    for plan, p in programs.items():
        for r in p.summary["regions"]:
            rows.append([plan, r["name"], f"{r['pes']:,}", r["stages"],
                         f"{r['kv_capacity_tokens']:,}",
                         seconds(r["bounds"]["prefill"]["pipeline_latency_s"]),
                         seconds(r["bounds"]["decode"]["pipeline_latency_s"])])
    parts = [render(p) for p in programs.values()]
    parts.append("Colocated versus disaggregated on the same wafer (compiler's lower bounds)\n"
                 + narrow_table(["plan", "region", "PEs", "stages", "KV tokens",
                                 "prefill latency", "decode latency"], rows, "llrrrrr"))
    return "\n\n".join(parts)


def _decode_steps(programs: dict, runs: dict) -> str:
    sim = []
    for plan, run_ in runs.items():
        bound = programs[plan].summary["bounds"][run_.region]["decode"]
        sim.append([plan, run_.region, seconds(run_.step_seconds),
                    seconds(bound["pipeline_latency_s"]), si(run_.latency_tokens_per_s()),
                    si(run_.tokens_per_s()), f"{run_.compute_utilization():.1%}"])
    return "One decode step (batch 1, context 4096) on the fast engine\n" + narrow_table(
        ["plan", "region", "step", "bound", "tok/s alone", "tok/s pipelined", "compute util"],
        sim, "llrrrrr")


def _table_estimate(model, cluster, programs: dict, cpu_per_shape: float, cache: Path) -> str:
    """What the experiment will time before it can serve, and about how long that takes here:
    every layout it tunes needs a table of stage times over a grid of micro-batch shapes, each
    shape costing about the processor time of a decode step (the cheaper of the two just timed:
    the first may include compiling the engine), shared among the cores."""
    colocated = programs["colocated"]
    if table_path(colocated, "mixed0", "decode", cache,
                  axes=grid_axes(SPACE.grid, "decode")).exists():
        return f"Stage-time tables: cached in {cache} from an earlier run."
    layouts = len(set(SPACE.copies) | {1}) + len(proposed_splits(model, cluster, SPACE.splits))
    shapes = layouts * sum(len(a) * len(b) for a, b in (grid_axes(SPACE.grid, "decode"),
                                                          grid_axes(SPACE.grid, "prefill")))
    cores = os.cpu_count() or 1
    minutes = shapes * cpu_per_shape / cores / 60
    return (f"Stage-time tables: not cached yet. The experiment times {layouts} layouts, "
            f"{shapes} micro-batch shapes in all, at about {cpu_per_shape:.1f} s of processor "
            f"time each on {cores} cores: about {max(minutes, 0.1):.1f} minutes, once (they are "
            f"then kept in {cache}).")


def _generate() -> list[dict]:
    """Greedy tokens of the tiny model, colocated and disaggregated, with emulated times."""
    f = FUNCTIONAL
    out = []
    for plan in ("colocated", "disaggregated"):
        program = api.compile(f["model"], f["fabric"], plan=plan, region=f["region"])
        result = api.generate(program, f["prompt"], f["new_tokens"], weights_seed=0)
        timing = generation_time(program, result.prefill_region, result.decode_region,
                                 len(f["prompt"]), f["new_tokens"], DEFAULT_PREFILL_TILE)
        later = timing.per_token[1:]
        regions = result.prefill_region + ("" if not result.disaggregated
                                           else f" -> {result.decode_region}")
        out.append({"plan": plan, "regions": regions, "generated_ids": result.generated_ids,
                    "first_token_s": timing.first_token_s,
                    "per_token_s": sum(later) / len(later)})
    return out


def _experiment(model, cluster, cache: Path) -> tuple:
    """The experiment's report at the 5 ms target, the answer at the vendor's speed (the
    frontier's headline rung: the same experiment at a p90 TPOT of one token at that speed,
    its serving runs shared with the first), and the best colocated and disaggregated
    configurations at 5 ms served side by side at twice the colocated one's highest rate:
    label -> (result, requests); and a sentence on the draws the answer took (draws are added
    until the headline's ratio is within the default precision)."""
    workload = workload_from_dict(WORKLOAD, "the demo's workload")
    slow = 1.0 / TARGETS.tpot_s  # tokens/s per user at the goodput target
    vendor = vendor_speed(model.name)  # None: no speed published for it, one target only
    fast_speed = None if vendor is None else vendor.tokens_per_s
    # Both speeds are rungs of one frontier, without the step-time leaning.
    report = api.frontier(FrontierSpec(
        model, Load(workload), TARGETS.ttft_s, TARGETS.attainment,
        Speeds((slow,), fast_speed, ()), Hardware(cluster.fabric, cluster.systems), SPACE,
        Execution(cache_dir=cache, progress=status)))
    exp = report.experiments[f"{slow:g}"]
    fast = next((row for row in report.rungs if row.user_speed == fast_speed), None)
    best = exp.rows()
    cmp_ = exp.comparison
    side = {}
    if cmp_.compared:
        requests = generate(workload)
        rate = 2 * best[cmp_.colocated].max_rate_per_s or WORKLOAD["rate"]
        faster = requests.faster(rate / requests.offered_rate())
        for label in (cmp_.colocated, cmp_.disaggregated):
            config = exp.configs[label]
            options = replace(config.options, timeline_events=TIMELINE_EVENTS)
            side[f"{label} at {number(rate)}/s"] = (serve(faster, config.regions, options), faster)
    return exp, fast, side, precision_text(report.precision)


def _answer(exp: ExperimentReport, fast: Rung | None) -> str:
    """The answer both ways, each named for what it measures: high-speed token capacity at the
    vendor's speed (the README's headline; ``fast`` None where the model has none published),
    and goodput at the 5 ms target."""
    def ratio(value, iv: dict | None = None) -> str:
        if value is None:
            return "none (neither plan reached it)"
        if value == "unbounded":
            return "unbounded (only disaggregated reached it)"
        if has_interval(iv):
            return f"{value:.2f}x (95% interval {iv['low']:.2f}x to {iv['high']:.2f}x)"
        return f"{value:.2f}x"
    over = exp.over_replicates or {}
    slow_iv = over.get("goodput_ratio")
    slow = slow_iv["mean"] if has_interval(slow_iv) else exp.comparison.goodput_ratio
    goodput = (f"  at {1 / TARGETS.tpot_s:,.0f} tokens/s per user (p90 TPOT <= "
               f"{seconds(TARGETS.tpot_s)}): goodput, the highest request rate meeting both "
               f"targets: disaggregated / colocated {ratio(slow, slow_iv)}")
    if fast is None:
        return (f"The answer on this workload (no vendor speed is published for {exp.model}, "
                f"so one way)\n{goodput}")
    capacity = fast.capacity_ratio.ratio
    per_system = ", ".join(f"{plan} {si(p.tokens_per_s_per_system)}"
                           for plan, p in fast.plans.items())
    lines = [
        "The answer on this workload, two ways (experiment frontier reads both; the README "
        "leads with the first)",
        f"  at the vendor's speed, {fast.user_speed:,.0f} tokens/s per user (p90 TPOT <= "
        f"{seconds(fast.tpot_target_s)}): high-speed token capacity, output tokens/s per "
        f"system with 90% of requests that fast ({per_system}): disaggregated / colocated "
        f"{ratio(capacity, fast.capacity_ratio.interval)}", goodput]
    if isinstance(capacity, float) and slow is not None:
        pays = [name for name, r in (("at the vendor's speed", capacity),
                                     (f"at {seconds(TARGETS.tpot_s)}", slow)) if r > 1]
        # Why, where the two speeds disagree as the model's pipelines make them: a colocated
        # copy's tokens wait behind prompts, which costs more the faster they must come.
        why = (": the faster the per-user speed, the less load colocated serving takes "
               "before its tokens wait behind prompts" if capacity > 1 >= slow else "")
        lines.append("  Disaggregation pays " + (" and ".join(pays) if pays else "at neither")
                     + why + ".")
    return "\n".join(lines)


def _write_runs(out: Path, programs: dict, runs: dict, exp: ExperimentReport,
                fast: Rung | None, side: dict) -> Path:
    """The decode steps and the experiment as run directories under ``out``, each drawn, and
    one report.html with the main figures; ``out`` is replaced only once all is written."""
    staging = out.parent / f".{out.name}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        write_text(staging / MARKER, "written by wse-emu demo\n")
        for plan, r in runs.items():
            sub = staging / f"{plan}-decode"
            sub.mkdir()
            write_step_outputs(sub, programs[plan], r)
            draw_run(sub, ("maps", "roofline"))
        (staging / "experiment").mkdir()
        write_json(staging / "experiment", "experiment.json", exp.to_json())
        draw_run(staging / "experiment", ("experiment",))
        served = {}
        for n, (label, (result, reqs)) in enumerate(side.items()):
            sub = staging / ("colocated-serve", "disaggregated-serve")[n]
            sub.mkdir()
            report = ServeReport({"ttft_s": TARGETS.ttft_s, "tpot_s": TARGETS.tpot_s},
                                 run_metrics(result, reqs, TARGETS.ttft_s, TARGETS.tpot_s),
                                 result.regions, configuration=label)
            write_serve_outputs(sub, result, reqs, report)
            draw_run(sub, ("serving",))
            served[label] = read_requests(sub / "requests.csv")
        if served:
            tpot_side_by_side(served, {"tpot_s": TARGETS.tpot_s},
                              staging / "experiment" / "figures" / "tpot_side_by_side")
        figures = [(staging / d / "figures" / f"{name}.png", caption)
                   for d, name, caption in GALLERY]
        config = [("model", DEFAULT_MODEL), ("fabric", f"1 x {DEFAULT_FABRIC}"),
                  ("decode step", "batch 1, context 4096"),
                  ("experiment workload", f"{WORKLOAD['name']}, {WORKLOAD['requests']} requests"),
                  ("targets", f"p90 TTFT <= {seconds(TARGETS.ttft_s)}, p90 TPOT <= "
                              f"{seconds(TARGETS.tpot_s)}")]
        ratio = exp.comparison.goodput_ratio
        metrics = [(f"{plan} decode step", seconds(r.step_seconds)) for plan, r in runs.items()]
        capacity = None if fast is None else fast.capacity_ratio.ratio
        if isinstance(capacity, float):
            metrics.append((f"disaggregated / colocated high-speed token capacity at "
                            f"{fast.user_speed:,.0f} tokens/s per user", f"{capacity:.2f}x"))
        if ratio is not None:
            metrics.append((f"disaggregated / colocated goodput (highest rate met) at p90 TPOT "
                            f"{seconds(TARGETS.tpot_s)}", f"{ratio:.2f}x"))
        write_report(staging / "report.html", "wse-emu demo: Llama-3.1-8B on one WSE-3",
                     config, metrics, [(f, c) for f, c in figures if f.exists()])
        if out.is_dir():  # an earlier demo's (checked before any work)
            shutil.rmtree(out)
        staging.replace(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out / "report.html"
