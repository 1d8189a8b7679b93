"""The compiled serving loop and its plain-Python twin give the same times, to the last bit:
for every registered policy, colocated and disaggregated, handoffs inside and between wafers,
the prefix cache of agentic sessions, the running cap and KV admission. A policy added by one
class (here, in the test) runs on both loops alike."""

from dataclasses import replace

import numpy as np
import pytest

from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.options import CompileOptions
from wse_emu.hardware.fabric import ClusterSpec, load_fabric
from wse_emu.models.spec import ModelSpec
from wse_emu.pools.kinds.wafer import WaferRegion
from wse_emu.serving import policies
from wse_emu.serving.knobs import BATCH_LIMIT, PREFILL_TILE
from wse_emu.serving.loops import compiled as compiled_loop
from wse_emu.serving.loops import state as compiled_state
from wse_emu.serving.loops.compiled import admit, next_prompt, ready, remaining, send, send_decode
from wse_emu.serving.serve import ServeOptions, serve
from wse_emu.serving.tables import build_table, verify_phase
from wse_emu.serving.workload import generate, workload_from_dict

SMALL = ModelSpec.from_fields(name="small", family="llama", hidden_size=512, intermediate_size=1536,
                              num_layers=4, num_heads=8, num_kv_heads=2, head_dim=64,
                              vocab_size=2048).validate("test")
AXES = {"decode": ((1, 2, 4, 8, 16), (64, 256, 1024, 4096)),
        "prefill": ((16, 64, 256), (0, 256, 1024, 4096))}
FABRIC = load_fabric("mesh64")
OPTIONS = ServeOptions.of(FABRIC, SMALL, batch_limit=16)


def pools_of(program, cache, capacity=None, systems=None, drafts=0):
    """The program's regions as pools; with ``drafts``, verifying that many drafted tokens per
    step (the later tiles' table timed by the engine; no draft's steps in the first stage:
    the loops alone are compared here)."""
    out = []
    for k, r in enumerate(program.regions):
        tables = {ph: build_table(program, r.name, ph, axes=AXES[ph], cache_dir=cache)
                  for ph in ("prefill", "decode")}
        decodes = r.role != "prefill"
        verify = build_table(program, r.name, verify_phase(drafts), axes=AXES["decode"],
                             cache_dir=cache) if drafts and decodes else None
        out.append(WaferRegion(r.name, r.role, capacity(r) if capacity else r.kv_capacity_tokens,
                               tables["prefill"] if r.role != "decode" else None,
                               tables["decode"] if decodes else None,
                               system=systems(k) if systems else 0, verify=verify,
                               draft_tokens=drafts if verify is not None else 0,
                               ).for_fabric(FABRIC))
    return out


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("twin-tables")


@pytest.fixture(scope="module")
def colocated():
    """Two replicas side by side."""
    return compile_model(SMALL, ClusterSpec(FABRIC, 1), CompileOptions(region=(32, 64)))


@pytest.fixture(scope="module")
def split():
    """Disaggregated: several prefill and decode replicas."""
    return compile_model(SMALL, ClusterSpec(FABRIC, 1),
                         CompileOptions(plan="disaggregated", region=(16, 64)))


def chat(rate, requests=120, seed=1, **extra):
    return generate(workload_from_dict({
        "name": "chat", "rate": rate, "requests": requests, "seed": seed,
        "prompt": {"kind": "lognormal", "median": 300, "sigma": 0.9, "low": 4, "high": 2000},
        "output": {"kind": "lognormal", "median": 30, "sigma": 0.9, "low": 1, "high": 300},
        **extra}, "test"))


def agentic(rate=3000.0):
    return chat(rate, requests=30, calls=4, think_s=0.0005,
                tool_tokens={"kind": "uniform", "low": 10, "high": 200})


def assert_twins(requests, pools, options):
    plain = serve(requests, pools, options, loop="plain")
    compiled = serve(requests, pools, options)
    for name in ("arrival", "first_token", "finish", "tokens", "gap_cycles", "gap_request",
                 "from_cache", "from_host", "to_host"):
        assert np.array_equal(getattr(plain, name), getattr(compiled, name)), name
    assert plain.region == compiled.region
    assert plain.caps == compiled.caps  # what the running cap and batch limit decided
    assert plain.regions == compiled.regions  # utilization, stall, KV peaks and means
    assert plain.kv_traces.keys() == compiled.kv_traces.keys()
    assert all(np.array_equal(plain.kv_traces[k], compiled.kv_traces[k]) for k in plain.kv_traces)
    assert np.array_equal(compiled.tokens, requests.output_tokens)
    return compiled


