"""Figures of a serving run (``wse-emu serve -o``): latency CDFs, TPOT over time with prompt
arrivals marked, a window of the pipeline (stages x time, prefill and decode coloured apart),
KV occupancy over time, and prefix-cache hits with the host tier's traffic."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import FuncFormatter, MaxNLocator

from wse_emu.errors import UserError
from wse_emu.serving.metrics import ServeReport
from wse_emu.util.configfile import regular_file
from wse_emu.util.fmt import duration, number, seconds
from wse_emu.visualize.draw import DPI, OKABE_ITO, save_figure
from wse_emu.visualize.style import (
    SMALL_PT,
    axis_numbers,
    log_axis,
    percent_formatter,
    seconds_formatter,
    styled,
)

PREFILL, DECODE, MIXED = OKABE_ITO[5], OKABE_ITO[4], OKABE_ITO[6]
WINDOW_BATCHES = 150  # micro-batches through stage 0 shown in the pipeline window
WINDOW_ROOM = 0.03  # room left after the window's last micro-batch, a share of the window


def read_requests(path: Path) -> dict[str, np.ndarray]:
    return _requests_of(path, _read_csv(path))


def _requests_of(path: Path, rows: list[dict]) -> dict[str, np.ndarray]:
    """requests.csv's columns the figures read, from its ``rows``."""
    if not rows:
        raise UserError(f"{path}: no requests")
    return _columns(path, rows, ("arrival_s", "ttft_s", "tpot_s", "e2e_s", "prompt_tokens",
                                 "output_tokens"))


def _read_csv(path: Path) -> list[dict]:
    try:
        with open(regular_file(path), newline="") as fh:
            return list(csv.DictReader(fh))
    except (OSError, csv.Error) as exc:
        raise UserError(f"{path}: unreadable ({exc})") from None


# Columns where a run writes infinity: the times of a request it refused.
UNBOUNDED_COLUMNS = ("ttft_s", "tpot_s", "e2e_s")


def _columns(path: Path, rows: list[dict], names) -> dict[str, np.ndarray]:
    """Numeric columns of a run's CSV; a damaged file is one clear error, not a traceback,
    and so is a number no run writes (negative, NaN, or infinite but for a refused request's
    times), named by column and row."""
    try:
        columns = {k: np.array([float(r[k]) for r in rows]) for k in names}
    except KeyError as exc:
        raise UserError(f"{path}: no column {exc}") from None
    except (TypeError, ValueError):
        raise UserError(f"{path}: a value that is not a number") from None
    for name, values in columns.items():
        bad = np.isnan(values) | (values < 0) | (np.isinf(values) & (name not in
                                                                     UNBOUNDED_COLUMNS))
        if bad.any():
            row = int(np.argmax(bad))
            raise UserError(f"{path}: {name} of row {row + 1} is {float(values[row])!r}, "
                            "which no run writes (the file was edited or damaged): write it "
                            "again")
    return columns


@styled
def latency_cdfs(requests: dict, targets: dict, path: Path, formats=("png",)) -> list[Path]:
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), dpi=DPI)
    for ax, key, name in ((axes[0], "ttft_s", "TTFT"), (axes[1], "tpot_s", "TPOT")):
        values = np.sort(requests[key])
        ax.step(values, np.arange(1, len(values) + 1) / len(values), where="post",
                color="black")
        target = targets.get(key)
        if target:
            ax.axvline(target, color=PREFILL, linestyle="--", label=f"target {seconds(target)}")
            ax.legend(loc="lower right")
        ax.axhline(0.9, color="grey", linestyle=":", linewidth=1)
        log_axis(ax, "x", seconds_formatter())
        axis_numbers(ax.yaxis, percent_formatter())
        ax.set_xlabel(name)
        ax.set_ylabel("requests")
        ax.set_title(f"{name}: cumulative distribution")
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path, formats)


