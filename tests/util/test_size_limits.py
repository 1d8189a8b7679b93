"""Sizes a user gives that would otherwise grow memory without bound (requests, model calls,
trace rows, draws, worker processes) are refused by name and limit, before any work, from the
command line and the Python API alike.

Each command runs in a subprocess given little address space and a timeout: were a limit
missing, it would fail on the allocation or the time it tried to take, not use them. Where a
missing limit would start work rather than allocate (draws, worker processes), an argument
checked just after it is wrong too, so that the test fails on that instead.
"""

import os
import resource
import subprocess
import sys

import pytest
from helpers import assert_one_line_error

from wse_emu import api
from wse_emu.errors import ConfigError, UserError
from wse_emu.serving.workload import (
    MAX_DRAWS,
    MAX_REQUESTS,
    WorkloadSpec,
    generate,
    workload_from_dict,
    workload_spec,
)
from wse_emu.util.configfile import preset_dir

LIMIT_S = 60
ADDRESS_SPACE = 2 << 30  # ample for a refusal, far below a billion requests' 8 bytes each
SWEEP = preset_dir("sweeps") / "sram_clock_decode.yaml"
EXPERIMENT = ["experiment", "disagg", "tiny", "--fabric", "mesh8", "--workload", "chat",
              "--ttft-slo", "1", "--tpot-slo", "1"]


def small_cli(*args):
    """``wse-emu ARGS`` in a process of ADDRESS_SPACE bytes at most, for LIMIT_S at most."""
    def confine():
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    return subprocess.run([sys.executable, "-m", "wse_emu.cli.main", *map(str, args)],
                          capture_output=True, text=True, timeout=LIMIT_S, preexec_fn=confine)


def test_serve_refuses_a_billion_requests():
    proc = small_cli("serve", "tiny", "--fabric", "mesh16", "--workload", "chat", "--requests",
                     "1000000000")
    assert_one_line_error(proc, "--requests must be at most 1,000,000", "1,000,000,000")


@pytest.mark.parametrize("fields,needle", [
    ("requests: 1000000000", "'requests' must be at most 1,000,000"),
    ("requests: 1000\ncalls: 1000000",
     "'requests' x 'calls' must be at most 1,000,000 model calls"),
])
def test_a_workload_yaml_too_large_is_refused(tmp_path, fields, needle):
    workload = tmp_path / "w.yaml"
    workload.write_text(f"version: 1\nname: big\n{fields}\n")
    proc = small_cli("serve", "tiny", "--fabric", "mesh8", "--workload", workload,
                     "--cache-dir", tmp_path)
    assert_one_line_error(proc, str(workload), needle)
    with pytest.raises(ConfigError, match=needle):
        api.check_serving(workload=str(workload))


@pytest.mark.parametrize("extra,needles", [
    (["--requests", "1000000000"], ["--requests must be at most 1,000,000"]),
    (["--seeds", "1000", "--tolerance", "2"], [f"--seeds must be at most {MAX_DRAWS}"]),
    (["--workers", "100000", "--tolerance", "2"], ["--workers must be at most", "per core"]),
])
def test_experiment_refuses_sizes_beyond_its_limits(tmp_path, extra, needles):
    assert_one_line_error(small_cli(*EXPERIMENT, "--cache-dir", tmp_path, *extra), *needles)


def test_sweep_refuses_more_workers_than_its_limit(tmp_path):
    out = tmp_path / "out"
    proc = small_cli("sweep", SWEEP, "-o", out, "--workers", "100000", "--max-points", "0")
    assert_one_line_error(proc, "--workers must be at most", "per core")
    assert not out.exists()  # nothing half-written


@pytest.mark.e2e
def test_a_trace_too_long_to_replay_whole_is_refused_and_its_first_rows_are_not(tmp_path):
    trace = tmp_path / "long.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                     + "0,1,1\n" * (MAX_REQUESTS + 1))
    proc = small_cli("serve", "tiny", "--fabric", "mesh8", "--trace", trace,
                     "--cache-dir", tmp_path)
    assert_one_line_error(proc, f"{trace}: more than 1,000,000 rows", "--requests")
    with pytest.raises(ConfigError, match="more than 1,000,000 rows"):
        api.check_serving(trace=trace)
    assert len(generate(workload_spec(trace=trace, requests=5))) == 5


# --- the Python API -------------------------------------------------------------------------

def test_the_api_refuses_too_many_requests():
    over = MAX_REQUESTS + 1  # were there no limit, quickly drawn: the test would fail, not hang
    with pytest.raises(UserError, match=r"^`requests` must be at most 1,000,000"):
        api.check_serving(workload="chat", requests=over)
    with pytest.raises(ConfigError, match="'requests' must be at most 1,000,000"):
        WorkloadSpec(name="w", requests=over).validate("w")
    with pytest.raises(ConfigError, match="'requests' x 'calls' must be at most"):
        workload_from_dict({"name": "w", "requests": 1000, "calls": 1001}, "w.yaml")
    with pytest.raises(ConfigError, match="more than 1,000,000 model calls"):
        generate(WorkloadSpec(name="w", requests=over))  # a spec never validated
    assert len(generate(WorkloadSpec(name="w", requests=MAX_REQUESTS // 100, calls=100))) \
        == MAX_REQUESTS  # the limit itself is allowed


@pytest.mark.parametrize("name,value,needle", [
    ("seeds", MAX_DRAWS + 1, f"`seeds` must be at most {MAX_DRAWS}"),
    ("workers", 10**6, "`workers` must be at most"),
])
def test_the_api_refuses_too_many_draws_or_workers(tmp_path, name, value, needle):
    with pytest.raises(UserError, match=needle):
        api.experiment(api.from_flat(
            api.ExperimentSpec, model="tiny", workload="chat", fabric="mesh8", ttft_s=1, tpot_s=1,
            tolerance=2,
                       **{name: value}))
    if name == "workers":
        with pytest.raises(UserError, match=needle):
            api.sweep(SWEEP, tmp_path / "out", workers=value, max_points=0)
        assert not (tmp_path / "out").exists()


def test_the_limits_themselves_are_allowed():
    """At each limit, the next check is reached (and refuses the tolerance given wrong)."""
    cores = os.cpu_count() or 1
    with pytest.raises(UserError, match=rf"at most {4 * cores} \(4 per core, {cores} cores"):
        api.experiment(api.from_flat(
            api.ExperimentSpec, model="tiny", workload="chat", fabric="mesh8", ttft_s=1, tpot_s=1,
            tolerance=2,
                       workers=4 * cores + 1))
    for limits in ({"workers": 4 * cores}, {"seeds": MAX_DRAWS}):
        with pytest.raises(UserError, match="`tolerance`"):
            api.experiment(api.from_flat(
                api.ExperimentSpec, model="tiny", workload="chat", fabric="mesh8", ttft_s=1,
                tpot_s=1, tolerance=2,
                           **limits))