@pytest.mark.slow
@pytest.mark.parametrize("policy", sorted(policies.POLICIES))
@pytest.mark.parametrize("rate", [300.0, 20000.0])
def test_every_policy_gives_the_same_times_on_both_loops(colocated, cache, policy, rate):
    assert_twins(chat(rate), pools_of(colocated, cache),
                 replace(OPTIONS, policy=policy, prefill_tile=32, token_budget=64,
                         interleave=2))


@pytest.mark.parametrize("policy", sorted(policies.POLICIES))
def test_the_prefix_cache_kv_admission_and_the_running_cap_on_both_loops(colocated, cache,
                                                                          policy):
    """Sessions whose contexts crowd a small KV space: cached contexts given up for room,
    admission waiting, and a cap on running sequences."""
    tight = pools_of(colocated, cache, capacity=lambda r: 2500)
    for options in (replace(OPTIONS, policy=policy), replace(OPTIONS, policy=policy,
                                                             max_running=3),
                    replace(OPTIONS, policy=policy, prefix_cache=False)):
        served = assert_twins(agentic(), tight, options)
    assert served.regions["mixed0"]["kv_blocked_s"] > 0


def blocks(rate=2000.0):
    """A block trace's requests (tests/fixtures/small_blocks.jsonl, 64-token blocks)."""
    from helpers import FIXTURES

    from wse_emu.serving.workload import load_workload

    spec = replace(load_workload(FIXTURES / "small_blocks.yaml"), rate_scale=rate)
    return generate(spec)


@pytest.mark.parametrize("router", ["least-busy", "round-robin", "prefix"])
def test_block_caches_and_every_router_on_both_loops(colocated, split, cache, router):
    """A block trace's prefix cache, crowded (blocks given up for room, a request's own
    spared), with each router, without and with a host tier (full or not), colocated and
    split; sessions with each router and tier too."""
    tight = pools_of(colocated, cache, capacity=lambda r: 1500)
    # A host tier too small to keep everything it is given, and one with room to spare.
    tiers = [dict(kv_tier="host", host_kv_bytes=OPTIONS.kv_bytes_per_token * tokens)
             for tokens in (600, 10**6)]
    for options in (replace(OPTIONS, router=router),
                    replace(OPTIONS, router=router, max_running=2),
                    *(replace(OPTIONS, router=router, **tier) for tier in tiers)):
        served = assert_twins(blocks(), tight, options)
        assert sum(r["prefix_reused_tokens"] for r in served.regions.values()) > 0
        # Each request's count adds up to its region's.
        assert served.from_cache.sum() == sum(r["prefix_reused_tokens"]
                                              for r in served.regions.values())
        assert (served.from_cache < served.requests.prompt_tokens).all()
    assert sum(r["prefix_restored_tokens"] for r in served.regions.values()) > 0
    assert served.from_host.sum() == sum(r["prefix_restored_tokens"]
                                         for r in served.regions.values())
    assert (served.from_host <= served.from_cache).all()  # of the tokens reused
    # What admissions parked adds up to what the regions sent to the tier.
    assert served.to_host.sum() == sum(r["host_parked_tokens"]
                                       for r in served.regions.values()) > 0
    assert_twins(blocks(), pools_of(split, cache), replace(OPTIONS, router=router, **tiers[1]))
    # Split over three systems, prefill crowded: what its cache gives up is parked over the
    # links out that carry the handoffs too.
    crowded = pools_of(split, cache, systems=lambda k: k % 3,
                       capacity=lambda r: 1500 if r.role == "prefill" else r.kv_capacity_tokens)
    served = assert_twins(blocks(), crowded, replace(OPTIONS, router=router, **tiers[1]))
    assert served.to_host.sum() == sum(r["host_parked_tokens"]
                                       for r in served.regions.values()) > 0
    sessions = pools_of(colocated, cache, capacity=lambda r: 2500)
    for tier in ({}, *tiers):
        served = assert_twins(agentic(), sessions, replace(OPTIONS, router=router, **tier))
    assert sum(r["prefix_restored_tokens"] for r in served.regions.values()) > 0


