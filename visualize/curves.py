"""Figures of the disaggregation experiment (``wse-emu experiment disagg -o``), from its search
points: output throughput against p90 TPOT with the gain at the TPOT target marked, and SLO
attainment against request rate; for ``--vary``, the goodput ratio against the varied input."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from wse_emu.experiments.comparison import ExperimentReport, VaryReport
from wse_emu.experiments.drift import PLANS, DriftReport
from wse_emu.experiments.frontier import FrontierReport
from wse_emu.experiments.goodput import MAX_PACE
from wse_emu.experiments.intervals import has_interval
from wse_emu.experiments.pairings import PairingsReport
from wse_emu.util.fmt import number, seconds, with_unit
from wse_emu.visualize.draw import DPI, OKABE_ITO, save_figure
from wse_emu.visualize.style import (
    axis_numbers,
    log_axis,
    percent_formatter,
    ratio_formatter,
    seconds_formatter,
    styled,
)


def ratio_bars(intervals: list) -> list[list[float]]:
    """Error bars of ratios (``yerr``): below and above each centre, uneven as an interval
    on the log scale is; none where a ratio has no interval."""
    below = [iv["mean"] - iv["low"] if has_interval(iv) else 0.0 for iv in intervals]
    above = [iv["high"] - iv["mean"] if has_interval(iv) else 0.0 for iv in intervals]
    return [below, above]


def _bars(points: list) -> list[list[float]]:
    """Error bars of frontier points' throughput: below and above each, to the ends of its
    interval over draws (cut at 0 below, so uneven there); none without one."""
    ivs = [p.tokens_per_s_per_system_interval or {} for p in points]
    return [[p.tokens_per_s_per_system - iv["low"] if has_interval(iv) else 0.0
             for p, iv in zip(points, ivs)],
            [iv["high"] - p.tokens_per_s_per_system if has_interval(iv) else 0.0
             for p, iv in zip(points, ivs)]]


def _style(label: str, n: int) -> dict:
    """Colour by position (black is kept for the targets), marker and line by plan."""
    disaggregated = label.startswith("disaggregated")
    colours = OKABE_ITO[:-1]
    return {"color": colours[n % len(colours)], "marker": "s" if disaggregated else "o",
            "linestyle": "-" if disaggregated else "--", "markersize": 4, "linewidth": 1.2,
            "label": label}


@styled
def throughput_vs_tpot(data: ExperimentReport, path: Path, formats=("png",)) -> list[Path]:
    """Each configuration's search points as output tokens/s against TPOT at the targets'
    percentile (p90 unless held elsewhere); the TPOT target is the 'same token speed' line,
    and the best of each plan within it is annotated."""
    target, at = data.targets.tpot_s, data.targets.at
    fig, ax = plt.subplots(figsize=(8.5, 4.6), dpi=DPI)
    for n, (label, points) in enumerate(_points(data).items()):
        pts = sorted(points, key=lambda p: p["rate_per_s"])
        ax.plot([p[f"tpot_{at}_s"] for p in pts], [p["output_tokens_per_s"] for p in pts],
                **_style(label, n))
    ax.axvline(target, color="black", linestyle=":", linewidth=1.2,
               label=f"TPOT target {seconds(target)}")
    cmp_ = data.comparison
    best = data.rows()
    if cmp_.goodput_ratio:
        for plan in ("colocated", "disaggregated"):
            c = best[cmp_.best(plan)]
            ax.annotate(f"best {plan}: {with_unit(c.output_tokens_per_s, 'tok/s')}",
                        (getattr(c, f"tpot_{at}_s"), c.output_tokens_per_s),
                        textcoords="offset points", xytext=(8, -14 if plan == "colocated" else 8),
                        arrowprops={"arrowstyle": "-", "color": "grey"})
        ax.set_title(f"{data.model} on {data.cluster}, {data.workload}: "
                     f"{cmp_.goodput_ratio:.2f}x goodput (max rate met)\ndisaggregated at "
                     "the same TPOT target")
    log_axis(ax, "x", seconds_formatter())
    log_axis(ax, "y")
    ax.set_xlabel(f"{at} TPOT")
    ax.set_ylabel("output tokens/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="best", framealpha=0.9)
    fig.tight_layout()
    return save_figure(fig, path, formats)


@styled
def attainment_vs_rate(data: ExperimentReport, path: Path, formats=("png",)) -> list[Path]:
    """Above: each configuration's share of requests meeting both targets at every rate its
    search ran, the rates that met all the targets filled and those that failed hollow, on an
    axis that starts below the lowest share drawn (at 0 to 100% a share of 97% reads as
    100%). Below: each run's pace (its first tokens' span over its arrivals') against the
    limit a steady run keeps: a short run can end before its growing queue pushes TTFT past
    the target, and fail there with its attainment still high."""
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(8.5, 6.6), dpi=DPI, sharex=True,
                                 height_ratios=(3, 2), layout="constrained")
    target = data.targets.attainment
    lowest, paces = target, []
    for n, (label, points) in enumerate(_points(data).items()):
        pts = sorted(points, key=lambda p: p["rate_per_s"])
        style = _style(label, n)
        rates = [p["rate_per_s"] for p in pts]
        shares = [p["slo_attainment"] for p in pts]
        lowest = min([lowest, *shares])
        ax.plot(rates, shares, **{**style, "marker": None})
        paced = [(p["rate_per_s"], p["pace"], p["met"]) for p in pts
                 if p.get("pace") is not None and math.isfinite(p["pace"])]
        paces += [pace for _, pace, _ in paced]
        bx.plot([r for r, _, _ in paced], [q for _, q, _ in paced],
                **{**style, "marker": None, "label": None})
        for axis, xy in ((ax, [(p["rate_per_s"], p["slo_attainment"], p["met"]) for p in pts]),
                         (bx, paced)):
            for met in (True, False):
                chosen = [(x, y) for x, y, m in xy if bool(m) == met]
                if chosen:
                    axis.plot(*zip(*chosen), linestyle="none", marker=style["marker"],
                              markersize=5, color=style["color"],
                              markerfacecolor=style["color"] if met else "white")
    ax.axhline(target, color="black", linestyle=":", linewidth=1.2)
    # From a tenth below the lowest share drawn (or the target), so that every share, failed
    # runs' too, stands apart from 100%.
    bottom = max(0.0, math.floor((lowest - 0.05) * 10) / 10)
    pad = (1 - bottom) * 0.04  # markers at either end clear of the frame
    ax.set_ylim(bottom - pad, 1 + pad)
    # Whole percentages (a step of 2.5% would print 97.5% as 98%).
    ax.yaxis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 5, 10]))
    axis_numbers(ax.yaxis, percent_formatter())
    ax.set_ylabel("requests meeting both targets")
    ax.set_title("SLO attainment against request rate")
    bx.axhline(MAX_PACE, color="black", linestyle="--", linewidth=1.2)
    if paces and max(paces) / max(min(paces), 1e-9) > 3:
        log_axis(bx, "y")
    else:
        axis_numbers(bx.yaxis)
    bx.set_ylabel("pace (first tokens' span\nper span of arrivals)")
    bx.set_xlabel("request rate (requests per s; sessions per s for agentic workloads)")
    for a in (ax, bx):
        log_axis(a, "x")
        a.grid(True, which="both", alpha=0.3)
    handles = [Line2D([], [], **_style(label, n)) for n, label in enumerate(_points(data))]
    handles += [Line2D([], [], color="grey", marker="o", linestyle="none",
                       label="rate met every target"),
                Line2D([], [], color="grey", marker="o", markerfacecolor="white",
                       linestyle="none", label="rate failed (a target, or a growing queue)"),
                Line2D([], [], color="black", linestyle=":", linewidth=1.2,
                       label=f"attainment required ({target:.0%})"),
                Line2D([], [], color="black", linestyle="--", linewidth=1.2,
                       label=f"pace above which the queue grows ({number(MAX_PACE)})")]
    fig.legend(handles=handles, loc="outside lower center", ncol=2, framealpha=0.9)
    return save_figure(fig, path, formats)


@styled
def sensitivity(data: VaryReport, path: Path, formats=("png",)) -> list[Path]:
    """The ratio of the plans' goodputs at each value of the varied input (with its 95%
    interval when the experiment ran several draws); for the TPOT target, the x axis counts
    decode steps of one sequence, so that any model and fabric read alike."""
    rows = [r for r in data.sensitivity if r.goodput_ratio is not None]
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=DPI)
    tpot = data.vary == "tpot"
    x = [r.tpot_in_decode_steps if tpot else r.value for r in rows]
    y = [r.goodput_ratio for r in rows]
    err = None
    if rows and all(has_interval(r.goodput_ratio_interval) for r in rows):
        y = [r.goodput_ratio_interval["mean"] for r in rows]
        err = ratio_bars([r.goodput_ratio_interval for r in rows])
    ax.errorbar(x, y, yerr=err, color=OKABE_ITO[0], marker="o", linewidth=1.4, capsize=3,
                label="disaggregated / colocated goodput" + (" (95% interval)" if err else ""))
    ax.axhline(1.0, color="black", linestyle=":", linewidth=1.2, label="break-even")
    if tpot:
        log_axis(ax, "x")
        # Each run states its targets (runs read back from before: none, p90).
        at = data.runs[0].targets.at if data.runs else "p90"
        ax.set_xlabel(f"{at} TPOT target, in decode steps of one sequence alone")
    else:
        axis_numbers(ax.xaxis)
        ax.set_xlabel(f"{data.vary}: {data.description}")
    axis_numbers(ax.yaxis, ratio_formatter())
    ax.set_ylabel("goodput ratio (highest rate met)")
    ax.set_title(f"{data.model} on {data.fabric}, {data.workload}: where "
                 "disaggregation pays")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(framealpha=0.9)
    fig.tight_layout()
    return save_figure(fig, path, formats)


@styled
def frontier(data: FrontierReport, path: Path, formats=("png",)) -> list[Path]:
    """Left: each plan's points (output tokens/s per system against the per-user speed at least
    90% of requests reached), its Pareto frontier joined, intervals over draws as bars, the
    headline's per-user speed marked. Right: the capacity ratio at each rung's target speed."""
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 5), dpi=DPI)
    for n, plan in enumerate(("colocated", "disaggregated")):
        style = {"color": OKABE_ITO[n], "marker": "s" if n else "o"}
        points = [r.plans[plan] for r in data.rungs if r.plans[plan].reached]
        x = [p.user_tokens_per_s.p90 for p in points]
        y = [p.tokens_per_s_per_system for p in points]
        ax.errorbar(x, y, yerr=_bars(points), linestyle="none", alpha=0.5, capsize=2,
                    markersize=4, **style)
        front = data.frontier[plan]
        ax.plot([p.user_tokens_per_s.p90 for p in front],
                [p.tokens_per_s_per_system for p in front], linewidth=1.4,
                label=f"{plan} frontier" + (", speculative" if data.baseline else ""),
                **style)
        if data.baseline is not None:  # the same plan without speculation, faded
            base = data.baseline.frontier[plan]
            ax.plot([p.user_tokens_per_s.p90 for p in base],
                    [p.tokens_per_s_per_system for p in base], linewidth=1.2,
                    linestyle="--", alpha=0.6, label=f"{plan}, no speculation",
                    color=style["color"], marker=style["marker"], markerfacecolor="none")
    head = data.headline
    if head:
        vendor = " (the vendor's speed)" if head.vendor else ""
        for a in (ax, bx):
            a.axvline(head.user_speed, color="black", linestyle=":", linewidth=1.2,
                      label=f"{head.user_speed:,.0f} tokens/s per user{vendor}")
    log_axis(ax, "x")
    log_axis(ax, "y")
    ax.set_xlabel("output tokens/s per user (reached by 90% of requests)")
    ax.set_ylabel("output tokens/s per system (steady window)")
    rows = [r for r in data.rungs if isinstance(r.capacity_ratio.ratio, float)]
    bx.errorbar([r.user_speed for r in rows], [r.capacity_ratio.ratio for r in rows],
                yerr=ratio_bars([r.capacity_ratio.interval for r in rows]),
                color=OKABE_ITO[2], marker="o", capsize=3, linewidth=1.4,
                label="disaggregated / colocated capacity"
                + (", speculative" if data.baseline else ""))
    if data.baseline is not None:
        base = [r for r in data.baseline.rungs if isinstance(r.capacity_ratio.ratio, float)]
        bx.errorbar([r.user_speed for r in base], [r.capacity_ratio.ratio for r in base],
                    yerr=ratio_bars([r.capacity_ratio.interval for r in base]),
                    color=OKABE_ITO[2], marker="o", markerfacecolor="none", capsize=3,
                    linewidth=1.2, linestyle="--", alpha=0.6, label="no speculation")
    bx.axhline(1.0, color="grey", linestyle="--", linewidth=1.0, label="break-even")
    log_axis(bx, "x")
    axis_numbers(bx.yaxis, ratio_formatter())
    bx.set_xlabel("per-user speed target, output tokens/s\n(p90 TPOT = 1 / speed)")
    bx.set_ylabel("ratio of output tokens/s per system")
    for a in (ax, bx):
        a.grid(True, which="both", alpha=0.3)
        a.legend(framealpha=0.9)
    fig.suptitle(f"{data.model} on {data.cluster}, {data.workload}: throughput against "
                 "per-user speed")
    fig.tight_layout()
    return save_figure(fig, path, formats)


@styled
def pairings(data: PairingsReport, path: Path, formats=("png",)) -> list[Path]:
    """Every pairing's disaggregated frontier, and each kind's colocated one (from its pairing
    with itself), on one axes: output tokens/s per footprint unit against the per-user speed
    at least 90% of requests reached, intervals over draws as bars; the vendor's speed
    marked where the frontiers name it."""
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=DPI)
    curves = [(f"colocated on {kind} alone", f, "colocated")
              for kind, f in data.colocated().items()]
    curves += [(label, f, "disaggregated") for label, f in data.frontiers.items()]
    # The palette without its yellow, too pale for a line on white.
    colours = [c for c in OKABE_ITO if c != "#F0E442"]
    for n, (label, f, plan) in enumerate(curves):
        front = f.frontier[plan]
        if not front:
            continue
        ax.errorbar([p.user_tokens_per_s.p90 for p in front],
                    [p.tokens_per_s_per_system for p in front], yerr=_bars(front), capsize=2,
                    color=colours[n % len(colours)], linewidth=1.4,
                    linestyle="--" if plan == "colocated" else "-",
                    marker="o" if plan == "colocated" else "s", markersize=4, label=label)
    speeds = {f.headline.user_speed for f in data.frontiers.values() if f.headline}
    for speed in sorted(speeds):
        ax.axvline(speed, color="black", linestyle=":", linewidth=1.2,
                   label=f"{speed:,.0f} tokens/s per user")
    log_axis(ax, "x")
    log_axis(ax, "y")
    ax.set_xlabel("output tokens/s per user (reached by 90% of requests)")
    ax.set_ylabel(f"output tokens/s per {data.footprint_unit} (steady window)")
    ax.grid(True, which="both", alpha=0.3)
    # Below the curves: the high-capacity corner, top right, is where they end.
    ax.legend(framealpha=0.9, fontsize="small", loc="lower left")
    ax.set_title(f"{data.model}, {data.workload}: every pairing of "
                 f"{', '.join(data.kinds)}, in the same footprint")
    fig.tight_layout()
    return save_figure(fig, path, formats)


@styled
def drift(data: DriftReport, path: Path, formats=("png",)) -> list[Path]:
    """Per workload served on: left, the ratio of the plans as tuned on the first workload
    and as retuned (95% intervals over draws); right, each plan's regret kept as tuned. A
    workload where a plan met no rate shows no bar for it."""
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.8), dpi=DPI)
    names = [r.workload for r in data.rows]
    x = list(range(len(names)))
    width = 0.38
    for k, (what, label) in enumerate((("fixed_ratio", f"as tuned on {data.tuned_on}"),
                                       ("retuned_ratio", "both retuned"))):
        ivs = [getattr(r, what) for r in data.rows]
        shown = [iv if iv.get("mean") is not None else {"mean": 0.0} for iv in ivs]
        ax.bar([i + (k - 0.5) * width for i in x], [iv["mean"] for iv in shown], width,
               yerr=ratio_bars(shown), capsize=3, color=OKABE_ITO[k], label=label)
    for i, r in zip(x, data.rows):  # where there is no bar to see, why
        iv = r.fixed_ratio
        why = "neither plan\nmet a rate" if iv.get("mean") is None else \
            "the split\nmet no rate" if not any(iv["values"]) else None
        if why:
            ax.text(i, 0.05, why, ha="center", va="bottom", fontsize="small")
    ax.axhline(1.0, color="black", linestyle=":", linewidth=1.2, label="break-even")
    ax.set_ylabel("disaggregated / colocated capacity")
    axis_numbers(ax.yaxis, ratio_formatter())
    for k, plan in enumerate(PLANS):
        ivs = [r.regret[plan] for r in data.rows]
        means = [iv["mean"] if iv.get("mean") is not None else 0.0 for iv in ivs]
        err = [[m - iv["low"] if has_interval(iv) else 0.0 for m, iv in zip(means, ivs)],
               [iv["high"] - m if has_interval(iv) else 0.0 for m, iv in zip(means, ivs)]]
        bx.bar([i + (k - 0.5) * width for i in x], means, width, yerr=err, capsize=3,
               color=("#009E73", "#CC79A7")[k], label=f"{plan}, kept as tuned")
    bx.set_ylabel("capacity given up against retuning")
    axis_numbers(bx.yaxis, percent_formatter())
    for a in (ax, bx):
        a.set_xticks(x)
        a.set_xticklabels(names, rotation=20, ha="right")
        a.grid(True, axis="y", alpha=0.3)
        a.legend(framealpha=0.9, fontsize="small")
    fig.suptitle(f"{data.model} on {data.cluster}:\nboth plans tuned on {data.tuned_on}, "
                 "served on other traffic")
    fig.tight_layout()
    return save_figure(fig, path, formats)


def draw_experiment(data: ExperimentReport | VaryReport | FrontierReport | DriftReport,
                    out: Path, formats=("png",)) -> list[tuple]:
    if isinstance(data, DriftReport):
        return [(drift(data, out / "drift", formats)[0],
                 f"Left: the ratio of the plans on each workload, both as tuned on "
                 f"{data.tuned_on} and both retuned on it (bars: 95% intervals over draws); "
                 "right: the capacity each plan, kept as tuned, gives up against its "
                 "retuning.")]
    if isinstance(data, FrontierReport):
        if not data.rungs:
            return []
        return [(frontier(data, out / "frontier", formats)[0],
                 "Left: each plan's output tokens/s per system against the per-user speed "
                 "90% of its requests reached, one point per rung (bars: 95% intervals over "
                 "draws), its frontier joined; right: the ratio at each rung's target speed. "
                 "The dotted line is the headline's per-user speed."
                 + (" Dashed and hollow: the same without speculative decoding."
                    if data.baseline is not None else ""))]
    if isinstance(data, VaryReport):
        if not data.sensitivity:
            return []
        return [(sensitivity(data, out / "sensitivity", formats)[0],
                 f"The disaggregated/colocated goodput ratio at each value of {data.vary} "
                 f"({data.description}); above the dotted line disaggregation pays.")]
    if not any(data.points.values()):
        return []
    return [(throughput_vs_tpot(data, out / "throughput_vs_tpot", formats)[0],
             f"Output throughput against {data.targets.at} TPOT at every rate the search "
             "tried; the dotted line is the TPOT target (the same token speed for every "
             "configuration)."),
            (attainment_vs_rate(data, out / "attainment_vs_rate", formats)[0],
             "Share of requests meeting both latency targets against request rate, rates "
             "that failed hollow; below, each run's pace against the limit of a steady run: "
             "a run can fail on a growing queue with its attainment still high.")]


def _points(data: ExperimentReport) -> dict:
    """The search points to draw: each plan's best searched on the confirming runs, or, before
    they existed or without them, every configuration tuned."""
    return data.final_points or data.points
