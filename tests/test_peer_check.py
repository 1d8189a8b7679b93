"""Our serving runtime on GPU pools against AIConfigurator's own answer (its `cli default`):
Llama-3.1-8B on 8 x H200, ISL 1024, OSL 256, TTFT 1 s, TPOT 5 ms. Run only where both the
gpu and the peer extras are installed (the planner is not needed otherwise)."""

import pytest

from wse_emu import api
from wse_emu.model import load_model
from wse_emu.runtime.comparison import Space

pytest.importorskip("aiconfigurator_core")
pytest.importorskip("aiconfigurator")

from wse_emu.runtime.peer_check import aiconfigurator_default  # noqa: E402

pytestmark = pytest.mark.slow
GPUS = 8


@pytest.fixture(scope="module")
def answers():
    peer, _ = aiconfigurator_default(load_model("llama-3.1-8b"), "h200", GPUS, 1024, 256,
                                     1.0, 0.005)
    report = api.experiment(
        "llama-3.1-8b", "steady-1024-256", ttft_s=1.0, tpot_s=0.005, split_pool=f"h200x{GPUS}",
        space=Space(window_s=0, token_budget=(128, 256, 512, 1024, 2048, 4096), rounds=2),
        workers=1)
    # Per GPU over the steady window (AIConfigurator plans a steady state); one node.
    ours = {"agg" if row.plan == "colocated" else "disagg":
            row.window_output_tokens_per_s_per_system / GPUS for row in report.final}
    return peer, ours


def test_disaggregated_within_20_percent(answers):
    peer, ours = answers
    assert ours["disagg"] == pytest.approx(peer["disagg"].tokens_per_s_per_gpu, rel=0.2)


@pytest.mark.xfail(strict=True, reason="AIConfigurator's aggregated TPOT counts four of its "
                   "seven mixed steps (5.47 ms with all seven, over the target); docs/serving.md")
def test_aggregated_within_20_percent(answers):
    peer, ours = answers
    assert ours["agg"] == pytest.approx(peer["agg"].tokens_per_s_per_gpu, rel=0.2)