@pytest.mark.slow
def test_handoffs_inside_and_between_wafers_on_both_loops(split, cache):
    requests = chat(20000.0)
    one_wafer = pools_of(split, cache)
    assert_twins(requests, one_wafer, replace(OPTIONS, prefill_tile=64))
    # The replicas on three systems: handoffs over the off-wafer links, both ends held.
    spread = pools_of(split, cache, systems=lambda k: k % 3)
    assert_twins(requests, spread, replace(OPTIONS, prefill_tile=256, max_running=4))
    # ... and a network with a latency, one end's larger than the other's.
    late = [replace(p, link_latency_cycles=3_000.0 * (k % 2)) for k, p in enumerate(spread)]
    assert_twins(requests, late, replace(OPTIONS, prefill_tile=256, max_running=4))
    # A decode side too small for the load: finished prompts wait in prefill, holding KV.
    small = pools_of(split, cache, capacity=lambda r: 300 if r.role == "decode"
                     else r.kv_capacity_tokens)
    burst = generate(workload_from_dict({"name": "burst", "rate": 1e5, "requests": 30,
                                         "prompt": {"kind": "fixed", "value": 64},
                                         "output": {"kind": "fixed", "value": 200}}, "test"))
    served = assert_twins(burst, small, OPTIONS)
    assert sum(r["kv_blocked_s"] for r in served.regions.values() if r["role"] == "prefill") > 0
    assert_twins(agentic(), one_wafer, OPTIONS)  # sessions' prefixes cached in prefill


def test_a_decode_riding_in_a_chunks_step_on_both_loops(colocated, cache):
    """Pools that run a chunk and a decode micro-batch as one step (an accelerator's copy):
    the chunk read at its tokens and the sequences' together, the decode at its own share."""
    plain = pools_of(colocated, cache)
    riding = [replace(p, riding=p.decode.scaled(0.25)) for p in plain]
    options = replace(OPTIONS, policy="chunked", token_budget=64)
    merged = assert_twins(chat(3000.0), riding, options)
    apart = serve(chat(3000.0), plain, options)
    assert not np.array_equal(merged.finish, apart.finish)


@pytest.mark.parametrize("riding", [False, True])
def test_a_chunk_of_several_prompts_on_both_loops(colocated, cache, riding):
    """Chunks that take the rest of one prompt and the next ones' while the budget lasts,
    with the prefix cache of agentic sessions and KV admission in the way."""
    pools = pools_of(colocated, cache)
    if riding:
        pools = [replace(p, riding=p.decode.scaled(0.25)) for p in pools]
    options = replace(OPTIONS, policy="chunked", token_budget=256, chunk_prompts=4)
    packed = assert_twins(chat(20000.0), pools, options)
    one = serve(chat(20000.0), pools, replace(options, chunk_prompts=1))
    assert not np.array_equal(packed.first_token, one.first_token)
    assert_twins(agentic(), pools_of(colocated, cache, capacity=lambda r: 2500), options)


def test_a_timeline_does_not_change_the_times(colocated, cache):
    requests = chat(20000.0)
    pools = pools_of(colocated, cache)
    plain = serve(requests, pools, OPTIONS)
    drawn = assert_twins(requests, pools, replace(OPTIONS, timeline_events=10_000))
    assert np.array_equal(plain.finish, drawn.finish)
    assert drawn.timeline["traceEvents"]


def test_requests_arriving_at_once_keep_their_order_on_both_loops(colocated, split, cache):
    burst = chat(1e9, requests=60)
    burst.arrival_s[:] = 0.0
    assert_twins(burst, pools_of(colocated, cache), replace(OPTIONS, policy="interleaved"))
    assert_twins(burst, pools_of(split, cache), OPTIONS)


def test_a_heap_that_fills_is_run_again_with_more_room(colocated, cache, monkeypatch):
    requests = chat(20000.0)
    pools = pools_of(colocated, cache)
    roomy = serve(requests, pools, OPTIONS)
    runs, original = [], compiled_loop.run_loop

    def run_loop(*args):
        runs.append(original(*args))
        return runs[-1]
    monkeypatch.setattr(compiled_state, "heap_room", lambda requests: 1)
    monkeypatch.setattr(compiled_loop, "run_loop", run_loop)
    cramped = serve(requests, pools, OPTIONS)
    assert runs[0] == -1 and runs[-1] > 0  # it filled, then had room
    for name in ("first_token", "finish", "gap_cycles"):
        assert np.array_equal(getattr(roomy, name), getattr(cramped, name)), name


