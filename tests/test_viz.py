"""wse-emu viz: figures of the expected size, maps equal to the simulator's counters, a report
that embeds them all, a valid trace, one-line errors."""

import json
from html.parser import HTMLParser

import matplotlib.image as mpimg
import numpy as np
import pytest

from wse_emu.cli.main import main
from wse_emu.program import WaferProgram
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


class _Images(HTMLParser):
    def __init__(self):
        super().__init__()
        self.sources = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.sources.append(dict(attrs)["src"])


def test_the_report_parses_and_embeds_every_figure(run_dir):
    parser = _Images()
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


@pytest.mark.parametrize("args, message", [
    (["viz", "no-such-dir"], "not a run directory"),
    (["viz", ".", "--what", "pie"], "--what takes"),
])
def test_bad_viz_input_is_one_line(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


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
    parser = _Images()
    parser.feed((out / "report.html").read_text())
    assert len(parser.sources) == len([n for n in names if n.endswith(".png")
                                       and ".pixels" not in n])
    events = json.loads((out / "timeline.json").read_text())["traceEvents"]
    tracks = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in events if e["ph"] == "X"} <= tracks
    rows = (out / "kv_occupancy.csv").read_text().splitlines()
    assert rows[0] == "region,time_s,kv_tokens" and len(rows) > 100


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
