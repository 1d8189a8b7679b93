"""Error bars: the experiment repeated over independent draws of its workload (seeds, or
windows of a trace) gives each goodput and the ratio a mean and a 95% interval, and the
intervals narrow as draws are added."""

import json

import numpy as np
import pytest
from helpers import QUICK_KNOBS, SMALL_CHAT

from wse_emu.cli.main import main
from wse_emu.errors import ConfigError
from wse_emu.experiments.goodput import Comparison, ConfigRow, Replicate, over_replicates
from wse_emu.experiments.intervals import interval, ratio_interval
from wse_emu.serving.workload import WorkloadSpec, generate, replicate


def test_interval_is_students_t():
    iv = interval([1.0, 2.0, 3.0])
    # mean 2, sample sd 1, t(0.975, 2) = 4.303
    assert iv["mean"] == 2.0 and iv["half_width"] == pytest.approx(4.303 / np.sqrt(3))
    assert "half_width" not in interval([5.0])


def test_a_ratios_interval_is_on_the_log_scale_and_never_below_zero():
    """Draws of 1.7x, 3.6x and 5.5x: on the linear scale the interval would reach -1.1x; on
    the log scale its centre is the geometric mean, its ends that times and divided by one
    factor, both above 0."""
    values = [1.7, 3.6, 5.5]
    assert interval(values)["low"] < 0
    iv = ratio_interval(values)
    logs = np.log(values)
    half = 4.303 * logs.std(ddof=1) / np.sqrt(3)
    assert iv["mean"] == pytest.approx(np.exp(logs.mean()))
    assert iv["low"] == pytest.approx(iv["mean"] / np.exp(half))
    assert iv["high"] == pytest.approx(iv["mean"] * np.exp(half))
    assert iv["relative_half_width"] == pytest.approx(np.exp(half) - 1) and iv["scale"] == "log"
    # A ratio and its inverse have mirrored intervals.
    inverse = ratio_interval([1 / v for v in values])
    assert inverse["low"] == pytest.approx(1 / iv["high"])
    # Bounds widen it on the log scale too; a draw of 0 has no log: linear, cut at 0.
    wide = ratio_interval(values, lower=[1.6, 3.4, 5.2], upper=[1.8, 3.8, 5.8])
    assert wide["low"] < iv["low"] and wide["high"] > iv["high"]
    zero = ratio_interval([0.0, 1.0, 2.0])
    assert zero["low"] == 0.0 and zero["scale"].startswith("linear")
    assert "low" not in ratio_interval([2.0]) and ratio_interval([2.0])["mean"] == 2.0


def test_draws_on_one_search_step_still_leave_the_step_unknown():
    """Three draws whose searches all stop at 5.76/s met and 6.05/s failed agree exactly, but
    the goodput is only known to lie in that step: the interval spans it."""
    iv = interval([5.76] * 3, upper=[6.05] * 3)
    assert iv["half_width"] == pytest.approx(0.0, abs=1e-12)
    assert iv["low"] == pytest.approx(5.76) and iv["high"] == pytest.approx(6.05)
    # Bounds only widen an interval, and missing bounds (a search that never failed) are
    # ignored.
    spread = interval([1.0, 2.0, 3.0], lower=[0.9, 1.9, 2.9], upper=[1.1, 2.1, 3.1])
    plain = interval([1.0, 2.0, 3.0])
    assert spread["low"] < plain["low"] and spread["high"] > plain["high"]
    assert interval([1.0, 2.0], upper=[None, 2.2])["high"] == interval([1.0, 2.0])["high"]


def test_the_ratio_is_bracketed_by_both_searches():
    """A draw where colocated met 10/s and failed at 10.5/s and disaggregated met 8/s and
    failed at 8.4/s: its ratio lies between 8/10.5 and 8.4/10."""
    def draw():
        return Replicate([ConfigRow("c", "colocated", "", 1, "", max_rate_per_system=10.0,
                                    failed_rate_per_system=10.5,
                                    output_tokens_per_s_per_system=1.0),
                          ConfigRow("d", "disaggregated", "", 1, "", max_rate_per_system=8.0,
                                    failed_rate_per_system=8.4,
                                    output_tokens_per_s_per_system=1.0)],
                         Comparison("c", "d", goodput_ratio=0.8))
    ratio = over_replicates([draw(), draw()])["goodput_ratio"]
    assert ratio["mean"] == pytest.approx(0.8)
    assert ratio["low"] == pytest.approx(8 / 10.5) and ratio["high"] == pytest.approx(0.84)
    assert ratio["scale"] == "log"


def test_replicates_are_new_seeds_or_the_next_trace_windows(tmp_path):
    spec = WorkloadSpec(name="w", rate=10.0, requests=20,
                        prompt={"kind": "fixed", "value": 8},
                        output={"kind": "fixed", "value": 4}).validate("test")
    a, b = generate(replicate(spec, 0, 20)), generate(replicate(spec, 1, 20))
    assert not np.array_equal(a.arrival_s, b.arrival_s)
    rows = "\n".join(f"{t},{10 + t},{1 + t}" for t in range(50))
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + rows + "\n")
    spec = WorkloadSpec(name="t", arrival="trace", trace=str(trace), requests=20)
    second = generate(replicate(spec, 1, 20))
    assert second.prompt_tokens.tolist() == list(range(30, 50))
    assert second.arrival_s[0] == 0.0


def test_skip_is_refused_outside_a_trace():
    with pytest.raises(ConfigError, match="'skip'"):
        WorkloadSpec(name="w", skip=5).validate("test")


@pytest.mark.e2e
def test_the_interval_narrows_with_more_seeds(tmp_path, capsys):
    args = ["experiment", "disagg", "tiny", "--fabric", "mesh16", "--workload", str(SMALL_CHAT),
            "--ttft-slo", "0.05", "--tpot-slo", "0.001", *QUICK_KNOBS, "--workers", "1",
            "--requests", "120", "--cache-dir", str(tmp_path / "cache"), "--json"]
    over = {}
    for seeds in (3, 10):
        assert main(args + ["--seeds", str(seeds)]) == 0
        over[seeds] = json.loads(capsys.readouterr().out)["over_replicates"]
        assert over[seeds]["replicates"] == seeds
    # The first three draws are the same in both runs.
    assert over[10]["goodput_ratio"]["values"][:3] == over[3]["goodput_ratio"]["values"]

    def mean_relative_width(o):
        ivs = [c[key] for c in o["configurations"]
               for key in ("max_rate_per_system", "output_tokens_per_s_per_system")]
        return np.mean([iv["half_width"] / iv["mean"] for iv in ivs])
    # One interval can come out narrow by luck from three draws that happen to agree; over
    # both plans' rates and token rates the intervals narrow as draws are added.
    assert mean_relative_width(over[10]) < 0.75 * mean_relative_width(over[3])
