"""``wse-emu experiment disagg``: colocated versus disaggregated serving at the same hardware and
the same token speed, each at the highest request rate that meets the latency targets;
``experiment frontier`` and ``experiment pairings``, the same along a ladder of token speeds.
Their flags are generated from the specs' declarations (``spec_args``); here they are parsed
into a spec, handed to one ``api`` function, and its report rendered."""

from __future__ import annotations

import os

from wse_emu import api
from wse_emu.cli.compile_cmd import add_format_args, add_routing_args, model_from_args
from wse_emu.cli.fabric_args import add_fabric_args, fabric_from_args
from wse_emu.cli.spec_args import add_spec_args, spec_from_args
from wse_emu.experiments.comparison import ExperimentReport, StepTiming, VaryReport
from wse_emu.experiments.draws import precision_text
from wse_emu.experiments.drift import DriftReport, DriftSpec
from wse_emu.experiments.frontier import CapacityRatio, FrontierPoint, FrontierReport, Rung
from wse_emu.experiments.goodput import MAX_PACE, MAX_TTFT_SLOPE, ConfigRow
from wse_emu.experiments.intervals import has_interval
from wse_emu.experiments.spec import ExperimentSpec, FrontierSpec, PairingsSpec, flat_names
from wse_emu.models.routing import routing_for
from wse_emu.rundir.directory import write_run_dir
from wse_emu.rundir.write import write_json
from wse_emu.serving.metrics import DRAIN, WARMUP
from wse_emu.util.fmt import duration, narrow_table, number, seconds
from wse_emu.util.progress import status


def add_parser(sub, summary: str) -> None:
    p = sub.add_parser("experiment", help=summary)
    kinds = p.add_subparsers(dest="experiment", metavar="EXPERIMENT")
    kinds.required = True
    d = kinds.add_parser("disagg", help="colocated versus disaggregated prefill and decode, at "
                         "the highest rate that meets the latency targets")
    _add_args(d, ExperimentSpec)
    d.set_defaults(func=run, writes_run_dir=True)
    f = kinds.add_parser("frontier", help="each plan's output tokens/s per system against "
                         "tokens/s per user, and the ratio at the vendor's token speed")
    _add_args(f, FrontierSpec)
    f.set_defaults(func=run_frontier, writes_run_dir=True)
    g = kinds.add_parser("pairings", help="every pairing of kinds of hardware (prefill on one, "
                         "decode on another or the same) as a frontier, against colocated "
                         "serving in the same footprint, on one figure")
    # A pairing's frontier reads no step-time factors (each frontier can add them).
    _add_args(g, PairingsSpec, leave_out=("step_scales",))
    g.set_defaults(func=run_pairings, writes_run_dir=True)
    r = kinds.add_parser("drift", help="both plans tuned on one workload, then served "
                         "unchanged on others (and on traffic that drifts within a run) and "
                         "tuned afresh there: how much of the answer survives")
    _add_args(r, DriftSpec)
    r.set_defaults(func=run_drift, writes_run_dir=True)


def _add_args(d, spec, leave_out: tuple = ()) -> None:
    """The model's flags, the flags the fields of ``spec`` declare (``spec_args``), those of
    the fields built from other flags (``spec_args.BUILT``) where ``spec`` has them, and the
    output's."""
    d.add_argument("model", help="model preset, model YAML or Hugging Face config.json")
    add_format_args(d)
    names = flat_names(spec)
    if "fabric" in names:
        add_fabric_args(d)
    if "routing" in names:
        add_routing_args(d)
    add_spec_args(d, spec, leave_out)
    d.add_argument("-o", "--output", help="run directory: experiment.json (every search point)")
    d.add_argument("--viz", action="store_true",
                   help="draw the run directory (figures/, report.html) at the end")
    d.add_argument("--json", action="store_true")


def _spec(spec, args):
    """The experiment's spec from its flags: the declared fields' and those built from the
    model's, the fabric's and the routing's flags, with progress lines on stderr."""
    model = model_from_args(args)
    names = flat_names(spec)
    built = {"model": model, "progress": status}
    if "fabric" in names and (args.fabric != "wse3" or args.fabric_set):
        built["fabric"] = fabric_from_args(args)
    if "routing" in names:
        built["routing"] = routing_for(model, args.routing, args.routing_seed)
    return spec_from_args(spec, args, **built)


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
    data = api.frontier(_spec(FrontierSpec, args))
    return _written(args, data, render_frontier(data) if not args.json else "")


