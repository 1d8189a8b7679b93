"""Experiments on pools named by their hardware: the footprint both plans share, the layouts
each may take, and the experiment end to end on a split between two kinds of hardware."""

import json

import pytest
from helpers import SMALL_CHAT, assert_one_line_error, run_cli

from wse_emu.errors import UserError
from wse_emu.experiments.layouts import (
    Footprint,
    colocated_names,
    every_split,
    plan_pools,
    pool_layouts,
    systems_of,
    variants,
)
from wse_emu.models.load import load_model
from wse_emu.pools.names import parse_pool
from wse_emu.serving.pools import StagePool


def names(*texts):
    return [parse_pool(t) for t in texts]


def test_the_footprint_counts_wafers_instances_and_whole_nodes():
    assert systems_of(names("trn2x2", "wse3")) == 3
    assert systems_of(names("mesh16x2", "wse3x4")) == 6


def test_colocated_serving_gets_the_splits_footprint_of_each_kind():
    split = [tuple(names("trn2x2", "wse3"))]
    assert [n.text for n in colocated_names(split, [])] == ["trn2x3", "wse3x3"]
    assert [n.text for n in colocated_names(split, names("wse3x3"))] == ["wse3x3"]


def test_a_footprint_in_kw_gives_colocated_serving_the_units_that_fit():
    """A Trn3 UltraServer (144 kW of chips) and a CS-3 (23 kW): 167 kW, which holds one
    UltraServer or seven CS-3s (161 kW); each layout is reported per kW of its own."""
    kw = Footprint("kw")
    split = [tuple(names("trn3", "wse3"))]
    assert kw.of(list(split[0])) == pytest.approx(167.0)
    assert [n.text for n in colocated_names(split, [], kw)] == ["trn3x1", "wse3x7"]
    with pytest.raises(UserError, match="trn2 has no wall power stated"):
        kw.of(names("trn2"))


def test_a_footprint_in_cost_takes_the_users_prices_and_invents_none():
    cost = Footprint("cost", (("mesh16", 10.0), ("trn2", 40.0)))
    split = [tuple(names("trn2", "mesh16"))]
    assert cost.of(list(split[0])) == 50.0
    assert [n.text for n in colocated_names(split, [], cost)] == ["trn2x1", "mesh16x5"]
    with pytest.raises(UserError, match="needs the price per hour of one wse3"):
        cost.of(names("wse3"))
    with pytest.raises(UserError, match="`footprint` must be one of"):
        Footprint("floorspace")


def test_a_footprint_in_racks_takes_the_users_units_per_rack():
    racks = Footprint("racks", per_rack=(("mesh16", 4.0), ("trn2", 2.0)))
    split = [tuple(names("trn2", "mesh16"))]
    assert racks.of(list(split[0])) == pytest.approx(0.75)
    assert [n.text for n in colocated_names(split, [], racks)] == ["trn2x1", "mesh16x3"]
    with pytest.raises(UserError, match="how many wse3 units a rack holds"):
        racks.of(names("wse3"))


def test_a_pool_split_every_way_between_the_phases():
    splits = every_split(parse_pool("trn2x4"))
    assert [(p.text, d.text) for p, d in splits] == [("trn2x1", "trn2x3"), ("trn2x2", "trn2x2"),
                                                     ("trn2x3", "trn2x1")]
    with pytest.raises(UserError, match="a split needs two or more"):
        every_split(parse_pool("trn2"))


def test_a_wafer_side_is_tried_with_each_copies_per_wafer_and_depth():
    sides = variants(parse_pool("wse3"), load_model("tiny"), copies=(1, 2), depths=(2,))
    assert [s.label for s in sides] == [
        "wse3", "wse3 (2 layers per stage)", "wse3 (2 copies per wafer)",
        "wse3 (2 copies per wafer, 2 layers per stage)"]


def test_an_accelerator_side_is_one_layout_side():
    assert [s.label for s in variants(parse_pool("trn2x2"), load_model("tiny"))] == ["2 x trn2"]


@pytest.mark.parametrize("kwargs, needle", [
    (dict(pool="trn2"), "give `prefill_pool` and `decode_pool` too"),
    (dict(prefill_pool="trn2"), "go together"),
    (dict(split_pool="trn2x2", pool="trn2"), "`split_pool` goes alone"),
    (dict(prefill_pool="trn2", decode_pool="wse3", pool="wse3x3"), "may not be larger"),
])
def test_pools_named_wrongly_are_refused(kwargs, needle):
    given = dict(pool=None, prefill_pool=None, decode_pool=None, split_pool=None) | kwargs
    with pytest.raises(UserError, match=needle):
        plan_pools(**given)


def test_every_layout_is_named_and_a_side_that_does_not_fit_is_skipped_with_why():
    model = load_model("tiny")

    def side(too_small):
        def pools(s, role, first):
            if s.pool.text in too_small:
                raise UserError("too small")
            return [StagePool("x", role, 1000, None, None, first)]
        return pools
    splits, colocated = plan_pools(None, "trn2x2", "mesh16", None)
    layouts, skipped = pool_layouts(model, splits, colocated, side({"mesh16x3"}))
    assert sorted(layouts) == [("colocated", "3 x trn2"),
                               ("disaggregated", "2 x trn2 prefill / mesh16 decode")]
    assert skipped == ["colocated 3 x mesh16: too small"]
    assert [p.name for p in layouts[("disaggregated", "2 x trn2 prefill / mesh16 decode")]
            .regions] == ["prefill0", "decode1"]
    with pytest.raises(UserError, match="no colocated layout holds tiny"):
        pool_layouts(model, splits, colocated, side({"mesh16x3", "trn2x3"}))


