"""``wse-emu experiment disagg``: colocated versus disaggregated serving at the same hardware and
the same token speed, each at the highest request rate that meets the latency targets."""

from __future__ import annotations

import os

from wse_emu import api
from wse_emu.cli.compile_cmd import (
    add_fabric_args,
    add_format_args,
    fabric_from_args,
    model_from_args,
)
from wse_emu.cli.knob_args import add_space_args, space_settings
from wse_emu.errors import UserError
from wse_emu.experiments.comparison import (
    TUNING_REQUESTS,
    ExperimentReport,
    Space,
    StepTiming,
    VaryReport,
)
from wse_emu.experiments.frontier import CapacityRatio, FrontierPoint, FrontierReport, Rung
from wse_emu.experiments.goodput import MAX_PACE, MAX_TTFT_SLOPE, PERCENTILES, ConfigRow, Targets
from wse_emu.experiments.sensitivity import VARIABLES
from wse_emu.experiments.spec import (
    Counting,
    Execution,
    ExperimentSpec,
    FrontierSpec,
    Hardware,
    Load,
    PairingsSpec,
    Speeds,
    WaferTiming,
)
from wse_emu.models.routing import routing_for
from wse_emu.rundir.directory import write_run_dir
from wse_emu.rundir.write import write_json
from wse_emu.serving.metrics import DRAIN, WARMUP
from wse_emu.serving.workload import trace_names
from wse_emu.util.fmt import duration, narrow_table, number, seconds
from wse_emu.util.progress import status


def add_parser(sub, summary: str) -> None:
    p = sub.add_parser("experiment", help=summary)
    kinds = p.add_subparsers(dest="experiment", metavar="EXPERIMENT")
    kinds.required = True
    d = kinds.add_parser("disagg", help="colocated versus disaggregated prefill and decode, at "
                         "the highest rate that meets the latency targets")
    _add_common(d)
    d.add_argument("--tpot-slo", dest="tpot_s", type=float, required=True,
                   help="time-per-output-token target at --slo-percentile, seconds (the token "
                        "speed every configuration must reach)")
    d.add_argument("--slo-percentile", dest="percentile", type=int, default=90,
                   choices=PERCENTILES,
                   help="the percentile of requests both targets hold at (default 90; 50: "
                        "the typical request, as a planner's steady state reads it; 99: "
                        "MLPerf's)")
    d.add_argument("--price-per-system-hour", type=float,
                   help="price of one system for an hour (any currency): adds the cost per "
                   "million output tokens at each plan's best (no default: none is published)")
    d.add_argument("--vary", metavar="NAME=V1,V2,...",
                   help="repeat the experiment at each value of one input and report how the "
                   "ratio moves: " + "; ".join(f"{k}: {v}" for k, v in VARIABLES.items()))
    d.set_defaults(func=run, writes_run_dir=True)
    f = kinds.add_parser("frontier", help="each plan's output tokens/s per system against "
                         "tokens/s per user, and the ratio at the vendor's token speed")
    _add_common(f)
    f.add_argument("--user-speeds", metavar="S1,S2,...",
                   help="per-user speeds to aim at, output tokens/s (each a p90 TPOT target "
                   "of 1/S; default: a ladder from a little slower than a lone sequence's "
                   "decode step to 50, with --user-speed among them)")
    f.add_argument("--user-speed", type=float,
                   help="where to read the headline, output tokens/s per user (default: the "
                   "model's published vendor speed, programs/vendor_speeds.yaml)")
    f.add_argument("--step-scales", default="0.7,1.3", metavar="F1,F2|none",
                   help="read the headline again with the prefill, then the decode, step "
                   "times times each factor, the hardware unchanged (default 0.7,1.3; none: "
                   "not)")
    f.set_defaults(func=run_frontier, writes_run_dir=True)
    g = kinds.add_parser("pairings", help="every pairing of kinds of hardware (prefill on one, "
                         "decode on another or the same) as a frontier, against colocated "
                         "serving in the same footprint, on one figure")
    _add_common(g)
    g.add_argument("--kinds", required=True, metavar="POOL,POOL,...",
                   help="kinds of hardware to pair, as --prefill-pool names them (wse3,trn2; "
                        "h200x8 with the gpu extra)")
    g.add_argument("--user-speeds", metavar="S1,S2,...",
                   help="per-user speeds to aim at (default: each pairing's own ladder)")
    g.add_argument("--user-speed", type=float,
                   help="the speed to mark, output tokens/s per user (default: the model's "
                   "published vendor speed)")
    g.set_defaults(func=run_pairings, writes_run_dir=True)


