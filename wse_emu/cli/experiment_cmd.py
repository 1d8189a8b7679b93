"""``wse-emu experiment disagg``: colocated versus disaggregated serving at the same hardware and
the same token speed, each at the highest request rate that meets the latency targets."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

from compiler.mapper import compile_model
from compiler.options import CompileOptions
from compiler.partition import disaggregated_splits, wafers_needed
from wse_emu.cli.compile_cmd import add_fabric_args, fabric_from_args
from wse_emu.cli.fmt import seconds, si, table
from wse_emu.cli.serve_cmd import (
    cache_dir,
    check_micro_batches,
    handoff_rate,
    region_models,
    workload_of,
)
from wse_emu.errors import CompileError, UserError
from wse_emu.fabric import ClusterSpec
from wse_emu.model import ModelSpec, load_model
from wse_emu.program import write_run_dir
from wse_emu.runtime.ceiling import ceiling_rate
from wse_emu.runtime.experiment import (
    MAX_PACE,
    MAX_TTFT_SLOPE,
    Config,
    Outcome,
    Targets,
    compare,
    evaluate_job,
    outcomes,
    over_replicates,
    search_rates,
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
from wse_emu.runtime.serve import ServeOptions, kv_shortfall
from wse_emu.runtime.workload import Requests, generate, replicate

DEFAULT_BUDGETS = (64, 256)
DEFAULT_REQUESTS = 1000  # enough to load a cluster, few enough for a search of many runs


def add_parser(sub) -> None:
    p = sub.add_parser("experiment", help="experiments that answer a question end to end")
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
    d.add_argument("--budgets", default=",".join(map(str, DEFAULT_BUDGETS)),
                   help="chunked prefill token budgets to try, comma-separated")
    d.add_argument("--batch-limit", type=int, default=64, help="sequences per decode micro-batch")
    d.add_argument("--prefill-tile", default="64",
                   help="tokens per prefill micro-batch; several, comma-separated, are each "
                   "tried with every configuration but chunked prefill (default 64)")
    d.add_argument("--copies", default="1",
                   help="copies of the model per wafer to try colocated, comma-separated (side "
                   "by side in column bands; a model on one wafer only; default 1)")
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
    budgets = _budgets(args.budgets)
    tiles = _positive_ints(args.prefill_tile, "--prefill-tile")
    copies = _positive_ints(args.copies, "--copies")
    for tile in tiles:
        check_micro_batches(args.batch_limit, tile, budgets)
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
    requests = draws[0]
    for draw in draws:
        if draw.offered_rate() <= 0:
            raise UserError(f"workload {spec.name}: its first arrivals all come at one instant, "
                            "so it has no rate to scale; give it at least two distinct arrival "
                            "times")
    model = load_model(args.model)
    cluster = ClusterSpec(fabric_from_args(args), args.systems)
    described = (f"windows of {len(requests):,} requests of the trace, one after another"
                 if spec.arrival == "trace" else
                 f"seeds {spec.seed} to {spec.seed + args.seeds - 1}")

    def one(pool, draws, targets, cluster):
        data, configs = disagg_experiment(model, cluster, spec.name, draws[0], targets, pool,
                                          cache_dir(args.cache_dir), budgets, args.batch_limit,
                                          tiles, args.tolerance, _progress(args), draws[1:],
                                          copies, args.price_per_system_hour)
        if len(draws) > 1:
            data["over_replicates"]["draws"] = described
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
                                ClusterSpec(cluster.fabric, systems))
        except UserError as exc:
            rows.append({**row, "error": str(exc)})
            continue
        # One sequence's decode step on a colocated region (any region, if none compiled).
        unit = next((c for c in configs if c.plan == "colocated"), configs[0])
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


def disagg_experiment(model: ModelSpec, cluster: ClusterSpec, workload: str,
                      requests: Requests, targets: Targets, pool, cache: Path,
                      budgets=DEFAULT_BUDGETS, batch_limit: int = 64, prefill_tile=64,
                      tolerance: float = 0.05, progress=None,
                      more_draws: list[Requests] = (), copies=(1,),
                      price: float | None = None) -> tuple[dict, list[Config]]:
    """Build the configurations, search them on ``pool`` and compare: the JSON-able report,
    and the configurations compared. With ``more_draws`` (independent draws of the same
    workload) the whole search is repeated on each, and the report adds every draw's answer
    and the mean and 95% interval over all of them."""
    configs, skipped = build_configs(model, cluster, requests, budgets, batch_limit,
                                     prefill_tile, cache, progress, copies)
    data = {"model": model.name, "cluster": f"{cluster.systems} x {cluster.fabric.name}",
            "workload": workload, "requests_per_run": len(requests),
            "targets": {"ttft_p90_s": targets.ttft_s, "tpot_p90_s": targets.tpot_s,
                        "attainment": targets.attainment},
            "skipped": skipped, "system_power_w": cluster.fabric.system_power_w,
            **experiment(configs, requests, targets, pool, tolerance, progress,
                         cluster.systems, cluster.fabric.system_power_w, price)}
    if more_draws:
        reports = [data] + [experiment(configs, draw, targets, pool, tolerance, progress,
                                       cluster.systems, cluster.fabric.system_power_w, price)
                            for draw in more_draws]
        data["replicates"] = [{"configurations": r["configurations"],
                               "comparison": r["comparison"]} for r in reports]
        data["over_replicates"] = over_replicates(reports)
    return data, configs


def experiment(configs: list[Config], requests: Requests, targets: Targets, pool,
               tolerance: float = 0.05, progress=None, systems: int = 1,
               power_w: float = 0.0, price: float | None = None) -> dict:
    """Search every configuration on ``pool`` (see ``runtime.pool``) and compare the plans:
    a JSON-able report."""
    run_points = pool.bind(evaluate_job, (configs, requests, targets))
    searches = search_rates(configs, requests, targets, run_points, tolerance=tolerance,
                            progress=(lambda r, n: progress(f"search round {r}: {n} runs"))
                            if progress else None)
    results = outcomes(searches)
    rows = [_row(r, targets, len(s.points), systems, power_w, price)
            for r, s in zip(results, searches)]
    for row, config in zip(rows, configs):
        # At 100% busy stages: how close each configuration's best rate comes.
        row["ceiling_rate_per_s"] = ceiling_rate(config.regions, config.options, requests)
        row["share_of_ceiling"] = row["max_rate_per_s"] / row["ceiling_rate_per_s"]
    return {"configurations": rows,
            "comparison": compare(results, targets, systems),
            "points": {s.config.label: [_point(p) for _, p in sorted(s.points.items())]
                       for s in searches}}


def _point(p) -> dict:
    """One serving run of the search, for curves: its rate and what it achieved."""
    m = p.metrics
    return {"rate_per_s": p.rate, "met": p.met, "ttft_p90_s": m["ttft_s"]["p90"],
            "tpot_p90_s": m["tpot_s"]["p90"], "slo_attainment": m["slo_attainment"],
            "ttft_growth_s": m["ttft_growth_s"], "ttft_slope": m["ttft_slope"],
            "pace": m["pace"], "output_tokens_per_s": m["output_tokens_per_s"],
            "goodput_requests_per_s": m["goodput_requests_per_s"]}


def build_configs(model: ModelSpec, cluster: ClusterSpec, requests: Requests, budgets,
                  batch_limit: int, prefill_tiles, cache: Path, progress=None,
                  copies=(1,)) -> tuple[list[Config], list[str]]:
    """Colocated (prefill priority, interleaved, and chunked at each budget) at each number of
    ``copies`` of the model per wafer, and disaggregated at each split; every configuration
    but chunked prefill at each of ``prefill_tiles`` (chunked prefill sizes its chunks by its
    budget). A layout that does not compile, or whose regions cannot hold the longest
    request's KV cache, is skipped, with why (colocated with one copy must compile)."""
    tiles = (prefill_tiles,) if isinstance(prefill_tiles, int) else tuple(prefill_tiles)
    base = ServeOptions(batch_limit=batch_limit, prefill_tile=tiles[0],
                        clock_hz=cluster.fabric.clock_hz,
                        kv_bytes_per_token=model.kv_bytes_per_token())
    splits = disaggregated_splits(model, cluster)
    fabric = cluster.fabric
    span = wafers_needed(model, fabric)
    if not splits:
        raise UserError(f"{model.name} spans {span} x {fabric.name} per replica, so "
                        f"{cluster.systems} system(s) leave no prefill/decode split to compare: "
                        f"use --systems {2 * span} or more")
    plans, skipped = [], []
    for n in copies:
        if n == 1:
            plans.append(("colocated", "", {}))
        elif span > 1:
            skipped.append(f"colocated {n} copies: {model.name} spans {span} wafers of "
                           f"{fabric.name}, so a wafer holds no whole copy")
        elif n > fabric.width:
            skipped.append(f"colocated {n} copies: a wafer has only {fabric.width} columns")
        else:
            # n copies side by side, each a column band of every wafer.
            plans.append(("colocated", f"{n} copies", {"region": (fabric.width // n,
                                                                    fabric.height)}))
    for split in splits:
        if "prefill_share" in split:
            knob = f"share {split['prefill_share']:g}"
        else:
            n = split["prefill_systems"]
            knob = f"{n} prefill system{'s' if n > 1 else ''}"
        plans.append(("disaggregated", knob, split))

    def tiled(label: str, options: ServeOptions) -> list[tuple[str, ServeOptions]]:
        if len(tiles) == 1:
            return [(label, options)]
        return [(f"{label}, tile {t}".lstrip(", "), replace(options, prefill_tile=t))
                for t in tiles]

    configs = []
    for plan, knob, split in plans:
        if progress:
            progress(f"compiling and timing {plan} {knob}".rstrip())
        try:
            program = compile_model(model, cluster, CompileOptions(plan=plan, **split))
        except CompileError as exc:
            if plan == "colocated" and not split:
                raise
            skipped.append(f"{plan} {knob}".rstrip() + f": {' '.join(str(exc).split())}")
            continue
        short = kv_shortfall(requests, program.regions)
        if short:
            skipped.append(f"{plan} {knob}".rstrip() + f": {short}")
            continue
        regions = region_models(program, cache)
        if plan == "colocated":
            prefix = f"{knob}, " if knob else ""
            policies = tiled(f"{prefix}prefill priority", base)
            policies += tiled(f"{prefix}interleaved", replace(base, policy="interleaved"))
            policies += [(f"{prefix}chunked {b}", replace(base, policy="chunked",
                                                         token_budget=b)) for b in budgets]
            configs += [Config(plan, label, regions, options) for label, options in policies]
        else:
            handoff = replace(base, handoff_bytes_per_cycle=handoff_rate(program))
            configs += [Config(plan, label, regions, options)
                        for label, options in tiled(knob, handoff)]
    if not configs:
        raise UserError("no configuration holds the longest request's KV cache: "
                        + "; ".join(skipped))
    return configs, skipped


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
         price: float | None = None) -> dict:
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
                    "tpot_p90_s": m["tpot_s"]["p90"], "slo_attainment": m["slo_attainment"],
                    "decode_stall_per_token_s": m["decode_stall_per_token_s"],
                    "prefill_utilization": m["prefill_utilization"],
                    "decode_utilization": m["decode_utilization"],
                    "kv_peak_share": m["kv_peak_share"],
                    **economics(r.tokens_per_s, systems, power_w, price)})
    else:
        row["max_rate_per_s"] = 0.0
    return row


