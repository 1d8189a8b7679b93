"""Speculative decoding's verify step: each sequence's next token and the K drafted after it,
timed by the engines as K+1 tiles streaming through the stages (never scaled from the
one-token step)."""

import pytest

from tests.helpers import compiled_on_mesh16
from wse_emu import api
from wse_emu.cli.main import main
from wse_emu.errors import UserError
from wse_emu.models import layer as ly
from wse_emu.models.layer import MicroBatch
from wse_emu.models.load import load_model


@pytest.fixture(scope="module")
def tiny():
    return compiled_on_mesh16(load_model("tiny"))


def step_cycles(program, draft_tokens: int, batch: int = 2, engine: str = "fast") -> float:
    return api.run(program, "decode", batch=batch, context=64, draft_tokens=draft_tokens,
                   engine=engine).step_cycles


def test_verify_costs_at_least_the_one_token_step_and_grows_with_k(tiny):
    one = step_cycles(tiny, 0)
    times = [step_cycles(tiny, k) for k in (1, 2, 4)]
    assert one < times[0] < times[1] < times[2]


def test_verify_streams_its_tiles_through_the_stages(tiny):
    """K+1 tokens per sequence in one tile each: the later tiles follow the first through
    the pipeline, so they cost less than K+1 lone steps would."""
    run = api.run(tiny, "decode", batch=2, context=64, draft_tokens=3)
    assert len(run.step.tiles()) == 4 and run.tokens == 2 * 4
    assert run.step_cycles < 4 * step_cycles(tiny, 0)
    assert all(s.first_tile_cycles < s.cycles for s in run.stages)


def test_each_drafted_token_waits_for_the_keys_before_it(tiny):
    """A tile's attention needs the previous tile's K and V at the same layer: the graph
    holds that edge, so the verify step is not faster than its tiles without it."""
    from wse_emu.kernels.stage import stage_graph

    stage = tiny.stages[tiny.region(tiny.regions[0].name).stage_ids[0]]
    graph, _, _ = stage_graph(tiny, stage, MicroBatch("decode", batch=2, context=64,
                                                      drafted=1))
    alone = [stage_graph(tiny, stage, t)[0] for t in MicroBatch(
        "decode", batch=2, context=64, drafted=1).tiles()]
    edges = len(graph.succ_task)
    assert edges > sum(len(g.succ_task) for g in alone)


def test_the_cycle_engine_times_it_too(tiny):
    fast, cycle = step_cycles(tiny, 2, engine="fast"), step_cycles(tiny, 2, engine="cycle")
    assert cycle == pytest.approx(fast, rel=0.25)


def test_attended_pairs_of_a_verify_step():
    step = MicroBatch("decode", batch=3, context=10, drafted=2)
    assert ly.attended_pairs(None, step) == 3 * (10 + 11 + 12)
    assert ly.attended_pairs(11, step) == 3 * (10 + 11 + 11)
    assert ly.kv_entries_read(None, step) == 3 * 12
    assert step.new_tokens == 9 and step.per_sequence == 3
    plain = MicroBatch("decode", batch=3, context=10)
    assert ly.attended_pairs(None, plain) == 30 and plain.new_tokens == 3


@pytest.mark.parametrize("fields, message", [
    ({"phase": "decode", "drafted": -1}, "drafted must be at least 0"),
    ({"phase": "prefill", "tokens": 8, "drafted": 2}, "verified in a decode step"),
])
def test_micro_batch_refuses(fields, message):
    with pytest.raises(UserError, match=message):
        MicroBatch(**fields)


@pytest.mark.parametrize("kwargs, message", [
    ({"draft_tokens": 17}, "`draft_tokens` must be at most 16"),
    ({"draft_tokens": -1}, "draft_tokens"),
    ({"draft_tokens": 2, "phase": "prefill"}, "give `phase=decode`"),
    ({"draft_tokens": 2, "context": 10**7}, "verifying `draft_tokens=2`"),
])
def test_api_refuses_by_name(tiny, kwargs, message):
    args = {"phase": "decode", "batch": 1, "context": 64, **kwargs}
    with pytest.raises(UserError, match=message):
        api.run(tiny, **args)


def test_kv_room_counts_the_drafted_entries(tiny):
    region = tiny.region(tiny.regions[0].name)
    context = region.kv_capacity_tokens // 4  # 4 sequences fit, not with a drafted entry
    api.run(tiny, "decode", batch=4, context=context)
    with pytest.raises(UserError, match=r"\+ `draft_tokens=1`.*do not fit the KV cache"):
        api.run(tiny, "decode", batch=4, context=context, draft_tokens=1)


def test_command_line_refuses_draft_tokens_outside_decode(capsys):
    code = main(["run", "tiny", "--fabric", "mesh16", "--phase", "prefill", "--draft-tokens",
                 "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--draft-tokens" in err[0]
