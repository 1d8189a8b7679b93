"""The frontier (``experiment frontier``): every point it reports meets its targets, a speed no
configuration reaches gives a capacity of 0 and no ratio, the frontier never gains throughput
as the per-user speed rises, more draws narrow the ratio's interval; and what it rests on:
requests no region holds are refused and counted as missed, both plans are tried at the same
pipeline depths, step times scale without touching the hardware, throughput is counted over
the steady window."""

import json
from dataclasses import replace

import numpy as np
import pytest
from helpers import SMALL_CHAT
from hypothesis import given
from hypothesis import strategies as st

from wse_emu import api
from wse_emu.cli.main import main
from wse_emu.experiments.comparison import ExperimentReport, Space
from wse_emu.experiments.draws import precision_text
from wse_emu.experiments.frontier import (
    FrontierPoint,
    FrontierReport,
    capacity_ratio,
    pareto,
    report_from_json,
    speed_ladder,
    vendor_speed,
)
from wse_emu.experiments.goodput import Comparison, ConfigRow, Replicate, Targets
from wse_emu.experiments.sensitivity import StepScale
from wse_emu.serving.metrics import (
    UserSpeeds,
    percentiles,
    run_metrics,
    token_times,
    user_speeds,
    window_tokens_per_s,
)
from wse_emu.serving.serve import ServeOptions, serve
from wse_emu.serving.workload import Requests

QUICK = Space(copies=(1,), prefill_tile=(64,), token_budget=(64,), interleave=(1,),
              max_running=(0,), batch_limit=(64,), window_s=0.0, layers_per_stage="own")


def tiny_frontier(tmp_path, **settings):
    defaults = dict(ttft_s=0.05, fabric="mesh16", space=QUICK, cache_dir=tmp_path / "cache",
                    workers=1, step_scales=())
    return api.frontier(api.from_flat(
        api.FrontierSpec, model="tiny", workload=str(SMALL_CHAT), **{**defaults, **settings}))


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    return tiny_frontier(tmp_path_factory.mktemp("frontier"), user_speed=20_000, seeds=2)


@pytest.mark.e2e
def test_every_point_reached_meets_its_targets(ladder):
    assert len(ladder.rungs) >= 3
    for r in ladder.rungs:
        rows = ladder.experiments[f"{r.user_speed:g}"].rows()
        for plan, point in r.plans.items():
            if not point.reached:
                continue
            row = rows[point.configuration]
            assert row.tpot_p90_s <= r.tpot_target_s
            assert row.ttft_p90_s <= ladder.ttft_p90_s
            assert row.slo_attainment >= ladder.attainment
            # 90% of requests at or above the speed.
            assert point.user_tokens_per_s.p90 >= r.user_speed
            assert point.tokens_per_s_per_system > 0


@pytest.mark.e2e
def test_the_frontier_never_gains_throughput_as_speed_rises(ladder):
    for plan, front in ladder.frontier.items():
        assert front, plan
        speeds = [p.user_tokens_per_s.p90 for p in front]
        tokens = [p.tokens_per_s_per_system for p in front]
        assert speeds == sorted(speeds, reverse=True)
        assert tokens == sorted(tokens)  # fastest first: throughput only grows as speed falls


@pytest.mark.e2e  # the module's frontier: 13 s
def test_the_headline_is_read_at_the_speed_asked_for(ladder):
    head = ladder.headline
    assert head.user_speed == 20_000
    rung = next(r for r in ladder.rungs if r.user_speed == 20_000)
    assert head.capacity_per_system["colocated"] == \
        rung.plans["colocated"].tokens_per_s_per_system
    assert head.capacity_ratio == rung.capacity_ratio


@pytest.mark.e2e  # the module's frontier: 13 s
def test_the_report_reads_back_from_its_json_as_it_was(ladder):
    """experiment.json holds ``to_json()``; read back, it is the same report, and its JSON
    the same JSON."""
    data = json.loads(json.dumps(ladder.to_json()))
    again = report_from_json(data)
    assert isinstance(again, FrontierReport) and again.to_json() == data
    assert again.rungs[0].plans["colocated"] == ladder.rungs[0].plans["colocated"]
    speed = f"{ladder.rungs[0].user_speed:g}"
    assert again.experiments[speed].comparison == ladder.experiments[speed].comparison
    assert again.experiments[speed].final == ladder.experiments[speed].final
    # Shown in a notebook, a row and a point are their fields, not dictionaries.
    assert repr(ladder.rungs[0].plans["colocated"]).startswith("FrontierPoint(plan='colocated'")