@pytest.mark.e2e
def test_the_experiment_compares_a_split_across_kinds_in_one_footprint(tmp_path):
    proc = run_cli("experiment", "disagg", "tiny", "--prefill-pool", "trn2",
                   "--decode-pool", "mesh16", "--workload", SMALL_CHAT, "--ttft-slo", "1",
                   "--tpot-slo", "0.01", "--window-s", "0", "--grid", "quick", "--workers", "1",
                   "--token-budget", "64",
                   "--cache-dir", tmp_path, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["cluster"].startswith("2 x footprint (trn2 prefill + mesh16 decode")
    tried = {t["value"] for s in report["tuning"] if s["plan"] == "colocated"
             and s["knob"] == "layout" for t in s["tried"]}
    # A wafer pool with each of the copies per wafer the wafer-only experiment tries.
    assert tried == {"2 x trn2", "2 x mesh16", "2 x mesh16 (2 copies per wafer)",
                     "2 x mesh16 (4 copies per wafer)"}
    split = {t["value"] for s in report["tuning"] if s["plan"] == "disaggregated"
             and s["knob"] == "layout" for t in s["tried"]}
    assert "trn2 prefill / mesh16 (2 copies per wafer) decode" in split
    assert {row["plan"] for row in report["final"]} == {"colocated", "disaggregated"}


@pytest.mark.e2e
def test_the_experiment_reports_per_unit_of_a_footprint_in_cost(tmp_path):
    proc = run_cli("experiment", "disagg", "tiny", "--prefill-pool", "trn2",
                   "--decode-pool", "mesh16", "--workload", SMALL_CHAT, "--ttft-slo", "1",
                   "--tpot-slo", "0.01", "--window-s", "0", "--grid", "quick", "--workers", "1",
                   "--token-budget", "64", "--footprint", "cost", "--price", "trn2=40",
                   "--price", "mesh16=10", "--copies", "1", "--cache-dir", tmp_path, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["footprint_unit"] == "cost/h"
    tried = {t["value"] for s in report["tuning"] if s["plan"] == "colocated"
             and s["knob"] == "layout" for t in s["tried"]}
    assert tried == {"trn2", "5 x mesh16"}
    rows = {row["plan"]: row for row in report["final"]}
    footprints = {"colocated": 40.0 if "trn2" in rows["colocated"]["configuration"] else 50.0,
                  "disaggregated": 50.0}
    for plan, row in rows.items():  # per unit of each plan's own footprint
        assert row["max_rate_per_system"] == pytest.approx(
            row["max_rate_per_s"] / footprints[plan])
        # A unit of the footprint costs 1 an hour: the cost per million tokens follows.
        assert row["cost_per_million_output_tokens"] == pytest.approx(
            footprints[plan] / 3600 / row["output_tokens_per_s"] * 1e6)


@pytest.mark.parametrize("args, needle", [
    (["--prefill-pool", "trn2", "--decode-pool", "trn2", "--systems", "2"], "--systems"),
    (["--footprint", "kw"], "--footprint, --price and --per-rack are for pools"),
    (["--prefill-pool", "trn2", "--decode-pool", "trn2", "--footprint", "cost"],
     "needs the price per hour of one trn2"),
    (["--prefill-pool", "trn2", "--decode-pool", "trn2", "--price", "trn2"], "NAME=PER_HOUR"),
    (["--split-pool", "trn2"], "a split needs two or more"),
])
def test_an_experiment_on_pools_refuses_a_clusters_flags_in_one_line(args, needle):
    proc = run_cli("experiment", "disagg", "tiny", *args, "--workload", SMALL_CHAT,
                   "--ttft-slo", "1", "--tpot-slo", "0.01")
    assert_one_line_error(proc, needle)


@pytest.mark.e2e
def test_every_pairing_of_two_kinds_runs_and_is_drawn_on_one_figure(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("experiment", "pairings", "tiny", "--kinds", "trn2,mesh16", "--workload",
                   SMALL_CHAT, "--ttft-slo", "1", "--window-s", "0", "--grid", "quick",
                   "--workers", "1", "--token-budget", "64", "--user-speeds", "100000,1000",
                   "--cache-dir", tmp_path / "cache", "-o", out, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert list(report["frontiers"]) == [
        "trn2 prefill + trn2 decode", "trn2 prefill + mesh16 decode",
        "mesh16 prefill + trn2 decode", "mesh16 prefill + mesh16 decode"]
    both = report["frontiers"]["trn2 prefill + mesh16 decode"]
    assert both["cluster"].startswith("2 x footprint (trn2 prefill + mesh16 decode")
    assert [r["user_speed"] for r in both["rungs"]] == [100000, 1000]
    assert json.loads((out / "pairings.json").read_text()) == report
    assert (out / "figures" / "pairings.png").stat().st_size > 10_000


def test_pairings_refuse_a_clusters_flags_and_a_kind_named_wrongly():
    # A compiled cluster's flags are not the pairings': --kinds names the hardware.
    for args, needle in ((["--kinds", "trn2", "--systems", "2"],
                          "unrecognized arguments: --systems 2"),
                         (["--kinds", "trn9"], "unknown pool 'trn9'")):
        proc = run_cli("experiment", "pairings", "tiny", *args, "--workload", SMALL_CHAT,
                       "--ttft-slo", "1")
        assert_one_line_error(proc, needle)
