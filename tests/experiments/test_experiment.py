"""The disaggregation experiment: the rate search, the comparison's sanity, and how little the
answers depend on the stage-table grid."""

import json
from dataclasses import replace

import numpy as np
import pytest
from helpers import FIXTURES, QUICK_KNOBS, RecordingPool, made_up_point, search_all

from wse_emu.cli.main import main
from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.options import CompileOptions
from wse_emu.errors import UserError
from wse_emu.experiments.comparison import Space
from wse_emu.experiments.goodput import Config, Outcome, Point, Targets, compare, evaluate, outcomes
from wse_emu.hardware.fabric import ClusterSpec, load_fabric
from wse_emu.models.spec import ModelSpec
from wse_emu.pools.kinds.wafer import WaferRegion
from wse_emu.serving.metrics import run_metrics
from wse_emu.serving.serve import ServeOptions, serve
from wse_emu.serving.tables import build_table
from wse_emu.serving.workload import generate, workload_from_dict

SMALL = ModelSpec.from_fields(name="small", family="llama", hidden_size=512, intermediate_size=1536,
                              num_layers=4, num_heads=8, num_kv_heads=2, head_dim=64,
                              vocab_size=2048).validate("test")
AXES = {"decode": ((1, 4, 16, 64), (64, 512, 2048)), "prefill": ((16, 64, 256), (0, 512, 2048))}
# The same grid with every interval halved: what a finer table would answer.
DENSE = {"decode": ((1, 2, 4, 8, 16, 32, 64), (64, 288, 512, 1280, 2048)),
         "prefill": ((16, 40, 64, 160, 256), (0, 256, 512, 1280, 2048))}
WSE3 = load_fabric("wse3")



def region_models(program, cache, axes=AXES, ample=False):
    out = []
    for r in program.regions:
        tables = {ph: build_table(program, r.name, ph, axes=axes[ph], cache_dir=cache)
                  for ph in ("prefill", "decode")}
        out.append(WaferRegion(r.name, r.role, 10**9 if ample else r.kv_capacity_tokens,
                               tables["prefill"] if r.role != "decode" else None,
                               tables["decode"] if r.role != "prefill" else None))
    return out


@pytest.fixture(scope="module")
def programs():
    cluster = ClusterSpec(load_fabric("mesh64"), 1)
    return (compile_model(SMALL, cluster, CompileOptions(region=(64, 64))),
            compile_model(SMALL, cluster, CompileOptions(plan="disaggregated")))


def test_the_search_brackets_the_highest_rate_met():
    """With a made-up configuration that meets its targets up to factor 2.7, the search ends
    with the met factor within the tolerance below 2.7 and the failed one above it."""
    def run_points(jobs):
        return [Point(f, f <= 2.7, None) for _, f in jobs]
    configs = [Config("colocated", "made up", [], ServeOptions.of(WSE3, SMALL))]
    (search,) = search_all(configs, run_points, tolerance=0.02)
    assert 2.7 / 1.02 <= search.best <= 2.7 < search.failed <= search.best * 1.02


def test_why_a_configuration_stopped_reads_its_numbers_as_the_command_line_writes_them():
    """The sentence on what stopped a configuration writes rates with SI prefixes and times
    in their unit (never 5.18e+03/s or 0.0276 ms)."""
    met = made_up_point(2500.0, True)
    failed = made_up_point(5180.0, False, tpot_p90_s=2.76e-5, pace=1.23,
                           decode_work_per_token_s=6.69e-6, decode_stall_per_token_s=4.1e-6,
                           prefill_utilization=0.34, decode_utilization=0.04)
    outcome = Outcome("colocated, made up", "colocated", "made up", met, failed)
    targets = Targets(ttft_s=1.0, tpot_s=1e-5)
    assert compare([outcome, replace(outcome, plan="disaggregated")], targets).reasons[0] == (
        "colocated, made up: at 5.18 k/s it missed p90 TPOT and a growing queue (first tokens "
        "spread over 1.23x the span of arrivals); p90 TPOT 27.6 us against 6.69 us of decode "
        "work per token: tokens waited behind prefill and other micro-batches (4.1 us per "
        "token on average); prefill stages 34% busy, decode stages 4%")
    rising = replace(failed, metrics=replace(failed.metrics, pace=1.0, ttft_slope=123.4))
    assert "(TTFT rising 120 s per s of arrivals)" in replace(outcome, failed=rising).limit(
        targets)