@pytest.mark.e2e
def test_a_speed_no_configuration_reaches_has_no_capacity_and_no_ratio(tmp_path, ladder):
    # Twice as fast as a lone sequence's decode step: no batch, no policy gets there.
    too_fast = 2.0 / ladder.lone_decode_step_s
    data = tiny_frontier(tmp_path, user_speeds=[too_fast], user_speed=too_fast)
    head = data.headline
    assert head.capacity_per_system == {"colocated": 0.0, "disaggregated": 0.0}
    assert head.capacity_ratio.ratio is None
    # No ratio on any draw, so no draws are added past the first three: nothing to narrow.
    assert head.capacity_ratio.neither_draws == data.seeds == 3
    assert not data.precision["reached"] and "not defined on every draw" in data.precision["why"]
    assert data.fastest_reached == {"colocated": 0.0, "disaggregated": 0.0}
    assert data.frontier == {"colocated": [], "disaggregated": []}


@pytest.mark.e2e
def test_draws_are_judged_at_the_fastest_rung_both_reach_when_neither_reaches_the_headline(
        tmp_path, ladder):
    too_fast = 2.0 / ladder.lone_decode_step_s
    both = [r.user_speed for r in ladder.rungs
            if all(p.reached for p in r.plans.values())]
    assert both, "the module's ladder has a rung both plans reach"
    slower = max(both)
    data = tiny_frontier(tmp_path, user_speeds=[too_fast, slower], user_speed=too_fast,
                         max_seeds=4)
    assert data.headline.capacity_ratio.neither_draws == data.headline.capacity_ratio.draws
    precision = data.precision
    assert precision["judged_at"] == slower and precision["headline_unreached"] == too_fast
    # The draws were judged at the slower rung: its ratio is defined on each of them.
    rung = next(r for r in data.rungs if r.user_speed == slower)
    assert rung.capacity_ratio.draws == data.seeds == precision["draws"]
    assert rung.capacity_ratio.unbounded_draws == rung.capacity_ratio.neither_draws == 0
    assert f"at {slower:,.0f} tokens/s per user (neither plan reaches" in \
        precision_text(precision)


def test_a_ratio_over_a_colocated_zero_is_unbounded_not_a_number():
    def row(name, rate):
        return ConfigRow(name, "", "", 1, "", max_rate_per_system=rate,
                         window_output_tokens_per_s_per_system=10.0 * rate)

    def draw(col, dis):
        return Replicate([row("c", col), row("d", dis)], Comparison("c", "d"))
    first = draw(0, 3)
    report = ExperimentReport("m", "1 x f", "w", 10, Targets(1.0, 1.0), True, "full", [], 0.0,
                              [], [], {}, first.configurations, 10, False, {},
                              first.comparison, replicates=[draw(0, 3), draw(0, 2)])
    assert capacity_ratio(report).ratio == "unbounded"
    report.replicates = [draw(1, 3), draw(0, 2)]
    mixed = capacity_ratio(report)
    assert mixed.ratio is None and mixed.unbounded_draws == 1
    report.replicates = [draw(1, 3), draw(2, 2)]
    assert capacity_ratio(report).ratio == pytest.approx(3.0 ** 0.5)  # 3x and 1x: geometric
    report.replicates = None  # one draw: the report's own rows
    assert capacity_ratio(report).ratio == "unbounded"


@pytest.mark.e2e
def test_more_draws_narrow_the_ratios_interval(tmp_path):
    widths = []
    for seeds in (2, 4):
        data = tiny_frontier(tmp_path, user_speeds=[20_000], user_speed=20_000, seeds=seeds)
        iv = data.headline.capacity_ratio.interval
        assert iv["n"] == seeds
        widths.append(iv["relative_half_width"])
    assert widths[1] < widths[0]


@given(st.lists(st.tuples(st.floats(1, 1e5), st.floats(0, 1e6)), max_size=30))
def test_pareto_points_dominate_every_other(points):
    pts = [FrontierPoint("colocated", "c", True, t, 0.0, UserSpeeds(s, s, s), None, None, None)
           for s, t in points]
    front = pareto(pts)
    for p in pts:  # every point is matched or beaten on both axes by one on the frontier
        assert any(f.user_tokens_per_s.p90 >= p.user_tokens_per_s.p90
                   and f.tokens_per_s_per_system >= p.tokens_per_s_per_system
                   for f in front)
    tokens = [f.tokens_per_s_per_system for f in front]
    assert tokens == sorted(tokens)


def test_the_ladder_runs_from_near_the_floor_to_20_ms_with_the_vendor_speed_on_it():
    speeds = speed_ladder(0.0003, 1800)
    assert speeds == sorted(speeds, reverse=True)
    assert 1800 in speeds
    assert speeds[0] < 1 / 0.0003 and speeds[0] == pytest.approx(1 / 0.00033, rel=1e-6)
    assert speeds[-1] == pytest.approx(50)
    assert 1e6 not in speed_ladder(0.0003, 1e6)  # faster than a lone step: not a rung


