"""The cycle engine against closed forms (VALIDATION.md) and against its plain-Python twin."""

import json

import numpy as np
import pytest

from wse_emu.engines import cycle
from wse_emu.engines.messages import LINE, Messages
from wse_emu.engines.reference import cycle_twin
from wse_emu.hardware.fabric import load_fabric, with_overrides
from wse_emu.sim.noc import (
    find_saturation,
    generate,
    mean_hops_uniform,
    run_noc,
    saturation_bound,
    stable,
)


@pytest.mark.parametrize("hop,ramp", [(1, 2), (2, 1), (3, 2)])
@pytest.mark.parametrize("src,dst,length", [((0, 0), (5, 3), 1), ((7, 7), (0, 2), 9),
                                            ((3, 3), (3, 3), 4), ((2, 6), (2, 0), 2)])
def test_zero_load_latency_is_exact(hop, ramp, src, dst, length):
    k = 8
    s, d = src[1] * k + src[0], dst[1] * k + dst[0]
    hops = abs(src[0] - dst[0]) + abs(src[1] - dst[1])
    res = cycle.run(k, k, 2, 4, hop, ramp, Messages.build([7], [s], [d], [length]), 500, True)
    assert res.t_first[0] == 7
    assert res.t_done[0] - 7 == hops * hop + 2 * ramp + (length - 1)
    assert res.violation_cycle == -1
    assert res.link_wavelets.sum() == hops * length


def test_line_multicast_reaches_every_router_on_its_path():
    k = 8
    res = cycle.run(k, k, 1, 4, 1, 2, Messages.build([0], [8 * 2], [8 * 2 + 7], [3], LINE), 500,
                    True)
    # Point i (i+1 hops away) gets its last wavelet at (i+1)*hop + 2*ramp + 2.
    assert list(res.point_done) == [(i + 1) + 4 + 2 for i in range(7)]
    assert res.delivered == 7 * 3 and res.injected == 3


def test_one_link_shared_by_many_flows_carries_one_wavelet_per_cycle():
    # Eight PEs of row 0 all send 50 wavelets east to the end of row 0: the last link into
    # PE 7 carries everything, one wavelet per cycle.
    k = 8
    msgs = Messages.build(np.zeros(7, int), np.arange(7), np.full(7, 7), 50,
                          vc=np.arange(7) % 4)
    res = cycle.run(k, k, 4, 4, 1, 2, msgs, 5000, True)
    assert res.link_wavelets[6, 1] == 7 * 50
    assert res.t_done.max() >= 7 * 50
    assert res.violation_cycle == -1


def test_disjoint_routes_do_not_interfere():
    k = 8
    alone = cycle.run(k, k, 1, 4, 1, 2, Messages.build([0], [0], [7], [40]), 500)
    rows = Messages.build(np.zeros(8, int), np.arange(8) * k, np.arange(8) * k + 7, 40)
    together = cycle.run(k, k, 1, 4, 1, 2, rows, 500)
    assert (together.t_done == alone.t_done[0]).all()


def test_backpressure_loses_nothing_under_overload():
    msgs = generate("hotspot", 6, 0.9, 300, 3, 2, seed=4)
    res = cycle.run(6, 6, 2, 2, 1, 2, msgs, 100_000, True)
    assert res.violation_cycle == -1
    assert (res.t_done >= 0).all()
    assert res.delivered == res.injected == msgs.length.sum()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_the_python_twin(seed):
    rng = np.random.default_rng(seed)
    w, h, vcs = 4, 3, 2
    count = 60
    t = np.sort(rng.integers(0, 40, count))
    msgs = Messages.build(t, rng.integers(0, w * h, count), rng.integers(0, w * h, count),
                          rng.integers(1, 5, count), rng.integers(0, 2, count),
                          rng.integers(0, vcs, count))
    # A queue of one wavelet has no ring behind its first; one of eight wraps its ring.
    for hop, ramp, qcap in ((1, 2, 2), (2, 1, 3), (1, 1, 1), (1, 2, 8)):
        fast = cycle.run(w, h, vcs, qcap, hop, ramp, msgs, 10_000, True)
        cycles, t_first, t_done, point_done, links, _, _ = cycle_twin(
            w, h, vcs, qcap, hop, ramp, msgs, 10_000)
        assert fast.cycles == cycles
        assert np.array_equal(fast.t_first, t_first)
        assert np.array_equal(fast.t_done, t_done)
        flat = [d for per in point_done for d in per]
        assert list(fast.point_done) == flat
        for (r, d), count_ in links.items():
            assert fast.link_wavelets[r, d] == count_
        assert fast.link_wavelets.sum() == sum(links.values())


