"""``wse-emu experiment disagg``: colocated versus disaggregated serving at the same hardware and
the same token speed, each at the highest request rate that meets the latency targets."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from compiler.mapper import compile_model
from compiler.options import CompileOptions
from compiler.partition import disaggregated_splits, wafers_needed
from wse_emu.cli.compile_cmd import add_fabric_args, fabric_from_args
from wse_emu.cli.fmt import seconds, si, table
from wse_emu.cli.serve_cmd import (
    cache_dir,
    check_micro_batches,
    handoff_links,
    region_models,
    workload_of,
)
from wse_emu.errors import CompileError, UserError
from wse_emu.fabric import ClusterSpec
from wse_emu.model import ModelSpec, load_model
from wse_emu.program import write_run_dir
from wse_emu.progress import status
from wse_emu.runtime.ceiling import ceiling_rate
from wse_emu.runtime.experiment import (
    MAX_PACE,
    MAX_TTFT_SLOPE,
    Config,
    Outcome,
    Search,
    Targets,
    compare,
    outcomes,
    over_replicates,
    run_searches,
)
from wse_emu.runtime.metrics import DRAIN, WARMUP
from wse_emu.runtime.pool import point_pool
from wse_emu.runtime.sensitivity import (
    VARIABLES,
    Variation,
    apply,
    decode_step_s,
    parse_vary,
)
from wse_emu.runtime.serve import POLICIES, ServeOptions, kv_shortfall
from wse_emu.runtime.tuning import Choice, Knob, Layout, config_of, evaluate_choice, tune
from wse_emu.runtime.workload import Requests, generate, replicate

DEFAULT_REQUESTS = 1000  # enough to load a cluster, few enough for a search of many runs
# The confirming runs stop growing here (a run of this many takes seconds to serve); the window
# they reach is reported.
MAX_CONFIRM_REQUESTS = 20_000


def add_parser(sub, summary: str) -> None:
    p = sub.add_parser("experiment", help=summary)
    kinds = p.add_subparsers(dest="experiment", metavar="EXPERIMENT")
    kinds.required = True
    d = kinds.add_parser("disagg", help="colocated versus disaggregated prefill and decode, at "
                         "the highest rate that meets the latency targets")
    d.add_argument("model", help="model preset, model YAML or Hugging Face config.json")
    add_fabric_args(d)
    d.add_argument("--systems", type=int, default=1, help="systems (wafers) in the cluster")
    src = d.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", help="workload preset or YAML")
    src.add_argument("--trace", help="CSV of arrived_at,num_prefill_tokens,num_decode_tokens")
    d.add_argument("--requests", type=int,
                   help=f"requests (sessions) per serving run (default: the workload's, at "
                   f"most {DEFAULT_REQUESTS})")
    d.add_argument("--ttft-slo", type=float, required=True, help="p90 time-to-first-token "
                   "target, seconds")
    d.add_argument("--tpot-slo", type=float, required=True, help="p90 time-per-output-token "
                   "target, seconds (the token speed every configuration must reach)")
    d.add_argument("--attainment", type=float, default=0.9,
                   help="share of requests that must meet both targets (default 0.9)")
    knobs = d.add_argument_group(
        "knobs", "values to tune each plan over, comma-separated (one value fixes the knob); "
        "the knobs are tuned one at a time, in this order, for both plans")
    space = Space()
    for flag, values, what in (
            ("--copies", space.copies, "copies of the model per wafer, colocated (side by side "
             "in column bands; a model on one wafer only)"),
            ("--prefill-tile", space.prefill_tiles, "tokens per prefill micro-batch (colocated "
             "with prefill priority or interleaved, and disaggregated prefill)"),
            ("--budgets", space.budgets, "chunked prefill token budgets"),
            ("--interleave", space.interleave, "decode micro-batches per prefill tile, "
             "interleaved"),
            ("--max-running", space.max_running, "cap on sequences holding KV in a colocated "
             "or decode region (0: none)"),
            ("--batch-limit", space.batch_limits, "sequences per decode micro-batch")):
        knobs.add_argument(flag, default=",".join(map(str, values)),
                           help=f"{what} (default {','.join(map(str, values))})")
    d.add_argument("--no-prefix-cache", action="store_true",
                   help="recompute every agentic call's whole context (by default a call "
                   "reuses its session's KV while it is still cached)")
    d.add_argument("--window-s", type=float, default=space.window_s,
                   help="after tuning, search each plan's best again on runs long enough that "
                   "the steady window holds this many emulated seconds at the rate found "
                   f"(default {space.window_s:g}; 0: no confirming runs)")
    d.add_argument("--seeds", type=int, default=1,
                   help="independent draws of the workload to repeat the whole search on "
                   "(the next seeds; for a trace, the next windows of --requests rows): with "
                   "2 or more, the mean and 95%% interval of every goodput and of the ratio")
    d.add_argument("--price-per-system-hour", type=float,
                   help="price of one system for an hour (any currency): adds the cost per "
                   "million output tokens at each plan's best (no default: none is published)")
    d.add_argument("--vary", metavar="NAME=V1,V2,...",
                   help="repeat the experiment at each value of one input and report how the "
                   "ratio moves: " + "; ".join(f"{k}: {v}" for k, v in VARIABLES.items()))
    d.add_argument("--tolerance", type=float, default=0.05,
                   help="stop a search when the failed rate is within this of the met one")
    where = d.add_mutually_exclusive_group()
    where.add_argument("--scheduler", help="dask scheduler address (default: a local cluster)")
    where.add_argument("--workers", type=int, default=0,
                       help="local worker processes (default: one per core; 1: no cluster)")
    d.add_argument("--cache-dir", help="where stage-time tables are kept")
    d.add_argument("-o", "--output", help="run directory: experiment.json (every search point)")
    d.add_argument("--viz", action="store_true",
                   help="draw the run directory (figures/, report.html) at the end")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=run)


def run(args):
    targets = _targets(args)
    space = Space(copies=_positive_ints(args.copies, "--copies"),
                  prefill_tiles=_positive_ints(args.prefill_tile, "--prefill-tile"),
                  budgets=_positive_ints(args.budgets, "--budgets"),
                  interleave=_positive_ints(args.interleave, "--interleave"),
                  max_running=_positive_ints(args.max_running, "--max-running", zero=True),
                  batch_limits=_positive_ints(args.batch_limit, "--batch-limit"),
                  prefix_cache=not args.no_prefix_cache, window_s=args.window_s)
    for limit in space.batch_limits:
        for tile in space.prefill_tiles:
            check_micro_batches(limit, tile, space.budgets)
    if args.window_s < 0:
        raise UserError(f"--window-s must be at least 0, got {args.window_s}")
    if args.requests is not None and args.requests < 2:
        raise UserError(f"--requests must be at least 2 (a rate needs two arrivals), got "
                        f"{args.requests}")
    if args.workers < 0:
        raise UserError(f"--workers must be at least 0, got {args.workers}")
    if args.price_per_system_hour is not None and not args.price_per_system_hour > 0:
        raise UserError(f"--price-per-system-hour must be positive, got "
                        f"{args.price_per_system_hour}")
    if args.seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {args.seeds}")
    if not 0 < args.tolerance < 1:
        raise UserError(f"--tolerance must be between 0 and 1, got {args.tolerance}")
    variation = parse_vary(args.vary) if args.vary else None
    out = Path(args.output) if args.output else None
    if out is not None and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"run directory {out} exists and is not empty: choose another -o")
    spec = workload_of(args.workload, args.trace, requests=args.requests)
    if args.requests is None:
        spec.requests = min(spec.requests, DEFAULT_REQUESTS)
    draws = [generate(replicate(spec, r, spec.requests)) for r in range(args.seeds)]
    for draw in draws:
        if draw.offered_rate() <= 0:
            raise UserError(f"workload {spec.name}: its first arrivals all come at one instant, "
                            "so it has no rate to scale; give it at least two distinct arrival "
                            "times")
    model = load_model(args.model)
    cluster = ClusterSpec(fabric_from_args(args), args.systems)
    # A trace's confirming windows share its rows, one window per draw.
    rows = len(generate(replace(spec, requests=0))) if spec.arrival == "trace" else None

    def one(pool, draws, targets, cluster, transform=lambda requests: requests):
        def longer(draw: int, n: int) -> Requests:
            if rows is not None:
                n = min(n, (rows - spec.skip) // args.seeds)
            return transform(generate(replace(replicate(spec, draw, n), requests=n)))
        data, configs = disagg_experiment(model, cluster, spec.name, draws[0], targets, pool,
                                          cache_dir(args.cache_dir), space, args.tolerance,
                                          _progress(args), draws[1:],
                                          args.price_per_system_hour, longer)
        if len(draws) > 1:
            sizes = sorted({r["requests_per_run"] for r in data["replicates"]})
            size = f"{sizes[0]:,}" if len(sizes) == 1 else f"{sizes[0]:,} to {sizes[-1]:,}"
            data["over_replicates"]["draws"] = (
                f"windows of {size} requests of the trace, one after another"
                if spec.arrival == "trace" else
                f"seeds {spec.seed} to {spec.seed + len(draws) - 1}")
        return data, configs

    with point_pool(args.scheduler, args.workers) as pool:
        if variation is None:
            data, _ = one(pool, draws, targets, cluster)
        else:
            data = vary_experiment(variation, one, pool, draws, targets, cluster)
    if args.output:
        write_run_dir(args.output, lambda tmp: (tmp / "experiment.json").write_text(
            json.dumps(data, indent=1)))
    if args.json:
        return data
    text = render(data) if variation is None else render_sensitivity(data)
    return text + (f"\n\nwrote {args.output}{os.sep} (experiment.json)" if args.output else "")


def vary_experiment(variation: Variation, one, pool, draws: list[Requests], targets: Targets,
                    cluster: ClusterSpec) -> dict:
    """``one(pool, draws, targets, cluster)`` at every value of ``variation``: each value's
    full report, and a row per value with the best of each plan, their ratio and the TPOT
    target in decode steps. A value the experiment cannot run (too few systems for a split)
    keeps its row, with why."""
    rows, runs = [], []
    for value in variation.values:
        varied = [apply(variation, value, d, targets, cluster.systems) for d in draws]
        v_targets, systems = varied[0][1], varied[0][2]
        row = {"value": value, "tpot_s": v_targets.tpot_s, "systems": systems}
        try:
            data, configs = one(pool, [v[0] for v in varied], v_targets,
                                ClusterSpec(cluster.fabric, systems),
                                lambda requests, value=value: apply(
                                    variation, value, requests, targets, cluster.systems)[0])
        except UserError as exc:
            rows.append({**row, "error": str(exc)})
            continue
        # One sequence's decode step on a colocated region (any region, if none compiled).
        unit = next((c for c in configs.values() if c.plan == "colocated"),
                    next(iter(configs.values())))
        step = decode_step_s(unit.regions, varied[0][0], cluster.fabric.clock_hz)
        cmp_ = data["comparison"]
        row.update(decode_step_s=step, tpot_in_decode_steps=v_targets.tpot_s / step,
                   colocated=cmp_.get("colocated"), disaggregated=cmp_.get("disaggregated"),
                   max_rate_per_system=cmp_.get("max_rate_per_system"),
                   goodput_ratio=cmp_.get("goodput_ratio"))
        if "over_replicates" in data:
            row["goodput_ratio_interval"] = data["over_replicates"]["goodput_ratio"]
        rows.append(row)
        runs.append({"value": value, **data})
    first = runs[0] if runs else {}
    return {"model": first.get("model"), "workload": first.get("workload"),
            "fabric": cluster.fabric.name, "vary": variation.name,
            "description": VARIABLES[variation.name], "sensitivity": rows, "runs": runs}


def render_sensitivity(data: dict) -> str:
    rows = []
    for r in data["sensitivity"]:
        if "error" in r:
            rows.append([f"{r['value']:g}", "-", "-", "-", "-", "-", r["error"]])
            continue
        rate = r["max_rate_per_system"] or {}
        ratio = r["goodput_ratio"]
        if "goodput_ratio_interval" in r and "half_width" in r["goodput_ratio_interval"]:
            iv = r["goodput_ratio_interval"]
            shown = f"{iv['mean']:.2f}x ({iv['low']:.2f} to {iv['high']:.2f})"
        else:
            shown = "-" if ratio is None else f"{ratio:.2f}x"
        rows.append([f"{r['value']:g}", seconds(r["tpot_s"]), f"{r['tpot_in_decode_steps']:.3g}",
                     f"{rate.get('colocated', 0):.3g}", f"{rate.get('disaggregated', 0):.3g}",
                     shown, f"{r['colocated'] or '-'} / {r['disaggregated'] or '-'}"])
    head = (f"{data['model']} on {data['fabric']}, workload {data['workload']}: the experiment "
            f"at each value of {data['vary']} ({data['description']})")
    return "\n".join([head, "", table(
        ["value", "TPOT target", "TPOT / decode step", "colocated goodput/s/system",
         "disaggregated goodput/s/system", "disaggregated / colocated", "best configurations"],
        rows, "rrrrrrl")])


@dataclass
class Space:
    """What the experiment tunes: the values to try of every knob (a single value fixes it),
    whether agentic calls reuse cached KV, and how long the confirming runs' steady windows
    must be (emulated seconds; 0: no confirming runs)."""

    copies: tuple = (1, 2, 4)
    prefill_tiles: tuple = (8, 16, 32, 64, 128, 256)
    budgets: tuple = (16, 32, 64, 128, 256, 512)
    interleave: tuple = (1, 2, 4)
    max_running: tuple = (0, 32, 128)
    batch_limits: tuple = (16, 32, 64)
    policies: tuple = POLICIES
    prefix_cache: bool = True
    window_s: float = 120.0

    def knobs(self, splits: list[str], copies: list[str]) -> dict:
        """Per plan, its knobs in the order they are tuned."""
        return {"colocated": [Knob("policy", "policy", self.policies),
                              Knob("copies per wafer", "layout", tuple(copies)),
                              Knob("prefill tile", "prefill_tile", self.prefill_tiles,
                                   ("prefill-priority", "interleaved")),
                              Knob("chunk budget", "token_budget", self.budgets, ("chunked",)),
                              Knob("interleave ratio", "interleave", self.interleave,
                                   ("interleaved",)),
                              Knob("running cap", "max_running", self.max_running),
                              Knob("decode batch limit", "batch_limit", self.batch_limits)],
                "disaggregated": [Knob("split", "layout", tuple(splits)),
                                  Knob("prefill tile", "prefill_tile", self.prefill_tiles),
                                  Knob("running cap", "max_running", self.max_running),
                                  Knob("decode batch limit", "batch_limit",
                                       self.batch_limits)]}

    def initial(self, plan: str, layout: str) -> Choice:
        """Where tuning starts: each knob's usual value if it is among those to try."""
        def pick(values, usual):
            return usual if usual in values else values[0]
        return Choice(plan, layout, policy=pick(self.policies, "prefill-priority"),
                      prefill_tile=pick(self.prefill_tiles, 64),
                      token_budget=pick(self.budgets, 256),
                      interleave=pick(self.interleave, 1),
                      max_running=pick(self.max_running, 0),
                      batch_limit=pick(self.batch_limits, 64))


