"""wse-emu experiment disagg: the table, the same answer on one worker process and on two, and
one-line errors."""

import json

import pytest
from helpers import QUICK_KNOBS, SMALL_CHAT

from wse_emu.cli.main import main
from wse_emu.util.workers import dask_available


@pytest.fixture(scope="module")
def args(tmp_path_factory):
    """The experiment's arguments; the tests share one table cache, built by the first."""
    root = tmp_path_factory.mktemp("experiment")
    return ["experiment", "disagg", "tiny", "--fabric", "mesh16", "--workload", str(SMALL_CHAT),
            "--ttft-slo", "0.05", "--tpot-slo", "0.001", *QUICK_KNOBS,
            "--cache-dir", str(root / "cache")]


@pytest.mark.e2e
def test_experiment_reports_every_configuration_and_the_ratio(args, capsys):
    assert main(args + ["--workers", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    labels = [c["configuration"] for c in data["configurations"]]
    assert "colocated, 1 copy, prefill priority, tile 64, batch 64" in labels
    assert "colocated, 1 copy, chunked 64, batch 64" in labels
    assert any(label.startswith("disaggregated, share") for label in labels)
    comparison = data["comparison"]
    best = {c["configuration"]: c for c in data["configurations"]}
    # Goodput as DistServe defines it: the highest rate met, per system.
    assert comparison["goodput_ratio"] == pytest.approx(
        best[comparison["disaggregated"]]["max_rate_per_system"]
        / best[comparison["colocated"]]["max_rate_per_system"])
    for plan in ("colocated", "disaggregated"):
        assert best[comparison[plan]]["max_rate_per_s"] == max(
            c["max_rate_per_s"] for c in data["configurations"] if c["plan"] == plan)
    for c in data["configurations"]:
        if c["max_rate_per_s"] > 0:
            assert c["tpot_p90_s"] <= 0.001 and c["ttft_p90_s"] <= 0.05
            assert c["slo_attainment"] >= 0.9
    assert len(comparison["reasons"]) == 2


@pytest.mark.e2e
def test_both_plans_take_the_same_attention_tiles_and_formats_and_the_report_says_so(args,
                                                                                     capsys):
    from wse_emu.cli.experiment_cmd import render
    from wse_emu.experiments.comparison import ExperimentReport

    assert main(args + ["--workers", "1", "--attention-tile", "4", "--grid", "quick",
                        "--weight-format", "bf16", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["attention_tile"] == 4 and data["routing"] is None  # a dense model
    assert data["stored_formats"] == "matrices in bf16"
    head = render(ExperimentReport.from_json(data)).splitlines()[0]
    assert "decode attention in tiles of 4" in head and "; matrices in bf16" in head


@pytest.mark.e2e
def test_two_worker_processes_give_the_same_answer(args, capsys):
    assert main(args + ["--workers", "1", "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert main(args + ["--workers", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == alone


@pytest.mark.e2e
def test_experiment_prints_a_table(args, capsys):
    assert main(args + ["--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "goodput/s/system" in out and "against the best colocated" in out and "Why:" in out


@pytest.mark.parametrize("extra, message", [
    (["--tpot-slo", "0"], "--tpot-slo must be a positive number"),
    (["--token-budget", "64,x"], "--token-budget must be comma-separated whole numbers"),
    (["--attainment", "1.5"], "--attainment must be in (0, 1]"),
    (["--requests", "1"], "--requests must be at least 2"),
    (["--batch-limit", "65"], "--batch-limit must be between 1 and 64"),
    (["--attention-tile", "-2"], "--attention-tile must be at least 0"),
    (["--scheduler", "tcp://127.0.0.1:1"], "dask scheduler"),
])
@pytest.mark.e2e
def test_bad_experiment_input_is_one_line(args, capsys, extra, message):
    if extra[0] == "--scheduler" and not dask_available():
        pytest.skip("dask.distributed is not installed")
    assert main(args + extra) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.e2e
def test_experiment_writes_its_points_and_draws_curves(args, tmp_path, capsys):
    out = tmp_path / "experiment"
    assert main(args + ["--workers", "1", "-o", str(out), "--viz"]) == 0
    assert "report:" in capsys.readouterr().out
    data = json.loads((out / "experiment.json").read_text())
    for c in data["configurations"]:
        points = data["points"][c["configuration"]]
        assert len(points) == c["runs"]
        met = [p["rate_per_s"] for p in points if p["met"]]
        if c["max_rate_per_s"] > 0:
            assert c["max_rate_per_s"] == pytest.approx(max(
                r for r in met if r < min([p["rate_per_s"] for p in points if not p["met"]]
                                          or [float("inf")])))
    assert {"throughput_vs_tpot.png", "attainment_vs_rate.png"} <= {
        f.name for f in (out / "figures").iterdir()}
    assert (out / "report.html").exists()


def test_viz_needs_a_run_directory(args, capsys):
    assert main(args + ["--viz"]) == 2
    assert "--viz draws the run directory" in capsys.readouterr().err