def _add_common(d) -> None:
    """The arguments both experiments take."""
    d.add_argument("model", help="model preset, model YAML or Hugging Face config.json")
    add_fabric_args(d)
    add_format_args(d)
    d.add_argument("--systems", type=int, default=1, help="systems (wafers) in the cluster")
    src = d.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", help="workload preset or YAML")
    src.add_argument("--trace", help=f"a shipped trace ({', '.join(trace_names())}) or a CSV "
                     "of arrived_at,num_prefill_tokens,num_decode_tokens")
    d.add_argument("--requests", type=int,
                   help=f"requests (sessions) per tuning run (default: the workload's, at "
                   f"most {TUNING_REQUESTS} model calls; agent sessions: that many per system)")
    d.add_argument("--ttft-slo", dest="ttft_s", type=float, required=True,
                   help="time-to-first-token target, seconds (at the p90; experiment disagg: "
                        "at --slo-percentile)")
    d.add_argument("--attainment", type=float,
                   help="share of requests that must meet both targets (default 0.9; "
                        "experiment disagg: the --slo-percentile's share)")
    space = Space()
    add_space_args(d, space.copies)
    d.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
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
    d.add_argument("--rounds", type=int, default=space.rounds,
                   help="passes of the knob-by-knob tuning, a further one only while the last "
                        f"changed a choice (default {space.rounds}; knobs that pay only "
                        "together need more)")
    d.add_argument("--each-layout", action="store_true",
                   help="tune every layout's other knobs before comparing the layouts (as "
                        "many tunings as layouts; by default the layout is one knob among "
                        "the others)")
    d.add_argument("--tolerance", type=float, default=0.05,
                   help="stop a search when the failed rate is within this of the met one")
    where = d.add_mutually_exclusive_group()
    where.add_argument("--scheduler",
                       help="dask scheduler address (default: local worker processes)")
    where.add_argument("--workers", type=int, default=0,
                       help="local worker processes (default: one per core; 1: none, run here)")
    d.add_argument("--cache-dir", help="where stage-time tables are kept")
    d.add_argument("--grid", default=space.grid, metavar="full|quick",
                   help="stage tables' micro-batch shapes: full (55 per region), or quick (21, "
                   "within 5%% of full on Llama-3.1-8B, for a first look; sequences per "
                   "micro-batch up to 64, prefill tiles up to 256 tokens)")
    d.add_argument("--routing", default="uniform", metavar="uniform|skewed:S",
                   help="a mixture of experts: how the timed steps' tokens pick their experts "
                        "(Zipf skew S; default uniform)")
    d.add_argument("--routing-seed", type=int, default=0, help="seed of the drawn routing")
    d.add_argument("--attention-tile", type=int, default=0, metavar="B",
                   help="batch tiling on attention in both plans' decode steps: attention takes "
                        "B sequences at a time, the MLP or experts the whole micro-batch "
                        "(default 0: off)")
    pools = d.add_argument_group("pools named by their hardware (instead of --fabric and "
                                 "--systems; the same footprint of systems for both plans)")
    pools.add_argument("--prefill-pool", metavar="POOL",
                       help="the split's prefill on POOL: a fabric (wse3, or wse3x4 for four "
                            "systems), an accelerator timed by its roofline (trn2, trn2x2), or "
                            "their YAML; or GPUs timed from AIConfigurator's measured data "
                            "(h200x8; h200x8tp2 for two per copy, else every degree; the gpu "
                            "extra)")
    pools.add_argument("--decode-pool", metavar="POOL",
                       help="the split's decode on POOL (as --prefill-pool)")
    pools.add_argument("--pool", metavar="POOL",
                       help="colocated serving on POOL, in the split's footprint (default: "
                            "each kind of hardware in the split, the better tuned)")
    pools.add_argument("--split-pool", metavar="POOL",
                       help="every split of POOL's units between prefill and decode (h200x8: "
                            "1 to 7 GPUs of prefill), against colocated serving on all of it")
    pools.add_argument("--footprint", default="systems", metavar="systems|racks|kw|cost",
                       help="what both plans hold equal and every result is per: systems "
                            "(default), racks (with --per-rack for every kind), kW of power "
                            "(the presets'), or cost per hour (with --price for every kind)")
    # Stored under the API's names, so that its errors read as these flags (`prices=h200=2`
    # as --price h200=2).
    pools.add_argument("--per-rack", dest="units_per_rack", action="append", default=[],
                       metavar="NAME=N",
                       help="units of a kind of hardware one rack holds (wse3=..., trn2=...; "
                            "repeatable; none is invented)")
    pools.add_argument("--price", dest="prices", action="append", default=[],
                       metavar="NAME=PER_HOUR",
                       help="price of one unit of a kind of hardware for an hour, any currency "
                            "(wse3=..., trn2=... per instance, h200=... per GPU; repeatable; "
                            "none is invented)")
    d.add_argument("-o", "--output", help="run directory: experiment.json (every search point)")
    d.add_argument("--viz", action="store_true",
                   help="draw the run directory (figures/, report.html) at the end")
    d.add_argument("--json", action="store_true")