def disagg_experiment(model: ModelSpec, cluster: ClusterSpec, workload: str,
                      requests: Requests, targets: Targets, pool, cache: Path,
                      space: Space = Space(), tolerance: float = 0.05, progress=None,
                      more_draws: list[Requests] = (), price: float | None = None,
                      longer=None) -> tuple[dict, dict]:
    """Compile the layouts, tune each plan on ``pool`` and compare: the JSON-able report, and every
    configuration searched (label -> Config). ``longer(draw, n)``: draw ``draw`` (0 for
    ``requests``) of the workload with ``n`` requests, for the confirming runs. With
    ``more_draws`` (independent draws of the same workload) the tuned configurations are
    searched again on each (the knobs are tuned on the first draw only), and the report adds
    every draw's answer and the mean and 95% interval over all of them."""
    draws = [requests, *more_draws]
    # Every request any run may serve must fit a layout's KV, the confirming runs' included.
    probes = draws + ([longer(r, MAX_CONFIRM_REQUESTS) for r in range(len(draws))]
                      if longer is not None and space.window_s > 0 else [])
    layouts, skipped = build_layouts(model, cluster, probes, cache, space.copies, progress)
    fabric = cluster.fabric
    base = ServeOptions(clock_hz=fabric.clock_hz, kv_bytes_per_token=model.kv_bytes_per_token(),
                        prefix_cache=space.prefix_cache)
    data = {"model": model.name, "cluster": f"{cluster.systems} x {fabric.name}",
            "workload": workload, "requests_per_run": len(requests),
            "targets": {"ttft_p90_s": targets.ttft_s, "tpot_p90_s": targets.tpot_s,
                        "attainment": targets.attainment},
            "prefix_cache": space.prefix_cache, "skipped": skipped,
            "system_power_w": fabric.system_power_w}
    names = {plan: [name for (p, name) in layouts if p == plan]
             for plan in ("colocated", "disaggregated")}
    knobs = space.knobs(names["disaggregated"], names["colocated"])
    initial = {plan: space.initial(plan, names[plan][0]) for plan in names if names[plan]}
    economy = (cluster.systems, fabric.system_power_w, price)
    run_points = pool.bind(evaluate_choice, (layouts, base, requests, targets))
    guess = {}
    for plan, choice in initial.items():  # start below the ceiling, where best rates sit
        config = config_of(choice, layouts, base)
        ceiling = ceiling_rate(config.regions, config.options, requests)
        guess[plan] = 0.6 * ceiling / requests.offered_rate()
    searches, steps, tuned = tune(initial, knobs, layouts, base, run_points, guess, tolerance,
                                  progress)
    data["configurations"] = [_row(o, targets, len(s.points), *economy, requests, s.config)
                              for o, s in zip(outcomes(list(searches.values())),
                                              searches.values())]
    data["tuning"] = [_step(s, searches, cluster.systems) for s in steps]
    data["points"] = {s.config.label: [_point(p) for _, p in sorted(s.points.items())]
                      for s in searches.values()}
    finals = [final(tuned, layouts, base, d, r, targets, pool, space, tolerance, progress,
                    economy, searches, longer) for r, d in enumerate(draws)]
    data.update(finals[0])
    if more_draws:
        data["replicates"] = [{"configurations": f["final"], "comparison": f["comparison"],
                               "requests_per_run": f["final_requests_per_run"]}
                              for f in finals]
        data["over_replicates"] = over_replicates(data["replicates"])
    return data, {s.config.label: s.config for s in searches.values()}