@pytest.mark.parametrize("k", [8, 16])
def test_mean_hops_uniform(k):
    res = run_noc(k, "uniform", 0.02, warmup=200, window=3000, drain=2000)
    assert res.hops_mean == pytest.approx(mean_hops_uniform(k), rel=0.03)


def test_conservation_and_littles_law():
    msgs = generate("uniform", 8, 0.3, 3000, 1, 4, seed=1)
    res = cycle.run(8, 8, 4, 8, 1, 2, msgs, 20_000, True)
    assert res.violation_cycle == -1
    latency = (res.t_done - msgs.t_ready).astype(float)
    in_network = (res.t_done - res.t_first + 1).sum()  # wavelet-cycles from injection
    # Little's law: mean occupancy over the run = throughput x mean time in the network.
    assert res.in_flight_cycles / res.cycles == pytest.approx(in_network / res.cycles, rel=0.1)
    assert latency.min() >= 2 * 2  # at least both ramps


@pytest.mark.slow
@pytest.mark.parametrize("k", [8, 16])
@pytest.mark.parametrize("pattern", ["uniform", "transpose", "bitcomp"])
def test_saturation_within_75_to_100_percent_of_the_bound(k, pattern):
    bound = saturation_bound(pattern, k)
    assert stable(run_noc(k, pattern, 0.5 * bound))
    assert not stable(run_noc(k, pattern, 1.2 * bound))
    rate, _ = find_saturation(k, pattern)
    assert 0.75 * bound <= rate <= bound, rate / bound


# --- the router model's fields: virtual channels and queue depth ----------------------------

