"""A pool of another kind: serving reads only the ``Pool`` attributes (a role, stage tables, a
KV capacity, a system and its link rates), so a place described by a closed-form step time
(as an accelerator described by measured or modelled step times would be) serves alongside
or instead of compiled wafer regions, with nothing else to change. The recipe in
docs/contributing.md, followed once."""

from dataclasses import dataclass, replace

import numpy as np
import pytest

from wse_emu.serving.serve import ServeOptions, serve
from wse_emu.serving.tables import StageTable
from wse_emu.serving.workload import generate, workload_from_dict

KV_BYTES_PER_TOKEN = 1024


def linear_table(phase: str, stages: int, fixed: float, per_unit: float, per_context: float,
                 axis0=(1, 8, 64, 512), axis1=(0, 512, 4096)) -> StageTable:
    """Per stage, ``fixed + per_unit * axis0 + per_context * axis1`` cycles: linear in both
    axes, so the table's bilinear look-up between its points is exact."""
    a0, a1 = np.asarray(axis0, float), np.asarray(axis1, float)
    one = fixed + per_unit * a0[:, None] + per_context * a1[None, :]
    return StageTable(phase, a0, a1, np.repeat(one[None], stages, axis=0),
                      np.zeros((len(a0), len(a1))))


@dataclass
class StepModelPool:
    """A pool whose step times come from a formula rather than from a compiled program."""

    name: str
    role: str
    kv_capacity_tokens: int
    prefill: StageTable | None
    decode: StageTable | None
    riding: StageTable | None = None  # its steps of both kinds are timed apart and added
    system: int = 0
    fabric_bytes_per_cycle: float = float("inf")
    link_bytes_per_cycle: float = 64.0
    link_latency_cycles: float = 0.0

    @property
    def stages(self) -> int:
        return len((self.prefill or self.decode).cycles)


PREFILL = dict(stages=4, fixed=500.0, per_unit=20.0, per_context=0.5)
DECODE = dict(stages=4, fixed=300.0, per_unit=10.0, per_context=0.05)


def prefill_cycles(tokens: int, cached: int = 0) -> float:
    p = PREFILL
    return p["stages"] * (p["fixed"] + p["per_unit"] * tokens + p["per_context"] * cached)


def decode_cycles(batch: int, context: float) -> float:
    d = DECODE
    return d["stages"] * (d["fixed"] + d["per_unit"] * batch + d["per_context"] * context)


def one_request(prompt: int, output: int):
    return generate(workload_from_dict({"name": "one", "requests": 1,
                                        "prompt": {"kind": "fixed", "value": prompt},
                                        "output": {"kind": "fixed", "value": output}}, "t"))


OPTIONS = ServeOptions(clock_hz=1e9, kv_bytes_per_token=KV_BYTES_PER_TOKEN, prefill_tile=256,
                       batch_limit=8)


def test_a_lone_request_on_a_step_model_pool_takes_the_formulas_times():
    pool = StepModelPool("mixed0", "mixed", 100_000, linear_table("prefill", **PREFILL),
                         linear_table("decode", **DECODE))
    res = serve(one_request(200, 4), [pool], OPTIONS)
    assert res.first_token[0] - res.arrival[0] == pytest.approx(prefill_cycles(200))
    assert res.finish[0] - res.first_token[0] == pytest.approx(
        sum(decode_cycles(1, 200 + k) for k in range(1, 4)))
    assert res.tokens[0] == 4


def test_a_split_of_step_model_pools_hands_off_over_the_slower_link():
    """Prefill on one system, decode on another: the prompt's KV crosses the sender's link
    out and the receiver's in, at the slower of the two."""
    prefill = StepModelPool("prefill0", "prefill", 100_000, linear_table("prefill", **PREFILL),
                            None, system=0, link_bytes_per_cycle=64.0)
    decode = StepModelPool("decode0", "decode", 100_000, None, linear_table("decode", **DECODE),
                           system=1, link_bytes_per_cycle=32.0)
    res = serve(one_request(200, 4), [prefill, decode], OPTIONS)
    assert res.first_token[0] - res.arrival[0] == pytest.approx(prefill_cycles(200))
    handoff = 200 * KV_BYTES_PER_TOKEN / 32.0
    assert res.finish[0] - res.first_token[0] == pytest.approx(
        handoff + sum(decode_cycles(1, 200 + k) for k in range(1, 4)))