def run_pairings(args):
    data = api.pairings(_spec(PairingsSpec, args))
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


def run_drift(args):
    data = api.drift(_spec(DriftSpec, args))
    return _written(args, data, render_drift(data) if not args.json else "")


def render_drift(data: DriftReport) -> str:
    """Per workload: both plans as tuned on the first and as retuned, the ratio of each,
    each plan's regret and the time to lay a wafer split out anew."""
    t = data.targets
    head = (f"{data.model} on {data.cluster}: both plans tuned on {data.tuned_on}, then "
            f"served unchanged on each workload and tuned afresh on it; targets {t.at} TTFT "
            f"<= {seconds(t.ttft_s)}, {t.at} TPOT <= {seconds(t.tpot_s)}")
    rows, best = [], []
    for r in data.rows:
        rows.append([r.workload, str(r.draws)]
                    + [number(r.fixed_tokens_per_s_per_system[p]) for p in _PLANS]
                    + [_interval_text(r.fixed_ratio, "x"), _interval_text(r.retuned_ratio, "x")]
                    + [_interval_text(r.regret[p], "%") for p in _PLANS]
                    + ["-" if r.relayout_s is None else seconds(r.relayout_s)])
        best += [[r.workload, f"as tuned on {data.tuned_on}: {r.fixed['disaggregated']} "
                  f"({r.fixed_limits['disaggregated'] or '-'})"],
                 ["", f"retuned: {r.retuned['disaggregated']}"]]
    lines = [head, "", narrow_table(
        ["workload", "draws", "colocated tok/s/system", "disaggregated tok/s/system",
         "ratio as tuned", "ratio retuned", "colocated regret", "split regret",
         "relayout"], rows, "lrrrrrrrr"), "",
        "Tok/s/system and the ratio as tuned: both plans as tuned on the first workload. "
        "Regret: the share of the capacity retuning reaches that a plan kept as tuned gives "
        "up (retuned: the better of the workload's own tuning and the choice kept).", "",
        narrow_table(["workload", "the split"], best, "ll")]
    if data.relayout_basis:
        lines += ["", f"Relayout: {data.relayout_basis}."]
    return "\n".join(lines)


_PLANS = ("colocated", "disaggregated")


def _interval_text(iv: dict, unit: str) -> str:
    """A mean and its 95% interval, as a ratio (``x``) or a share (``%``)."""
    if not iv or iv.get("mean") is None:
        return f"unbounded on {iv['unbounded_draws']}" if iv and iv.get("unbounded_draws") \
            else "-"
    if unit == "x" and not any(iv["values"]):
        return "0 (the split met no rate)"

    def shown(v):
        return f"{v:.2f}x" if unit == "x" else f"{v:.0%}"
    text = shown(iv["mean"])
    if has_interval(iv):
        text += f" ({shown(iv['low'])} to {shown(iv['high'])})"
    return text + (f", unbounded on {iv['unbounded_draws']}" if iv.get("unbounded_draws")
                   else "")


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


def _ratio_text(capacity: CapacityRatio) -> str:
    ratio = capacity.ratio
    if ratio == "unbounded":
        return "unbounded (colocated reaches it at no rate)"
    if ratio is None:
        return "-" if not capacity.unbounded_draws else \
            f"unbounded on {capacity.unbounded_draws} of {capacity.draws} draws"
    iv = capacity.interval or {}
    if has_interval(iv):
        return f"{ratio:.2f}x ({iv['low']:.2f} to {iv['high']:.2f})"
    return f"{ratio:.2f}x"


def _frontier_speculation(data: FrontierReport) -> str:
    """The speculative decoding a frontier's rungs served with, if any (every rung alike)."""
    for rung in (data.experiments or {}).values():
        timing = getattr(rung, "timing", None)
        if timing is not None and timing.speculation:
            return _speculation_text(timing.speculation)
    return ""