def _tpot_panel(ax, requests: dict, targets: dict, low: float, point_label: str) -> None:
    """Each request's TPOT at the time of its first token, prompt arrivals as ticks at
    ``low`` (seconds), and the TPOT target, on a log scale."""
    first = requests["arrival_s"] + requests["ttft_s"]
    ax.scatter(first, requests["tpot_s"], s=6, color=DECODE, alpha=0.6, label=point_label)
    ax.plot(requests["arrival_s"], np.full(len(first), low), "|", color=PREFILL, markersize=8,
            label="prompt arrivals")
    if targets.get("tpot_s"):
        ax.axhline(targets["tpot_s"], color="black", linestyle="--", linewidth=1,
                   label=f"TPOT target {seconds(targets['tpot_s'])}")
    log_axis(ax, "y", seconds_formatter())
    axis_numbers(ax.xaxis, seconds_formatter())
    ax.set_xlabel("time")
    ax.grid(True, alpha=0.3)


def _tick_level(runs) -> float:
    """Where the arrival ticks go: half the lowest TPOT drawn (seconds)."""
    return max(min(float(np.min(r["tpot_s"])) for r in runs) * 0.5, 1e-6)


@styled
def tpot_over_time(requests: dict, targets: dict, path: Path, formats=("png",)) -> list[Path]:
    """Each request's TPOT at the time of its first token; prompt arrivals as ticks below:
    where prefill shares the pipeline, TPOT rises where the ticks crowd."""
    fig, ax = plt.subplots(figsize=(9, 3.6), dpi=DPI)
    _tpot_panel(ax, requests, targets, _tick_level([requests]),
                "a request's TPOT (at its first token)")
    ax.set_ylabel("TPOT")
    ax.set_title("TPOT over time, with prompt arrivals")
    ax.legend(loc="upper right", framealpha=0.9)
    fig.tight_layout()
    return save_figure(fig, path, formats)


@styled
def pipeline_window(timeline: dict, path: Path, formats=("png",)) -> list[Path]:
    """Stages x time for every region, over a window of ``WINDOW_BATCHES`` micro-batches from
    the middle of the run, from the first's entry into stage 0 to the last's exit from the
    last stage (with whatever else the stages held then): prefill tiles, decode
    micro-batches and mixed ones coloured apart."""
    events = [e for e in timeline.get("traceEvents", []) if e.get("ph") == "X"]
    names = {e["pid"]: e["args"]["name"] for e in timeline.get("traceEvents", [])
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    if not events:
        raise UserError("the run's timeline.json has no stage events")
    regions = sorted({e["pid"] for e in events})[:4]
    # Constrained layout keeps every tick label, title and the legend above the panels inside
    # the figure, whatever the number of regions.
    fig, axes = plt.subplots(len(regions), 1, figsize=(9, 2.3 * len(regions) + 0.7), dpi=DPI,
                             squeeze=False, layout="constrained")
    for ax, pid in zip(axes[:, 0], regions):
        by_stage: dict[int, list] = {}  # stage -> its events in time order
        for e in events:
            if e["pid"] == pid:
                by_stage.setdefault(e["tid"], []).append(e)
        for mine in by_stage.values():
            mine.sort(key=lambda e: e["ts"])
        a, b, shown = _window(by_stage)
        # A little room after the last micro-batch, so that it does not run into the frame;
        # what else the stages held in the window is drawn too (cut at its edges).
        right = b + (b - a) * WINDOW_ROOM
        stages = max(by_stage) + 1
        bars: dict[tuple, list] = {}  # (stage, colour) -> its bars: one collection each
        for stage, mine in by_stage.items():
            for e in mine:
                if e["ts"] + e["dur"] < a or e["ts"] > right:
                    continue
                color = (MIXED if "+" in e["name"] else PREFILL if e["name"] == "prefill"
                         else DECODE)
                bars.setdefault((stage, color), []).append(((e["ts"] - a) / 1e6,
                                                            e["dur"] / 1e6))
        for (stage, color), spans in bars.items():
            ax.broken_barh(spans, (stage - 0.4, 0.8), facecolors=color, linewidth=0)
        ax.set_xlim(0, (right - a) / 1e6)
        ax.set_ylim(stages - 0.5, -0.5)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        axis_numbers(ax.xaxis, seconds_formatter())
        ax.set_ylabel("stage")
        ax.set_title(f"{names.get(pid, pid)}: {shown} micro-batches from {duration(a / 1e6)}",
                     fontsize=SMALL_PT + 1)
    axes[-1, 0].set_xlabel("time in the window")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in (PREFILL, DECODE, MIXED)]
    fig.legend(handles, ["prefill tile", "decode micro-batch", "decode + prefill chunk"],
               loc="outside upper center", ncol=3, frameon=False)
    return save_figure(fig, path, formats)


