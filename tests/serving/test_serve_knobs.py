"""The serving knobs and what the runtime now models: inter-token gaps, the prefix cache of
agentic sessions, handoffs between wafers over both wafers' links, and the running cap."""

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



@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    program = compile_model(SMALL, ClusterSpec(load_fabric("mesh64"), 1),
                            CompileOptions(region=(64, 64)))
    r = program.regions[0]
    cache = tmp_path_factory.mktemp("tables")
    return {ph: build_table(program, r.name, ph, axes=AXES[ph], cache_dir=cache)
            for ph in ("prefill", "decode")}


def mixed(tables, capacity=100_000):
    return [WaferRegion("r0", "mixed", capacity, tables["prefill"], tables["decode"])]


def agentic(sessions=1, calls=3):
    return generate(workload_from_dict({
        "name": "a", "requests": sessions, "rate": 1000.0, "calls": calls, "think_s": 0.001,
        "prompt": {"kind": "fixed", "value": 100}, "output": {"kind": "fixed", "value": 8},
        "tool_tokens": {"kind": "fixed", "value": 20}}, "t"))


@pytest.mark.slow
def test_every_gap_between_tokens_is_kept_and_they_add_up(tables):
    reqs = generate(workload_from_dict({"name": "w", "requests": 6, "rate": 50.0,
                                        "prompt": {"kind": "fixed", "value": 64},
                                        "output": {"kind": "fixed", "value": 5}}, "t"))
    res = serve(reqs, mixed(tables), OPTIONS)
    assert len(res.gap_cycles) == int((res.tokens - 1).sum())
    for i in range(len(reqs)):
        gaps = res.gap_cycles[res.gap_request == i]
        assert gaps.sum() == pytest.approx(res.finish[i] - res.first_token[i])
    assert np.all(res.itl_s() > 0)


def test_a_session_reuses_its_cached_context(tables):
    """Each later call computes only the tokens after its previous call's prompt and output,
    so its first token comes sooner than when the whole context is computed again."""
    reqs = agentic()
    cached = serve(reqs, mixed(tables), OPTIONS)
    fresh = serve(reqs, mixed(tables), replace(OPTIONS, prefix_cache=False))
    prompt, out = reqs.prompt_tokens, reqs.output_tokens
    expect = sum(int(prompt[k] + out[k] - 1) for k in range(len(reqs) - 1))
    assert cached.regions["r0"]["prefix_reused_tokens"] == expect
    assert fresh.regions["r0"]["prefix_reused_tokens"] == 0
    assert cached.ttft_s()[0] == pytest.approx(fresh.ttft_s()[0])  # nothing cached yet
    assert np.all(cached.ttft_s()[1:] < fresh.ttft_s()[1:])


def test_the_cache_gives_way_when_admission_needs_the_room(tables):
    """Two sessions on a region that holds only one context at a time: each admission gives
    up the other session's cached KV, and every call still finishes."""
    reqs = agentic(sessions=2)
    room = int((reqs.prompt_tokens + reqs.output_tokens).max())
    tight = serve(reqs, mixed(tables, capacity=room), OPTIONS)
    ample = serve(reqs, mixed(tables), OPTIONS)
    assert np.all(np.isfinite(tight.finish))
    assert tight.regions["r0"]["prefix_reused_tokens"] \
        < ample.regions["r0"]["prefix_reused_tokens"]
    assert tight.regions["r0"]["kv_peak_tokens"] <= room


def handoff_cluster(tables, senders, link=1.0):
    """Prefill regions on ``senders`` systems, one decode region on system 9; handoffs inside
    a system nearly free, between systems at ``link`` bytes per cycle each way."""
    regs = [WaferRegion(f"p{k}", "prefill", 100_000, tables["prefill"], None, system=s,
                        fabric_bytes_per_cycle=1e9, link_bytes_per_cycle=link)
            for k, s in enumerate(senders)]
    return regs + [WaferRegion("d", "decode", 100_000, None, tables["decode"], system=9,
                               fabric_bytes_per_cycle=1e9, link_bytes_per_cycle=link)]


def test_handoffs_between_wafers_hold_the_receiving_link_too(tables):
    """Two prompts finishing at once on two wafers leave over their own links, but the one
    decode wafer takes them in one after the other; on one sending wafer they queue there."""
    reqs = generate(workload_from_dict({"name": "w", "requests": 2, "rate": 1e6,
                                        "prompt": {"kind": "fixed", "value": 64},
                                        "output": {"kind": "fixed", "value": 2}}, "t"))
    reqs.arrival_s[:] = 0.0
    options = replace(OPTIONS, kv_bytes_per_token=1000)
    transfer = 64 * 1000 / 1.0
    res = serve(reqs, handoff_cluster(tables, (0, 1)), options)
    first_gap = np.sort(res.gap_cycles)
    assert first_gap[1] - first_gap[0] >= 0.99 * transfer
    assert first_gap[0] >= transfer
    one_sender = np.sort(serve(reqs, handoff_cluster(tables, (0, 0)), options).gap_cycles)
    assert one_sender[1] - one_sender[0] >= 0.99 * transfer
    fast = serve(reqs, handoff_cluster(tables, (0, 1), link=1e9), options)
    assert fast.gap_cycles.max() < transfer


def test_the_running_cap_admits_one_sequence_at_a_time(tables):
    reqs = generate(workload_from_dict({"name": "w", "requests": 3, "rate": 1e6,
                                        "prompt": {"kind": "fixed", "value": 64},
                                        "output": {"kind": "fixed", "value": 4}}, "t"))
    res = serve(reqs, mixed(tables), replace(OPTIONS, max_running=1))
    order = np.argsort(res.first_token)
    for a, b in zip(order, order[1:]):
        assert res.first_token[b] > res.finish[a]  # b's prefill began after a finished
    free = serve(reqs, mixed(tables), OPTIONS)
    assert free.first_token.max() < res.first_token.max()
