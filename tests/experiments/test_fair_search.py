"""The colocated baseline gets the same tuning as disaggregation: knob by knob, each plan's
values are searched, the best stays, and the report says what each knob bought; each plan's
best is then searched again on longer runs."""

import json

import pytest
from helpers import QUICK_KNOBS, SMALL_CHAT

from wse_emu.cli.main import main


def run(tmp_path, capsys, *extra) -> dict:
    args = ["experiment", "disagg", "tiny", "--fabric", "mesh64", "--workload", str(SMALL_CHAT),
            "--ttft-slo", "0.05", "--tpot-slo", "0.001", *QUICK_KNOBS, "--workers", "1",
            "--requests", "60", "--cache-dir", str(tmp_path / "cache"), "--json", *extra]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.e2e
def test_the_search_takes_several_copies_per_wafer_when_they_serve_more(tmp_path, capsys):
    """A tiny model on a 64x64 mesh leaves one copy's pipeline mostly idle: four copies, each
    on a quarter of the columns, sustain a higher rate, and the comparison is made against
    them."""
    data = run(tmp_path, capsys, "--copies", "1,4")
    rates = {c["configuration"]: c["max_rate_per_s"] for c in data["configurations"]}
    one = max(r for label, r in rates.items() if label.startswith("colocated, 1 copy"))
    four = max(r for label, r in rates.items() if label.startswith("colocated, 4 copies"))
    assert four > one
    assert data["comparison"]["colocated"].startswith("colocated, 4 copies")


@pytest.mark.e2e
def test_each_knob_keeps_its_best_value_and_says_what_it_bought(tmp_path, capsys):
    data = run(tmp_path, capsys, "--prefill-tile", "16,64", "--copies", "1,65",
               "--batch-limit", "16,64")
    steps = {(s["plan"], s["knob"]): s for s in data["tuning"]}
    for plan in ("colocated", "disaggregated"):
        for knob in ("prefill tile", "decode batch limit"):
            step = steps[(plan, knob)]
            assert [t["value"] for t in step["tried"]] == ([16, 64] if knob == "prefill tile"
                                                           else [16, 64])
            best = max(t["max_rate_per_system"] for t in step["tried"])
            assert step["after_per_system"] == best
            assert step["after_per_system"] >= step["before_per_system"]
    # The knobs of a policy not chosen are not tuned; every policy is tried first.
    policy = steps[("colocated", "policy")]
    assert {t["value"] for t in policy["tried"]} == {"prefill-priority", "chunked",
                                                      "interleaved"}
    if policy["chosen_value"] != "chunked":
        assert ("colocated", "chunk budget") not in steps
    assert any(s.startswith("colocated 65 copies") for s in data["skipped"])
    # The tuned best is what is compared.
    last = [s for s in data["tuning"] if s["plan"] == "colocated"][-1]
    assert data["comparison"]["colocated"] == last["chosen"]


@pytest.mark.e2e
def test_each_plans_best_is_searched_again_on_longer_runs(tmp_path, capsys):
    """A tiny model serves thousands of requests per second: a steady window of 50 ms holds
    hundreds of them."""
    data = run(tmp_path, capsys, "--window-s", "0.05")
    assert data["confirmed"]
    assert data["final_requests_per_run"] > data["requests_per_run"]
    assert {c["plan"] for c in data["final"]} == {"colocated", "disaggregated"}
    for c in data["final"]:
        assert c["max_rate_per_s"] > 0
        # The window holds about the time asked for at the rate found.
        assert c["window_s"] >= 0.9 * 0.05
        assert c["window_requests"] > 60


def test_confirming_runs_of_agent_sessions_are_capped_by_model_calls():
    """Agentic workloads count sessions, each of several calls: the cap on a confirming run is in
    model calls, so a run of five-call sessions holds a fifth as many sessions."""
    from wse_emu.experiments.comparison import MAX_CONFIRM_REQUESTS, confirm_cap
    from wse_emu.serving.workload import WorkloadSpec, generate

    plain = generate(WorkloadSpec(name="plain", requests=50))
    agents = generate(WorkloadSpec(name="agents", requests=50, calls=5))
    assert (plain.sessions(), len(plain)) == (50, 50)
    assert (agents.sessions(), len(agents)) == (50, 250)
    assert confirm_cap(plain) == MAX_CONFIRM_REQUESTS
    assert confirm_cap(agents) == MAX_CONFIRM_REQUESTS // 5