def _window(by_stage: dict[int, list]) -> tuple[float, float, int]:
    """(start, end, count) of a region's window: in microseconds, from the middle
    micro-batch's entry into stage 0 to the exit from the last stage of the
    ``WINDOW_BATCHES``-th from there, and how many micro-batches that is. A stage's n-th
    event is the n-th micro-batch (each passes every stage, in order); a stage whose events
    the timeline cut short ends at its last."""
    first = by_stage[min(by_stage)]
    i0 = len(first) // 2
    i1 = min(len(first) - 1, i0 + WINDOW_BATCHES - 1)
    a = first[i0]["ts"]
    b = max(e["ts"] + e["dur"] for e in (mine[min(i1, len(mine) - 1)]
                                          for mine in by_stage.values()))
    return a, max(b, a + 1.0), i1 - i0 + 1


@styled
def kv_occupancy(path_csv: Path, capacities: dict, path: Path, formats=("png",)) -> list[Path]:
    rows = _read_csv(path_csv)
    values = _columns(path_csv, rows, ("time_s", "kv_tokens"))
    traces: dict[str, list] = {}
    for row, t, k in zip(rows, values["time_s"], values["kv_tokens"]):
        traces.setdefault(row.get("region", "?"), []).append((t, k))
    fig, ax = plt.subplots(figsize=(9, 3.4), dpi=DPI)
    for n, (name, trace) in enumerate(sorted(traces.items())[:8]):
        t, k = np.array(trace).T if trace else (np.zeros(1), np.zeros(1))
        cap = capacities.get(name) or 1
        ax.step(t, k / cap, where="post", color=OKABE_ITO[n % len(OKABE_ITO)], label=name,
                linewidth=1)
    ax.set_ylim(0, 1.05)
    axis_numbers(ax.xaxis, seconds_formatter())
    axis_numbers(ax.yaxis, percent_formatter())
    ax.set_xlabel("time")
    ax.set_ylabel("KV cache held, of capacity")
    ax.set_title("KV occupancy over time")
    ax.legend(loc="upper right", ncol=2)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path, formats)


CACHE_BINS = 40  # spans of arrival time the prefix-cache figure sums over


@styled
def prefix_cache(requests: dict, path: Path, formats=("png",)) -> list[Path]:
    """Over the run, by arrival time: the share of prompt tokens each span's requests found in
    their region's prefix cache, and of those brought back from the host tier (top); the KV
    the host tier sent back over the systems' links and, where the run says (``parked_tokens``),
    the KV parked there to admit them, in tokens per second (bottom)."""
    arrival = requests["arrival_s"]
    edges = np.linspace(arrival.min(), arrival.max() + 1e-9, CACHE_BINS + 1)
    at = np.clip(np.searchsorted(edges, arrival, side="right") - 1, 0, CACHE_BINS - 1)

    def summed(key: str) -> np.ndarray:
        return np.bincount(at, weights=requests[key], minlength=CACHE_BINS)

    prompts, cached, restored = (summed(k) for k in ("prompt_tokens", "cached_tokens",
                                                      "restored_tokens"))
    share = np.divide(cached, prompts, out=np.zeros(CACHE_BINS), where=prompts > 0)
    back = np.divide(restored, prompts, out=np.zeros(CACHE_BINS), where=prompts > 0)
    mids, width = (edges[:-1] + edges[1:]) / 2, float(edges[1] - edges[0])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 4.8), dpi=DPI, sharex=True)
    top.bar(mids, share, width=width, color=OKABE_ITO[1], label="from the prefix cache")
    top.bar(mids, np.minimum(back, share), width=width, color=OKABE_ITO[4],
            label="of it, back from the host tier")
    total = requests["cached_tokens"].sum() / max(requests["prompt_tokens"].sum(), 1)
    top.axhline(total, color="black", linestyle=":", linewidth=1,
                label=f"whole run: {total:.1%}")
    top.set_ylim(0, max(0.05, float(share.max()) * 1.15))
    axis_numbers(top.yaxis, percent_formatter())
    top.set_ylabel("prompt tokens")
    top.set_title("Prefix cache hits and host-tier traffic, by arrival time")
    top.legend(loc="upper right", ncol=3, framealpha=0.9)
    bottom.bar(mids, restored / width, width=width, color=OKABE_ITO[4], label="back (in)")
    if "parked_tokens" in requests:  # (a run written before it was counted has none)
        parked = summed("parked_tokens")
        bottom.bar(mids, -parked / width, width=width, color=OKABE_ITO[5],
                   label="parked (out)")
        bottom.axhline(0.0, color="black", linewidth=0.8)
        bottom.legend(loc="lower right", ncol=2, framealpha=0.9)
        axis_numbers(bottom.yaxis, FuncFormatter(lambda v, _: number(abs(v))))
    bottom.set_ylabel("host-tier KV tokens\nper second")
    axis_numbers(bottom.xaxis, seconds_formatter())
    bottom.set_xlabel("arrival time")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path, formats)


