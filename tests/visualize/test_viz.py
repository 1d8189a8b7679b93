"""wse-emu viz: figures of the expected size, maps equal to the simulator's counters, a report
that embeds them all, a valid trace, one-line errors."""

import csv
import json

import matplotlib.image as mpimg
import numpy as np
import pytest
from helpers import FIXTURES, ImageSources

from wse_emu.cli.main import main
from wse_emu.program.format import WaferProgram
from wse_emu.visualize.check_report import find_browser, inspect, screenshot
from wse_emu.visualize.draw import MARGIN, pixels, quantity_cmap, scale_for
from wse_emu.visualize.figures import utilization_scale


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("viz") / "run"
    assert main(["run", "tiny", "--fabric", "mesh16", "--phase", "decode", "--batch", "2",
                 "--context", "256", "-o", str(out)]) == 0
    assert main(["viz", str(out)]) == 0
    return out


@pytest.mark.e2e
def test_every_map_has_the_expected_size(run_dir):
    program = WaferProgram.load(run_dir)
    h, w = program.fabric.height, program.fabric.width
    k = scale_for(h, w)
    maps = sorted((run_dir / "figures").glob("map_*.pixels.png"))
    assert {m.name.split(".")[0] for m in maps} >= {
        "map_placement", "map_kernels", "map_colors", "map_sram_total", "map_sram_weights",
        "map_compute", "map_links_max", "map_links_N"}
    for raw in maps:
        assert mpimg.imread(raw).shape[:2] == (h, w)  # one pixel per PE
        figure = mpimg.imread(raw.with_name(raw.name.replace(".pixels", "")))
        assert figure.shape[:2] == (h * k + MARGIN["top"] + MARGIN["bottom"],
                                    w * k + MARGIN["left"] + MARGIN["right"])
    assert (run_dir / "figures" / "roofline.png").stat().st_size > 10_000


def test_maps_equal_the_simulators_counters(run_dir):
    with np.load(run_dir / "counters.npz") as z:
        busy, links = z["pe_busy_cycles"][0], z["link_wavelets_nesw"][0]
        weights = z["sram_weights"][0]
    results = json.loads((run_dir / "results.json").read_text())
    program = WaferProgram.load(run_dir)
    cycles = np.full(busy.shape, np.nan)
    for s in results["stages"]:
        r = program.stages[s["stage"]].rect
        cycles[r.y:r.y1, r.x:r.x1] = s["cycles"]
    with np.load(run_dir / "figures" / "maps.npz") as m:
        simulated = np.isfinite(cycles)
        assert simulated.any()
        assert np.array_equal(np.isfinite(m["compute"]), simulated)
        assert np.allclose(m["compute"][simulated] * cycles[simulated], busy[simulated])
        assert np.allclose(m["links_E"][simulated] * cycles[simulated], links[simulated, 1])
        assert np.array_equal(m["sram_weights"], weights)
        compute = m["compute"]
    # The exact image is the colour map of the array, pixel for pixel.
    drawn = (mpimg.imread(run_dir / "figures" / "map_compute.pixels.png") * 255).round()
    # ... on a scale whose top the label states, above 99.9% of the PEs.
    top = utilization_scale(compute)
    assert np.nanpercentile(compute, 99.9) <= top
    expect = pixels(compute, quantity_cmap(), 0.0, top)
    assert np.array_equal(drawn.astype(np.uint8), expect)


def test_the_report_parses_and_embeds_every_figure(run_dir):
    parser = ImageSources()
    parser.feed((run_dir / "report.html").read_text())
    figures = [f for f in (run_dir / "figures").glob("*.png") if ".pixels" not in f.name]
    assert len(parser.sources) == len(figures)
    assert all(s.startswith("data:image/png;base64,") for s in parser.sources)


def test_the_trace_has_named_events_on_tracks(run_dir):
    trace = json.loads((run_dir / "timeline.json").read_text())
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all({"name", "pid", "tid", "ts", "dur"} <= e.keys() for e in spans)
    assert all(e["dur"] >= 0 for e in spans)
    processes = {e["pid"] for e in events if e["name"] == "process_name"}
    tracks = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    assert {e["pid"] for e in spans} <= processes
    assert {(e["pid"], e["tid"]) for e in spans} <= tracks
    # Spans on one track nest or are apart, as trace viewers need: none overlaps another
    # partly.
    by_track = {}
    for e in spans:
        by_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for track in by_track.values():
        track.sort()
        for (s0, e0), (s1, e1) in zip(track, track[1:]):
            assert s1 >= e0 - 1e-9 or e1 <= e0 + 1e-9


