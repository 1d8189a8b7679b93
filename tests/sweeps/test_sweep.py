"""wse-emu sweep: every point once, rows kept across a kill, failures kept as rows."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wse_emu.cli.main import main
from wse_emu.sweeps.sweep import RESULTS, read_rows

SWEEP = """version: 1
name: tiny-sweep
point: run
base: {model: tiny, fabric: mesh16, region: 8x8, phase: decode}
axes:
  fabric.clock_hz: [1.0e+9, 1.5e+9, 2.0e+9]
  context: [16, 32, 48, 64, 96, 128, 160, 192]
"""


def write(tmp_path, text=SWEEP) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    return path


@pytest.mark.e2e
def test_a_killed_sweep_resumes_without_running_a_point_twice(tmp_path, capsys):
    sweep, out = write(tmp_path), tmp_path / "out"
    command = [sys.executable, "-m", "wse_emu.cli.main", "sweep", str(sweep), "-o", str(out),
               "--workers", "2", "--json"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(read_rows(out)) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the command and its workers
        proc.wait()
    before = read_rows(out)
    assert 3 <= len(before) < 24, "the sweep finished before it could be killed"
    assert main(["sweep", str(sweep), "-o", str(out), "--workers", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    lines = (out / RESULTS).read_text().splitlines()
    keys = [json.loads(line)["key"] for line in lines]
    assert len(keys) == len(set(keys)) == 24  # every point once: none lost, none run twice
    assert {r.key for r in before} <= set(keys)
    assert len(data["rows"]) == 24 and all("result" in r for r in data["rows"])
    # The clock scales the step: twice the clock, half the time.
    steps = {(r["config"]["fabric.clock_hz"], r["config"]["context"]): r["result"]["step_seconds"]
             for r in data["rows"]}
    assert steps[(1.0e9, 64)] == pytest.approx(2 * steps[(2.0e9, 64)])


def test_a_failing_point_keeps_its_error_and_the_others_run(tmp_path, capsys):
    sweep = write(tmp_path, SWEEP.replace("context: [16, 32, 48, 64, 96, 128, 160, 192]",
                                          "context: [64, 100000000]").replace(
        "[1.0e+9, 1.5e+9, 2.0e+9]", "[1.0e+9]"))
    assert main(["sweep", str(sweep), "-o", str(tmp_path / "out"), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "1 failed" in out and "needs 100,000,000 positions" in out
    rows = read_rows(tmp_path / "out")
    assert len(rows) == 2 and sum(r.failed for r in rows) == 1
    # Drawn: the points that ran, against the axis that varies; the failure said.
    assert main(["viz", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "figures" / "sweep.png").stat().st_size > 10_000
    assert "1 point failed" in (tmp_path / "out" / "report.html").read_text()


@pytest.mark.parametrize("text, message", [
    ("version: 1\nname: x\npoint: fly\naxes: {a: [1]}\n", "'point' must be one of"),
    ("version: 1\nname: x\npoint: run\naxes: {}\n", "'axes' must map"),
    ("version: 1\nname: x\npoint: run\naxes: {a: 3}\n", "axis 'a' must be a non-empty list"),
    ("version: 1\nname: x\npoint: run\nsteps: 3\naxes: {a: [1]}\n", "unknown field(s) 'steps'"),
    ("version: 1\nname: x\npoint: run\nmetric: goodput_requests_per_s\naxes: {a: [1]}\n",
     "'metric' of a run point must be one of"),
])
def test_bad_sweeps_are_one_line_errors(tmp_path, capsys, text, message):
    assert main(["sweep", str(write(tmp_path, text)), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_directory_of_another_sweep_is_refused(tmp_path, capsys):
    one = write(tmp_path, SWEEP.replace("[16, 32, 48, 64, 96, 128, 160, 192]", "[64]"))
    assert main(["sweep", str(one), "-o", str(tmp_path / "o"), "--workers", "1"]) == 0
    other = tmp_path / "other.yaml"
    other.write_text(SWEEP.replace("[16, 32, 48, 64, 96, 128, 160, 192]", "[128]"))
    capsys.readouterr()
    assert main(["sweep", str(other), "-o", str(tmp_path / "o"), "--workers", "1"]) == 2
    assert "another sweep" in capsys.readouterr().err


def test_the_example_sweeps_load_and_name_only_settings_a_point_takes():
    from wse_emu.sweeps.points import CLUSTER_SETTINGS, POINT_SETTINGS
    from wse_emu.sweeps.sweep import load_sweep

    examples = sorted((Path(__file__).resolve().parents[2] / "programs" / "sweeps")
                      .glob("*.yaml"))
    assert len(examples) >= 3
    for path in examples:
        spec = load_sweep(path)
        for config in spec.points():
            assert all(k in CLUSTER_SETTINGS + POINT_SETTINGS[spec.point]
                       or k.startswith("fabric.") for k in config), path


def test_a_sweep_shows_the_metric_it_names(tmp_path, capsys):
    """Replicas count in the cluster's tokens/s: a 16x16 mesh holds four 8x8 regions of the
    tiny model, each with its own pipeline."""
    text = SWEEP.replace("point: run\n", "point: run\nmetric: tokens_per_s_cluster\n")
    text = text.replace("[16, 32, 48, 64, 96, 128, 160, 192]", "[64]")
    out = tmp_path / "o"
    assert main(["sweep", str(write(tmp_path, text)), "-o", str(out), "--workers", "1"]) == 0
    assert "tokens/s of the cluster" in capsys.readouterr().out
    for row in read_rows(out):
        r = row.result
        assert r["replicas"] == 4
        assert r["tokens_per_s_cluster"] == pytest.approx(4 * r["tokens_per_s_pipelined"])


@pytest.mark.parametrize("axes, message", [
    ("{contxt: [64, 128]}", "a run point does not take 'contxt' (it takes model, fabric,"),
    ("{fabric.clock_ghz: [1.0, 2.0]}", "the fabric has no field 'clock_ghz' (its fields:"),
    ("{workload: [chat]}", "a run point does not take 'workload'"),
])
def test_a_setting_no_point_takes_is_refused_before_the_first_point(tmp_path, capsys, axes,
                                                                     message):
    text = SWEEP.split("axes:")[0] + f"axes: {axes}\n"
    out = tmp_path / "o"
    assert main(["sweep", str(write(tmp_path, text)), "-o", str(out), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()  # nothing run, nothing written


def test_an_enormous_sweep_is_refused_unless_allowed(tmp_path, capsys):
    axes = "axes: {batch: [%s], context: [%s]}\n" % (
        ", ".join(map(str, range(1, 201))), ", ".join(map(str, range(1, 201))))
    sweep = write(tmp_path, SWEEP.split("axes:")[0] + axes)
    assert main(["sweep", str(sweep), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "has 40,000 points (200 x 200), more than 10,000: give --max-points" in err
    assert main(["sweep", str(sweep), "-o", str(tmp_path / "o"), "--max-points", "0"]) == 2
    assert "--max-points must be at least 1" in capsys.readouterr().err


def test_a_folder_that_cannot_be_made_is_refused_up_front(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["sweep", str(write(tmp_path)), "-o", str(blocker / "o"), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "cannot use" in err and len(err.strip().splitlines()) == 1


def test_a_resumed_sweep_runs_failed_points_again_and_keys_files_by_content(tmp_path, capsys):
    fabric = tmp_path / "fabric.yaml"
    preset = Path(__file__).resolve().parents[2] / "programs" / "fabrics" / "mesh16.yaml"
    fabric.write_text(preset.read_text())
    text = SWEEP.replace("fabric: mesh16", f"fabric: {fabric}").split("axes:")[0] + \
        "axes: {context: [64]}\n"
    sweep, out = write(tmp_path, text), tmp_path / "o"
    argv = ["sweep", str(sweep), "-o", str(out), "--workers", "1", "--json"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)["rows"][0]["result"]["step_seconds"]
    assert main(argv) == 0  # nothing changed: read back, not run
    assert len(read_rows(out)) == 1
    capsys.readouterr()
    # The fabric file edited in place (a faster clock): the old row is stale, the point runs.
    fabric.write_text(_with_clock(preset.read_text(), 2.2e9))  # twice the preset's 1.1 GHz
    assert main(argv) == 0
    again = json.loads(capsys.readouterr().out)["rows"][0]["result"]["step_seconds"]
    assert again == pytest.approx(first / 2)
    # A failed row is run again on resume (here: it is written as if it had failed).
    rows = read_rows(out)
    (out / RESULTS).write_text(json.dumps({**rows[-1].to_json(), "error": "killed",
                                           "result": None}) + "\n")
    assert read_rows(out)[0].failed
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert "error" not in data["rows"][0] and data["rows"][0]["result"]["step_seconds"] == again


def _with_clock(text: str, clock_hz: float) -> str:
    lines = [f"clock_hz: {clock_hz:.1f}" if line.startswith("clock_hz:") else line
             for line in text.splitlines()]
    return "\n".join(lines) + "\n"


@pytest.mark.e2e
def test_the_library_checks_a_sweep_as_the_command_does(tmp_path):
    """``api.sweep`` (not only ``wse-emu sweep``) refuses an unknown setting, a sweep past
    its size limit and bad counts, by parameter name, before a point runs or a folder is
    made."""
    from wse_emu import api
    from wse_emu.errors import UserError
    from wse_emu.sweeps.sweep import SweepSpec

    def spec(**axes):
        return SweepSpec("lib", "run", {"model": "tiny", "fabric": "mesh8"}, axes)
    out = tmp_path / "out"
    cases = [(spec(contxt=[1, 2]), {}, "a run point does not take 'contxt'"),
             (spec(**{"fabric.clock": [1e9]}), {}, "the fabric has no field 'clock'"),
             (spec(batch=list(range(1, 101)), context=list(range(1, 102))), {},
              "10,100 points (100 x 101), more than 10,000: give `max_points`"),
             (spec(batch=[1, 2, 3]), {"max_points": 2}, "more than 2"),
             (spec(batch=[1]), {"max_points": 0}, "`max_points` must be"),
             (spec(batch=[1]), {"workers": -1}, "`workers` must be")]
    for sweep, options, message in cases:
        with pytest.raises(UserError, match=re.escape(message)):
            api.sweep(sweep, out, **options)
        assert not out.exists()
    folder, rows = api.sweep(spec(batch=[1, 2], context=[64]), out, workers=1)
    assert folder == out and [r.config["batch"] for r in rows] == [1, 2]
    assert all(r.result is not None and not r.failed for r in rows)
    # Each row is the line results.jsonl holds, and reads back as the same row.
    lines = [json.loads(line) for line in (out / RESULTS).read_text().splitlines()]
    assert [r.to_json() for r in rows] == lines
    assert read_rows(out) == rows
