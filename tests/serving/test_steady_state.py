"""The experiment's yardstick: percentiles over the steady window, a growing queue fails
whatever its percentiles, and goodput is the highest rate met (DistServe's definition)."""

import numpy as np
import pytest
from helpers import made_up_point, search_all

from wse_emu.errors import UserError
from wse_emu.experiments.goodput import Config, Targets, compare, outcomes
from wse_emu.hardware.fabric import load_fabric
from wse_emu.models.load import load_model
from wse_emu.serving.metrics import run_metrics, steady_window
from wse_emu.serving.serve import ServeOptions, ServeResult
from wse_emu.serving.workload import Requests

CLOCK = 1e9
OPTIONS = ServeOptions.of(load_fabric("wse3"), load_model("tiny"))



def result(ttft_s: np.ndarray, tpot_s: float = 1e-3, tokens: int = 10,
           rate: float = 50.0) -> ServeResult:
    """A run of requests arriving ``rate`` a second with the given TTFTs."""
    n = len(ttft_s)
    arrival = np.arange(n) * CLOCK / rate
    first = arrival + ttft_s * CLOCK
    finish = first + tpot_s * (tokens - 1) * CLOCK
    return ServeResult(arrival.astype(np.int64), first.astype(np.int64),
                       finish.astype(np.int64), np.full(n, tokens), ["r"] * n, CLOCK)


def requests(n: int) -> Requests:
    ones = np.ones(n, dtype=np.int64)
    return Requests(np.arange(n, dtype=float), 100 * ones, 10 * ones, np.arange(n), 0 * ones,
                    np.zeros(n))


def test_the_window_leaves_out_the_fill_and_the_drain():
    mask = steady_window(np.arange(100.0))
    assert mask.sum() == 80 and not mask[:10].any() and not mask[90:].any()


def test_a_growing_queue_fails_though_its_percentiles_pass():
    """TTFT rising from 0.05 s to 0.7 s over 4 s of arrivals (a queue that has not settled):
    p90 TTFT is under a 1 s target and every request meets it, yet the run is not sustained."""
    targets = Targets(ttft_s=1.0, tpot_s=0.005)
    growing = run_metrics(result(np.linspace(0.05, 0.7, 200)), requests(200), 1.0, 0.005,
                          steady=True)
    assert growing.ttft_s.p90 < 1.0 and growing.slo_attainment == 1.0
    assert growing.ttft_slope > 0.05
    assert not targets.stable(growing) and not targets.met(growing)
    rng = np.random.default_rng(0)
    # The same spread of TTFTs without a trend, over 40 s of arrivals.
    flat = run_metrics(result(rng.uniform(0.05, 0.7, 200), rate=5.0), requests(200), 1.0,
                       0.005, steady=True)
    assert targets.stable(flat) and targets.met(flat)


def test_a_burst_arriving_at_once_is_not_steady():
    """Requests arriving all at once: whatever order their TTFTs come in, their first tokens
    are spread over time they did not arrive in."""
    res = result(np.linspace(0.3, 0.01, 100))
    res.arrival[:] = 0
    res.first_token[:] = (np.linspace(0.3, 0.01, 100) * CLOCK).astype(np.int64)
    burst = run_metrics(res, requests(100), 1.0, 0.005, steady=True)
    assert burst.pace == float("inf")
    assert not Targets(ttft_s=1.0, tpot_s=0.005).met(burst)


def sessions_run(starts_s: np.ndarray, ttft_first_s: np.ndarray, calls: int = 5,
                 step_s: float = 0.5, ttft_later_s=0.01) -> tuple[ServeResult, Requests]:
    """Agent sessions starting at ``starts_s``: each first call waits ``ttft_first_s``, each
    later call ``ttft_later_s`` (per session, or one for all), and arrives ``step_s`` after the
    one before it was answered (the closed loop: later calls are paced by service, not by the
    offered rate)."""
    n = len(starts_s)
    session = np.repeat(np.arange(n), calls)
    call = np.tile(np.arange(calls), n)
    later = np.broadcast_to(np.asarray(ttft_later_s, dtype=float), (n,))
    waits = np.where(call == 0, np.repeat(ttft_first_s, calls), np.repeat(later, calls))
    # Each call arrives step_s after the previous one's first token.
    arrival = np.repeat(starts_s, calls).astype(float)
    for k in range(1, calls):
        arrival[call == k] = arrival[call == k - 1] + waits[call == k - 1] + step_s
    first = arrival + waits
    finish = first + 1e-3 * 9
    order = np.argsort(arrival, kind="stable")
    res = ServeResult((arrival * CLOCK).astype(np.int64)[order],
                      (first * CLOCK).astype(np.int64)[order],
                      (finish * CLOCK).astype(np.int64)[order], np.full(n * calls, 10),
                      ["r"] * (n * calls), CLOCK)
    ones = np.ones(n * calls, dtype=np.int64)
    opening = np.where(call == 0, arrival, np.nan)
    reqs = Requests(opening[order], 100 * ones[order], 10 * ones[order], session[order],
                    call[order], np.zeros(n * calls))
    return res, reqs


def test_a_burst_of_sessions_is_too_short_to_judge():
    """Sixty sessions arriving within 6 ms, their first calls served over 0.6 s: a burst the
    cluster absorbed. Their later calls, paced by service, spread over seconds and look like
    a steady stream; but every session started before the first one ended, so the run never
    reached the load such a stream keeps up: it meets nothing."""
    targets = Targets(ttft_s=1.0, tpot_s=0.005)
    res, reqs = sessions_run(np.linspace(0, 0.006, 60), np.linspace(0.01, 0.6, 60))
    burst = run_metrics(res, reqs, 1.0, 0.005, steady=True)
    assert burst.too_short and not targets.met(burst)
    whole = run_metrics(res, reqs, 1.0, 0.005)  # every call counted, the percentiles pass
    assert whole.ttft_s.p90 < 1.0 and whole.slo_attainment == 1.0 and not whole.steady


