"""The serving runtime: exactly-once completion, a lone request's timing, KV limits."""

from dataclasses import replace

import numpy as np
import pytest

from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.options import CompileOptions
from wse_emu.hardware.fabric import ClusterSpec, load_fabric
from wse_emu.models.spec import ModelSpec
from wse_emu.pools.kinds.wafer import WaferRegion
from wse_emu.serving.serve import ServeOptions, serve
from wse_emu.serving.tables import build_table
from wse_emu.serving.workload import generate, workload_from_dict

SMALL = ModelSpec.from_fields(name="small", family="llama", hidden_size=512, intermediate_size=1536,
                              num_layers=2, num_heads=8, num_kv_heads=2, head_dim=64,
                              vocab_size=2048).validate("test")
AXES = {"decode": ((1, 2, 4, 8), (64, 256, 1024)), "prefill": ((16, 64, 256), (0, 256, 1024))}
# The tables' fabric and model, and the largest decode batch they time.
OPTIONS = ServeOptions.of(load_fabric("mesh64"), SMALL, batch_limit=8)



def regions(program, tmp_path):
    out = []
    for r in program.regions:
        tables = {ph: build_table(program, r.name, ph, axes=AXES[ph], cache_dir=tmp_path)
                  for ph in ("prefill", "decode")}
        out.append(WaferRegion(r.name, r.role, r.kv_capacity_tokens,
                               tables["prefill"] if r.role != "decode" else None,
                               tables["decode"] if r.role != "prefill" else None)
                   .for_fabric(program.fabric))
    return out


@pytest.fixture(scope="module")
def colocated(tmp_path_factory):
    p = compile_model(SMALL, ClusterSpec(load_fabric("mesh64"), 1),
                      CompileOptions(region=(64, 64)))
    return p, regions(p, tmp_path_factory.mktemp("tables"))


@pytest.mark.slow
def test_lone_request_times_are_the_pipeline_sums(colocated):
    program, regs = colocated
    reqs = generate(workload_from_dict({"name": "one", "requests": 1,
                                        "prompt": {"kind": "fixed", "value": 200},
                                        "output": {"kind": "fixed", "value": 4}}, "t"))
    res = serve(reqs, regs, replace(OPTIONS, prefill_tile=256))
    table_p, table_d = regs[0].prefill, regs[0].decode
    expect_ttft = table_p.stage_cycles(200, 0).sum() + table_p.transfer_cycles(200, 0)
    assert res.first_token[0] - res.arrival[0] == pytest.approx(expect_ttft)
    expect_rest = sum(table_d.stage_cycles(1, 200 + k).sum() + table_d.transfer_cycles(1, 200 + k)
                      for k in range(1, 4))
    assert res.finish[0] - res.first_token[0] == pytest.approx(expect_rest)
    assert res.tokens[0] == 4


def test_a_long_prompt_streams_through_the_stages_as_a_flow_shop(colocated):
    """Tiles of one prompt follow each other stage by stage: tile k leaves stage s when both
    it has left stage s - 1 (and crossed the hop) and tile k - 1 has left stage s."""
    program, regs = colocated
    reqs = generate(workload_from_dict({"name": "one", "requests": 1,
                                        "prompt": {"kind": "fixed", "value": 200},
                                        "output": {"kind": "fixed", "value": 1}}, "t"))
    res = serve(reqs, regs, replace(OPTIONS, prefill_tile=64))
    table = regs[0].prefill
    stages = len(table.cycles)
    left = [0.0] * stages  # when the previous tile left each stage
    for prefix, tokens in ((0, 64), (64, 64), (128, 64), (192, 8)):
        times, between = table.at(tokens, prefix)
        hop = between / (stages - 1)
        t = 0.0
        for s in range(stages):
            t = max(t + (hop if s else 0.0), left[s]) + times[s]
            left[s] = t
    assert res.first_token[0] - res.arrival[0] == pytest.approx(left[-1])
    whole = table.at(200, 0)
    assert left[-1] < whole[0].sum() + whole[1]  # streaming beats one 200-token tile


def test_every_request_completes_once_with_its_tokens(colocated):
    program, regs = colocated
    spec = workload_from_dict({"name": "mix", "rate": 20000.0, "requests": 60,
                               "prompt": {"kind": "uniform", "low": 16, "high": 400},
                               "output": {"kind": "uniform", "low": 1, "high": 12},
                               "seed": 3}, "t")
    reqs = generate(spec)
    res = serve(reqs, regs, replace(OPTIONS, batch_limit=8))
    assert np.array_equal(res.tokens, reqs.output_tokens)
    assert (res.first_token >= res.arrival).all() and (res.finish >= res.first_token).all()
    again = serve(reqs, regs, replace(OPTIONS, batch_limit=8))
    assert np.array_equal(again.finish, res.finish)


def test_agentic_calls_follow_each_other(colocated):
    program, regs = colocated
    spec = workload_from_dict({"name": "agent", "requests": 3, "calls": 3, "think_s": 1e-4,
                               "prompt": {"kind": "fixed", "value": 64},
                               "output": {"kind": "fixed", "value": 3},
                               "tool_tokens": {"kind": "fixed", "value": 32}}, "t")
    reqs = generate(spec)
    res = serve(reqs, regs, OPTIONS)
    clock = OPTIONS.clock_hz
    for s in range(3):
        rows = np.flatnonzero(reqs.session == s)
        for a, b in zip(rows, rows[1:]):
            assert res.arrival[b] == pytest.approx(res.finish[a] + 1e-4 * clock)