def render_frontier(data: FrontierReport) -> str:
    per = data.footprint_unit
    head = (f"{data.model} on {data.cluster}, workload {data.workload}: output "
            f"tokens/s per {per} against tokens/s per user; p90 TTFT <= "
            f"{seconds(data.ttft_p90_s)}, each rung's p90 TPOT <= 1 / its speed, >= "
            f"{data.attainment:.0%} of requests meeting both; tuning runs of "
            f"{data.requests_per_run:,} requests, {data.seeds} draw(s)"
            + ("; stage tables on the quick grid" if data.stage_grid == "quick" else "")
            + _serving_text(next((e.serving for e in (data.experiments or {}).values()), None)))
    spec = _frontier_speculation(data)
    head += (f"; a lone sequence's decode step {seconds(data.lone_decode_step_s)}" if not spec
             else f"{spec}; a lone sequence's time per token, verify rounds over the tokens "
             f"each yields on average, {seconds(data.lone_decode_step_s)} at best")
    lines = [head, "", render_rungs(data.rungs, per)]
    for plan in ("colocated", "disaggregated"):
        lines += ["", f"How {plan} serving reached each rung:", "",
                  render_plan_rungs(data.rungs, plan)]
    lines += ["", _fastest_text(data)]
    lines += _headline_lines(data, per)
    base = data.baseline
    if base is not None:
        lines += ["", "Without speculative decoding (the same workload, draws, hardware and "
                  "tuning):", "", render_rungs(base.rungs, per), "", _fastest_text(base)]
        lines += _headline_lines(base, per)
    precision = precision_text(data.precision)
    if precision:
        lines += ["", precision]
    if data.step_time_leaning:
        lines += ["", "The headline with step times scaled (the hardware unchanged):"]
        lines += [f"  - {r.phase} x{r.factor:g}: {_ratio_text(r.capacity_ratio)}"
                  for r in data.step_time_leaning]
    return "\n".join(lines)


def _fastest_text(data: FrontierReport) -> str:
    return "Fastest per-user speed reached (p90): " + ", ".join(
        f"{plan} {v:,.0f} tokens/s" for plan, v in data.fastest_reached.items())


def _headline_lines(data: FrontierReport, per: str) -> list[str]:
    """Both plans' capacity at the headline's speed, their ratio, and why each stopped."""
    h = data.headline
    if not h:
        return []
    cap = h.capacity_per_system
    src = f" (the vendor's: {h.vendor.source})" if h.vendor else ""
    return ["", f"High-speed token capacity at {h.user_speed:,.0f} tokens/s per user{src}: "
            f"colocated {number(cap['colocated'])} tok/s per {per}, disaggregated "
            f"{number(cap['disaggregated'])}; disaggregated / colocated "
            f"{_ratio_text(h.capacity_ratio)}"
            + ("" if h.goodput_ratio is None else
               f"; DistServe goodput ratio at the same target {h.goodput_ratio:.2f}x") + "."
            ] + [f"  - {why}" for why in h.why.values() if why]


def render_rungs(rungs: list[Rung], per: str = "system") -> str:
    """Each rung's target, both plans' output tokens/s per system (or per ``per``), their
    ratios, and p: the share of the colocated best's busy stage time spent on prefill; for
    agent sessions, how long a session took on each plan (p50 / p90)."""
    plans = ("colocated", "disaggregated")
    sessions = any(r.plans[plan].session_p50_s is not None for r in rungs for plan in plans)
    rows = []
    for r in rungs:
        g = r.goodput_ratio
        rows.append([f"{r.user_speed:,.0f} ({seconds(r.tpot_target_s)})"]
                    + [_tokens_per_system(r.plans[plan]) for plan in plans]
                    + [_ratio_text(r.capacity_ratio), "-" if g is None else f"{g:.2f}x",
                       _prefill_share(r.plans["colocated"])]
                    + ([_session_times(r.plans[plan]) for plan in plans] if sessions else []))
    head = ["tok/s/user target (p90 TPOT)", f"colocated tok/s/{per}",
            f"disaggregated tok/s/{per}", "capacity ratio", "goodput ratio",
            "colocated prefill share p"]
    if sessions:
        head += [f"{plan} sessions p50 / p90" for plan in plans]
    return narrow_table(head, rows, "r" * len(head))


def _session_times(point) -> str:
    """How long an agent session took on ``point``'s best, p50 / p90."""
    if point.session_p50_s is None:
        return "-"
    return f"{seconds(point.session_p50_s)} / {seconds(point.session_p90_s)}"


def _prefill_share(point) -> str:
    """p, the colocated best's busy stage time spent on prefill: were prefill removed for
    free, its decode capacity would grow by at most 1 / (1 - p)."""
    pre, dec = point.prefill_utilization, point.decode_utilization
    if not point.reached or pre is None or dec is None or pre + dec <= 0:
        return "-"
    return f"{pre / (pre + dec):.2f}"


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
        f" ({number(iv['low'])} to {number(iv['high'])})" if has_interval(iv) else "")