def test_viz_adds_one_kind_in_svg_and_keeps_the_other_figures(run_dir):
    before = {f.name for f in (run_dir / "figures").iterdir()}
    shown = (run_dir / "report.html").read_text().count("<figure>")
    assert main(["viz", str(run_dir), "--what", "roofline", "--format", "svg"]) == 0
    files = {f.name for f in (run_dir / "figures").iterdir()}
    assert files == before | {"roofline.svg"}
    assert (run_dir / "report.html").read_text().count("<figure>") == shown + 1


KINDS_LISTED = "takes one or more of maps, roofline, serving, experiment, sweep"


@pytest.mark.parametrize("args, message", [
    (["viz", "no-such-dir"], "not a run directory"),
    (["viz", ".", "--what", "pie"], f"--what {KINDS_LISTED}; got 'pie'"),
    (["viz", ".", "--what", "maps,Roofline"], f"--what {KINDS_LISTED}; got 'Roofline'"),
    (["viz", ".", "--what", ","], f"--what {KINDS_LISTED}; got none"),
])
def test_bad_viz_input_is_one_line(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("what, got", [("pie", "'pie'"), (("maps", "heatmap"), "'heatmap'"),
                                       (["serving", 3], "3"), ((), "none")])
def test_the_library_refuses_a_kind_of_figure_it_does_not_draw(what, got, tmp_path):
    """``api.draw`` checks ``what`` itself (a misspelt kind would draw nothing and say so
    nowhere), naming the word and the kinds there are, before reading the directory."""
    from wse_emu import api
    from wse_emu.errors import UserError

    with pytest.raises(UserError) as info:
        api.draw(tmp_path, what=what)
    assert str(info.value) == f"`what` {KINDS_LISTED}; got {got}"
    assert list(tmp_path.iterdir()) == []


SERVE_WORKLOAD = """version: 1
name: small-chat
arrival: poisson
rate: 300
requests: 120
prompt: {kind: lognormal, median: 300, sigma: 0.7, low: 8, high: 2000}
output: {kind: lognormal, median: 30, sigma: 0.7, low: 1, high: 200}
"""


@pytest.mark.e2e
def test_a_serving_run_gets_its_latency_pipeline_and_kv_figures(tmp_path):
    workload = tmp_path / "w.yaml"
    workload.write_text(SERVE_WORKLOAD)
    out = tmp_path / "serve"
    assert main(["serve", "tiny", "--fabric", "mesh16", "--workload", str(workload),
                 "--ttft-slo", "0.05", "--tpot-slo", "0.001", "--cache-dir",
                 str(tmp_path / "cache"), "-o", str(out)]) == 0
    assert main(["viz", str(out)]) == 0
    names = {f.name for f in (out / "figures").iterdir()}
    assert {"latency_cdfs.png", "tpot_over_time.png", "pipeline.png", "kv.png",
            "map_placement.png", "roofline.png"} <= names
    parser = ImageSources()
    parser.feed((out / "report.html").read_text())
    assert len(parser.sources) == len([n for n in names if n.endswith(".png")
                                       and ".pixels" not in n])
    events = json.loads((out / "timeline.json").read_text())["traceEvents"]
    tracks = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in events if e["ph"] == "X"} <= tracks
    rows = (out / "kv_occupancy.csv").read_text().splitlines()
    assert rows[0] == "region,time_s,kv_tokens" and len(rows) > 100