def test_the_search_gives_up_at_its_floor():
    configs = [Config("colocated", "never", [], ServeOptions.of(WSE3, SMALL))]
    (search,) = search_all(configs, lambda jobs: [Point(f, False, None) for _, f in jobs])
    assert search.best is None and outcomes([search])[0].goodput == 0.0


@pytest.mark.e2e
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_disaggregation_with_free_transfer_and_room_is_never_worse_on_long_prompts(
        programs, tmp_path_factory, seed):
    """Long prompts, short answers, a TPOT target a few decode steps wide: colocated decode
    waits behind prefill, disaggregated decode does not; with the KV handoff free and KV room
    ample, nothing else can make disaggregation lose."""
    cache = tmp_path_factory.getbasetemp() / "tables"
    colocated, disaggregated = (region_models(p, cache, ample=True) for p in programs)
    base = replace(ServeOptions.of(programs[0].fabric, programs[0].model), kv_bytes_per_token=0)
    configs = [Config("colocated", "prefill priority", colocated, base),
               Config("colocated", "chunked 64", colocated,
                      replace(base, policy="chunked", token_budget=64)),
               Config("colocated", "chunked 256", colocated,
                      replace(base, policy="chunked", token_budget=256)),
               Config("disaggregated", "share 0.5", disaggregated, base)]
    decode = next(r for r in disaggregated if r.role == "decode").decode
    step_s = float(decode.vector(1, 1024).sum()) / base.clock_hz
    requests = generate(workload_from_dict(
        {"name": "long prompts", "rate": 1000.0, "requests": 200, "seed": seed,
         "prompt": {"kind": "uniform", "low": 512, "high": 1024},
         "output": {"kind": "uniform", "low": 4, "high": 32}}, "test"))
    targets = Targets(ttft_s=0.02, tpot_s=3 * step_s)
    searches = search_all(configs, lambda jobs: [
        evaluate(configs[i], requests, f, targets) for i, f in jobs])
    results = {o.label: o for o in outcomes(searches)}
    best_colocated = max(r.max_rate for label, r in results.items() if "colocated" in label)
    assert results["disaggregated, share 0.5"].max_rate >= best_colocated > 0


@pytest.mark.e2e
def test_results_barely_move_with_a_finer_table_grid(programs, tmp_path_factory):
    """Serving answers (latency percentiles, throughput) with the tables' grid halved change by
    less than 5%: interpolation error does not steer the experiment."""
    cache = tmp_path_factory.getbasetemp() / "tables"
    program = programs[0]
    requests = generate(workload_from_dict(
        {"name": "mixed", "rate": 3000.0, "requests": 300, "seed": 4,
         "prompt": {"kind": "lognormal", "median": 300, "sigma": 0.8, "low": 16, "high": 2000},
         "output": {"kind": "lognormal", "median": 40, "sigma": 0.8, "low": 1, "high": 200}},
        "test"))
    options = ServeOptions.of(program.fabric, program.model)
    answers = []
    for axes in (AXES, DENSE):
        result = serve(requests, region_models(program, cache, axes), options)
        answers.append(run_metrics(result, requests, None, None))
    coarse, fine = answers
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        for q in ("p50", "p90"):
            assert getattr(getattr(coarse, key), q) == \
                pytest.approx(getattr(getattr(fine, key), q), rel=0.05), (key, q)
    assert coarse.output_tokens_per_s == pytest.approx(fine.output_tokens_per_s, rel=0.05)
    assert np.isfinite(coarse.tpot_s.p99)


def test_a_run_whose_every_request_is_refused_misses_its_targets(tmp_path):
    """Requests no region of a layout can hold (long agent contexts on a split's halves, say):
    every one refused, nothing runs, and the run misses its targets rather than failing."""
    from types import SimpleNamespace

    from wse_emu import api
    from wse_emu.experiments.goodput import judge, serve_run
    from wse_emu.pools.kinds.wafer import wafer_pools
    from wse_emu.serving.workload import Requests

    program = api.compile("tiny", "mesh16")
    pools = wafer_pools(program, tmp_path)
    options = ServeOptions.of(program.fabric, program.model)
    too_long = Requests(np.array([0.0, 1.0]), np.array([9000, 9000]), np.array([4, 4]),
                        np.arange(2), np.zeros(2, int), np.zeros(2))
    run = serve_run(SimpleNamespace(regions=pools, options=options), too_long, 1.0)
    assert run.metrics.refused == 2 and run.pressure.kv_peak_share == 0.0
    assert not judge(run, Targets(ttft_s=10.0, tpot_s=1.0)).met