@pytest.mark.slow
def test_disaggregated_serving_hands_off_and_respects_capacity(tmp_path):
    p = compile_model(SMALL, ClusterSpec(load_fabric("mesh64"), 1),
                      CompileOptions(plan="disaggregated", region=(32, 64)))
    regs = regions(p, tmp_path)
    assert {r.role for r in regs} == {"prefill", "decode"}
    spec = workload_from_dict({"name": "mix", "rate": 50000.0, "requests": 40,
                               "prompt": {"kind": "uniform", "low": 16, "high": 300},
                               "output": {"kind": "uniform", "low": 2, "high": 10}}, "t")
    reqs = generate(spec)
    res = serve(reqs, regs, replace(OPTIONS, kv_bytes_per_token=SMALL.kv_bytes_per_token()))
    assert np.array_equal(res.tokens, reqs.output_tokens)
    decode_names = {r.name for r in regs if r.role == "decode"}
    assert set(res.region) <= decode_names


def test_chunked_prefill_serves_everything_and_keeps_decode_moving(colocated):
    program, regs = colocated
    spec = workload_from_dict({"name": "mix", "rate": 5000.0, "requests": 40,
                               "prompt": {"kind": "uniform", "low": 200, "high": 1000},
                               "output": {"kind": "uniform", "low": 8, "high": 24},
                               "seed": 5}, "t")
    reqs = generate(spec)
    priority = serve(reqs, regs, OPTIONS)
    chunked = serve(reqs, regs, replace(OPTIONS, policy="chunked", token_budget=128))
    assert np.array_equal(chunked.tokens, reqs.output_tokens)
    # Prompts no longer stall the decoding sequences for their whole length.
    assert np.percentile(chunked.tpot_s(), 99) < np.percentile(priority.tpot_s(), 99)


def test_interleaved_prefill_serves_everything_and_bounds_the_decode_stall(colocated):
    """Taking turns, a decode token waits behind one prefill tile, not a whole prompt."""
    program, regs = colocated
    spec = workload_from_dict({"name": "mix", "rate": 5000.0, "requests": 40,
                               "prompt": {"kind": "uniform", "low": 200, "high": 1000},
                               "output": {"kind": "uniform", "low": 8, "high": 24},
                               "seed": 5}, "t")
    reqs = generate(spec)
    priority = serve(reqs, regs, replace(OPTIONS, prefill_tile=64))
    turns = serve(reqs, regs, replace(OPTIONS, policy="interleaved", prefill_tile=64))
    assert np.array_equal(turns.tokens, reqs.output_tokens)
    stall = {name: r["decode_stall_s"] / r["decode_tokens"] for name, r in
             (("priority", priority.regions["mixed0"]), ("turns", turns.regions["mixed0"]))}
    assert stall["turns"] < stall["priority"]
    assert np.percentile(turns.tpot_s(), 90) < np.percentile(priority.tpot_s(), 90)


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    p = compile_model(SMALL, ClusterSpec(load_fabric("mesh64"), 1),
                      CompileOptions(plan="disaggregated", region=(16, 64)))
    return regions(p, tmp_path_factory.mktemp("split-tables"))


@pytest.mark.slow
def test_a_prefill_region_keeps_the_prompts_kv_until_its_handoff(split):
    """With room in decode for one sequence at a time, finished prompts wait in their prefill
    region (holding their KV), which then stops admitting new ones."""
    need = 64 + 200
    regs = [replace(r, kv_capacity_tokens=need) if r.role == "decode" else r for r in split]
    reqs = generate(workload_from_dict({"name": "burst", "rate": 1e6, "requests": 30,
                                        "prompt": {"kind": "fixed", "value": 64},
                                        "output": {"kind": "fixed", "value": 200}}, "t"))
    res = serve(reqs, regs, replace(OPTIONS, kv_bytes_per_token=SMALL.kv_bytes_per_token()))
    assert np.array_equal(res.tokens, reqs.output_tokens)
    prefill = [res.regions[r.name] for r in regs if r.role == "prefill"]
    assert sum(r["kv_blocked_s"] for r in prefill) > 0
    # Most prompts sit finished in prefill, holding their KV, while decode has room for two.
    assert sum(r["kv_peak_tokens"] for r in prefill) >= 20 * 64
    assert all(r["kv_peak_tokens"] <= r["kv_capacity_tokens"] for r in res.regions.values())


def test_handoffs_from_one_wafer_share_its_link(split):
    """Two prompts finishing together on two prefill replicas of one wafer leave one after the
    other over its link; from two wafers (one crossing to the other's decode regions over the
    off-wafer links, as slow here) they leave at once."""
    prefills = [r for r in split if r.role == "prefill"][:2]
    decode = [r for r in split if r.role == "decode"][:2]
    reqs = generate(workload_from_dict({"name": "pair", "rate": 1e9, "requests": 2,
                                        "prompt": {"kind": "fixed", "value": 256},
                                        "output": {"kind": "fixed", "value": 2}}, "t"))
    reqs = reqs.faster(1e9)  # both arrive at once
    slow = replace(OPTIONS, kv_bytes_per_token=SMALL.kv_bytes_per_token())
    prefills, decode = ([replace(r, fabric_bytes_per_cycle=1.0, link_bytes_per_cycle=1.0)
                         for r in group] for group in (prefills, decode))
    transfer = 256 * SMALL.kv_bytes_per_token() / 1.0
    one_wafer = serve(reqs, prefills + decode, slow)
    two_wafers = serve(reqs, [prefills[0], replace(prefills[1], system=1)] + decode, slow)
    gap = abs(one_wafer.finish[1] - one_wafer.finish[0])
    assert gap == pytest.approx(transfer, rel=0.05)
    assert abs(two_wafers.finish[1] - two_wafers.finish[0]) < 0.05 * transfer