@pytest.mark.e2e
def test_a_run_with_a_prefix_cache_and_host_tier_draws_their_hits_and_traffic(tmp_path):
    """A block trace served with the host tier: each request's cached and restored tokens in
    requests.csv add up to its region's, and the run's figures include the cache's."""
    out = tmp_path / "serve"
    assert main(["serve", "tiny", "--fabric", "mesh16", "--workload",
                 str(FIXTURES / "small_blocks.yaml"), "--kv-tier", "host", "--cache-dir",
                 str(tmp_path / "cache"), "-o", str(out)]) == 0
    rows = list(csv.DictReader(open(out / "requests.csv")))
    regions = json.loads((out / "metrics.json").read_text())["regions"]
    for column, key in (("cached_tokens", "prefix_reused_tokens"),
                        ("restored_tokens", "prefix_restored_tokens")):
        assert sum(int(r[column]) for r in rows) == sum(r[key] for r in regions.values()) > 0
    assert all(int(r["cached_tokens"]) < int(r["prompt_tokens"]) for r in rows)
    assert main(["viz", str(out)]) == 0
    assert (out / "figures" / "prefix_cache.png").exists()


@pytest.mark.skipif(find_browser() is None, reason="no Chromium on this machine")
def test_the_report_shows_its_figures_in_a_headless_browser(run_dir, tmp_path):
    assert main(["viz", str(run_dir)]) == 0
    shot = tmp_path / "shot.png"
    screenshot(find_browser(), run_dir / "report.html", shot)
    seen = inspect(shot)
    assert seen["shows_figures"], seen


@pytest.mark.e2e
def test_a_disaggregated_run_shows_its_roles_side_by_side(tmp_path):
    out = tmp_path / "disagg"
    assert main(["run", "tiny", "--fabric", "mesh16", "--plan", "disaggregated", "--phase",
                 "decode", "--batch", "1", "--context", "128", "-o", str(out), "--viz"]) == 0
    names = {f.name for f in (out / "figures").iterdir()}
    assert {"regions_sram_total.png", "regions_compute.png", "regions_links_max.png"} <= names


# --- figures that read right: the pipeline window inside its figure, the attainment plot
# showing the rates that failed ------------------------------------------------------------

def _captured(monkeypatch, module):
    """The figures ``module`` saves, kept open (drawn) for the test to measure."""
    figures = []

    def keep(fig, path, formats=("png",)):
        fig.canvas.draw()
        figures.append(fig)
        return [path.with_suffix(".png")]
    monkeypatch.setattr(module, "save_figure", keep)
    return figures


def _timeline(regions: dict) -> dict:
    """Chrome trace events of pipelines: region id -> (stages, micro-batches, names): each
    micro-batch takes 10 us on every stage and enters stage 0 every 12 us."""
    events = []
    for pid, (stages, batches, names) in regions.items():
        events.append({"name": "process_name", "ph": "M", "pid": pid,
                       "args": {"name": f"region{pid}"}})
        for i in range(batches):
            for s in range(stages):
                events.append({"name": names[i % len(names)], "ph": "X", "pid": pid, "tid": s,
                               "ts": 12.0 * i + 10.0 * s, "dur": 10.0})
    return {"traceEvents": events}


def _inside(inner, outer, margin: float) -> bool:
    return (inner.x0 >= outer.x0 + margin and inner.y0 >= outer.y0 + margin
            and inner.x1 <= outer.x1 - margin and inner.y1 <= outer.y1 - margin)


@pytest.mark.parametrize("regions", [
    {0: (3, 400, ["decode"])},
    {0: (2, 400, ["prefill", "decode", "decode+prefill"]), 3: (4, 20, ["prefill"]),
     5: (1, 7, ["decode"])}])