def draw_serving(run_path: Path, report: ServeReport, out: Path,
                 formats=("png",)) -> list[tuple]:
    """Every serving figure of the run directory (its metrics.json read as ``report``), with
    captions."""
    rows = _read_csv(run_path / "requests.csv")  # read once, for every figure below
    requests = _requests_of(run_path / "requests.csv", rows)
    targets = report.targets
    figures = [(latency_cdfs(requests, targets, out / "latency_cdfs", formats)[0],
                "TTFT and TPOT distributions; the dotted line marks the 90th percentile."),
               (tpot_over_time(requests, targets, out / "tpot_over_time", formats)[0],
                "Each request's TPOT over time; ticks at the bottom are prompt arrivals.")]
    if (run_path / "timeline.json").exists():
        try:
            timeline = json.loads(regular_file(run_path / "timeline.json").read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"{run_path / 'timeline.json'}: not valid JSON ({exc})") from None
        if any(e.get("ph") == "X" for e in timeline.get("traceEvents", [])):
            try:
                window = pipeline_window(timeline, out / "pipeline", formats)[0]
            except (KeyError, TypeError) as exc:
                raise UserError(f"{run_path / 'timeline.json'}: an event lacks {exc}") from None
            figures.append((window, "A window of each region's pipeline: stages down, time "
                                    "across."))
    if (run_path / "kv_occupancy.csv").exists():
        caps = {n: r["kv_capacity_tokens"] for n, r in report.regions.items()}
        figures.append((kv_occupancy(run_path / "kv_occupancy.csv", caps, out / "kv",
                                     formats)[0], "KV cache held by each region over time."))
    # (A run written before requests.csv had the cache's columns has no such figure.)
    if any(r.get("prefix_reused_tokens") for r in report.regions.values()) \
            and "cached_tokens" in rows[0]:
        hits = _columns(run_path / "requests.csv", rows,
                        ("arrival_s", "prompt_tokens", "cached_tokens", "restored_tokens")
                        + (("parked_tokens",) if "parked_tokens" in rows[0] else ()))
        figures.append((prefix_cache(hits, out / "prefix_cache", formats)[0],
                        "Prompt tokens found in the prefix cache and KV brought back from the "
                        "host tier, by arrival time."))
    return figures


@styled
def tpot_side_by_side(runs: dict, targets: dict, path: Path, formats=("png",)) -> list[Path]:
    """TPOT over time for several runs of the same requests (label -> requests), one panel each
    on shared axes: where prefill shares the pipeline, decode slows as prompts arrive."""
    fig, axes = plt.subplots(1, len(runs), figsize=(5.2 * len(runs), 3.8), dpi=DPI,
                             sharey=True, squeeze=False)
    low = _tick_level(runs.values())
    for ax, (label, requests) in zip(axes[0], runs.items()):
        _tpot_panel(ax, requests, targets, low, "a request's TPOT")
        ax.set_title(label)
    axes[0, 0].set_ylabel("TPOT")
    axes[0, 0].legend(loc="upper left", framealpha=0.9)
    fig.tight_layout()
    return save_figure(fig, path, formats)