def _hardware(args) -> Hardware:
    """The hardware both plans run on: pools named by their hardware, or a fabric and a count
    of systems (refused beside pools)."""
    pools = {name: getattr(args, name) for name in ("pool", "prefill_pool", "decode_pool",
                                                    "split_pool")}
    counting = _counting(args)
    if all(v is None for v in pools.values()):
        if args.footprint != "systems" or args.prices or args.units_per_rack:
            raise UserError("--footprint, --price and --per-rack are for pools named by their "
                            "hardware; one compiled cluster counts its systems")
        return Hardware(fabric=fabric_from_args(args), systems=args.systems)
    given = [flag for flag, changed in (("--fabric", args.fabric != "wse3"),
                                        ("--set", bool(args.fabric_set)),
                                        ("--systems", args.systems != 1)) if changed]
    if given:
        raise UserError(f"{given[0]} describes one compiled cluster; pools named by their "
                        "hardware say it themselves")
    return Hardware(**pools, counting=counting)


def _per_kind(items: list[str], flag: str, what: str) -> dict:
    """NAME=NUMBER flags (--price NAME=PER_HOUR, --per-rack NAME=N): hardware name -> number
    (each checked by ``api.experiment``); a name given twice is refused, not the last kept."""
    out: dict = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            number = float(value) if sep else None
        except ValueError:
            number = None
        if number is None:
            raise UserError(f"{flag} needs NAME={what} (a number), got {item!r}")
        if name.strip() in out:
            raise UserError(f"{flag} {name.strip()}=...: given twice ({item!r} after "
                            f"{name.strip()}={out[name.strip()]:g}); give one per kind")
        out[name.strip()] = number
    return out


def _counting(args) -> Counting:
    """--footprint and what it counts by."""
    prices = _per_kind(args.prices, "--price", "PER_HOUR")
    per_rack = _per_kind(args.units_per_rack, "--per-rack", "N")
    return Counting(args.footprint, prices or None, per_rack or None)


def _load(args) -> Load:
    return Load(args.workload, args.trace, args.requests, args.seeds)


def _execution(args) -> Execution:
    return Execution(args.scheduler, args.workers, args.cache_dir, status)


def _speeds(args, scales: bool = True) -> Speeds:
    speeds = None if args.user_speeds is None else _floats(args.user_speeds, "user_speeds")
    if not scales or args.step_scales.strip() == "none":
        return Speeds(speeds, args.user_speed, ())
    return Speeds(speeds, args.user_speed, _floats(args.step_scales, "step_scales"))


def _timing(args, model) -> WaferTiming:
    return WaferTiming(routing_for(model, args.routing, args.routing_seed), args.attention_tile)


def _space(args) -> Space:
    return Space(**space_settings(args), prefix_cache=args.prefix_cache,
                 window_s=args.window_s, grid=args.grid, rounds=args.rounds,
                 each_layout=args.each_layout)


def _written(args, report, text: str):
    """Writes the run directory if asked (the report's ``to_json()``); the JSON, or the
    text, to print."""
    data = report.to_json()
    if args.output:
        write_run_dir(args.output, lambda tmp: write_json(tmp, "experiment.json", data))
    if args.json:
        return data
    return text + (f"\n\nwrote {args.output}{os.sep} (experiment.json)" if args.output else "")


