"""Equal effort by default: on the README's cases, tuning harder than the default (more
passes over the knobs, every layout tuned apart, wider lists of values) moves neither plan's
best by more than 5%. A default that favoured one plan (a GPU's chunk budgets stopping at
512 tokens, a policy chosen where nothing met the targets) fails here.

The cases: Llama-3.1-8B on one WSE-3 on the chat trace at the vendor's 1,800 tokens/s per user
(the README's headline) and at 5 ms per token; and the check against AIConfigurator's setup on
eight H200s (with the gpu extra). Each plan's best is read off the tuning runs (``window_s``
0) of one draw: what the search found, not a confirming run's draw."""

from functools import cache

import pytest

from wse_emu import api
from wse_emu.experiments.comparison import Space

pytestmark = pytest.mark.slow
SPEEDS = (1800.0, 200.0)  # the vendor's speed, and 5 ms per token

HARDER = {
    "more passes": {"rounds": 3},
    "every layout tuned apart": {"each_layout": True},
    "wider lists": {"prefill_tile": (4, 8, 16, 32, 64, 128, 256), "batch_limit": (8, 16, 32, 64),
                    "interleave": (1, 2, 3, 4, 8), "max_running": (0, 16, 32, 64, 128)},
}
# A server's own knobs, wider: chunk budgets, batches and prompts per chunk between and beyond
# the ones its engines use.
SERVER_WIDER = {"token_budget": (256, 512, 1024, 1536, 2048, 4096, 6144, 8192),
                "batch_limit": (16, 32, 64, 96, 128, 192, 256), "chunk_prompts": (1, 2, 4, 8)}


def best(report) -> dict:
    """Each plan's best: output tokens/s per system over the steady window of its best run."""
    return {row.plan: row.window_output_tokens_per_s_per_system for row in report.final}


@cache
def wafer(space: tuple = ()) -> dict:
    """Speed (tokens/s per user) -> each plan's best there: both speeds of one frontier, so
    that they share every serving run they have in common."""
    report = api.frontier(api.from_flat(
        api.FrontierSpec, model="llama-3.1-8b", trace="azure-conv", ttft_s=1.0, fabric="wse3",
                          user_speeds=SPEEDS, step_scales=(), workers=1, seeds=1,
                          space=Space(grid="quick", window_s=0, **dict(space))))
    return {float(speed): best(data) for speed, data in report.experiments.items()}


@cache
def gpus(space: tuple = ()) -> dict:
    return best(api.experiment(api.from_flat(
        api.ExperimentSpec, model="llama-3.1-8b", workload="steady-1024-256", ttft_s=1.0,
        tpot_s=0.005,
                               split_pool="h200x8", percentile=50, workers=1, seeds=1,
                               space=Space(window_s=0, **dict(space)))))


def assert_within_5_percent(default: dict, harder: dict) -> None:
    for plan in ("colocated", "disaggregated"):
        assert harder[plan] == pytest.approx(default[plan], rel=0.05), plan


@pytest.mark.parametrize("speed", SPEEDS, ids=["1800 tokens per s", "200 (5 ms)"])
@pytest.mark.parametrize("harder", list(HARDER))
def test_tuning_a_wafer_harder_moves_neither_plan(speed, harder):
    assert_within_5_percent(wafer()[speed], wafer(tuple(HARDER[harder].items()))[speed])


@pytest.mark.parametrize("harder", ["more passes", "every layout tuned apart", "wider lists"])
def test_tuning_gpus_harder_moves_neither_plan(harder):
    pytest.importorskip("aiconfigurator_core")
    space = SERVER_WIDER if harder == "wider lists" else HARDER[harder]
    assert_within_5_percent(gpus(), gpus(tuple(space.items())))