@pytest.mark.e2e
def test_the_floor_is_the_fastest_lone_step_of_any_layout(tmp_path, monkeypatch):
    """The ladder starts from the fastest layout either plan may take, not from the first one
    built: a deeper or a wider pipeline steps at its own pace."""
    from wse_emu.experiments import run

    real, seen = run.decode_step_s, []

    def recorded(regions, requests, clock_hz, *rest):
        seen.append(real(regions, requests, clock_hz, *rest))
        return seen[-1]

    monkeypatch.setattr(run, "decode_step_s", recorded)
    report = tiny_frontier(tmp_path, user_speeds=(1000,))
    assert len(seen) >= 2 and report.lone_decode_step_s == min(seen)


def test_vendor_speeds_have_sources():
    speed = vendor_speed("llama-3.1-8b")
    assert speed.tokens_per_s == 1800 and "2024-08-27" in speed.source
    assert vendor_speed("tiny") is None


def test_percentiles_of_refused_requests_are_infinite_not_nan():
    p = percentiles(np.array([1.0, 2.0, 3.0, np.inf]))
    assert p.p50 == 2.5 and p.p90 == np.inf and p.p99 == np.inf
    assert percentiles(np.arange(10.0)).to_json() == {
        f"p{q}": float(np.percentile(np.arange(10.0), q)) for q in (50, 90, 99)}


def test_user_speeds_read_as_a_p90_target_does():
    tpot = np.array([0.001] * 9 + [0.01])
    speeds = user_speeds(tpot, np.full(10, 5))
    assert speeds.p50 == pytest.approx(1000)
    assert speeds.p90 == pytest.approx(1 / np.percentile(tpot, 90))
    assert speeds.mean == pytest.approx((9 * 1000 + 100) / 10)


@pytest.fixture(scope="module")
def tiny_split(tmp_path_factory):
    program = api.compile("tiny", "mesh16", plan="disaggregated")
    from wse_emu.pools.kinds.wafer import wafer_pools
    return program, wafer_pools(program, tmp_path_factory.mktemp("tables"), grid="quick")


def _requests(prompts, outputs, gap=0.01):
    n = len(prompts)
    return Requests(np.arange(n) * gap, np.asarray(prompts), np.asarray(outputs),
                    np.arange(n), np.zeros(n, dtype=np.int64), np.zeros(n))


@pytest.mark.e2e
def test_a_request_no_region_holds_is_refused_and_misses_its_targets(tiny_split):
    program, pools = tiny_split
    room = max(p.kv_capacity_tokens for p in pools)
    reqs = _requests([64] * 9 + [room + 10], [8] * 10)
    options = ServeOptions.of(program.fabric, program.model, batch_limit=8)
    with pytest.raises(Exception, match="KV cache"):
        serve(reqs, pools, options)
    res = serve(reqs, pools, options, refuse=True)
    assert res.refused.tolist() == [False] * 9 + [True]
    assert res.tokens[-1] == 0 and np.isinf(res.ttft_s()[-1]) and np.isinf(res.tpot_s()[-1])
    m = run_metrics(res, reqs, 10.0, 10.0)
    assert m.refused == 1 and m.slo_attainment == pytest.approx(0.9)
    assert m.ttft_s.p99 == np.inf
    alone = serve(_requests([64] * 9, [8] * 9), pools, options)
    assert np.array_equal(res.finish[:9], alone.finish)  # the others served as without it


