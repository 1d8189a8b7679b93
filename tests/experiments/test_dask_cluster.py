"""The experiment on a real dask cluster, as the README tells it: a ``dask scheduler`` and a
``dask worker`` started as processes of their own, the experiment given the scheduler's
address. Its stage tables are timed on the cluster's workers, and its answer is the one the
same experiment gives on this machine alone."""

import json
import os
import subprocess
import sys
import time

import pytest
from helpers import QUICK_KNOBS, SMALL_CHAT

from wse_emu.cli.main import main
from wse_emu.util.workers import dask_available

pytestmark = pytest.mark.skipif(not dask_available(), reason="dask.distributed is not installed")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A scheduler and one worker of two processes, on this machine's loopback."""
    where = tmp_path_factory.mktemp("dask")
    address_file = where / "scheduler.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    procs = [subprocess.Popen(dask + ["--host", "127.0.0.1", "--port", "0",
                                      "--dashboard-address", ":0",
                                      "--scheduler-file", str(address_file)],
                              cwd=where, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)]
    try:
        for _ in range(600):
            if address_file.exists() and address_file.stat().st_size:
                break
            time.sleep(0.1)
        address = json.loads(address_file.read_text())["address"]
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nworkers", "2",
             "--nthreads", "1", "--no-dashboard"], cwd=where, env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        yield address
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.mark.e2e
def test_the_experiment_on_a_dask_cluster_gives_the_local_answer(cluster, tmp_path, capsys):
    args = ["experiment", "disagg", "tiny", "--fabric", "mesh16", "--workload", str(SMALL_CHAT),
            "--ttft-slo", "0.05", "--tpot-slo", "0.001", *QUICK_KNOBS, "--json"]
    # Tables timed on the cluster (nothing cached yet), then the same experiment here alone.
    assert main(["--quiet"] + args + ["--scheduler", cluster,
                                      "--cache-dir", str(tmp_path / "cluster")]) == 0
    on_cluster = json.loads(capsys.readouterr().out)
    assert list((tmp_path / "cluster").glob("stage-table-*.npz"))
    assert main(["--quiet"] + args + ["--workers", "1",
                                      "--cache-dir", str(tmp_path / "here")]) == 0
    here = json.loads(capsys.readouterr().out)
    assert on_cluster["comparison"] == here["comparison"]
    assert on_cluster["final"] == here["final"]
