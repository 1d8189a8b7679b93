"""The experiment and the frontier with speculative decoding: both plans carry the same draft,
every count of drafted tokens is a layout of each plan, and what they assumed is reported."""

import pytest
from helpers import SMALL_CHAT

from wse_emu import api
from wse_emu.cli.experiment_cmd import render_frontier
from wse_emu.errors import UserError
from wse_emu.experiments.comparison import Space
from wse_emu.experiments.frontier import FrontierReport
from wse_emu.experiments.spec import WaferTiming
from wse_emu.visualize.curves import draw_experiment

QUICK = Space(copies=(1, 2), prefill_tile=(64,), token_budget=(64,), interleave=(1,),
              max_running=(0,), batch_limit=(64,), window_s=0.0, layers_per_stage="own",
              grid="quick")
SPECULATING = dict(draft="mtp", draft_tokens=(2, 4), acceptance=0.7)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    spec = api.from_flat(api.ExperimentSpec, model="tiny", workload=str(SMALL_CHAT),
                         ttft_s=1.0, tpot_s=0.01, fabric="mesh16", space=QUICK,
                         cache_dir=tmp_path_factory.mktemp("cache"), workers=1, **SPECULATING)
    return api.experiment(spec)


@pytest.mark.slow  # about 20 s: both plans' layouts with their drafts, at two counts
def test_each_count_is_a_layout_of_both_plans(report):
    tried = {(c.plan, part) for c in report.configurations
             for part in c.configuration.split(", ") if part.startswith("K ")}
    for plan in ("colocated", "disaggregated"):
        assert {(plan, "K 2"), (plan, "K 4")} <= tried
    assert report.timing.speculation == {"draft": "mtp", "draft_tokens": [2, 4],
                                         "draft_strips": [1.0], "acceptance": 0.7,
                                         "acceptance_seed": 0}
    assert all(", K " in row.configuration for row in report.final)


@pytest.mark.slow  # about 20 s: both plans' layouts beside two widths of strip
def test_each_width_of_the_drafts_strip_is_a_layout_of_both_plans(tmp_path):
    spec = api.from_flat(api.ExperimentSpec, model="tiny", workload=str(SMALL_CHAT),
                         ttft_s=1.0, tpot_s=0.01, fabric="mesh16", space=QUICK,
                         cache_dir=tmp_path, workers=1, draft="mtp", draft_tokens=(2,),
                         acceptance=0.7, draft_strips=(1, 1.3, 3))
    report = api.experiment(spec)
    narrowest = api.compile("tiny", "mesh16", draft="mtp").summary["draft"]["strip_columns"]
    for plan in ("colocated", "disaggregated"):  # 1.3 times as wide: a layout of each plan
        assert any(", strip " in c.configuration for c in report.configurations
                   if c.plan == plan)
    assert any(f"colocated, 1 copy, strip {round(1.3 * narrowest)}, K 2" in c.configuration
               for c in report.configurations)
    # Three times the narrowest is more than half of the mesh's columns.
    assert any("more than half of mesh16's 16" in s for s in report.skipped)
    assert report.timing.speculation["draft_strips"] == [1.0, 1.3, 3.0]


@pytest.mark.slow
def test_a_wafer_holds_one_copy_beside_its_draft(report):
    assert any("2 copies: with a draft, a wafer holds one copy" in s for s in report.skipped)


@pytest.mark.parametrize("fields, message", [
    ({"draft": "mtp"}, "a `draft` and its `acceptance` together"),
    ({"acceptance": 0.5}, "a `draft` and its `acceptance` together"),
    ({"draft": "mtp", "acceptance": 0.5, "draft_tokens": (4, 17)}, "at most 16"),
    ({"draft": "mtp", "acceptance": 0.5, "draft_tokens": ()}, "one or more whole numbers"),
    ({"draft": "mtp", "acceptance": 1.5}, "`acceptance` must be a probability"),
    ({"draft_tokens": (4,)}, "give a `draft` too"),
    ({"acceptance_seed": 2}, "give a `draft` too"),
    ({"draft_strips": (2,)}, "give a `draft` too"),
    ({"draft": "mtp", "acceptance": 0.5, "draft_strips": (0.5,)}, "numbers of 1 or more"),
    ({"draft": "mtp", "acceptance": 0.5, "draft_strips": ()}, "one or more numbers"),
])
def test_bad_speculation_is_refused_by_name(fields, message):
    with pytest.raises(UserError, match=message):
        WaferTiming(**fields)


def test_a_baseline_without_a_draft_is_refused():
    with pytest.raises(UserError, match="`baseline` sets the frontier without speculative"):
        api.from_flat(api.FrontierSpec, model="tiny", workload=str(SMALL_CHAT), ttft_s=1.0,
                      fabric="mesh16", baseline=True)


def test_a_draft_is_checked_before_any_layout_is_compiled():
    with pytest.raises(UserError, match="must share one"):
        api.experiment(api.from_flat(
            api.ExperimentSpec, model="tiny", workload=str(SMALL_CHAT), ttft_s=1.0,
            tpot_s=0.01, fabric="mesh16", draft="llama-3.2-1b", acceptance=0.5))


def test_pools_named_by_their_hardware_take_no_draft():
    with pytest.raises(UserError, match="a `draft` are for compiled wafers"):
        api.experiment(api.from_flat(
            api.ExperimentSpec, model="tiny", workload=str(SMALL_CHAT), ttft_s=1.0,
            tpot_s=0.01, prefill_pool="mesh16", decode_pool="mesh16", **SPECULATING))


@pytest.mark.e2e
def test_the_frontier_reaches_above_a_lone_non_speculative_step(tmp_path):
    """With every drafted token accepted, a lone sequence's time per token falls below its
    plain decode step, and the ladder starts above it."""
    common = dict(model="tiny", workload=str(SMALL_CHAT), ttft_s=1.0, fabric="mesh16",
                  space=QUICK, cache_dir=tmp_path / "cache", workers=1, step_scales=(),
                  user_speeds=None)
    plain = api.frontier(api.from_flat(api.FrontierSpec, **common))
    fast = api.frontier(api.from_flat(api.FrontierSpec, draft="mtp", draft_tokens=(4,),
                                      acceptance=1.0, baseline=True, **common))
    assert fast.lone_decode_step_s < plain.lone_decode_step_s
    assert max(r.user_speed for r in fast.rungs) > max(r.user_speed for r in plain.rungs)
    # The baseline beside it is the frontier without speculation, as run on its own.
    assert fast.baseline.to_json() == plain.to_json()
    written = fast.to_json()
    assert FrontierReport.from_json(written).to_json() == written
    text = render_frontier(fast)
    assert "Without speculative decoding (the same workload, draws" in text
    captions = draw_experiment(fast, tmp_path)
    assert "without speculative decoding" in captions[0][1] and captions[0][0].is_file()