def test_the_pipeline_window_shows_whole_micro_batches_inside_its_figure(
        monkeypatch, tmp_path, regions):
    """The window ends after its last micro-batch leaves the last stage, with room before
    the frame (no micro-batch cut at the right edge); every panel (with its labels) and the
    legend lie inside the figure with a margin, the legend over no panel."""
    from wse_emu.visualize import serving

    figures = _captured(monkeypatch, serving)
    serving.pipeline_window(_timeline(regions), tmp_path / "pipeline")
    (fig,) = figures
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    assert _inside(legend, fig.bbox, 2)
    for ax, (stages, batches, _) in zip(fig.axes, regions.values()):
        box = ax.get_tightbbox(renderer)
        assert _inside(box, fig.bbox, 2)
        assert not legend.overlaps(box)
        shown = min(serving.WINDOW_BATCHES, batches - batches // 2)
        left, right = ax.get_xlim()
        # The window's last micro-batch leaves the last stage at 12 us per batch after the
        # first shown, plus its 10 us on each stage: drawn whole, with room before the frame.
        last_end = (12.0 * (shown - 1) + 10.0 * stages) / 1e6
        assert last_end < right and (right - last_end) >= 0.02 * (right - left)
        bars = [(round(p.vertices[:, 0].min() * 1e6, 6), round(np.ptp(p.vertices[:, 0]) * 1e6, 6))
                for c in ax.collections for p in c.get_paths()]
        assert (round(last_end * 1e6 - 10.0, 6), 10.0) in bars
        assert ax.get_title().split(": ")[1].startswith(f"{shown} micro-batches")


class _Report:
    """What the attainment figure reads of an experiment's report."""

    def __init__(self, points: dict, attainment: float = 0.9):
        from wse_emu.experiments.goodput import Targets

        self.targets = Targets(1.0, 0.005, attainment)
        self.points, self.final_points = points, {}


def _point(rate, met, attainment, pace=1.0):
    return {"rate_per_s": rate, "met": met, "slo_attainment": attainment, "pace": pace,
            "ttft_slope": 0.0}


def test_the_attainment_plot_shows_the_rates_that_failed(monkeypatch, tmp_path):
    """Every rate the search ran is drawn at its own attainment, the failed ones hollow,
    on an axis reaching below the lowest; the pace of each run is drawn against the limit
    of a steady run, failed runs above it."""
    from wse_emu.experiments.goodput import MAX_PACE
    from wse_emu.visualize import curves

    points = {"colocated, 1 copy": [_point(100, True, 1.0), _point(200, True, 0.97),
                                    _point(400, False, 0.62, 1.6), _point(800, False, 0.31, 3.0)],
              "disaggregated, share 0.5": [_point(150, True, 0.99, 0.95),
                                           _point(300, False, 0.985, 1.3)]}
    figures = _captured(monkeypatch, curves)
    curves.attainment_vs_rate(_Report(points), tmp_path / "attainment")
    (fig,) = figures
    top, bottom = fig.axes
    drawn = [(x, y) for line in top.get_lines() if line.get_linestyle() == "None"
             for x, y in zip(line.get_xdata(), line.get_ydata())]
    every = [(p["rate_per_s"], p["slo_attainment"]) for pts in points.values() for p in pts]
    assert sorted(drawn) == sorted(every)
    hollow = sorted((x, y) for line in top.get_lines() if line.get_linestyle() == "None"
                    and line.get_markerfacecolor() == "white"
                    for x, y in zip(line.get_xdata(), line.get_ydata()))
    assert hollow == sorted((p["rate_per_s"], p["slo_attainment"]) for pts in points.values()
                            for p in pts if not p["met"])
    low, high = top.get_ylim()
    assert low < 0.31 and high >= 1.0
    limit = [line for line in bottom.get_lines() if list(line.get_ydata()) == [MAX_PACE] * 2]
    assert limit
    above = [(x, y) for line in bottom.get_lines() if line.get_linestyle() == "None"
             and line.get_markerfacecolor() == "white"
             for x, y in zip(line.get_xdata(), line.get_ydata())]
    assert sorted(above) == [(300, 1.3), (400, 1.6), (800, 3.0)]
    assert all(y > MAX_PACE for _, y in above)


def test_an_attainment_of_97_percent_does_not_read_as_100(monkeypatch, tmp_path):
    """Where every run keeps its attainment high (it failed on a growing queue), the axis
    starts near the lowest share, so that 97% stands well apart from 100%."""
    from wse_emu.visualize import curves

    figures = _captured(monkeypatch, curves)
    curves.attainment_vs_rate(_Report({"colocated": [
        _point(100, True, 1.0), _point(200, True, 0.97), _point(400, False, 0.97, 1.5)]}),
        tmp_path / "attainment")
    top = figures[0].axes[0]
    gap_px = abs(top.transData.transform((100, 1.0))[1] - top.transData.transform((100, 0.97))[1])
    assert gap_px > 25
    # Whole percentages on the axis, each written once.
    labels = [t.get_text() for t in top.get_yticklabels() if t.get_text()]
    assert len(labels) == len(set(labels)) >= 3
