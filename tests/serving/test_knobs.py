"""The serving knobs are declared once (``knobs.ServingKnobs``): the options inherit them, each
policy names the ones it reads, its compiled dispatch reads them at positions named after them,
and what it sends is bounded by the stage tables of the pools it serves."""

from dataclasses import fields

import numpy as np
import pytest

from wse_emu.errors import UserError
from wse_emu.serving import knobs
from wse_emu.serving.knobs import KNOB_NAMES, ServingKnobs, info, knob_fields
from wse_emu.serving.policies import POLICIES, SPLIT_POLICY, Policy, register
from wse_emu.serving.pools import StagePool
from wse_emu.serving.serve import ServeOptions, check_micro_batches, setting_names
from wse_emu.serving.tables import StageTable

OPTIONS = ServeOptions(clock_hz=1.0, kv_bytes_per_token=1)


def test_the_options_inherit_every_knob_with_its_declaration():
    declared = {f.name: f for f in knob_fields()}
    inherited = {f.name: f for f in fields(ServeOptions) if f.name in declared}
    assert list(inherited) == list(KNOB_NAMES)
    for name, f in inherited.items():
        assert info(f) is info(declared[name]) and f.default == declared[name].default
    # The hardware and the other settings come first, as they are listed and checked.
    settings = ("policy", "prefix_cache", "router", "kv_tier", "host_kv_bytes",
                "timeline_events", "draft_tokens", "acceptance", "acceptance_seed")
    assert setting_names()[:len(settings)] == settings
    assert setting_names()[len(settings):] == KNOB_NAMES


def test_a_knob_out_of_range_is_refused_by_its_name():
    with pytest.raises(UserError, match="`prefill_tile` must be at least 1, got 0"):
        ServeOptions(clock_hz=1.0, kv_bytes_per_token=1, prefill_tile=0)
    with pytest.raises(UserError, match="`max_running` must be a whole number"):
        ServingKnobs(max_running=1.5)


def test_each_position_constant_is_its_knobs_place_in_the_packed_knobs():
    values = ServingKnobs(**{name: 100 + k for k, name in enumerate(KNOB_NAMES)})
    packed = POLICIES["chunked"](values).packed()
    for name in KNOB_NAMES:
        assert packed[getattr(knobs, name.upper())] == getattr(values, name)


def test_every_policy_reads_declared_knobs_and_the_split_reads_its_own():
    for policy in POLICIES.values():
        assert set(policy.reads) <= set(KNOB_NAMES)
    assert SPLIT_POLICY.reads == ("prefill_tile", "max_running", "batch_limit")

    class Misspelt(Policy):
        name = "misspelt"
        reads = ("prefil_tile",)
    with pytest.raises(TypeError, match="undeclared knobs prefil_tile"):
        register(Misspelt)
    assert "misspelt" not in POLICIES


def test_the_running_cap_applies_where_a_policy_reads_it():
    capped = ServingKnobs(max_running=8)
    assert POLICIES["interleaved"](capped).running_cap() == 8

    class Uncapped(Policy):
        name = "uncapped"
        reads = ("prefill_tile",)
    assert Uncapped(capped).running_cap() == 0


def _pool(role: str, prefill_top: int = 256, decode_top: int = 64):
    """A pool whose stage tables stop at the given largest sizes (their times unused)."""
    def table(phase, top):
        return StageTable(phase, np.array([1.0, top]), np.array([0.0, 1.0]),
                          np.ones((1, 2, 2)), np.zeros((2, 2)))
    return StagePool(role, role, 1000, table("prefill", prefill_top) if role != "decode" else None,
                     table("decode", decode_top) if role != "prefill" else None)


def test_a_policy_bounds_the_sizes_it_sends_by_the_tables_that_time_them():
    big = ServingKnobs(prefill_tile=512, token_budget=512, batch_limit=128)
    mixed, prefill, decode = _pool("mixed"), _pool("prefill"), _pool("decode")
    assert POLICIES["prefill-priority"](big).limits(mixed) == [("prefill_tile", 512, 256),
                                                               ("batch_limit", 128, 64)]
    # The chunked policy's budget bounds a mixed pool's prefill steps; it sends no tile.
    assert POLICIES["chunked"](big).limits(mixed) == [("token_budget", 512, 256),
                                                      ("batch_limit", 128, 64)]
    # A pool without a phase's table is sent none of that phase.
    assert SPLIT_POLICY(big).limits(prefill) == [("prefill_tile", 512, 256)]
    assert SPLIT_POLICY(big).limits(decode) == [("batch_limit", 128, 64)]


@pytest.mark.parametrize("policy, knob", [("chunked", "token_budget"),
                                          ("prefill-priority", "prefill_tile"),
                                          ("interleaved", "batch_limit")])
def test_serving_refuses_a_size_beyond_a_pools_tables(policy, knob):
    options = ServeOptions(clock_hz=1.0, kv_bytes_per_token=1, policy=policy, **{knob: 1024})
    with pytest.raises(UserError, match=rf"`{knob}` must be between 1 and \d+ \(the range of "
                                        r"pool mixed's stage tables\), got 1024"):
        check_micro_batches([_pool("mixed")], options.policies())


def test_a_split_is_bounded_by_its_own_policy_not_the_colocated_one():
    options = ServeOptions(clock_hz=1.0, kv_bytes_per_token=1, policy="chunked",
                           token_budget=1024)
    check_micro_batches([_pool("prefill"), _pool("decode")], options.policies())
    with pytest.raises(UserError, match="`prefill_tile`"):
        check_micro_batches([_pool("prefill")], ServeOptions(
            clock_hz=1.0, kv_bytes_per_token=1, policy="chunked", prefill_tile=1024).policies())
