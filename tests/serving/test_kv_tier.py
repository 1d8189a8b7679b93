"""The KV tier off the wafer: what the prefix cache gives up is parked in host memory, and
brought back over the system's link in, at its bandwidth and per-transfer overhead, when that
is quicker than computing it again."""

from dataclasses import replace

import numpy as np
import pytest
from helpers import FIXTURES

from wse_emu import api
from wse_emu.cli.main import main
from wse_emu.errors import UserError
from wse_emu.hardware.fabric import load_fabric
from wse_emu.pools.kinds.wafer import wafer_pools
from wse_emu.serving.blocktrace import numbered
from wse_emu.serving.loops.plain import RegionState, Simulation
from wse_emu.serving.serve import ServeOptions
from wse_emu.serving.speculation import acceptance_runs
from wse_emu.serving.workload import Requests

WORKLOAD = FIXTURES / "small_blocks.yaml"


@pytest.fixture(scope="module")
def program():
    return api.compile("tiny", "mesh16", region=(16, 16))


@pytest.fixture(scope="module")
def pool(program, tmp_path_factory):
    return wafer_pools(program, tmp_path_factory.mktemp("tier-tables"))[0]


def simulation(program, pool, options):
    """Two block-trace requests sharing three 64-token blocks, on one region with a tier."""
    blocks = numbered([np.array([0, 1, 2]), np.array([0, 1, 2, 3]), np.array([7, 8, 9])], 64)
    requests = Requests(np.array([0.0, 1.0, 2.0]), np.array([192, 250, 192]),
                        np.array([4, 4, 4]), np.arange(3), np.zeros(3, int), np.zeros(3),
                        blocks)
    region = RegionState(0, pool, options.policies()["mixed"], 0, options.host_tokens())
    sim = Simulation(requests, [region], options.clock_hz, options.kv_bytes_per_token, True,
                     acceptance_runs(requests, options), options.router, True,
                     options.host_transfer_overhead_s * options.clock_hz)
    return sim, region


def test_bringing_kv_back_takes_the_links_bandwidth_and_overhead(program, pool):
    options = ServeOptions.of(program.fabric, program.model, kv_tier="host")
    # A region slow to compute prompts, so that every transfer is the quicker way.
    pool = replace(pool, prefill=pool.prefill.scaled(1e4))
    sim, region = simulation(program, pool, options)
    for block in (0, 1, 2):
        region.kv.park(block, (0, 64))
    region.kv.park(4, (0, 64))  # the third request's first three blocks, numbered 4 to 6
    region.kv.park(5, (0, 64))
    tokens, done = sim.restore(region, 1, 0, 0, now=1000.0)
    overhead = program.fabric.host_transfer_overhead_s * program.fabric.clock_hz
    assert overhead > 0 and tokens == 192
    one = overhead + 192 * options.kv_bytes_per_token / pool.link_bytes_per_cycle
    assert done == pytest.approx(1000.0 + one)
    assert not {0, 1, 2} & set(region.kv.host)  # taken out of the tier
    # The next transfer waits for the link in, as a handoff would.
    tokens, later = sim.restore(region, 2, 0, 0, now=1000.0)
    assert tokens == 128
    assert later == pytest.approx(done + overhead + 128 * options.kv_bytes_per_token
                                  / pool.link_bytes_per_cycle)


def test_what_is_quicker_to_compute_again_stays_in_the_tier(program, pool):
    options = ServeOptions.of(program.fabric, program.model, kv_tier="host")
    slow = replace(pool, link_bytes_per_cycle=1e-6)  # a link slower than the region computes
    sim, region = simulation(program, slow, options)
    for block in (0, 1, 2):
        region.kv.park(block, (0, 64))
    assert sim.restore(region, 1, 0, 0, now=0.0) is None
    assert set(region.kv.host) == {0, 1, 2}


def test_the_tier_keeps_what_fits_and_gives_up_its_oldest(program, pool):
    options = ServeOptions.of(program.fabric, program.model, kv_tier="host",
                              host_kv_bytes=program.model.kv_bytes_per_token() * 150)
    sim, region = simulation(program, pool, options)
    for block in (0, 1, 2):
        region.kv.park(block, (0, 64))
    assert list(region.kv.host) == [1, 2] and region.kv.hosted == 128
    region.kv.park(9, (0, 200))  # larger than the whole tier: dropped
    assert 9 not in region.kv.host


def test_serving_with_a_host_tier_brings_kv_back(tmp_path, capsys):
    program = api.compile("tiny", "mesh16")  # copies whose KV the trace crowds
    cache = tmp_path / "tables"
    without = api.serve(program, WORKLOAD, cache_dir=cache)
    tier = api.serve(program, WORKLOAD, cache_dir=cache, kv_tier="host",
                     host_kv_bytes=program.model.kv_bytes_per_token() * 10**6)
    region = tier.result.regions["mixed0"]
    assert region["prefix_restored_tokens"] > 0
    assert region["prefix_reused_tokens"] >= without.result.regions["mixed0"][
        "prefix_reused_tokens"]
    assert "prefix_restored_tokens" not in without.result.regions["mixed0"]
    assert main(["serve", "tiny", "--fabric", "mesh16", "--workload", str(WORKLOAD),
                 "--cache-dir", str(cache), "--kv-tier", "host"]) == 0
    assert "brought back from host memory" in capsys.readouterr().out


@pytest.mark.parametrize("options, words", [
    ({"kv_tier": "disk"}, "`kv_tier` must be one of none, host"),
    ({"kv_tier": "host", "host_kv_bytes": 0}, "`host_kv_bytes` must be a positive number"),
])
def test_a_bad_tier_is_refused_by_name(options, words):
    with pytest.raises(UserError, match=words):
        ServeOptions.of(load_fabric("mesh16"), api.load_model("tiny"), **options)


def test_the_fabric_gives_the_transfer_overhead(program):
    options = ServeOptions.of(program.fabric, program.model)
    assert options.host_transfer_overhead_s == program.fabric.host_transfer_overhead_s
    with pytest.raises(UserError, match="unknown serving option `host_transfer_overhead_s`"):
        ServeOptions.of(program.fabric, program.model, host_transfer_overhead_s=1.0)


def test_a_pool_without_a_modelled_link_has_no_tier(program, pool, tmp_path):
    from wse_emu.serving.serve import serve

    options = ServeOptions.of(program.fabric, program.model, kv_tier="host")
    unlinked = replace(pool, link_bytes_per_cycle=float("inf"))
    requests = Requests(np.zeros(1), np.array([10]), np.array([2]), np.arange(1),
                        np.zeros(1, int), np.zeros(1))
    with pytest.raises(UserError, match="no off-system link modelled"):
        serve(requests, [unlinked], options)


@pytest.mark.parametrize("options, words", [
    ({"kv_tier": "host", "prefix_cache": False}, "it needs the prefix cache"),
    ({"host_kv_bytes": 1e9}, "give `kv_tier=host` with it"),
])
def test_a_tier_setting_that_would_be_ignored_is_refused(options, words):
    with pytest.raises(UserError, match=words):
        ServeOptions.of(load_fabric("mesh16"), api.load_model("tiny"), **options)