def test_a_share_of_refused_requests_reads_as_a_percentage():
    from wse_emu.experiments.goodput import _percent

    assert [_percent(x) for x in (100, 39.2, 7.23, 0.5)] == ["100%", "39%", "7.2%", "0.5%"]


@pytest.mark.parametrize("fields, words", [
    ({"router": "nearest"}, "`router` must be one of least-busy, round-robin, prefix"),
    ({"kv_tier": "disk"}, "`kv_tier` must be one of none, host"),
    ({"kv_tier": "host", "prefix_cache": False}, "it needs the prefix cache"),
])
def test_an_experiments_router_and_kv_tier_are_checked_by_name(fields, words):
    with pytest.raises(UserError, match=words):
        Space(**fields)


@pytest.mark.e2e
def test_an_experiment_serves_both_plans_with_the_router_and_tier_asked(tmp_path, capsys):
    """A block trace's experiment with the prefix router and the host tier: the report says
    so, and its head line too."""
    args = ["experiment", "disagg", "tiny", "--fabric", "mesh16", "--workload",
            str(FIXTURES / "small_blocks.yaml"), "--ttft-slo", "0.05", "--tpot-slo", "0.001",
            *QUICK_KNOBS, "--workers", "1", "--seeds", "1", "--cache-dir", str(tmp_path)]
    assert main(args + ["--router", "prefix", "--kv-tier", "host", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["serving"] == {"router": "prefix", "kv_tier": "host"}
    assert main(args + ["--json"]) == 0
    assert "serving" not in json.loads(capsys.readouterr().out)
    assert main(args + ["--router", "prefix", "--kv-tier", "host"]) == 0
    assert "requests routed prefix; KV given up parked in host memory" in capsys.readouterr().out


@pytest.mark.parametrize("parallel", [True, False])
def test_the_serving_loop_is_made_ready_before_workers_get_runs(parallel, monkeypatch):
    """Before serving runs go to worker processes, the loop is compiled (or loaded) here, its
    line said, once; the workers load it. Runs served here need nothing first."""
    from wse_emu.experiments import goodput
    from wse_emu.experiments.goodput import RunBook
    from wse_emu.serving.workload import Requests

    seen: list = []
    monkeypatch.setattr(goodput, "warm_loop", lambda: seen.append("warm"))
    monkeypatch.setattr(goodput, "judge", lambda run, targets: run)
    book = RunBook(RecordingPool(seen, parallel), lambda requests, config, factor: (config, factor))
    requests = Requests(np.array([0.0]), np.array([8]), np.array([2]), np.arange(1),
                        np.zeros(1, int), np.zeros(1))
    run_points = book.run_points((), requests, Targets(ttft_s=1.0, tpot_s=1.0))
    assert run_points([("a", 1.0), ("a", 2.0)]) == [("a", 1.0), ("a", 2.0)]
    assert run_points([("a", 1.0)]) == [("a", 1.0)]  # served before: no jobs
    assert seen == (["warm", "jobs"] if parallel else ["jobs"])


def test_warming_the_loop_readies_it_and_every_policys_dispatch(monkeypatch):
    from wse_emu.serving import policies
    from wse_emu.serving.loops import compiled as compiled_loop

    made = []

    def recording_njit(*args, **kwargs):
        def compile_(function):
            made.append(function)
            return function
        return compile_

    monkeypatch.setattr(compiled_loop, "_compiled", {})
    monkeypatch.setattr(compiled_loop, "njit", recording_njit)
    monkeypatch.setattr(compiled_loop, "_CALLED", ())  # no primitive compiled for real
    policies.warm_loop()
    assert made == [compiled_loop._loop] + [c.compiled for c in policies.POLICIES.values()]
    policies.warm_loop()  # once per process
    assert len(made) == 1 + len(policies.POLICIES)