def test_sessions_are_judged_after_one_session_length_and_must_end_at_their_pace():
    targets = Targets(ttft_s=1.0, tpot_s=0.005)
    # Sixty sessions over 30 s, each about 2 s long: steady, and the window holds every call
    # of the sessions it holds, none started in the first 2 s.
    starts = np.linspace(0, 30, 60)
    res, reqs = sessions_run(starts, np.full(60, 0.1))
    steady = run_metrics(res, reqs, 1.0, 0.005, steady=True)
    assert targets.met(steady) and steady.window_requests % 5 == 0
    assert steady.session_pace == pytest.approx(1.0, abs=0.01)
    # The same sessions with later calls waiting longer and longer (0.01 s up to 0.9 s): each
    # call's TTFT is within 1 s and the first calls keep pace, but sessions end over 12% more
    # time than they start over: the load is still growing.
    res, reqs = sessions_run(starts, np.full(60, 0.1), ttft_later_s=np.linspace(0.01, 0.9, 60))
    growing = run_metrics(res, reqs, 1.0, 0.005, steady=True)
    assert growing.ttft_s.p90 < 1.0 and growing.slo_attainment == 1.0
    assert growing.session_pace > 1.1 and not targets.met(growing)


def test_percentiles_count_only_the_window():
    """A burst of slow first tokens during warm-up does not count against the run."""
    ttft = np.full(100, 0.1)
    ttft[:10] = 5.0
    steady = run_metrics(result(ttft), requests(100), 1.0, 0.005, steady=True)
    whole = run_metrics(result(ttft), requests(100), 1.0, 0.005)
    assert steady.slo_attainment == 1.0 and whole.slo_attainment == pytest.approx(0.9)


def _points(rate_met: float, tokens_per_request: float):
    """A made-up configuration that meets its targets up to ``rate_met`` requests/s."""
    def run(jobs):
        return [made_up_point(
            f, f <= rate_met, goodput_requests_per_s=0.5 * f,
            output_tokens_per_s=tokens_per_request * f,
            window_output_tokens_per_s=tokens_per_request * f,
            slo_attainment=0.95 if f <= rate_met else 0.5, decode_work_per_token_s=0.5,
            prefill_utilization=0.5, decode_utilization=0.5, kv_peak_share=0.5)
            for _, f in jobs]
    return run


def test_goodput_is_the_highest_rate_met_per_system():
    configs = [Config("colocated", "a", [], OPTIONS),
               Config("disaggregated", "b", [], OPTIONS)]
    limits = {0: 3.0, 1: 4.5}

    def run_points(jobs):
        return [_points(limits[i], 100)([(i, f)])[0] for i, f in jobs]
    searches = search_all(configs, run_points, tolerance=0.01)
    results = outcomes(searches)
    for r, limit in zip(results, limits.values()):
        assert limit / 1.01 <= r.max_rate <= limit
    summary = compare(results, Targets(1.0, 1.0), systems=2)
    assert summary.goodput_ratio == pytest.approx(results[1].max_rate / results[0].max_rate)
    assert summary.max_rate_per_system["colocated"] == pytest.approx(results[0].max_rate / 2)


def test_targets_hold_at_the_percentile_asked():
    """A run whose typical request is fast and whose slowest quarter is slow meets targets
    held at the median (half the requests within them) and misses the same targets at the
    p90."""
    tpot = np.where(np.arange(200) % 4 == 0, 0.008, 0.004)  # a quarter of requests slow
    n = len(tpot)
    arrival = np.arange(n) * CLOCK / 5.0
    first = arrival + 0.1 * CLOCK
    finish = first + tpot * 9 * CLOCK
    run = ServeResult(arrival.astype(np.int64), first.astype(np.int64),
                      finish.astype(np.int64), np.full(n, 10), ["r"] * n, CLOCK)
    metrics = run_metrics(run, requests(n), 1.0, 0.005, steady=True)
    assert metrics.tpot_s.p50 < 0.005 < metrics.tpot_s.p90
    assert not Targets(1.0, 0.005).met(metrics)
    median = Targets(1.0, 0.005, percentile=50)
    assert median.attainment == 0.5 and median.met(metrics)
    assert not Targets(1.0, 0.005, attainment=0.9, percentile=50).met(metrics)


def test_targets_read_back_name_their_percentile():
    for targets in (Targets(1.0, 0.005), Targets(0.5, 0.002, 0.6, percentile=50)):
        assert Targets.from_json(targets.to_json()) == targets
    assert set(Targets(1.0, 0.005, percentile=99).to_json()) == {
        "ttft_p99_s", "tpot_p99_s", "attainment"}
    with pytest.raises(UserError, match="percentile"):
        Targets(1.0, 0.005, percentile=80)


def test_a_run_with_every_request_refused_has_no_queue_trend_and_misses():
    """No request served, so no first token to trend: the queue's signals are not measured
    (None, never an overflow of stand-in values) and the run misses its targets."""
    run = result(np.full(200, 0.1))
    run = ServeResult(run.arrival, run.first_token, run.finish, run.tokens, run.regions,
                      CLOCK, refused=np.ones(200, dtype=bool))
    with np.errstate(all="raise"):
        m = run_metrics(run, requests(200), 1.0, 0.005, steady=True)
    assert m.refused == 200 and m.ttft_by_fifth_s == []
    assert m.ttft_growth_s is None and m.ttft_slope is None and m.pace is None
    assert not Targets(ttft_s=1.0, tpot_s=0.005).met(m)