def render(data: dict) -> str:
    t = data["targets"]
    head = (f"{data['model']} on {data['cluster']}, workload {data['workload']} "
            f"({data['requests_per_run']:,} requests per run); targets: p90 TTFT <= "
            f"{seconds(t['ttft_p90_s'])}, p90 TPOT <= {seconds(t['tpot_p90_s'])}, "
            f">= {t['attainment']:.0%} of requests meeting both, counted from the "
            f"{WARMUP:.0%} to the {1 - DRAIN:.0%} point of arrivals, TTFT rising by at most "
            f"{MAX_TTFT_SLOPE:g} s per s of arrivals across them and their first tokens out "
            f"within {MAX_PACE:g}x the span they arrived in")
    energy = any("energy_per_output_token_j" in c for c in data["configurations"])
    rows = []
    for c in data["configurations"]:
        if "goodput_requests_per_s" not in c:
            rows.append([c["configuration"], "0", f"0 of {c['ceiling_rate_per_s']:.3g}"]
                        + ["-"] * (8 + energy) + [c["limited_by"]])
            continue
        rows.append([c["configuration"], f"{c['max_rate_per_system']:.3g}",
                     f"{c['share_of_ceiling']:.0%} of {c['ceiling_rate_per_s']:.3g}",
                     si(c["output_tokens_per_s_per_system"])]
                    + ([f"{c['energy_per_output_token_j']:.3g}"] if energy else [])
                    + [seconds(c["ttft_p90_s"]), seconds(c["tpot_p90_s"]),
                       seconds(c["decode_stall_per_token_s"]),
                       f"{c['prefill_utilization']:.0%}", f"{c['decode_utilization']:.0%}",
                       f"{c['goodput_requests_per_s']:.3g}", c["limited_by"]])
    lines = [head, "", table(["configuration", "goodput/s/system", "vs ceiling/s",
                              "tok/s/system"] + (["J/token"] if energy else [])
                             + ["p90 TTFT", "p90 TPOT", "stall/token", "prefill busy",
                                "decode busy", "on-target/s (makespan)", "next rate fails on"],
                             rows, "lrrr" + "r" * energy + "rrrrrrl")]
    lines += [f"skipped {s}" for s in data["skipped"]]
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
    best = {c["configuration"]: c for c in data["configurations"]}
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


def _positive_ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UserError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise UserError(f"{flag} must be one or more positive integers, got {text!r}")
    return tuple(dict.fromkeys(values))


def _budgets(text: str) -> tuple[int, ...]:
    try:
        budgets = tuple(int(b) for b in text.split(",") if b.strip())
    except ValueError:
        raise UserError(f"--budgets must be comma-separated integers, got {text!r}") from None
    if any(b < 1 for b in budgets):
        raise UserError(f"--budgets must be positive, got {text!r}")
    return budgets


def _progress(args):
    if args.json or not sys.stderr.isatty():
        return None
    return lambda message: print(message, file=sys.stderr)
