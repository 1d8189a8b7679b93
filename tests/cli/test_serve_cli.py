"""wse-emu serve: metrics, outputs and one-line errors."""

import csv
import json
import subprocess
import sys

import pytest

from wse_emu.cli.main import main

WORKLOAD = """version: 1
name: small-chat
arrival: poisson
rate: 2000
requests: 120
prompt: {kind: lognormal, median: 200, sigma: 0.7, low: 8, high: 1500}
output: {kind: lognormal, median: 20, sigma: 0.7, low: 1, high: 200}
"""


@pytest.fixture()
def workload(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(WORKLOAD)
    return path


@pytest.mark.e2e
def test_serve_metrics_and_run_directory(tmp_path, workload, capsys):
    out = tmp_path / "run"
    args = ["serve", "tiny", "--fabric", "mesh8", "--region", "8x8", "--workload",
            str(workload), "--ttft-slo", "1", "--tpot-slo", "1", "--cache-dir",
            str(tmp_path / "cache"), "-o", str(out), "--json"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["requests"] == 120 and data["slo_attainment"] == 1.0
    assert data["ttft_s"]["p50"] <= data["ttft_s"]["p90"] <= data["ttft_s"]["p99"]
    assert data["goodput_requests_per_s"] == pytest.approx(data["requests_per_s"])
    for region in data["regions"].values():
        assert 0 < region["stage_utilization"] <= 1
        assert 0 < region["kv_peak_tokens"] <= region["kv_capacity_tokens"]
    trace = json.loads((out / "timeline.json").read_text())
    assert {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"} >= {"prefill", "decode"}
    rows = list(csv.DictReader(open(out / "requests.csv")))
    assert len(rows) == 120
    assert sum(int(r["output_tokens"]) for r in rows) == pytest.approx(
        data["output_tokens_per_s"] * data["duration_s"])
    # A tighter target than anything achieved: no request meets it.
    assert main(args[:-3] + ["--json", "--ttft-slo", "1e-9"]) == 0
    assert json.loads(capsys.readouterr().out)["slo_attainment"] == 0.0


@pytest.mark.parametrize("make,needle", [
    (lambda d: d / "missing.csv", "cannot read"),
    (lambda d: (d / "bad.csv").write_text("a,b,c\n1,2,3\n") and d / "bad.csv",
     "first line must be the columns"),
])
@pytest.mark.e2e
def test_bad_traces_are_one_line_errors(tmp_path, make, needle):
    trace = make(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "wse_emu.cli.main", "serve", "tiny",
                           "--fabric", "mesh8", "--trace", str(trace)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and needle in proc.stderr


@pytest.mark.e2e
def test_requests_too_long_for_the_kv_cache(tmp_path, workload):
    proc = subprocess.run([sys.executable, "-m", "wse_emu.cli.main", "serve", "tiny",
                           "--fabric", "mesh8", "--workload", "long-prompt", "--cache-dir",
                           str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2 and "more than any region holds" in proc.stderr


@pytest.mark.e2e
def test_wafer_pools_know_their_wafer(tmp_path):
    from wse_emu.compiler.mapper import compile_model
    from wse_emu.compiler.options import CompileOptions
    from wse_emu.hardware.fabric import ClusterSpec, load_fabric
    from wse_emu.models.load import load_model
    from wse_emu.pools.kinds.wafer import wafer_pools

    program = compile_model(load_model("tiny"), ClusterSpec(load_fabric("mesh16"), 2),
                            CompileOptions(plan="disaggregated", prefill_systems=1))
    models = wafer_pools(program, tmp_path)
    assert {m.name: m.system for m in models} == {
        r.name: r.parts[0].system for r in program.regions}
    assert {m.system for m in models} == {0, 1}


@pytest.mark.e2e
def test_progress_lines_reach_a_log_file_unless_quiet(tmp_path, workload, capsys, monkeypatch):
    """stderr is not a terminal here: progress comes as plain lines (every PERIOD_S seconds,
    here every status), saying what is being timed; --quiet leaves only the results."""
    from wse_emu.util import progress

    monkeypatch.setattr(progress, "PERIOD_S", 0.0)
    args = ["serve", "tiny", "--fabric", "mesh8", "--region", "8x8", "--workload",
            str(workload), "--json"]
    assert main(args + ["--cache-dir", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert "timing the stage tables" in err and "left" in err
    assert all(line.startswith("[") for line in err.splitlines())
    assert main(["--quiet"] + args + ["--cache-dir", str(tmp_path / "b")]) == 0
    assert capsys.readouterr().err == ""