@pytest.mark.parametrize("queue", [1, 2, 3, 8])
@pytest.mark.parametrize("length", [1, 2, 5, 10])
def test_a_shallow_queue_passes_its_wavelets_one_credit_loop_at_a_time(queue, length):
    """One message, 5 hops, hop 1, ramp 2. A queue's credit comes back the cycle after its
    wavelet moves on, so a queue behind a d-cycle wire passes ``queue`` wavelets per d + 1
    cycles. The PE's ramp (d = 2) allows ``queue`` per 3 cycles, the links (d = 1) ``queue``
    per 2, never the tighter: wavelet i is injected at 3 * (i // queue) + i % queue below a
    queue of 3, at i from 3 on, and lands 5 + 2 * 2 cycles later."""
    hops, ramp = 5, 2
    res = cycle.run(8, 8, 1, queue, 1, ramp, Messages.build([0], [0], [hops], [length]), 1000,
                    True)
    last = length - 1
    injected = last if queue > ramp else (ramp + 1) * (last // queue) + last % queue
    assert res.t_done[0] == injected + hops + 2 * ramp
    assert res.violation_cycle == -1


@pytest.mark.parametrize("length", [1, 2, 3, 10, 20])
def test_classes_on_one_virtual_channel_share_its_credit_loop(length):
    """Two messages of ``length`` wavelets, PE 0 and PE 1 to PE 2 of a 3 x 1 row, share the
    link 1 -> 2; queues of one wavelet, hop 1 and ramp 1, so every queue passes one wavelet
    per 2 cycles. On virtual channels of their own each runs as if alone: it lands
    hops + 2 * ramp + 2 * (length - 1) cycles after it starts. On one channel the link
    passes one wavelet of either per 2 cycles, at cycles 1, 3, ..., 4 * length - 1, and the
    last lands hop + ramp = 2 cycles later."""
    for vcs, expected in ((2, [2 + 2 + 2 * (length - 1), 1 + 2 + 2 * (length - 1)]),
                          (1, None)):
        msgs = Messages.build([0, 0], [0, 1], [2, 2], [length, length], 0,
                              np.array([0, 1]) % vcs)
        res = cycle.run(3, 1, vcs, 1, 1, 1, msgs, 1000, True)
        assert res.link_wavelets[1, 1] == 2 * length and res.violation_cycle == -1
        if expected:
            assert list(res.t_done) == expected
        else:
            assert res.t_done.max() == 4 * length + 1
        twin = cycle_twin(3, 1, vcs, 1, 1, 1, msgs, 1000)
        assert np.array_equal(res.t_done, twin[2])


def test_fewer_virtual_channels_and_shallower_queues_slow_contended_traffic():
    """Hotspot traffic under overload on a 6 x 6 mesh: one virtual channel of one-wavelet
    queues takes far longer to deliver it than the defaults. (Between nearby settings the
    order is not strict: round-robin arbitration under overload can finish a case a cycle or
    two sooner with shallower queues.)"""
    base = generate("hotspot", 6, 0.5, 200, 3, 4, seed=0)
    times = {}
    for vcs, depth in ((1, 1), (4, 1), (1, 8), (4, 8)):
        msgs = Messages.build(base.t_ready, base.src, base.dst, base.length, 0, base.vc % vcs)
        res = cycle.run(6, 6, vcs, depth, 1, 2, msgs, 100_000, True)
        assert (res.t_done >= 0).all() and res.violation_cycle == -1
        times[vcs, depth] = int(res.t_done.max())
    assert times[1, 1] > 1.2 * times[4, 8]
    assert times[1, 1] >= times[4, 1] > times[4, 8]
    assert times[1, 1] > times[1, 8]


@pytest.mark.parametrize("vcs", [1, 32])
def test_the_ends_of_the_virtual_channel_range_match_the_python_twin(vcs):
    """32 channels fill the per-port color masks (int32: sign bits to mind)."""
    rng = np.random.default_rng(5)
    count = 80
    msgs = Messages.build(np.sort(rng.integers(0, 30, count)), rng.integers(0, 12, count),
                          rng.integers(0, 12, count), rng.integers(1, 5, count),
                          rng.integers(0, 2, count), rng.integers(0, vcs, count))
    res = cycle.run(4, 3, vcs, 2, 1, 2, msgs, 10_000, True)
    cycles, t_first, t_done, _, _, _, _ = cycle_twin(4, 3, vcs, 2, 1, 2, msgs, 10_000)
    assert res.cycles == cycles and res.violation_cycle == -1
    assert np.array_equal(res.t_first, t_first) and np.array_equal(res.t_done, t_done)


def test_router_queues_beyond_the_memory_limit_are_refused():
    msgs = Messages.build([0], [0], [1], [1])
    with pytest.raises(ValueError, match="GiB of router queues"):
        cycle.run(128, 128, 32, 1024, 1, 2, msgs, 10)
    with pytest.raises(ValueError, match="1 to 32 virtual channels"):
        cycle.run(2, 2, 33, 8, 1, 2, Messages.build([0], [0], [1], [1], vc=32), 10)
    # A credit is two bytes: a deeper queue than the fabric allows is refused, not wrapped.
    for depth in (0, 1025):
        with pytest.raises(ValueError, match="queues of 1 to 1024 wavelets"):
            cycle.run(2, 2, 1, depth, 1, 2, msgs, 10)


def test_noc_runs_on_the_fabric_routers():
    """A study takes its virtual channels, queue depth and latencies from the fabric: by
    default the wse3 preset's, the former constants (4 channels of 8 wavelets, hop 1, ramp 2)."""
    wse3 = load_fabric("wse3")
    kw = dict(warmup=200, window=1500, drain=1500)
    default = run_noc(6, "hotspot", 0.3, **kw)
    assert default == run_noc(6, "hotspot", 0.3, fabric=wse3, **kw)
    msgs = generate("hotspot", 6, 0.3, 1700, 1, 4, 0)
    res = cycle.run(6, 6, 4, 8, 1, 2, msgs, 3200)
    assert default.cycles == res.cycles
    narrow = run_noc(6, "hotspot", 0.3,
                     fabric=with_overrides(wse3, virtual_channels=1, queue_wavelets=1), **kw)
    assert narrow.latency_mean > default.latency_mean


def test_noc_command_reads_the_fabric_and_its_options_override_it(capsys):
    from wse_emu.cli.main import main

    args = ["noc", "--mesh", "4", "--rate", "0.3", "--window", "600", "--drain", "600",
            "--warmup", "100", "--json"]

    def run(*extra):
        assert main([*args, *extra]) == 0
        return json.loads(capsys.readouterr().out)

    default = run()
    assert (default["virtual_channels"], default["queue_wavelets"]) == (4, 8)
    assert run("--vcs", "4", "--queue", "8")["runs"] == default["runs"]
    narrow = run("--set", "virtual_channels=1", "--set", "queue_wavelets=1")
    assert (narrow["virtual_channels"], narrow["queue_wavelets"]) == (1, 1)
    assert narrow["runs"][0]["latency_mean"] > default["runs"][0]["latency_mean"]
    assert run("--vcs", "1", "--queue", "1")["runs"] == narrow["runs"]
    assert main(["noc", "--set", "virtual_channels=40"]) == 2
    assert "virtual_channels' must be between 1 and 32" in capsys.readouterr().err
