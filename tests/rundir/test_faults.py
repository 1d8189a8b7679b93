"""Killed at random points (SIGKILL: no handler runs, no file is closed), a serving run and an
experiment leave nothing damaged behind: run again on what they left, they give the results of
a run never interrupted, and no stage-table entry or run directory they left is half-written
under a name that is read."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import assert_whole

WORKLOAD = """version: 1
name: faults
arrival: poisson
rate: 20.0
requests: 40
prompt: {kind: lognormal, median: 200, sigma: 0.6, low: 16, high: 1000}
output: {kind: lognormal, median: 30, sigma: 0.6, low: 1, high: 100}
seed: 3
"""
TARGETS = ["--ttft-slo", "1", "--tpot-slo", "0.01"]
COMMANDS = {
    "serve": ["serve", "tiny", "--fabric", "mesh16", *TARGETS],
    "experiment": ["experiment", "disagg", "tiny", "--fabric", "mesh16", *TARGETS,
                   "--workers", "1", "--copies", "1", "--layers-per-stage", "own"],
}
KILLS = 3


def start(args: list, workload: Path, cache: Path, out: Path) -> subprocess.Popen:
    """The command in a session of its own, so that a kill reaches all it started."""
    return subprocess.Popen(
        [sys.executable, "-m", "wse_emu.cli.main", *args, "--workload", str(workload),
         "--cache-dir", str(cache), "-o", str(out), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(proc: subprocess.Popen) -> tuple[str, str]:
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr
    return stdout, stderr


@pytest.mark.e2e
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_killed_run_leaves_nothing_damaged_and_its_rerun_gives_the_same_results(tmp_path,
                                                                                  command):
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    args = COMMANDS[command]
    began = time.perf_counter()
    reference = finish(start(args, workload, tmp_path / "fresh", tmp_path / "fresh-out"))[0]
    took = time.perf_counter() - began
    cache = tmp_path / "cache"
    rng = random.Random(command)  # the same kill points on every run of the test
    killed = 0
    for attempt in range(KILLS):
        out = tmp_path / f"killed-{attempt}"
        proc = start(args, workload, cache, out)
        # Within the run's first half: later attempts find more of the cache built, and so
        # end sooner.
        time.sleep(rng.uniform(0.05, 0.5) * took)
        killed += proc.poll() is None
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        assert_whole(cache, out, killed=True)
    assert killed >= 2  # the kills landed while the run was at work
    out = tmp_path / "rerun"
    stdout, stderr = finish(start(args, workload, cache, out))
    assert "unusable" not in stderr  # no damaged entry was met, let alone used
    assert json.loads(stdout) == json.loads(reference)
    assert_whole(cache, out, killed=True)