def final(tuned: dict, layouts: dict, base: ServeOptions, requests: Requests, draw: int,
          targets: Targets, pool, space: Space, tolerance: float, progress, economy,
          tuning: dict, longer=None) -> dict:
    """Each plan's tuned configuration on one draw: searched again on runs long enough for a
    steady window of ``space.window_s`` at the rates found (the confirming runs: sized by the
    rates tuning found, and lengthened while the rates they find leave the window short), or,
    without them, as tuning left it (``tuning``: the first draw's searches) or searched on this
    draw's ``requests``. Returns its rows and the comparison."""
    window = space.window_s if longer is not None else 0.0
    guess = {c: _rate_of(tuning, c) for c in tuned.values()}  # requests (sessions) per s
    if window <= 0 and draw == 0:
        searches, runs = {c: tuning[c] for c in tuned.values()}, requests
    else:
        n = len(requests)
        for _ in range(3):
            if window > 0:
                # The steady window is the middle of the arrivals (``metrics.steady_window``).
                wanted = int(np.ceil(max(guess.values()) * window / (1 - WARMUP - DRAIN)))
                n = max(n, min(MAX_CONFIRM_REQUESTS, wanted))
                runs = longer(draw, n)
            else:
                runs = requests
            searches = _search_again(tuned, layouts, base, runs, targets, pool, guess,
                                     tolerance, progress)
            reached = [s.points[s.best].metrics["window_s"] for s in searches.values()
                       if s.best is not None]
            longest = window <= 0 or len(runs) < n or n >= MAX_CONFIRM_REQUESTS
            if longest or min(reached, default=window) >= 0.9 * window:
                break
            guess = {c: _rate_of(searches, c) or guess[c] for c in tuned.values()}
    results = outcomes(list(searches.values()))
    return {"final": [_row(o, targets, len(s.points), *economy, runs, s.config)
                      for o, s in zip(results, searches.values())],
            "final_requests_per_run": len(runs),
            "confirmed": window > 0,
            "final_points": {s.config.label: [_point(p) for _, p in sorted(s.points.items())]
                             for s in searches.values()},
            "comparison": compare(results, targets, economy[0])}


