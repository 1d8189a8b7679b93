"""Output that does not mislead: a limit named for what bound (KV room, not the targets), no
attainment where no target was given, a refusal for KV room that says which region would
hold the request, and sizes in the units people use."""

import json

import pytest
from helpers import SMALL_CHAT, made_up_point

from wse_emu import api
from wse_emu.cli.main import main
from wse_emu.errors import UserError
from wse_emu.experiments.goodput import Config, Search, Targets, outcomes
from wse_emu.serving.serve import ServeOptions
from wse_emu.util.fmt import count

TARGETS = Targets(1.0, 0.005)


def searched(*points) -> Search:
    config = Config("colocated", "1 copy", [], ServeOptions(clock_hz=1.0, kv_bytes_per_token=0))
    return Search(config, {p.rate: p for p in points})


def test_a_layout_that_cannot_hold_the_prompts_is_limited_by_kv_room():
    # A quarter of the requests refused for room: no rate can meet 90% attainment.
    failed = made_up_point(0.1, False, tpot_p90_s=0.001, slo_attainment=0.75, refused=25)
    why = outcomes([searched(failed)])[0].limit(TARGETS)
    assert why.startswith("KV room: 25 of its requests (25%) need more KV cache")
    assert "TTFT" not in why and "attainment" not in why
    # A few refused among other misses: the targets bound it, the refusals said beside them.
    few = made_up_point(2.0, False, ttft_p90_s=3.0, tpot_p90_s=0.001, slo_attainment=0.8,
                         refused=2)
    why = outcomes([searched(made_up_point(1.0, True), few)])[0].limit(TARGETS)
    assert why.startswith("p90 TTFT and attainment (80.0% < 90%; 2 of its requests (2%)")


def test_model_sizes_are_in_the_units_people_use():
    assert [count(n) for n in (107_000, 494e6, 8.03e9, 1.2e12, 512)] == \
        ["107 k", "494 M", "8.03 B", "1.2 T", "512"]


@pytest.fixture(scope="module")
def program():
    return api.compile("tiny", "mesh16", region=(16, 16))


@pytest.mark.e2e
def test_no_attainment_is_reported_without_targets(program, tmp_path, capsys):
    metrics = api.serve(program, SMALL_CHAT, requests=20, cache_dir=tmp_path).metrics
    assert metrics.slo_attainment is None and metrics.goodput_requests_per_s is None
    assert "on target" not in repr(metrics)
    judged = api.serve(program, SMALL_CHAT, requests=20, cache_dir=tmp_path, tpot_s=1.0).metrics
    assert judged.slo_attainment == 1.0
    args = ["serve", "tiny", "--fabric", "mesh16", "--region", "16x16", "--workload",
            str(SMALL_CHAT), "--requests", "20", "--cache-dir", str(tmp_path)]
    assert main(args) == 0
    assert "SLO attainment       no targets given" in capsys.readouterr().out
    assert main(args + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["slo_attainment"] is None and data["goodput_requests_per_s"] is None


@pytest.mark.e2e
def test_a_region_too_small_for_a_request_is_refused_with_one_that_holds_it(tmp_path):
    small = api.compile("tiny", "mesh16")  # many small copies, each with little KV room
    with pytest.raises(UserError, match=r"more than any region holds .*: a region of 16x16 "
                                        r"PEs holds it .*`region=16x16`"):
        api.serve(small, "chat", requests=200, cache_dir=tmp_path)
    # The region it names serves the same requests.
    metrics = api.serve(api.compile("tiny", "mesh16", region=(16, 16)), "chat",
                        requests=200, cache_dir=tmp_path).metrics
    assert metrics.refused == 0
