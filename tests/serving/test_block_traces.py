"""Traces whose prompts come as prefix blocks (JSON lines, as Mooncake publishes them): read and
checked line by line, their blocks shared between requests by the prefix cache of both loops
alike, never more than the trace's hashes allow."""

import json

import numpy as np
import pytest
from helpers import FIXTURES

from wse_emu import api
from wse_emu.cli.main import main
from wse_emu.errors import ConfigError
from wse_emu.serving.blocktrace import numbered, shareable_tokens
from wse_emu.serving.workload import generate, read_trace, workload_spec

TRACE = FIXTURES / "small_blocks.jsonl"
WORKLOAD = FIXTURES / "small_blocks.yaml"  # the trace with its 64-token blocks


@pytest.fixture(scope="module")
def program():
    return api.compile("tiny", "mesh16")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("block-tables")


def test_the_rows_and_their_blocks_are_read(tmp_path):
    times, prompts, outputs, blocks = read_trace(TRACE, block_tokens=64)
    rows = [json.loads(line) for line in TRACE.read_text().splitlines()]
    assert list(prompts) == [r["input_length"] for r in rows]
    assert np.allclose(times, [(r["timestamp"] - rows[0]["timestamp"]) / 1000 for r in rows])
    assert blocks.tokens == 64 and len(blocks) == len(rows)
    # Renumbered densely, equal ids staying equal and different ones different.
    for i in range(len(rows)):
        for j in range(i):
            same = [a == b for a, b in zip(rows[i]["hash_ids"], rows[j]["hash_ids"])]
            assert same == [a == b for a, b in zip(blocks.of(i), blocks.of(j))]
    assert blocks.distinct() == len({h for r in rows for h in r["hash_ids"]})


def test_a_window_numbers_its_blocks_afresh():
    whole = read_trace(TRACE, block_tokens=64)[3]
    window = read_trace(TRACE, skip=10, rows=20, block_tokens=64)[3]
    assert len(window) == 20 and window.ids.min() == 0
    assert window.distinct() == len(set(np.concatenate([whole.of(i) for i in range(10, 30)])))
    assert numbered([np.array([7, 9]), np.array([7, 3])], 64).ids.tolist() == [0, 1, 0, 2]


@pytest.mark.parametrize("line, words", [
    ('{"timestamp": 0, "input_length": 10}', "no output_length, hash_ids"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0, 1]}',
     "2 hash_ids for a prompt of 10 tokens, which makes 1 blocks of 64"),
    ('{"timestamp": 0, "input_length": 100, "output_length": 2, "hash_ids": [4, 4]}',
     "repeats an id"),
    ('{"timestamp": -1, "input_length": 10, "output_length": 2, "hash_ids": [0]}', ">= 0"),
    ('{"timestamp": 0, "input_length": 1.5, "output_length": 2, "hash_ids": [0]}',
     "whole numbers"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": ["a"]}',
     "hash_ids must be a list"),
    ('[1, 2]', "not a JSON object"),
    ('{"timestamp": 0,', "not a JSON object"),
])
def test_a_bad_line_is_refused_with_its_number_and_why(tmp_path, line, words):
    path = tmp_path / "bad.jsonl"
    good = '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}'
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(ConfigError, match="line 2") as info:
        read_trace(path, block_tokens=64)
    assert words in str(info.value)


def test_times_out_of_order_are_refused(tmp_path):
    path = tmp_path / "late.jsonl"
    path.write_text('{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [0]}\n'
                    '{"timestamp": 4, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n')
    with pytest.raises(ConfigError, match="line 2: timestamp 4 is before"):
        read_trace(path, block_tokens=64)