def _search_again(tuned: dict, layouts: dict, base: ServeOptions, runs: Requests,
                  targets: Targets, pool, guess: dict, tolerance: float, progress) -> dict:
    """The tuned configurations' rate searches on ``runs``, started near ``guess``."""
    run_points = pool.bind(evaluate_choice, (layouts, base, runs, targets))
    searches = {c: Search(config_of(c, layouts, base),
                          start=guess[c] / runs.offered_rate() if guess[c] else None)
                for c in tuned.values()}
    run_searches(searches, run_points, tolerance=tolerance,
                 progress=(lambda r, n: progress(f"searching the best again: round {r}, "
                                                 f"{n} runs")) if progress else None)
    return searches


def _rate_of(searches: dict, choice) -> float:
    s = searches[choice]
    return s.points[s.best].rate if s.best is not None else 0.0


def _step(step, searches: dict, systems: int) -> dict:
    """A tuning step as reported: each value tried and its goodput per system."""
    def rate(c):
        return _rate_of(searches, c) / systems
    return {"plan": step.plan, "knob": step.knob,
            "tried": [{"value": v, "configuration": c.label, "max_rate_per_system": rate(c)}
                      for v, c in step.tried],
            "chosen": step.chosen.label, "chosen_value": next(
                v for v, c in step.tried if c == step.chosen),
            "before_per_system": rate(step.before) if step.before else None,
            "after_per_system": rate(step.chosen)}