def run_frontier(args):
    model = model_from_args(args)
    spec = FrontierSpec(model, _load(args), args.ttft_s, args.attainment, _speeds(args),
                        _hardware(args), _space(args), _execution(args), _timing(args, model),
                        args.tolerance)
    data = api.frontier(spec)
    return _written(args, data, render_frontier(data) if not args.json else "")


def run_pairings(args):
    pools = ("pool", "prefill_pool", "decode_pool", "split_pool")
    if any(getattr(args, k) is not None for k in pools) or args.fabric != "wse3" \
            or args.fabric_set or args.systems != 1:
        raise UserError("--kinds names the hardware of every pairing; --fabric, --set, "
                        "--systems and the pool flags do not go with it")
    counting = _counting(args)
    model = model_from_args(args)
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    data = api.pairings(PairingsSpec(model, _load(args), kinds, args.ttft_s, args.attainment,
                                     _speeds(args, scales=False), counting, _space(args),
                                     _execution(args), args.tolerance))
    if args.output:
        def write(tmp):
            from wse_emu.visualize.curves import pairings as draw_pairings

            write_json(tmp, "pairings.json", data.to_json())
            (tmp / "figures").mkdir()
            draw_pairings(data, tmp / "figures" / "pairings")
        write_run_dir(args.output, write)
    if args.json:
        return data.to_json()
    lines = [render_pairings(data)]
    if args.output:
        lines.append(f"\nwrote {args.output}{os.sep} (pairings.json, figures/pairings.png)")
    return "\n".join(lines)


def render_pairings(data) -> str:
    """Each pairing's capacity at every rung, both plans, per footprint unit."""
    per = data.footprint_unit
    lines = [f"{data.model}, workload {data.workload}: every pairing of "
             f"{', '.join(data.kinds)}, each against colocated serving in its footprint "
             f"(output tokens/s per {per}, 90% of requests at or above the speed)"]
    for label, f in data.frontiers.items():
        lines += ["", f"{label} ({f.cluster}):", "", render_rungs(f.rungs, per)]
    lines += [f"skipped {label}: {why}" for label, why in data.skipped.items()]
    return "\n".join(lines)


