"""What a reader sees: every figure's text legible at its saved size, its numbers written as
the command line writes them (never '8.48e+03' or '10^3'), tick labels that do not collide,
pipeline stages in colours no two neighbours share, and printed tables that fit 100 columns."""

import contextlib
import io
import json
import re
from pathlib import Path

import matplotlib
import matplotlib.image as mpimg
import numpy as np
import pytest
from helpers import QUICK_KNOBS, SMALL_CHAT
from hypothesis import given
from hypothesis import strategies as st
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.text import Text

from wse_emu.cli.main import main
from wse_emu.sweeps.sweep import SweepRow, SweepSpec
from wse_emu.util.fmt import WIDTH, duration, narrow_table, number, seconds, si, table
from wse_emu.visualize import wafer
from wse_emu.visualize.draw import DPI, LEVEL_PALETTE, MapLook, level_cmap, map_figure, save_figure
from wse_emu.visualize.style import (
    TICK_PT,
    distinct_colours,
    log_axis,
    seconds_formatter,
    styled,
)
from wse_emu.visualize.sweep import sweep_figure

EXPONENT = re.compile(r"\d[eE][+-]?\d|\\mathdefault|\^\{|\$")  # 8.48e+03, 10^{3}, mathtext
SMALLEST_PT = 9


def serpentine(columns: int = 7, rows: int = 5, cell: int = 4) -> np.ndarray:
    """Stages laid as the compiler lays a long pipeline: bands of ``columns`` stages, every
    other band right to left."""
    out = np.zeros((rows * cell, columns * cell))
    for r in range(rows):
        for c in range(columns):
            stage = r * columns + (c if r % 2 == 0 else columns - 1 - c)
            out[r * cell:(r + 1) * cell, c * cell:(c + 1) * cell] = stage
    return out


def touching_pairs(levels: np.ndarray):
    """(a, b) for PEs side by side or one above the other with different levels."""
    for a, b in ((levels[:, :-1], levels[:, 1:]), (levels[:-1, :], levels[1:, :])):
        differ = np.isfinite(a) & np.isfinite(b) & (a != b)
        yield from zip(a[differ].astype(int), b[differ].astype(int))


# -- colours of categories --------------------------------------------------------------------

def test_a_plain_cycle_would_paint_touching_stages_alike_and_ours_does_not():
    levels = serpentine()
    cycled = [LEVEL_PALETTE[i % len(LEVEL_PALETTE)] for i in range(35)]
    assert any(cycled[a] == cycled[b] for a, b in touching_pairs(levels))  # 3 above 10
    colours = distinct_colours(levels, LEVEL_PALETTE, 35)
    assert all(colours[a] != colours[b] for a, b in touching_pairs(levels))
    assert all(colours[i] != colours[i + 1] for i in range(34))
    assert set(colours) <= set(LEVEL_PALETTE)


@given(st.lists(st.integers(0, 40), min_size=4, max_size=64))
def test_consecutive_levels_never_share_a_colour(values):
    levels = np.array(values, dtype=float).reshape(1, -1)
    colours = distinct_colours(levels, LEVEL_PALETTE, 41)
    assert all(colours[i] != colours[i + 1] for i in range(40))


def test_the_stage_map_is_discrete_and_its_pixels_tell_touching_stages_apart(tmp_path):
    levels = serpentine()
    cmap = level_cmap(levels, 35)
    assert isinstance(cmap, ListedColormap) and cmap.N == 35
    names = [(c * 4, r * 4, 4, 4, str(int(levels[r * 4, c * 4]))) for r in range(5)
             for c in range(7)]
    map_figure(levels, "Pipeline stages", "stage", tmp_path / "stages",
               look=MapLook(levels=35, names=names))
    drawn = (mpimg.imread(tmp_path / "stages.pixels.png")[:, :, :3] * 255).round()
    for (y, x), (y1, x1) in _touching_pes(levels):
        assert not np.array_equal(drawn[y, x], drawn[y1, x1]), (levels[y, x], levels[y1, x1])