def test_a_handoff_between_systems_arrives_after_the_networks_latency():
    """The larger end's latency delays the KV's arrival, once; the links are free again as
    the last byte leaves, so a second transfer queues behind the first's bytes only."""
    prefill = StepModelPool("prefill0", "prefill", 100_000, linear_table("prefill", **PREFILL),
                            None, system=0, link_bytes_per_cycle=64.0,
                            link_latency_cycles=2_000.0)
    decode = StepModelPool("decode0", "decode", 100_000, None, linear_table("decode", **DECODE),
                           system=1, link_bytes_per_cycle=32.0, link_latency_cycles=5_000.0)
    res = serve(one_request(200, 4), [prefill, decode], OPTIONS)
    handoff = 200 * KV_BYTES_PER_TOKEN / 32.0 + 5_000.0
    assert res.finish[0] - res.first_token[0] == pytest.approx(
        handoff + sum(decode_cycles(1, 200 + k) for k in range(1, 4)))


def test_many_requests_on_step_model_pools_complete_once_each():
    prefill = StepModelPool("prefill0", "prefill", 20_000, linear_table("prefill", **PREFILL),
                            None, system=0)
    decode = StepModelPool("decode0", "decode", 20_000, None, linear_table("decode", **DECODE),
                           system=1)
    reqs = generate(workload_from_dict({"name": "many", "requests": 200, "rate": 2e5,
                                        "prompt": {"kind": "uniform", "low": 16, "high": 900},
                                        "output": {"kind": "uniform", "low": 1, "high": 40}},
                                       "t"))
    res = serve(reqs, [prefill, decode], OPTIONS)
    assert (res.tokens == reqs.output_tokens).all()
    assert (res.finish >= res.first_token).all() and (res.first_token > res.arrival).all()
    # With a network latency, both serving loops alike.
    late = [replace(prefill, link_latency_cycles=700.0), decode]
    plain, compiled = (serve(reqs, late, OPTIONS, loop=loop) for loop in ("plain", "compiled"))
    assert np.array_equal(plain.finish, compiled.finish)
    assert (compiled.finish >= res.finish).all() and (compiled.finish > res.finish).any()


def test_a_chunk_takes_several_short_prompts_in_one_step():
    """Four 16-token prompts arriving at once on a one-step pool (one stage, as an
    accelerator's copy), a 64-token budget taking up to four prompts: one step of 64 tokens
    prefills them all, in the formula's time for 64 tokens, sooner than one a step."""
    one_stage = PREFILL | {"stages": 1}
    pool = StepModelPool("mixed0", "mixed", 100_000, linear_table("prefill", **one_stage),
                         linear_table("decode", **(DECODE | {"stages": 1})))
    burst = generate(workload_from_dict({"name": "burst", "requests": 4,
                                         "prompt": {"kind": "fixed", "value": 16},
                                         "output": {"kind": "fixed", "value": 2}}, "t"))
    burst = replace(burst, arrival_s=np.zeros(4))
    options = replace(OPTIONS, policy="chunked", token_budget=64, chunk_prompts=4)
    served = serve(burst, [pool], options)
    assert (served.first_token == served.first_token[0]).all()
    step = one_stage["fixed"] + one_stage["per_unit"] * 64
    assert served.first_token[0] == pytest.approx(step)
    # One prompt a step: four steps, the later ones carrying the earlier prompts' decode.
    one_each = serve(burst, [pool], replace(options, chunk_prompts=1))
    assert one_each.first_token.max() > 4 * (one_stage["fixed"] + one_stage["per_unit"] * 16)
