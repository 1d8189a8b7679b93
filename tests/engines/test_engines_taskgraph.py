"""Both engines on task graphs: against their Python twins, and against each other."""

import dataclasses

import numpy as np
import pytest

from wse_emu.engines import cycle, fast
from wse_emu.engines.messages import LINE, UNICAST
from wse_emu.engines.reference import cycle_twin, fast_twin
from wse_emu.engines.taskgraph import Builder


def random_graph(seed, w=4, h=3, tasks=40):
    """A random DAG: each task may feed later tasks by messages (unicast or line) or directly."""
    rng = np.random.default_rng(seed)
    b = Builder(w, h)
    pes = rng.integers(0, w * h, tasks)
    ids = [b.task(int(pes[i]), int(rng.integers(0, 30)), kind=i % 3,
                  priority=int(rng.choice([0, 1, 2, 254, 255]))) for i in range(tasks)]
    for i in range(tasks - 1):
        for _ in range(int(rng.integers(0, 3))):
            j = int(rng.integers(i + 1, tasks))
            if rng.random() < 0.3 and pes[j] != pes[i]:
                # A line along the row or column of the source, feeding a task at every point.
                sx, sy = pes[i] % w, pes[i] // w
                if rng.random() < 0.5:
                    dst = sy * w + int(rng.choice([0, w - 1]))
                else:
                    dst = int(rng.choice([0, h - 1])) * w + sx
                hops = abs(dst % w - sx) + abs(dst // w - sy)
                if hops == 0:
                    continue
                feeds = []
                for k in range(hops):
                    feeds.append(b.task(int(dst), 1, kind=9))  # placeholders, PE fixed below
                # Put each fed task on its point's PE.
                step = np.sign([dst % w - sx, dst // w - sy])
                for k, t in enumerate(feeds):
                    b.tasks[t][0] = int((sy + step[1] * (k + 1)) * w + sx + step[0] * (k + 1))
                b.send(ids[i], int(pes[i]), int(dst), int(rng.integers(1, 6)), feeds, LINE,
                       int(rng.integers(0, 2)))
            elif rng.random() < 0.5:
                b.send(ids[i], int(pes[i]), int(pes[j]), int(rng.integers(1, 6)), ids[j],
                       UNICAST, int(rng.integers(0, 2)))
            else:
                b.then(ids[i], ids[j])
    return b.build()


@pytest.mark.parametrize("seed", range(6))
def test_fast_engine_matches_its_twin(seed):
    g = random_graph(seed)
    res = fast.run(g, 1, 2)
    start, end, point_done, links = fast_twin(g, 1, 2)
    assert list(res.task_start) == start
    assert list(res.task_end) == end
    assert list(res.point_done) == point_done
    assert res.unfinished() == 0
    assert_links(res.link_wavelets, links)


def assert_links(table: np.ndarray, links: dict) -> None:
    """A (routers, 4) table of wavelets per link holds the twin's counts, and nothing else."""
    expected = np.zeros_like(table)
    for (router, direction), count in links.items():
        expected[router, direction] = count
    assert np.array_equal(table, expected)


@pytest.mark.parametrize("w, h", [(5, 3), (2, 6), (7, 1), (1, 4)])
def test_fast_engine_counts_each_links_wavelets_like_its_twin(w, h):
    # The engine keeps its links in planes laid out by row or by column (``fast.Network``):
    # on meshes wider than tall and taller than wide, every link's count lands on its own
    # router and direction.
    g = random_graph(w * 10 + h, w=w, h=h, tasks=60)
    res = fast.run(g, 2, 1)
    start, end, point_done, links = fast_twin(g, 2, 1)
    assert list(res.task_end) == end and list(res.point_done) == point_done
    assert links and res.link_wavelets.shape == (w * h, 4)
    assert_links(res.link_wavelets, links)


@pytest.mark.parametrize("seed", range(4))
def test_cycle_engine_runs_task_graphs_like_its_twin(seed):
    g = random_graph(seed)
    res = cycle.run_graph(g, 2, 3, 1, 2, 20_000, check=True)
    cycles, t_first, t_done, point_done, links, start, end = cycle_twin(
        g.width, g.height, 2, 3, 1, 2, g.msgs, 20_000, graph=g)
    assert list(res.task_start) == start and list(res.task_end) == end
    assert np.array_equal(res.t_done, t_done)
    assert res.violation_cycle == -1
    assert (res.task_end >= 0).all()


def test_engines_agree_exactly_without_contention():
    # A chain of tasks passing one message each along a row: no two messages ever compete.
    b = Builder(8, 8)
    prev = b.task(0, 5)
    for pe in range(1, 8):
        nxt = b.task(pe, 3)
        b.send(prev, pe - 1, pe, 4, nxt)
        prev = nxt
    g = b.build()
    f = fast.run(g, 1, 2)
    c = cycle.run_graph(g, 2, 8, 1, 2, 10_000)
    assert list(f.task_end) == list(c.task_end)


@pytest.mark.parametrize("seed", range(4))
def test_engines_agree_within_ten_percent_on_random_graphs(seed):
    g = random_graph(seed + 10, w=6, h=6, tasks=80)
    f = fast.run(g, 1, 2)
    c = cycle.run_graph(g, 4, 8, 1, 2, 50_000)
    makespan_f = max(f.task_end.max(), f.msg_done.max())
    makespan_c = max(c.task_end.max(), c.t_done.max())
    assert makespan_f == pytest.approx(makespan_c, rel=0.10)


def test_priorities_beyond_the_packed_range_are_refused():
    b = Builder(2, 1)
    b.task(0, 5, priority=256)
    with pytest.raises(ValueError, match="priorities"):
        b.build()


@pytest.mark.parametrize("queue", [1, 2, 4, 8, 16, 37, 38, 64])
def test_fast_engine_frees_the_links_behind_a_blocked_message_by_its_queues(queue):
    """A 4 x 1 row, hop 1, ramp 2. B (40 wavelets, PE 2 -> 3, from cycle 0) takes link 2 -> 3
    over cycles 2..41; A (20 wavelets, PE 0 -> 3, from cycle 1) takes link 0 -> 1 at 3 and
    1 -> 2 at 4, then waits for 2 -> 3 until 42 and holds it to 62. As a wormhole, A holds
    1 -> 2 until its wavelets behind the hold-up fit the queue ahead: to 62 - hop - queue.
    C (10 wavelets, PE 1 -> 2, from cycle 2) needs 1 -> 2 from cycle 4 on: it starts at
    max(4 + 20, 61 - queue) and lands hop + ramp + 9 cycles later."""
    b = Builder(4, 1)
    got = [b.task(3, 0), b.task(3, 0), b.task(2, 0)]
    b.send(None, 2, 3, 40, got[0], t_ready=0)
    b.send(None, 0, 3, 20, got[1], t_ready=1)
    b.send(None, 1, 2, 10, got[2], t_ready=2)
    g = b.build()
    res = fast.run(g, 1, 2, queue)
    assert list(res.point_done) == [3 + 2 + 39, 43 + 2 + 19, max(24, 61 - queue) + 1 + 2 + 9]
    assert list(res.point_done) == fast_twin(g, 1, 2, queue)[2]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("queue", [0, 1, 3])
def test_fast_engine_matches_its_twin_with_other_queue_depths(seed, queue):
    # Shallow queues hold links behind a hold-up longest: the wormhole pass the engine skips
    # for a message that never waited past its first link must give the twin's times.
    g = random_graph(seed + 20)
    res = fast.run(g, 1, 2, queue)
    start, end, point_done, _ = fast_twin(g, 1, 2, queue)
    assert list(res.task_start) == start and list(res.task_end) == end
    assert list(res.point_done) == point_done


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("vcs, queue", [(1, 1), (3, 2), (32, 5)])
def test_cycle_engine_matches_its_twin_with_other_router_fields(seed, vcs, queue):
    g = random_graph(seed + 30)
    res = cycle.run_graph(g, vcs, queue, 1, 2, 20_000, check=True)
    # The engine puts color class c on channel c % vcs; the twin takes the channels as given.
    on_channels = dataclasses.replace(g.msgs, vc=g.msgs.vc % vcs)
    _, _, t_done, _, _, start, end = cycle_twin(g.width, g.height, vcs, queue, 1, 2,
                                                on_channels, 20_000, graph=g)
    assert list(res.task_start) == start and list(res.task_end) == end
    assert np.array_equal(res.t_done, t_done) and res.violation_cycle == -1