class DecodeFirst(policies.Policy):
    """A policy written for this test: a ready decode micro-batch goes before any prompt."""

    name = "decode-first"
    reads = ("prefill_tile", "max_running", "batch_limit")

    def dispatch(self, sim, r, now):
        if r.queues.ready:
            return sim.send_decode(r, now, self.knobs.batch_limit)
        i = sim.next_prompt(r)
        if i >= 0 and (sim.started(r, i) or sim.admit(r, i, now)):
            sim.send(r, now, 0, i, min(self.knobs.prefill_tile, sim.remaining(r, i)))
            return True
        return False

    @staticmethod
    def compiled(st, r, now, knobs):
        if ready(st, r) > 0:
            return send_decode(st, r, now, knobs[BATCH_LIMIT])
        i = next_prompt(st, r)
        if i >= 0 and (st.progress[i] >= 0 or admit(st, r, i, now)):
            send(st, r, now, 0, i, min(knobs[PREFILL_TILE], remaining(st, i)))
            return True
        return False


@pytest.mark.slow
def test_a_new_policy_is_one_class(colocated, cache, monkeypatch):
    monkeypatch.setitem(policies.POLICIES, DecodeFirst.name, DecodeFirst)
    options = replace(OPTIONS, policy="decode-first")
    first = assert_twins(chat(20000.0), pools_of(colocated, cache), options)
    priority = serve(chat(20000.0), pools_of(colocated, cache), OPTIONS)
    # Decode never waits behind a prompt here, so tokens come faster than with prefill first.
    assert np.percentile(first.tpot_s(), 90) < np.percentile(priority.tpot_s(), 90)


def test_a_dispatch_passing_constants_reuses_the_one_compiled_send():
    """Every dispatch, the registered ones and one written elsewhere that passes constants
    (``send(st, r, now, 0, i, n)``, ``send_decode``'s ``send(..., -1, 0)``), calls the one
    compiled copy of each primitive it does not inline: a copy per constant took minutes to
    compile with nothing cached."""
    for cls in (*policies.POLICIES.values(), DecodeFirst):
        compiled_loop.compile_dispatch(cls.compiled)
    for function, signature in compiled_loop._CALLED:
        assert function.signatures == [signature.args], function.__name__


@pytest.mark.parametrize("policy", sorted(policies.POLICIES))
def test_a_region_has_one_dispatch_due_at_a_time(colocated, split, cache, monkeypatch, policy):
    """Under overload, the events the loop handles grow with the tokens served, not faster:
    a region kicked while its dispatch is already due gets no second one (copies of it once
    piled up to 3,000 events a request, and filled the heap again and again)."""
    requests = chat(1e6, requests=3000)
    handled, original = [], compiled_loop.run_loop

    def run_loop(*args):
        handled.append(original(*args))
        return handled[-1]
    monkeypatch.setattr(compiled_loop, "run_loop", run_loop)
    for program in (colocated, split):
        handled.clear()
        serve(requests, pools_of(program, cache), replace(OPTIONS, policy=policy))
        assert len(handled) == 1 and 0 < handled[0]  # no rerun for want of heap room
        assert handled[0] < 3 * (len(requests) + int(requests.output_tokens.sum()))


@pytest.mark.parametrize("policy", sorted(policies.POLICIES))
def test_speculative_decoding_on_both_loops(colocated, cache, policy):
    """Verify steps of three drafted tokens: the later tiles through the pipeline, the
    accepted tokens out in bursts, on both loops alike, at the ends of the acceptance and
    between them."""
    pools = pools_of(colocated, cache, drafts=3)
    requests = chat(20000.0)
    for acceptance in (0.0, 0.6, 1.0):
        options = replace(OPTIONS, policy=policy, prefill_tile=32, token_budget=64,
                          draft_tokens=3, acceptance=acceptance, acceptance_seed=5)
        served = assert_twins(requests, pools, options)
        together = np.count_nonzero(served.gap_cycles == 0)
        assert (together > 0) == (acceptance > 0)


@pytest.mark.slow
def test_speculative_decoding_split_on_both_loops(split, cache):
    assert_twins(chat(20000.0), pools_of(split, cache, drafts=2),
                 replace(OPTIONS, prefill_tile=64, draft_tokens=2, acceptance=0.8))