def test_the_8b_stages_on_a_wafer_all_differ_from_their_neighbours(llama8b_colocated):
    levels = wafer.placement(llama8b_colocated)
    stages = max(len(r.stage_ids) for r in llama8b_colocated.regions)
    assert stages >= 16
    colours = distinct_colours(levels, LEVEL_PALETTE, stages)
    pairs = set(touching_pairs(levels))
    assert pairs and all(colours[a] != colours[b] for a, b in pairs)


def _touching_pes(levels: np.ndarray):
    ys, xs = np.nonzero(levels[:, :-1] != levels[:, 1:])
    yield from (((y, x), (y, x + 1)) for y, x in zip(ys, xs))
    ys, xs = np.nonzero(levels[:-1, :] != levels[1:, :])
    yield from (((y, x), (y + 1, x)) for y, x in zip(ys, xs))


# -- numbers ----------------------------------------------------------------------------------

@given(st.floats(min_value=-1e17, max_value=1e17, allow_nan=False))
def test_numbers_never_take_exponent_form(value):
    assert not EXPONENT.search(number(value))
    assert not EXPONENT.search(duration(abs(value) / 1e12))


@given(st.floats(min_value=-1e17, max_value=1e17, allow_nan=False))
def test_si_never_takes_exponent_form_below_its_largest_prefix(value):
    assert "e+" not in si(value) and "e+" not in si(value, "B")


def test_si_takes_the_next_prefix_where_a_value_rounds_up_to_it():
    assert [si(v) for v in (999.5, 999_999, 999.5e9, -999.6)] == ["1 k", "1 M", "1 T", "-1 k"]
    # Everything else as it was: small numbers kept, three digits, a unit joined to the prefix.
    assert [si(v, "B") for v in (999.4, 999, 1234, 12, 0.5, 2**40)] == \
        ["999 B", "999 B", "1.23 kB", "12 B", "0.5 B", "1.1 TB"]


def test_numbers_read_as_the_command_line_writes_them():
    assert [number(v) for v in (8480.0, 37470.0, 0.005, 1.5e-5, 0.0, 7.0)] == \
        ["8.48 k", "37.5 k", "0.005", "0.000015", "0", "7"]
    assert [duration(v) for v in (0.005, 0.0, -0.0005, 12.0, 1250.0)] == \
        ["5 ms", "0 s", "-500 us", "12 s", "1,250 s"]


# -- tables -----------------------------------------------------------------------------------

def test_a_table_that_fits_is_unchanged_and_a_wide_one_is_wrapped_to_fit():
    rows = [["colocated", "4.96 k"], ["disaggregated", "8.08 k"]]
    assert narrow_table(["plan", "goodput"], rows) == table(["plan", "goodput"], rows)
    wide = [["colocated, 2 copies, interleaved 2:1, tile 16, batch 64", "16.4 k",
             "p90 TTFT, attainment and a growing queue (85.5% < 90%)", "66"]]
    text = narrow_table(["configuration", "tok/s/system", "next rate fails on",
                         "on-target/s (makespan)"], wide, "lrlr")
    assert max(len(line) for line in text.splitlines()) <= WIDTH
    words = " ".join(text.split())
    for cell in wide[0]:
        assert all(word in words for word in cell.split())


# -- figures ----------------------------------------------------------------------------------

def _drawn_tick_labels(fig):
    """(axis, label) of every tick label a saved figure shows."""
    axes = list(fig.axes) + [c for ax in fig.axes for c in ax.child_axes]
    for ax in axes:
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis._update_ticks():  # the ticks within the view, as drawn
                for label in (tick.label1, tick.label2):
                    if label.get_visible() and label.get_text():
                        yield axis, label