def _floats(text: str, name: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UserError(f"`{name}` must be comma-separated numbers, got {text!r}") from None


def _ratio_text(capacity: CapacityRatio) -> str:
    ratio = capacity.ratio
    if ratio == "unbounded":
        return "unbounded (colocated reaches it at no rate)"
    if ratio is None:
        return "-" if not capacity.unbounded_draws else \
            f"unbounded on {capacity.unbounded_draws} of {capacity.draws} draws"
    iv = capacity.interval or {}
    if "half_width" in iv:
        return f"{ratio:.2f}x ({iv['low']:.2f} to {iv['high']:.2f})"
    return f"{ratio:.2f}x"


def render_frontier(data: FrontierReport) -> str:
    per = data.footprint_unit
    head = (f"{data.model} on {data.cluster}, workload {data.workload}: output "
            f"tokens/s per {per} against tokens/s per user; p90 TTFT <= "
            f"{seconds(data.ttft_p90_s)}, each rung's p90 TPOT <= 1 / its speed, >= "
            f"{data.attainment:.0%} of requests meeting both; tuning runs of "
            f"{data.requests_per_run:,} requests, {data.seeds} draw(s)"
            + ("; stage tables on the quick grid" if data.stage_grid == "quick" else "")
            + f"; a lone sequence's decode step {seconds(data.lone_decode_step_s)}")
    lines = [head, "", render_rungs(data.rungs, per)]
    for plan in ("colocated", "disaggregated"):
        lines += ["", f"How {plan} serving reached each rung:", "",
                  render_plan_rungs(data.rungs, plan)]
    lines += ["", "Fastest per-user speed reached (p90): " + ", ".join(
        f"{plan} {v:,.0f} tokens/s" for plan, v in data.fastest_reached.items())]
    h = data.headline
    if h:
        cap = h.capacity_per_system
        src = f" (the vendor's: {h.vendor.source})" if h.vendor else ""
        lines += ["", f"High-speed token capacity at {h.user_speed:,.0f} tokens/s per user"
                  f"{src}: colocated {number(cap['colocated'])} tok/s per {per}, disaggregated "
                  f"{number(cap['disaggregated'])}; disaggregated / colocated "
                  f"{_ratio_text(h.capacity_ratio)}"
                  + ("" if h.goodput_ratio is None else
                     f"; DistServe goodput ratio at the same target {h.goodput_ratio:.2f}x")
                  + "."]
        lines += [f"  - {why}" for why in h.why.values() if why]
    if data.step_time_leaning:
        lines += ["", "The headline with step times scaled (the hardware unchanged):"]
        lines += [f"  - {r.phase} x{r.factor:g}: {_ratio_text(r.capacity_ratio)}"
                  for r in data.step_time_leaning]
    return "\n".join(lines)


def render_rungs(rungs: list[Rung], per: str = "system") -> str:
    """Each rung's target, both plans' output tokens/s per system (or per ``per``) and their
    ratios."""
    rows = []
    for r in rungs:
        g = r.goodput_ratio
        rows.append([f"{r.user_speed:,.0f} ({seconds(r.tpot_target_s)})"]
                    + [_tokens_per_system(r.plans[plan])
                       for plan in ("colocated", "disaggregated")]
                    + [_ratio_text(r.capacity_ratio), "-" if g is None else f"{g:.2f}x"])
    return narrow_table(["tok/s/user target (p90 TPOT)", f"colocated tok/s/{per}",
                         f"disaggregated tok/s/{per}", "capacity ratio", "goodput ratio"],
                        rows, "rrrrr")


def render_plan_rungs(rungs: list[Rung], plan: str) -> str:
    """One plan at each rung: the per-user speeds its requests reached and its best
    configuration."""
    rows = []
    for r in rungs:
        pt = r.plans[plan]
        if not pt.reached:
            rows.append([f"{r.user_speed:,.0f}", "-", "-"])
            continue
        u = pt.user_tokens_per_s
        rows.append([f"{r.user_speed:,.0f}", f"{u.p50:,.0f} / {u.p90:,.0f} / {u.mean:,.0f}",
                     pt.configuration.split(", ", 1)[1]])
    return narrow_table(["tok/s/user target", f"{plan} tok/s/user p50/p90/mean",
                         f"{plan} best"], rows, "rrl")


def _tokens_per_system(point: FrontierPoint) -> str:
    if not point.reached:
        return "0 (not reached)"
    iv = point.tokens_per_s_per_system_interval or {}
    return number(point.tokens_per_s_per_system) + (
        f" ({number(iv['low'])} to {number(iv['high'])})" if "half_width" in iv else "")


def run(args):
    space = _space(args)
    model = model_from_args(args)
    spec = ExperimentSpec(model, _load(args), Targets(args.ttft_s, args.tpot_s, args.attainment,
                                                      args.percentile),
                          _hardware(args), space, _execution(args), _timing(args, model),
                          args.tolerance, args.price_per_system_hour, args.vary)
    data = api.experiment(spec)
    if args.json:
        return _written(args, data, "")
    return _written(args, data, render(data) if args.vary is None else render_sensitivity(data))


def render_sensitivity(data: VaryReport) -> str:
    rows, best = [], []
    for r in data.sensitivity:
        value = number(r.value, 6)
        if r.error is not None:
            rows.append([value, "-", "-", "-", "-", "-"])
            best.append([value, r.error])
            continue
        rate = r.max_rate_per_system or {}
        iv = r.goodput_ratio_interval or {}
        if "half_width" in iv:
            shown = f"{iv['mean']:.2f}x ({iv['low']:.2f} to {iv['high']:.2f})"
        else:
            shown = "-" if r.goodput_ratio is None else f"{r.goodput_ratio:.2f}x"
        rows.append([value, seconds(r.tpot_s), number(r.tpot_in_decode_steps),
                     number(rate.get("colocated", 0)), number(rate.get("disaggregated", 0)), shown])
        # One line per plan: the two labels side by side would not fit beside the numbers.
        best += [[value, f"{r.colocated or '-'} /"], ["", r.disaggregated or "-"]]
    head = (f"{data.model} on {data.fabric}, workload {data.workload}: the experiment "
            f"at each value of {data.vary} ({data.description})")
    return "\n".join([head, "", narrow_table(
        ["value", "TPOT target", "TPOT / decode step", "colocated goodput/s/system",
         "disaggregated goodput/s/system", "disaggregated / colocated"], rows, "rrrrrr"),
        "", narrow_table(["value", "best configurations"], best, "rl")])


def render(data: ExperimentReport) -> str:
    t, timing = data.targets, data.timing or StepTiming()
    head = (f"{data.model} on {data.cluster}, workload {data.workload}; targets: {t.at} "
            f"TTFT <= {seconds(t.ttft_s)}, {t.at} TPOT <= {seconds(t.tpot_s)}, "
            f">= {t.attainment:.0%} of requests meeting both, counted from the "
            f"{WARMUP:.0%} to the {1 - DRAIN:.0%} point of arrivals, TTFT rising by at most "
            f"{MAX_TTFT_SLOPE:g} s per s of arrivals across them and their first tokens out "
            f"within {MAX_PACE:g}x the span they arrived in"
            + ("" if data.prefix_cache else "; no prefix cache")
            + ("; stage tables on the quick grid" if data.stage_grid == "quick" else "")
            + (f"; {timing.routing}" if timing.routing else "")
            + (f"; decode attention in tiles of {timing.attention_tile}"
               if timing.attention_tile else "")
            + (f"; {timing.stored_formats}" if timing.stored_formats else ""))
    per = data.footprint_unit  # "system", or the unit of a footprint across kinds
    lines = [head, "", f"Tuning, knob by knob, on runs of {data.requests_per_run:,} "
             f"requests: goodput (highest rate met) per {per} of each value tried", "",
             render_tuning(data.tuning, per)]
    lines += [f"skipped {s}" for s in data.skipped]
    windows = [c.window_s for c in data.final if c.window_s is not None]
    runs = (f"searched again on runs of {data.final_requests_per_run:,} requests"
            + (f" (steady windows of {duration(min(windows))} to {duration(max(windows))} "
               "emulated at the rates found)" if windows else "")
            if data.confirmed else "as tuned")
    lines += ["", f"Each plan's best, {runs}:", "", render_rows(data.final, per, t.at)]
    cmp_ = data.comparison
    if not cmp_.compared:
        missing = "colocated" if cmp_.colocated is None else "disaggregated"
        return "\n".join(lines + ["", f"No comparison: every {missing} configuration was "
                                       "skipped."])
    ratio, tokens = cmp_.goodput_ratio, cmp_.tokens_per_s_ratio
    if ratio is not None:
        verdict = (f"{ratio:.2f}x the goodput (the highest rate with the targets met), "
                   f"{tokens:.2f}x the output tokens/s at that rate"
                   + ("" if per == "system" else f", each per {per} of its footprint"))
    elif cmp_.max_rate_per_system["disaggregated"] > 0:
        verdict = "no colocated configuration met the targets at any rate tried"
    else:
        verdict = "neither plan met the targets at any rate tried"
    if not all(cmp_.ceiling_found.values()):
        verdict += (" (a best configuration met every rate tried, so its rate is only a floor: "
                    "more requests per run would load it further)")
    colocated = cmp_.colocated.split(", ", 1)[1]
    lines += ["", f"Disaggregated ({cmp_.split}) against the best colocated ({colocated}) "
              f"at the same TPOT target: {verdict}.", "Why:"]
    lines += [f"  - {reason}" for reason in cmp_.reasons]
    best = {c.configuration: c for c in data.final}
    if any(c.cost_per_million_output_tokens is not None for c in best.values()):
        lines += ["", "At each plan's best rate (energy from the systems' wall power"
                  + (f", {data.system_power_w:g} W each" if data.system_power_w
                     else ", not stated for this fabric") + "):"]
        for plan in ("colocated", "disaggregated"):
            c = best[cmp_.best(plan)]
            energy = c.energy_per_output_token_j
            lines.append(f"  - {c.configuration}: "
                         + (f"{number(energy)} J per output token, " if energy else "")
                         + f"{number(c.cost_per_million_output_tokens)} per million output "
                           "tokens")
    if data.over_replicates is not None:
        lines += [""] + render_replicates(data.over_replicates, per)
    return "\n".join(lines)


def render_tuning(steps: list[dict], per: str = "system") -> str:
    """What each knob bought: per plan and knob, every value's goodput per system (or per
    ``per``), the value kept, and the plan's goodput before and after."""
    rows = []
    for st in steps:
        tried = ", ".join(f"{_value(st['knob'], t['value'])} {number(t['max_rate_per_system'])}"
                          for t in st["tried"])
        before = "-" if st["before_per_system"] is None else number(st["before_per_system"])
        plan = st["plan"] + (f" ({st['line']})" if st.get("line") else "")
        rows.append([plan, st["knob"], tried, _value(st["knob"], st["chosen_value"]),
                     f"{before} -> {number(st['after_per_system'])}"])
    return narrow_table(["plan", "knob", f"values tried: goodput/s/{per}", "kept",
                         f"goodput/s/{per}"], rows, "lllll")


def _value(knob: str, value) -> str:
    if knob == "running cap" and value == 0:
        return "none"
    if knob == "interleave ratio":
        return f"{value}:1"
    return str(value).replace("-", " ")


ROW_COLUMNS = 2  # configurations side by side in one table of ``render_rows``


def render_rows(configurations: list[ConfigRow], per: str = "system", at: str = "p90") -> str:
    """Each configuration's results, one column per configuration and one row per metric (a
    row per configuration would be some 260 columns wide), two configurations to a table;
    rates per system (or per ``per``); TTFT and TPOT at the targets' percentile ``at``."""
    energy = any(c.energy_per_output_token_j is not None for c in configurations)
    names = ([f"goodput/s/{per}", f"vs ceiling/s/{per}", f"tok/s/{per}"]
             + (["J/token"] if energy else [])
             + [f"{at} TTFT", f"{at} TPOT", "p90 ITL", "stall/token", "prefill busy",
                "decode busy", "on-target/s (makespan)", "next rate fails on"])
    tables = []
    for n in range(0, len(configurations), ROW_COLUMNS):
        group = configurations[n:n + ROW_COLUMNS]
        columns = [_metrics_of(c, energy, at) for c in group]
        rows = [[name] + [column[i] for column in columns] for i, name in enumerate(names)]
        tables.append(narrow_table(["configuration"] + [c.configuration for c in group], rows,
                                   "l" * (1 + len(group))))
    return "\n\n".join(tables)


def _metrics_of(c: ConfigRow, energy: bool, at: str = "p90") -> list[str]:
    """One configuration's column of ``render_rows``, in the order of its rows."""
    # Per system, as the goodput beside it (reports from before it was kept: one system).
    ceiling = c.ceiling_rate_per_system if c.ceiling_rate_per_system is not None \
        else c.ceiling_rate_per_s
    if not c.met_some_rate:
        return (["0", f"0 of {number(ceiling)}" if ceiling else "-"] + ["-"] * (9 + energy)
                + [c.limited_by])
    return ([number(c.max_rate_per_system),
             f"{c.share_of_ceiling:.0%} of {number(ceiling)}" if ceiling else "-",
             number(c.output_tokens_per_s_per_system)]
            + ([number(c.energy_per_output_token_j)] if energy else [])
            + [seconds(getattr(c, f"ttft_{at}_s")), seconds(getattr(c, f"tpot_{at}_s")),
               seconds(c.itl_p90_s),
               seconds(c.decode_stall_per_token_s), f"{c.prefill_utilization:.0%}",
               f"{c.decode_utilization:.0%}", number(c.goodput_requests_per_s),
               c.limited_by])


def _interval(iv: dict, fmt) -> str:
    if iv["mean"] is None:
        return "-"
    if "half_width" not in iv:
        return fmt(iv["mean"])
    return f"{fmt(iv['mean'])} ({fmt(iv['low'])} to {fmt(iv['high'])})"


def render_replicates(over: dict, per: str = "system") -> list[str]:
    """The mean and 95% interval over the draws, per configuration and of the ratio; rates
    per system (or per ``per``)."""
    rows = [[c["configuration"], _interval(c["max_rate_per_system"], number),
             _interval(c["output_tokens_per_s_per_system"], number)]
            for c in over["configurations"]]
    ratio = over["goodput_ratio"]
    lines = [f"Over {over['replicates']} independent draws of the workload "
             f"({over.get('draws', 'each searched alone')}): mean (95% interval; for "
             "goodputs and their ratio, widened to the rate search's step)", "",
             narrow_table(["configuration", f"goodput/s/{per}", f"tok/s/{per}"], rows, "lrr")]
    if ratio["mean"] is not None:
        lines += ["", "Disaggregated / colocated goodput: "
                  + _interval(ratio, lambda v: f"{v:.2f}x")
                  + f" over the {ratio['n']} draws where colocated met the targets at some rate."]
    return lines