def test_the_shipped_trace_is_named_and_its_blocks_are_512_tokens():
    requests = generate(workload_spec(trace="mooncake-conv", requests=200))
    assert len(requests) == 200 and requests.blocks.tokens == 512
    assert np.array_equal(np.diff(requests.blocks.at), -(-requests.prompt_tokens // 512))


def test_sessions_of_calls_are_refused_on_a_block_trace(tmp_path):
    spec = workload_spec(WORKLOAD)
    spec.calls = 3
    with pytest.raises(ConfigError, match="'calls' must be 1"):
        generate(spec, base_dir=FIXTURES)


def _bound(requests) -> int:
    """The most prompt tokens a prefix cache could ever skip on this trace: for each request,
    its leading blocks some earlier request also had, but its last token."""
    seen, most = set(), 0
    for i in range(len(requests)):
        ids = requests.blocks.of(i).tolist()
        k = 0
        while k < len(ids) and ids[k] in seen:
            k += 1
        size = requests.blocks.tokens
        shared = sum(min(size, int(requests.prompt_tokens[i]) - j * size) for j in range(k))
        most += min(shared, int(requests.prompt_tokens[i]) - 1)
        seen.update(ids)
    return most


def test_hits_never_exceed_what_the_hashes_allow(program, cache):
    run = api.serve(program, WORKLOAD, cache_dir=cache)
    reused = sum(r["prefix_reused_tokens"] for r in run.result.regions.values())
    assert 0 < reused <= _bound(run.requests)
    # The report's own bound, worked out apart, agrees.
    assert shareable_tokens(run.requests.blocks, run.requests.prompt_tokens) == \
        _bound(run.requests)
    off = api.serve(program, WORKLOAD, cache_dir=cache, prefix_cache=False)
    assert sum(r["prefix_reused_tokens"] for r in off.result.regions.values()) == 0


def test_one_region_reuses_every_shared_block_it_kept(cache):
    """On one region with room for every block, each request skips all it shares with those
    before it that have finished: with requests far apart, all the hashes allow."""
    one = api.compile("tiny", "mesh16", region=(16, 16))
    slow = api.serve(one, WORKLOAD, cache_dir=cache, rate=0.01)  # arrivals 100x further apart
    reused = slow.result.regions["mixed0"]["prefix_reused_tokens"]
    assert reused == _bound(slow.requests)


def test_both_loops_give_the_same_times(program, cache):
    compiled = api.serve(program, WORKLOAD, cache_dir=cache)
    plain = api.serve(program, WORKLOAD, cache_dir=cache, loop="plain")
    for name in ("first_token", "finish", "gap_cycles", "gap_request"):
        assert np.array_equal(getattr(compiled.result, name), getattr(plain.result, name)), name
    assert compiled.report.to_json() == plain.report.to_json()
    assert compiled.result.regions == plain.result.regions


def test_the_command_line_serves_a_block_trace(capsys, cache):
    assert main(["serve", "tiny", "--fabric", "mesh16", "--workload", str(WORKLOAD),
                 "--cache-dir", str(cache), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert sum(r["prefix_reused_tokens"] for r in data["regions"].values()) > 0


def _reused(run) -> int:
    return sum(r["prefix_reused_tokens"] for r in run.result.regions.values())


def test_the_prefix_router_finds_the_cached_blocks(program, cache):
    """Over many copies, sending each request where most of its leading blocks are cached
    serves more of the prompts from the caches than sending them in turn."""
    runs = {router: api.serve(program, WORKLOAD, cache_dir=cache, router=router)
            for router in ("round-robin", "prefix")}
    assert _reused(runs["prefix"]) > _reused(runs["round-robin"])


def test_round_robin_takes_the_regions_in_turn(program, cache):
    run = api.serve(program, WORKLOAD, cache_dir=cache, router="round-robin")
    names = [r.name for r in program.regions]
    assert run.result.region[:len(names)] == names
    assert run.result.region[len(names)] == names[0]


def test_an_unknown_router_is_refused_by_name(program, cache):
    from wse_emu.errors import UserError

    with pytest.raises(UserError, match="`router` must be one of least-busy, round-robin"):
        api.serve(program, WORKLOAD, cache_dir=cache, router="random")


def test_a_block_size_where_there_are_no_blocks_is_refused(tmp_path):
    from wse_emu.serving.workload import WorkloadSpec

    with pytest.raises(ConfigError, match="applies to traces with prefix blocks"):
        WorkloadSpec(name="chat", block_tokens=64).validate("test")
    spec = workload_spec(trace="azure-conv", requests=10)
    spec.block_tokens = 64
    with pytest.raises(ConfigError, match="this one has none"):
        generate(spec)
