"""A run's caps say which other caps would have served it the same way (``serving.caps``): every
pair of runs the rule calls alike is alike to the last bit, colocated and split, for every
policy; a cap that stopped something is alike only at its own value; and an experiment's run
book serves one run for the caps it proves alike, each judged as its own run would be."""

from dataclasses import replace
from itertools import product

import numpy as np
import pytest

from wse_emu.experiments.goodput import Config, RunBook, Targets, evaluate, loosest_first, serve_run
from wse_emu.experiments.tuning import Choice
from wse_emu.serving.policies import POLICIES
from wse_emu.serving.pools import StagePool
from wse_emu.serving.serve import ServeOptions, serve
from wse_emu.serving.tables import StageTable
from wse_emu.serving.workload import generate, workload_from_dict
from wse_emu.util.workers import point_pool

STAGES = 6
OPTIONS = ServeOptions(clock_hz=1e9, kv_bytes_per_token=1024)
# (running cap, batch limit): none, loose and tight of each, and both tight.
CAPS = [(0, 64), (0, 16), (0, 4), (0, 2), (64, 64), (12, 64), (3, 64), (12, 4), (3, 2)]


def table(phase: str, fixed: float, per_unit: float, per_context: float) -> StageTable:
    """Stage times that grow with both axes, unevenly (the later stages slower), so that
    batches and contexts of every size give other times."""
    a0 = np.array([1.0, 2.0, 4.0, 16.0, 64.0, 256.0])
    a1 = np.array([0.0, 256.0, 1024.0, 4096.0])
    one = fixed + per_unit * a0[:, None] ** 0.8 + per_context * a1[None, :]
    cycles = np.stack([one * (1 + 0.1 * s) for s in range(STAGES)])
    return StageTable(phase, a0, a1, cycles, np.full((len(a0), len(a1)), 50.0))


PREFILL = table("prefill", 2_000.0, 400.0, 0.5)
DECODE = table("decode", 3_000.0, 300.0, 0.2)


def colocated(capacity: int = 40_000) -> list:
    return [StagePool(f"mixed{k}", "mixed", capacity, PREFILL, DECODE) for k in range(2)]


def split() -> list:
    """A prefill pool and two decode pools on other systems: handoffs wait for a decode pool
    under its running cap."""
    return [StagePool("prefill0", "prefill", 60_000, PREFILL, None, link_bytes_per_cycle=512.0),
            *(StagePool(f"decode{k}", "decode", 30_000, None, DECODE, system=k + 1,
                        link_bytes_per_cycle=512.0) for k in range(2))]


def chat(rate: float, requests: int = 150):
    return generate(workload_from_dict({
        "name": "chat", "rate": rate, "requests": requests, "seed": 3,
        "prompt": {"kind": "lognormal", "median": 300, "sigma": 0.9, "low": 4, "high": 2000},
        "output": {"kind": "lognormal", "median": 40, "sigma": 0.9, "low": 1, "high": 300}},
        "test"))


def alike(a, b) -> bool:
    return all(np.array_equal(getattr(a, name), getattr(b, name))
               for name in ("arrival", "first_token", "finish", "gap_cycles", "gap_request")) \
        and a.regions == b.regions and a.caps == b.caps


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("pools", [colocated, split])
def test_runs_their_caps_prove_alike_are_alike(policy, pools):
    proven = stopped = 0
    for rate in (200.0, 5_000.0):
        runs = {caps: serve(chat(rate), pools(), replace(OPTIONS, policy=policy,
                                                         max_running=caps[0],
                                                         batch_limit=caps[1]))
                for caps in CAPS}
        for a, b in product(CAPS, CAPS):
            if a != b and runs[a].caps.same_under(a, b):
                assert alike(runs[a], runs[b]), (rate, a, b)
                proven += 1
        stopped += sum(1 for a, b in product(CAPS, CAPS) if not alike(runs[a], runs[b]))
        # A cap that stopped nothing stood at or above what its checks found.
        for (running, limit), run in runs.items():
            if not run.caps.running_met and running:
                assert run.caps.running_peak < running
            if not run.caps.batch_met:
                assert run.caps.batch_peak <= limit
    assert proven and stopped  # the rule spared runs, and some caps did change the serving


def test_a_cap_that_stopped_something_is_alike_only_at_its_own_value():
    tight = serve(chat(5_000.0), colocated(), replace(OPTIONS, max_running=10, batch_limit=1))
    assert tight.caps.running_met and tight.caps.batch_met
    assert tight.caps.same_under((10, 1), (10, 1))
    for other in ((0, 1), (11, 1), (10, 2), (10, 64), (0, 64)):
        assert not tight.caps.same_under((10, 1), other)
    loose = serve(chat(5_000.0), colocated(), replace(OPTIONS, max_running=0, batch_limit=64))
    assert not alike(tight, loose)


def test_the_loops_note_the_same_caps():
    noted = []
    for options in (replace(OPTIONS, max_running=10, batch_limit=1), OPTIONS):
        for pools in (colocated(), split()):
            plain = serve(chat(5_000.0), pools, options, loop="plain")
            compiled = serve(chat(5_000.0), pools, options)
            assert plain.caps == compiled.caps
            noted.append(compiled.caps)
    for name in ("running_peak", "running_met", "batch_peak", "batch_met"):
        assert len({getattr(caps, name) for caps in noted}) > 1, name


def test_the_loosest_caps_of_each_family_are_served_first():
    choice = Choice(plan="colocated", layout="1 copy", policy="chunked")
    jobs = [(replace(choice, max_running=m, batch_limit=b), f)
            for (m, b), f in product(CAPS, (1.0, 2.0))]
    other = [(replace(choice, token_budget=64, max_running=3, batch_limit=2), 1.0)]
    first, later = loosest_first(jobs + other)
    assert sorted(first, key=str) == sorted([(replace(choice, max_running=0, batch_limit=64), f)
                                             for f in (1.0, 2.0)] + other, key=str)
    assert len(first) + len(later) == len(jobs) + 1


def _serve_choice(pools: list, base: ServeOptions, requests, choice, factor):
    return serve_run(_config(pools, base, choice), requests, factor)


def _config(pools, base, choice) -> Config:
    return Config(choice.plan, choice.knob, pools, replace(
        base, policy=choice.policy, max_running=choice.max_running,
        batch_limit=choice.batch_limit))


@pytest.mark.parametrize("policy", ["chunked", "interleaved"])
def test_a_run_book_serves_one_run_for_the_caps_it_proves_alike(policy):
    pools, requests = colocated(), chat(1_000.0)
    targets = Targets(ttft_s=0.5, tpot_s=0.0005)
    choice = Choice(plan="colocated", layout="2 copies", policy=policy)
    jobs = [(replace(choice, max_running=m, batch_limit=b), f)
            for (m, b), f in product(CAPS, (0.5, 4.0))]
    served = []

    def counted(*args):
        served.append(args[-2:])
        return _serve_choice(*args)

    with point_pool(workers=1) as pool:
        book = RunBook(pool, counted)
        points = book.run_points((pools, OPTIONS), requests, targets)(jobs)
    apart = [evaluate(_config(pools, OPTIONS, c), requests, f, targets) for c, f in jobs]
    assert [repr(p) for p in points] == [repr(p) for p in apart]
    assert 0 < len(served) < len(jobs)
    # Asked again, nothing is served again.
    count = len(served)
    again = book.run_points((pools, OPTIONS), requests, targets)(jobs[::-1])
    assert [repr(p) for p in again] == [repr(p) for p in apart[::-1]]
    assert len(served) == count