def _point(p) -> dict:
    """One serving run of the search, for curves: its rate and what it achieved."""
    m = p.metrics
    return {"rate_per_s": p.rate, "met": p.met, "ttft_p90_s": m["ttft_s"]["p90"],
            "tpot_p90_s": m["tpot_s"]["p90"], "itl_p90_s": m["itl_s"]["p90"],
            "slo_attainment": m["slo_attainment"],
            "ttft_growth_s": m["ttft_growth_s"], "ttft_slope": m["ttft_slope"],
            "pace": m["pace"], "output_tokens_per_s": m["output_tokens_per_s"],
            "goodput_requests_per_s": m["goodput_requests_per_s"]}


def build_layouts(model: ModelSpec, cluster: ClusterSpec, probes: list[Requests], cache: Path,
                  copies=(1,), progress=None) -> tuple[dict, list[str]]:
    """Every layout to tune: colocated with each number of ``copies`` of the model per wafer
    (side by side in column bands), and disaggregated at each split. A layout that does not
    compile, or whose regions cannot hold the KV cache of the longest request of any of
    ``probes`` (every set of requests the experiment may serve), is skipped, with why
    (colocated with one copy must compile). Returns (plan, name) -> Layout, and the skipped."""
    fabric = cluster.fabric
    splits = disaggregated_splits(model, cluster)
    span = wafers_needed(model, fabric)
    if not splits:
        raise UserError(f"{model.name} spans {span} x {fabric.name} per replica, so "
                        f"{cluster.systems} system(s) leave no prefill/decode split to compare: "
                        f"use --systems {2 * span} or more")
    plans, skipped = [], []
    for n in sorted(set(copies) | {1}):
        name = f"{n} cop{'y' if n == 1 else 'ies'}"
        if n == 1:
            plans.append(("colocated", name, {}))
        elif span > 1:
            skipped.append(f"colocated {name}: {model.name} spans {span} wafers of "
                           f"{fabric.name}, so a wafer holds no whole copy")
        elif n > fabric.width:
            skipped.append(f"colocated {name}: a wafer has only {fabric.width} columns")
        else:
            plans.append(("colocated", name, {"region": (fabric.width // n, fabric.height)}))
    for split in splits:
        if "prefill_share" in split:
            name = f"share {split['prefill_share']:g}"
        else:
            n = split["prefill_systems"]
            name = f"{n} prefill system{'s' if n > 1 else ''}"
        plans.append(("disaggregated", name, split))
    layouts = {}
    for plan, name, split in plans:
        if progress:
            progress(f"compiling and timing {plan} {name}")
        try:
            program = compile_model(model, cluster, CompileOptions(plan=plan, **split))
        except CompileError as exc:
            if plan == "colocated" and not split:
                raise
            skipped.append(f"{plan} {name}: {' '.join(str(exc).split())}")
            continue
        short = next(filter(None, (kv_shortfall(r, program.regions) for r in probes)), None)
        if short:
            skipped.append(f"{plan} {name}: {short}")
            continue
        options = handoff_links(program) if plan == "disaggregated" else {}
        layouts[(plan, name)] = Layout(plan, name, region_models(program, cache), options)
    if not any(plan == "disaggregated" for plan, _ in layouts):
        raise UserError("no disaggregated split holds the longest request's KV cache: "
                        + "; ".join(skipped))
    return layouts, skipped


def economics(tokens_per_s: float, systems: int, power_w: float,
              price: float | None) -> dict:
    """Energy per output token (the systems' wall power over their output rate) and, given a
    price per system-hour, cost per million output tokens."""
    out = {}
    if tokens_per_s > 0 and power_w > 0:
        out["energy_per_output_token_j"] = systems * power_w / tokens_per_s
    if tokens_per_s > 0 and price is not None:
        out["cost_per_million_output_tokens"] = systems * price / 3600 / tokens_per_s * 1e6
    return out


def _row(r: Outcome, targets: Targets, runs: int, systems: int = 1, power_w: float = 0.0,
         price: float | None = None, requests: Requests | None = None,
         config: Config | None = None) -> dict:
    row = {"configuration": r.label, "plan": r.plan, "knob": r.knob, "runs": runs,
           "limited_by": r.limit(targets)}
    if r.best is not None:
        m = r.best.metrics
        row.update({"max_rate_per_s": r.best.rate,
                    "max_rate_per_system": r.best.rate / systems,
                    "goodput_requests_per_s": r.goodput,
                    "output_tokens_per_s": r.tokens_per_s,
                    "output_tokens_per_s_per_system": r.tokens_per_s / systems,
                    "window_requests": m["window_requests"], "window_s": m["window_s"],
                    "ttft_growth_s": m["ttft_growth_s"], "ttft_slope": m["ttft_slope"],
                    "pace": m["pace"], "ttft_p90_s": m["ttft_s"]["p90"],
                    "tpot_p90_s": m["tpot_s"]["p90"], "itl_p90_s": m["itl_s"]["p90"],
                    "slo_attainment": m["slo_attainment"],
                    "decode_stall_per_token_s": m["decode_stall_per_token_s"],
                    "prefill_utilization": m["prefill_utilization"],
                    "decode_utilization": m["decode_utilization"],
                    "kv_peak_share": m["kv_peak_share"],
                    **economics(r.tokens_per_s, systems, power_w, price)})
    else:
        row["max_rate_per_s"] = 0.0
        row["max_rate_per_system"] = 0.0
    if config is not None and requests is not None:
        # At 100% busy stages: how close the configuration's best rate comes.
        row["ceiling_rate_per_s"] = ceiling_rate(config.regions, config.options, requests)
        row["share_of_ceiling"] = row["max_rate_per_s"] / row["ceiling_rate_per_s"]
    return row


def render(data: dict) -> str:
    t = data["targets"]
    head = (f"{data['model']} on {data['cluster']}, workload {data['workload']}; targets: p90 "
            f"TTFT <= {seconds(t['ttft_p90_s'])}, p90 TPOT <= {seconds(t['tpot_p90_s'])}, "
            f">= {t['attainment']:.0%} of requests meeting both, counted from the "
            f"{WARMUP:.0%} to the {1 - DRAIN:.0%} point of arrivals, TTFT rising by at most "
            f"{MAX_TTFT_SLOPE:g} s per s of arrivals across them and their first tokens out "
            f"within {MAX_PACE:g}x the span they arrived in"
            + ("" if data.get("prefix_cache", True) else "; no prefix cache"))
    lines = [head, "", f"Tuning, knob by knob, on runs of {data['requests_per_run']:,} "
             "requests: goodput (highest rate met) per system of each value tried", "",
             render_tuning(data["tuning"])]
    lines += [f"skipped {s}" for s in data["skipped"]]
    windows = [c["window_s"] for c in data["final"] if "window_s" in c]
    runs = (f"searched again on runs of {data['final_requests_per_run']:,} requests"
            + (f" (steady windows of {min(windows):.3g} to {max(windows):.3g} s emulated at "
               "the rates found)" if windows else "")
            if data.get("confirmed") else "as tuned")
    lines += ["", f"Each plan's best, {runs}:", "", render_rows(data["final"])]
    cmp_ = data["comparison"]
    if "goodput_ratio" not in cmp_:
        missing = "colocated" if cmp_["colocated"] is None else "disaggregated"
        return "\n".join(lines + ["", f"No comparison: every {missing} configuration was "
                                       "skipped."])
    ratio, tokens = cmp_["goodput_ratio"], cmp_["tokens_per_s_ratio"]
    if ratio is not None:
        verdict = (f"{ratio:.2f}x the goodput (the highest rate with the targets met), "
                   f"{tokens:.2f}x the output tokens/s at that rate")
    elif cmp_["max_rate_per_system"]["disaggregated"] > 0:
        verdict = "no colocated configuration met the targets at any rate tried"
    else:
        verdict = "neither plan met the targets at any rate tried"
    if not all(cmp_["ceiling_found"].values()):
        verdict += (" (a best configuration met every rate tried, so its rate is only a floor: "
                    "more requests per run would load it further)")
    colocated = cmp_["colocated"].split(", ", 1)[1]
    lines += ["", f"Disaggregated ({cmp_['split']}) against the best colocated ({colocated}) "
              f"at the same TPOT target: {verdict}.", "Why:"]
    lines += [f"  - {reason}" for reason in cmp_["reasons"]]
    best = {c["configuration"]: c for c in data["final"]}
    if any("cost_per_million_output_tokens" in c for c in best.values()):
        lines += ["", "At each plan's best rate (energy from the systems' wall power"
                  + (f", {data['system_power_w']:g} W each" if data.get("system_power_w")
                     else ", not stated for this fabric") + "):"]
        for plan in ("colocated", "disaggregated"):
            c = best[cmp_[plan]]
            energy = c.get("energy_per_output_token_j")
            lines.append(f"  - {c['configuration']}: "
                         + (f"{energy:.3g} J per output token, " if energy else "")
                         + f"{c['cost_per_million_output_tokens']:.3g} per million output "
                           "tokens")
    if "over_replicates" in data:
        lines += [""] + render_replicates(data["over_replicates"])
    return "\n".join(lines)


def render_tuning(steps: list[dict]) -> str:
    """What each knob bought: per plan and knob, every value's goodput per system, the value
    kept, and the plan's goodput before and after."""
    rows = []
    for st in steps:
        tried = ", ".join(f"{_value(st['knob'], t['value'])} {t['max_rate_per_system']:.3g}"
                          for t in st["tried"])
        before = "-" if st["before_per_system"] is None else f"{st['before_per_system']:.3g}"
        rows.append([st["plan"], st["knob"], tried, _value(st["knob"], st["chosen_value"]),
                     f"{before} -> {st['after_per_system']:.3g}"])
    return table(["plan", "knob", "values tried: goodput/s/system", "kept", "goodput/s/system"],
                 rows, "lllll")


def _value(knob: str, value) -> str:
    if knob == "running cap" and value == 0:
        return "none"
    if knob == "interleave ratio":
        return f"{value}:1"
    return str(value).replace("-", " ")


def render_rows(configurations: list[dict]) -> str:
    energy = any("energy_per_output_token_j" in c for c in configurations)
    rows = []
    for c in configurations:
        ceiling = c.get("ceiling_rate_per_s")
        if "goodput_requests_per_s" not in c:
            rows.append([c["configuration"], "0", f"0 of {ceiling:.3g}" if ceiling else "-"]
                        + ["-"] * (9 + energy) + [c["limited_by"]])
            continue
        rows.append([c["configuration"], f"{c['max_rate_per_system']:.3g}",
                     f"{c['share_of_ceiling']:.0%} of {ceiling:.3g}" if ceiling else "-",
                     si(c["output_tokens_per_s_per_system"])]
                    + ([f"{c['energy_per_output_token_j']:.3g}"] if energy else [])
                    + [seconds(c["ttft_p90_s"]), seconds(c["tpot_p90_s"]),
                       seconds(c["itl_p90_s"]), seconds(c["decode_stall_per_token_s"]),
                       f"{c['prefill_utilization']:.0%}", f"{c['decode_utilization']:.0%}",
                       f"{c['goodput_requests_per_s']:.3g}", c["limited_by"]])
    return table(["configuration", "goodput/s/system", "vs ceiling/s", "tok/s/system"]
                 + (["J/token"] if energy else [])
                 + ["p90 TTFT", "p90 TPOT", "p90 ITL", "stall/token", "prefill busy",
                    "decode busy", "on-target/s (makespan)", "next rate fails on"],
                 rows, "lrrr" + "r" * energy + "rrrrrrrl")


def _interval(iv: dict, fmt) -> str:
    if iv["mean"] is None:
        return "-"
    if "half_width" not in iv:
        return fmt(iv["mean"])
    return f"{fmt(iv['mean'])} ({fmt(iv['low'])} to {fmt(iv['high'])})"


def render_replicates(over: dict) -> list[str]:
    """The mean and 95% interval over the draws, per configuration and of the ratio."""
    rows = [[c["configuration"], _interval(c["max_rate_per_system"], lambda v: f"{v:.3g}"),
             _interval(c["output_tokens_per_s_per_system"], si)]
            for c in over["configurations"]]
    ratio = over["goodput_ratio"]
    lines = [f"Over {over['replicates']} independent draws of the workload "
             f"({over.get('draws', 'each searched alone')}): mean (95% interval)", "",
             table(["configuration", "goodput/s/system", "tok/s/system"], rows, "lrr")]
    if ratio["mean"] is not None:
        lines += ["", "Disaggregated / colocated goodput: "
                  + _interval(ratio, lambda v: f"{v:.2f}x")
                  + f" over the {ratio['n']} draws where colocated met the targets at some rate."]
    return lines


def _targets(args) -> Targets:
    for name in ("ttft_slo", "tpot_slo"):
        value = getattr(args, name)
        if not value > 0:
            raise UserError(f"--{name.replace('_', '-')} must be positive, got {value}")
    if not 0 < args.attainment <= 1:
        raise UserError(f"--attainment must be in (0, 1], got {args.attainment}")
    return Targets(args.ttft_slo, args.tpot_slo, args.attainment)


def _positive_ints(text: str, flag: str, zero: bool = False) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UserError(f"{flag} must be comma-separated integers, got {text!r}") from None
    low = 0 if zero else 1
    if not values or any(v < low for v in values):
        what = "integers of at least 0" if zero else "positive integers"
        raise UserError(f"{flag} must be one or more {what}, got {text!r}")
    return tuple(dict.fromkeys(values))


def _progress(args):
    return status