def run(args):
    data = api.experiment(_spec(ExperimentSpec, args))
    if args.json:
        return _written(args, data, "")
    text = render_sensitivity(data) if isinstance(data, VaryReport) else render(data)
    return _written(args, data, text)


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
        if has_interval(iv):
            shown = f"{iv['mean']:.2f}x ({iv['low']:.2f} to {iv['high']:.2f})"
        else:
            shown = "-" if r.goodput_ratio is None else f"{r.goodput_ratio:.2f}x"
        rows.append([value, seconds(r.tpot_s), number(r.tpot_in_decode_steps),
                     number(rate.get("colocated", 0)), number(rate.get("disaggregated", 0)), shown])
        # One line per plan: the two labels side by side would not fit beside the numbers.
        best += [[value, f"{r.colocated or '-'} /"], ["", r.disaggregated or "-"]]
    head = (f"{data.model} on {data.fabric}, workload {data.workload}: the experiment "
            f"at each value of {data.vary} ({data.description})")
    draws = [f"At {number(run.value, 6)}: {precision_text(run.precision)}"
             for run in data.runs if precision_text(run.precision)]
    return "\n".join([head, "", narrow_table(
        ["value", "TPOT target", "TPOT / decode step", "colocated goodput/s/system",
         "disaggregated goodput/s/system", "disaggregated / colocated"], rows, "rrrrrr"),
        "", narrow_table(["value", "best configurations"], best, "rl")]
        + (["", *draws] if draws else []))


def _serving_text(serving: dict | None) -> str:
    """The router and KV tier both plans served with, where not the defaults."""
    if not serving:
        return ""
    return (f"; requests routed {serving['router']}"
            + ("; KV given up parked in host memory" if serving["kv_tier"] == "host" else ""))


def _speculation_text(spec: dict | None) -> str:
    """The speculative decoding both plans served with, as the head of a report says it."""
    if not spec:
        return ""
    acceptance = spec["acceptance"]
    told = f"probability {acceptance:g}" if isinstance(acceptance, (int, float)) \
        else f"as {acceptance} says"
    counts = ", ".join(map(str, spec["draft_tokens"]))
    strips = spec.get("draft_strips", [1.0])
    widths = "" if strips == [1.0] else (
        f", on strips {', '.join(f'{w:g}' for w in strips)} times the narrowest that holds it")
    return (f"; speculative decoding in both plans: draft {spec['draft']}{widths}, {counts} "
            f"drafted tokens per step tried, each accepted with {told}")


def render(data: ExperimentReport) -> str:
    t, timing = data.targets, data.timing or StepTiming()
    head = (f"{data.model} on {data.cluster}, workload {data.workload}; targets: {t.at} "
            f"TTFT <= {seconds(t.ttft_s)}, {t.at} TPOT <= {seconds(t.tpot_s)}, "
            f">= {t.attainment:.0%} of requests meeting both, counted from the "
            f"{WARMUP:.0%} to the {1 - DRAIN:.0%} point of arrivals, TTFT rising by at most "
            f"{MAX_TTFT_SLOPE:g} s per s of arrivals across them and their first tokens out "
            f"within {MAX_PACE:g}x the span they arrived in"
            + ("" if data.prefix_cache else "; no prefix cache")
            + _serving_text(data.serving)
            + ("; stage tables on the quick grid" if data.stage_grid == "quick" else "")
            + (f"; {timing.routing}" if timing.routing else "")
            + (f"; decode attention in tiles of {timing.attention_tile}"
               if timing.attention_tile else "")
            + (f"; {timing.stored_formats}" if timing.stored_formats else "")
            + _speculation_text(timing.speculation))
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
    first = " on the first draw (over every draw below)" if data.replicates else ""
    lines += ["", f"Disaggregated ({cmp_.split}) against the best colocated ({colocated}) "
              f"at the same TPOT target{first}: {verdict}.", "Why:"]
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
    precision = precision_text(data.precision)
    if precision:
        lines += ["", precision]
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
    if not has_interval(iv):
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
             f"({over.get('draws', 'each searched alone')}): mean (95% interval; for the "
             "ratio the geometric mean, its interval on the log scale; for "
             "goodputs and their ratio, widened to the rate search's step)", "",
             narrow_table(["configuration", f"goodput/s/{per}", f"tok/s/{per}"], rows, "lrr")]
    if ratio["mean"] is not None:
        lines += ["", "Disaggregated / colocated goodput: "
                  + _interval(ratio, lambda v: f"{v:.2f}x")
                  + f" over the {ratio['n']} draws where colocated met the targets at some rate."]
    return lines