def test_window_throughput_counts_the_tokens_inside_the_window(tiny_split):
    program, pools = tiny_split
    reqs = _requests([64] * 30, [16] * 30, gap=0.0005)
    res = serve(reqs, pools, ServeOptions.of(program.fabric, program.model, batch_limit=8))
    times = token_times(res)
    assert len(times) == res.tokens.sum()
    assert times.min() >= res.first_token.min() and times.max() == pytest.approx(res.finish.max())
    m = run_metrics(res, reqs, None, None, steady=True)
    assert 0 < m.window_output_tokens_per_s
    # Counted without making the times, the same count: at edges falling on a token's time
    # too, where an inclusive bound decides.
    later = times[np.count_nonzero(res.tokens > 0):]  # the tokens after each first
    for begin, end in ((times.min(), times.max()), (np.median(times), times.max()),
                       (later[len(later) // 3], later[2 * len(later) // 3]),
                       (times[3], times[-5]), (times.max() + 1, times.max() + 2)):
        inside = np.count_nonzero((times >= begin) & (times <= end))
        assert window_tokens_per_s(res, begin, end) == inside / ((end - begin) / res.clock_hz)
    # The gaps of some requests: numpy's mask and division, value for value.
    chosen = np.arange(len(reqs)) % 3 == 1
    assert np.array_equal(res.itl_s(chosen),
                          (res.gap_cycles / res.clock_hz)[chosen[res.gap_request]])


def test_step_scale_multiplies_the_tables_and_nothing_else(tiny_split):
    program, pools = tiny_split
    scaled = StepScale(prefill=1.3).pool(pools[0])
    assert np.allclose(scaled.prefill.cycles, 1.3 * pools[0].prefill.cycles)
    assert scaled.kv_capacity_tokens == pools[0].kv_capacity_tokens
    assert scaled.link_bytes_per_cycle == pools[0].link_bytes_per_cycle
    decode = next(p for p in pools if p.role == "decode")
    assert StepScale(prefill=1.3).pool(decode).decode is decode.decode
    assert not StepScale() and StepScale(decode=0.7).describe() == "decode step times x0.7"
    # A decode riding in a chunk's step is decode work: scaled with it, not with prefill.
    riding = replace(decode, riding=decode.decode)
    assert np.allclose(StepScale(decode=0.7).pool(riding).riding.cycles,
                       0.7 * decode.decode.cycles)
    assert StepScale(prefill=1.3).pool(riding).riding is decode.decode


@pytest.mark.e2e
def test_both_plans_are_tried_at_the_same_pipeline_depths(tmp_path):
    data = api.experiment(api.from_flat(
        api.ExperimentSpec, model="tiny", workload=str(SMALL_CHAT), ttft_s=0.05, tpot_s=0.001,
        fabric="mesh16",
                          space=replace(QUICK, layers_per_stage="matched"),
                          cache_dir=tmp_path, workers=1))
    layouts = {t["value"] for s in data.tuning if s["knob"] == "layout" for t in s["tried"]}
    deeper = {name for name in layouts if "/stage" in name}
    assert any(name.startswith("1 copy") for name in deeper) or \
        any(name.startswith("share") for name in deeper)
    # Each plan has the layouts at the other's depth: one name per depth the layouts came to.
    own = {name for name in layouts if "/stage" not in name}
    assert len(deeper) == len(own)


@pytest.mark.e2e
def test_frontier_command_writes_json_and_figure_and_refuses_bad_speeds(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["experiment", "frontier", "tiny", "--fabric", "mesh16", "--workload",
            str(SMALL_CHAT), "--ttft-slo", "0.05", "--token-budget", "64", "--copies", "1",
            "--prefill-tile", "64", "--interleave", "1", "--max-running", "0",
            "--batch-limit", "64", "--window-s", "0", "--layers-per-stage", "own",
            "--workers", "1", "--cache-dir", str(tmp_path / "cache"), "--user-speeds",
            "40000,5000", "--user-speed", "5000", "--step-scales", "1.3", "-o", str(out),
            "--viz", "--json"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["user_speed"] for r in data["rungs"]] == [40000, 5000]
    assert [(r["phase"], r["factor"]) for r in data["step_time_leaning"]] == \
        [("prefill", 1.3), ("decode", 1.3)]
    assert (out / "experiment.json").exists() and (out / "figures" / "frontier.png").exists()
    assert "frontier" in (out / "report.html").read_text()
    bad = [a if a != "40000,5000" else "fast,5000" for a in args]
    assert main(bad[:-4] + ["--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--user-speeds" in err[0]


@pytest.mark.e2e
def test_agent_sessions_report_how_long_a_session_took(tmp_path):
    """Agent sessions: each point reached says how long a whole session took (p50 <= p90),
    read back from the JSON, and shown beside the ratios; plain requests have no such
    column."""
    agents = tmp_path / "agents.yaml"
    agents.write_text(SMALL_CHAT.read_text().replace("name: small-chat", "name: agents")
                      .replace("requests: 40", "requests: 12\ncalls: 3\nthink_s: 0.0005"))
    data = api.frontier(api.from_flat(
        api.FrontierSpec, model="tiny", workload=str(agents), ttft_s=0.05, fabric="mesh16",
        space=QUICK, cache_dir=tmp_path / "cache", workers=1, step_scales=(),
        user_speed=20_000))
    points = [r.plans[plan] for r in data.rungs for plan in ("colocated", "disaggregated")
              if r.plans[plan].reached]
    assert points and all(0 < p.session_p50_s <= p.session_p90_s for p in points)
    back = FrontierReport.from_json(json.loads(json.dumps(data.to_json())))
    assert [r.plans["colocated"].session_p90_s for r in back.rungs] == \
        [r.plans["colocated"].session_p90_s for r in data.rungs]
    from wse_emu.cli.experiment_cmd import render_rungs

    assert "sessions" in render_rungs(data.rungs)  # (a header narrow_table may wrap)
    assert "sessions" not in render_rungs(tiny_frontier(tmp_path / "plain",
                                                        user_speed=20_000).rungs)
