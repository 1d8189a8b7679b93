"""Our serving runtime on GPU pools against AIConfigurator's own answer (its `cli default`):
Llama-3.1-8B on 8 x H200, ISL 1024, OSL 256, TTFT 1 s, TPOT 5 ms, every knob at its default
values. Run only where both the gpu and the peer extras are installed (the planner is not
needed otherwise).

AIConfigurator's TTFT and TPOT are one steady-state estimate per configuration, the average
request's, with no spread; ours are held like for like, at the median request (half of them
meeting both). Its disaggregated plans stretch the database's decode steps by 8% and its
prefill steps by 10% (its latency corrections), so its decode batch stops where the steps
alone would take more: ours is compared with it at its own configuration, and tuned freely
serves at least that. At our own default, the p90, both plans serve less (docs/serving.md
says why)."""

import pytest

from wse_emu import api
from wse_emu.experiments.comparison import Space
from wse_emu.models.load import load_model

pytest.importorskip("aiconfigurator_core")
pytest.importorskip("aiconfigurator")

from wse_emu.experiments.peer_check import aiconfigurator_default  # noqa: E402

pytestmark = pytest.mark.slow
GPUS = 8
SETUP = dict(ttft_s=1.0, tpot_s=0.005, workers=1, seeds=1)  # one draw, as docs/serving.md


def per_gpu(report) -> dict:
    """Output tokens/s per GPU over the steady window (AIConfigurator plans a steady state) of
    each plan's best."""
    return {"agg" if row.plan == "colocated" else "disagg":
            row.window_output_tokens_per_s_per_system / GPUS for row in report.final}


def ours(percentile: int) -> dict:
    """Each plan's best on one node, every knob at its default values, targets held at
    ``percentile``."""
    return per_gpu(api.experiment(api.from_flat(
        api.ExperimentSpec, model="llama-3.1-8b", workload="steady-1024-256",
        split_pool=f"h200x{GPUS}",
                                  space=Space(window_s=0), percentile=percentile, **SETUP)))


@pytest.fixture(scope="module")
def peer():
    answers, _ = aiconfigurator_default(load_model("llama-3.1-8b"), "h200", GPUS, 1024, 256,
                                        1.0, 0.005)
    return answers


@pytest.fixture(scope="module")
def at_the_median():
    return ours(50)


def test_the_aggregated_plan_is_within_20_percent_of_aiconfigurator(peer, at_the_median):
    assert at_the_median["agg"] == pytest.approx(peer["agg"].tokens_per_s_per_gpu, rel=0.2)


def test_the_disaggregated_plan_at_its_configuration_is_within_20_percent(peer, at_the_median):
    """Served at AIConfigurator's own split and decode batch, ours is within 20% of its
    answer; tuned freely, ours finds at least as much."""
    theirs = peer["disagg"]
    report = api.experiment(api.from_flat(api.ExperimentSpec,
        model="llama-3.1-8b", workload="steady-1024-256", prefill_pool=theirs.prefill_pool,
        decode_pool=theirs.decode_pool, space=Space(window_s=0, batch_limit=(
            theirs.decode_batch,)), percentile=50, **SETUP))
    at_theirs = per_gpu(report)["disagg"]
    assert at_theirs == pytest.approx(theirs.tokens_per_s_per_gpu, rel=0.2)
    assert at_the_median["disagg"] >= at_theirs * (1 - 1e-9)


def test_holding_the_p90_serves_no_more(at_the_median):
    """The p90 is the stricter target: no plan serves more under it."""
    at_p90 = ours(90)
    for plan in ("agg", "disagg"):
        assert at_p90[plan] <= at_the_median[plan] * (1 + 1e-9)