def check_figure(fig, name: str) -> list[str]:
    """What is wrong with a figure about to be saved: small text, numbers in exponent form,
    tick labels on one axis that overlap."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    problems = []
    for text in fig.findobj(Text):
        if text.get_visible() and text.get_text().strip():
            if text.get_fontsize() < SMALLEST_PT:
                problems.append(f"{name}: {text.get_text()!r} at {text.get_fontsize()} pt")
            if EXPONENT.search(text.get_text()):
                problems.append(f"{name}: {text.get_text()!r} in exponent form")
    by_axis: dict = {}
    for axis, label in _drawn_tick_labels(fig):
        if label.get_fontsize() < TICK_PT:
            problems.append(f"{name}: tick {label.get_text()!r} at {label.get_fontsize()} pt")
        by_axis.setdefault(id(axis), []).append(label)
    for labels in by_axis.values():
        boxes = [(lb.get_text(), lb.get_window_extent(renderer)) for lb in labels]
        for i, (a, box) in enumerate(boxes):
            for b, other in boxes[i + 1:]:
                if box.shrunk(0.98, 0.9).overlaps(other.shrunk(0.98, 0.9)):
                    problems.append(f"{name}: tick labels {a!r} and {b!r} overlap")
    return problems


@pytest.fixture(scope="module")
def checked():
    """Every figure saved while the fixture is active is checked first: name -> problems."""
    seen: dict[str, list[str]] = {}
    original = Figure.savefig

    def savefig(fig, path, *args, **kwargs):
        seen[Path(path).name] = check_figure(fig, Path(path).name)
        return original(fig, path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Figure, "savefig", savefig)
        yield seen


@pytest.fixture(scope="module")
def runs(tmp_path_factory, checked):
    """Run directories of every kind the figures come from, drawn, and what each command
    printed: name -> (path, output)."""
    root = tmp_path_factory.mktemp("style")
    cache = ["--cache-dir", str(root / "cache")]
    experiment = ["experiment", "disagg", "tiny", "--fabric", "mesh16", "--workload",
                  str(SMALL_CHAT), "--ttft-slo", "0.05", "--tpot-slo", "0.001", *QUICK_KNOBS,
                  "--workers", "1", *cache]
    frontier = ["experiment", "frontier", *experiment[2:9], *QUICK_KNOBS, "--workers", "1",
                *cache, "--user-speeds", "40000,5000", "--user-speed", "5000",
                "--step-scales", "none", "--seeds", "2"]
    commands = {
        "run": ["run", "tiny", "--fabric", "mesh16", "--plan", "disaggregated", "--phase",
                "decode", "--batch", "1", "--context", "128"],
        "serve": ["serve", "tiny", "--fabric", "mesh16", "--workload", str(SMALL_CHAT),
                  "--ttft-slo", "0.05", "--tpot-slo", "0.001", *cache],
        "experiment": experiment,
        "vary": experiment + ["--vary", "tpot=0.0002,0.002"],
        "frontier": frontier,
    }
    out = {}
    for name, args in commands.items():
        path = root / name
        out[name] = (path, _printed(args + ["-o", str(path)]))
        assert main(["--quiet", "viz", str(path)]) == 0
    return out


def _printed(args) -> str:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["--quiet"] + args) == 0
    return buffer.getvalue()


@pytest.mark.e2e
def test_every_figure_of_every_run_reads_at_its_saved_size(runs, checked):
    drawn = set(checked)
    assert {"map_placement.png", "map_kernels.png", "map_compute.png", "regions_compute.png",
            "roofline.png", "latency_cdfs.png", "tpot_over_time.png", "pipeline.png",
            "kv.png", "throughput_vs_tpot.png", "attainment_vs_rate.png", "sensitivity.png",
            "frontier.png"} <= drawn
    assert [p for problems in checked.values() for p in problems] == []


def test_sweep_figures_read_at_their_saved_size(tmp_path, checked):
    rows = [{"config": {"sram": s, "clock": c}, "result": {"tokens_per_s_pipelined": s * c}}
            for s in (40960, 49152, 57344) for c in (0.9e9, 1.1e9, 1.3e9)]
    for axes in ({"sram": [40960, 49152, 57344]},
                 {"sram": [40960, 49152, 57344], "clock": [0.9e9, 1.1e9, 1.3e9]}):
        kept = [SweepRow(str(i), "run", **r) for i, r in enumerate(rows)
                if len(axes) == 2 or r["config"]["clock"] == 0.9e9]
        sweep_figure(SweepSpec("s", "run", axes=axes), kept, tmp_path / f"sweep{len(axes)}")
        assert checked[f"sweep{len(axes)}.png"] == []


@pytest.mark.parametrize("low, high", [(3e-6, 5e-6), (2e-6, 9e-6), (1e-6, 3e-4),
                                       (1e-6, 2e3), (7e-4, 1.1e-3)])
def test_a_log_axis_of_any_span_has_two_labels_or_more_and_none_collide(tmp_path, checked,
                                                                          low, high):
    @styled
    def draw():
        fig = matplotlib.pyplot.figure(figsize=(4, 3), dpi=DPI)
        ax = fig.add_subplot()
        ax.plot([low, high], [low, high])
        log_axis(ax, "x", seconds_formatter())
        log_axis(ax, "y")
        fig.tight_layout()
        labels = [lb.get_text() for axis, lb in _drawn_tick_labels(fig)]
        save_figure(fig, tmp_path / "span")
        return labels

    labels = draw()
    assert len([t for t in labels if t.endswith("s")]) >= 2  # the x axis, in seconds
    assert len([t for t in labels if not t.endswith("s")]) >= 2
    assert checked["span.png"] == []


@pytest.mark.e2e  # its fixture runs an experiment, a frontier and a serve: 20 s
def test_the_report_writes_numbers_as_the_command_line_does(runs):
    for name in ("run", "serve", "experiment", "frontier"):
        page = (runs[name][0] / "report.html").read_text()
        body = re.sub(r'src="data:[^"]*"', "", page)
        # The experiment's reasons are the library's sentences, shown as they are.
        body = re.sub(r"<tr><th>why</th>.*?</tr>", "", body)
        assert not re.search(r"\d[eE][+-]\d", body), name
    experiment = (runs["experiment"][0] / "report.html").read_text()
    assert "p90 TTFT &lt;= 50 ms, p90 TPOT &lt;= 1 ms" in experiment


# -- printed tables ---------------------------------------------------------------------------

def tables(text: str):
    """The lines of every table printed: a header, its rule of dashes, the rows to the next
    blank line."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() and set(line) <= {"-", " "} and "--" in line:
            start = i - 1
            while start > 0 and lines[start - 1].strip():
                start -= 1
            end = i
            while end < len(lines) and lines[end].strip():
                end += 1
            yield lines[start:end]


@pytest.mark.e2e  # its fixture runs an experiment, a frontier and a serve: 20 s
@pytest.mark.parametrize("name", ["serve", "experiment", "vary", "frontier"])
def test_every_printed_table_fits_in_100_columns(runs, name):
    found = list(tables(runs[name][1]))
    assert found, runs[name][1]
    wide = [line for t in found for line in t if len(line) > WIDTH]
    assert wide == []


@pytest.mark.e2e  # its fixture runs an experiment, a frontier and a serve: 20 s
def test_the_experiment_prints_each_number_it_printed_in_one_row(runs):
    data = json.loads((runs["experiment"][0] / "experiment.json").read_text())
    text = runs["experiment"][1]
    for c in data["final"]:
        assert c["configuration"].split(", ")[0] in text
        for key in ("ttft_p90_s", "tpot_p90_s", "itl_p90_s"):
            assert seconds(c[key]) in text
    assert "e+0" not in "\n".join(line for t in tables(text) for line in t)
