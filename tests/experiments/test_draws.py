"""How many draws an experiment runs: fixed with `seeds`, or added from three until the ratio's
95% interval (on the log scale) is within `precision` or `max_seeds` are drawn; the first
draws the same whatever the cap, and where the precision is not reached, why."""

import json

import numpy as np
import pytest
from helpers import QUICK_KNOBS, SMALL_CHAT

from wse_emu.cli.main import main
from wse_emu.errors import UserError
from wse_emu.experiments.draws import (
    DEFAULT_MAX_SEEDS,
    DEFAULT_PRECISION,
    DrawPlan,
    Swing,
    precision_text,
    run_until_precise,
)
from wse_emu.experiments.intervals import interval, ratio_interval
from wse_emu.experiments.spec import Load
from wse_emu.serving.workload import Requests


def requests(prompt: int) -> Requests:
    ones = np.ones(4, dtype=np.int64)
    return Requests(np.arange(4.0), prompt * ones, 10 * ones, np.arange(4), 0 * ones,
                    np.zeros(4))


def test_the_default_adds_draws_and_seeds_fix_them():
    assert Load(workload="chat").draw_plan() == DrawPlan(3, DEFAULT_MAX_SEEDS, DEFAULT_PRECISION)
    assert Load(workload="chat", seeds=5).draw_plan() == DrawPlan(5, 5, None)
    assert Load(workload="chat", precision=0.05, max_seeds=8).draw_plan() == DrawPlan(3, 8, 0.05)


@pytest.mark.parametrize("fields, words", [
    ({"seeds": 4, "precision": 0.1}, "`precision` is for draws added"),
    ({"seeds": 4, "max_seeds": 10}, "`max_seeds` is for draws added"),
    ({"precision": 0}, "`precision` must be a share between 0 and 1"),
    ({"precision": 1.5}, "`precision` must be a share between 0 and 1"),
    ({"max_seeds": 2}, "`max_seeds` must be from 3"),
    ({"max_seeds": 101}, "`max_seeds` must be from 3"),
])
def test_a_draw_setting_that_would_be_ignored_or_is_out_of_range_is_refused(fields, words):
    with pytest.raises(UserError, match=words):
        Load(workload="chat", **fields)


def test_a_trace_caps_the_draws_at_its_windows():
    assert DrawPlan(3, 20, 0.1).within(7) == DrawPlan(3, 7, 0.1)
    assert DrawPlan(3, 20, 0.1).within(2) == DrawPlan(2, 2, 0.1)
    assert DrawPlan(5, 5, None).within(2) == DrawPlan(5, 5, None)  # fixed: as asked


def fake(ratios: list, plan: DrawPlan):
    """run_until_precise on draws whose ratios are ``ratios``: the draws each run used."""
    ran = []

    def run(n):
        ran.append(n)
        return n

    def swing_of(n):
        return Swing(ratio_interval(ratios[:n]), {"colocated": [1.0] * n,
                                                  "disaggregated": ratios[:n]},
                     [requests(100 + 10 * k) for k in range(n)])
    return run_until_precise(plan, run, swing_of), ran


def test_draws_are_added_until_the_interval_is_narrow_enough():
    rng = np.random.default_rng(0)
    ratios = list(np.exp(rng.normal(np.log(3.0), 0.2, 60)))
    (n, report), ran = fake(ratios, DrawPlan(3, 60, 0.1))
    assert ran[0] == 3 and ran == sorted(ran) and n == ran[-1]
    assert report["reached"] and report["relative_half_width"] <= 0.1
    # Draws are added until the interval is narrow enough: the count tried before was not.
    if len(ran) > 1:
        before = ratio_interval(ratios[:ran[-2]])["relative_half_width"]
        assert before > 0.1
    assert "why" not in report


def test_a_cap_reached_first_says_which_plan_swings_and_on_which_draws():
    ratios = [1.0, 4.0, 1.5, 3.5, 2.0]
    (n, report), ran = fake(ratios, DrawPlan(3, 5, 0.1))
    assert ran == [3, 5] and not report["reached"] and report["draws"] == 5
    assert report["spread"]["swings_most"] == "disaggregated"
    assert report["spread"]["lowest_draw"]["draw"] == 0
    assert report["spread"]["highest_draw"]["draw"] == 1
    text = precision_text(report)
    assert "not reached" in text and "Disaggregated swings most" in text
    assert "lowest on draw 1 (1.00x" in text and "highest on draw 2 (4.00x" in text


def test_fixed_draws_run_once():
    (n, report), ran = fake([1.0, 4.0, 1.5], DrawPlan(3, 3, None))
    assert ran == [3] and report["asked"] is None and precision_text(report) is None


def test_no_ratio_on_every_draw_stops_adding():
    ran = []

    def run(n):
        ran.append(n)
        return n
    _, report = run_until_precise(DrawPlan(3, 20, 0.1), run,
                                  lambda n: Swing(None, {}, [], "colocated reached nothing"))
    assert ran == [3] and not report["reached"] and report["why"] == "colocated reached nothing"


@pytest.mark.e2e
def test_draws_added_extend_the_fixed_ones(tmp_path, capsys):
    """The default adds draws; its first three are the three of `--seeds 3`, and the report
    says how precise the ratio came out."""
    args = ["experiment", "disagg", "tiny", "--fabric", "mesh16", "--workload", str(SMALL_CHAT),
            "--ttft-slo", "0.05", "--tpot-slo", "0.001", *QUICK_KNOBS, "--workers", "1",
            "--requests", "120", "--cache-dir", str(tmp_path / "cache"), "--json"]
    assert main(args + ["--seeds", "3"]) == 0
    fixed = json.loads(capsys.readouterr().out)
    assert "precision" not in fixed
    assert main(args + ["--max-seeds", "6", "--precision", "0.01"]) == 0
    added = json.loads(capsys.readouterr().out)
    precision = added["precision"]
    assert precision["asked"] == 0.01 and precision["max_draws"] == 6
    assert precision["draws"] == added["over_replicates"]["replicates"] > 3
    assert (added["over_replicates"]["goodput_ratio"]["values"][:3]
            == fixed["over_replicates"]["goodput_ratio"]["values"])


def test_a_throughputs_interval_is_cut_at_zero_and_its_centre_kept():
    wide = interval([100.0, 2000.0, 50.0], floor=0.0)
    plain = interval([100.0, 2000.0, 50.0])
    assert plain["low"] < 0 and wide["low"] == 0.0
    assert (wide["mean"], wide["high"], wide["half_width"]) == \
        (plain["mean"], plain["high"], plain["half_width"])
    assert interval([100.0, 110.0], floor=0.0)["low"] == interval([100.0, 110.0])["low"]
