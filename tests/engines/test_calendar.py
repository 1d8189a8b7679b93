"""The event calendar pops exactly what a heap of every pending event pops, in the same order,
however far ahead events are filed and whatever is filed for the cycle being handled."""

import heapq

import numpy as np
from numba import njit

from wse_emu.engines import calendar, heap


@njit
def _drain(cal, times, keys, spawn, gaps):
    """File events (``times``, ``keys``); pop them all, and each popped event with
    ``spawn[k]`` files one more, ``gaps[k]`` cycles after it (0: for the cycle being
    handled), keyed above every given key. Returns the (cycle, key) popped, in order."""
    size = 0
    for i in range(len(times)):
        size = calendar.push(cal, size, times[i], keys[i])
    out_t, out_k = np.empty(4 * len(times), np.int64), np.empty(4 * len(times), np.int64)
    n = 0
    made = len(keys)
    while size > 0:
        t, key, size = calendar.pop(cal, size)
        out_t[n], out_k[n] = t, key
        n += 1
        k = key % len(spawn)
        if key < len(keys) and spawn[k]:
            size = calendar.push(cal, size, t + gaps[k], made)
            made += 1
    return out_t[:n], out_k[:n]


def _heap_order(times, keys, spawn, gaps):
    events = list(zip(times.tolist(), keys.tolist()))
    heapq.heapify(events)
    made, out = len(keys), []
    while events:
        t, key = heapq.heappop(events)
        out.append((t, key))
        k = key % len(spawn)
        if key < len(keys) and spawn[k]:
            heapq.heappush(events, (t + int(gaps[k]), made))
            made += 1
    return out


def test_the_calendar_pops_what_a_heap_pops_near_and_far():
    rng = np.random.default_rng(7)
    n = 5000
    # Most events close together, some past the window, some in the same cycles.
    times = np.concatenate([rng.integers(0, 300, n - 200),
                            rng.integers(0, 5 * calendar.WINDOW, 200)]).astype(np.int64)
    keys = rng.permutation(n).astype(np.int64)
    spawn = rng.random(n) < 0.5
    gaps = np.where(rng.random(n) < 0.3, 0,
                    rng.integers(1, 3 * calendar.WINDOW, n)).astype(np.int64)
    cal = calendar.new_calendar(4 * n, 0)
    got_t, got_k = _drain(cal, times, keys, spawn, gaps)
    assert list(zip(got_t.tolist(), got_k.tolist())) == _heap_order(times, keys, spawn, gaps)


@njit
def _due_by_cycle(cal, times, keys, last):
    """The cycle engine's use: cycle by cycle, pop what is due, and file, for each event
    popped, one more at the cycle after it (keyed above the rest)."""
    size = 0
    for i in range(len(times)):
        size = calendar.push(cal, size, times[i], keys[i])
    popped = []
    made = len(keys)
    for t in range(last):
        while size > 0 and calendar.due(cal, t):
            at, key, size = calendar.pop(cal, size)
            popped.append((t, at, key))
            if key < len(keys) and key % 3 == 0:
                size = calendar.push(cal, size, t + 1, made)
                made += 1
    return popped


def test_the_cycle_by_cycle_use_pops_each_event_in_its_own_cycle():
    rng = np.random.default_rng(3)
    times = np.concatenate([rng.integers(0, 500, 400),
                            rng.integers(0, 3 * calendar.WINDOW, 40)]).astype(np.int64)
    keys = np.arange(len(times), dtype=np.int64)
    popped = _due_by_cycle(calendar.new_calendar(2000, 0), times, keys, 3 * calendar.WINDOW + 2)
    assert all(t == at for t, at, _ in popped)
    expected = sorted(zip(times.tolist(), keys.tolist()))
    given = [(at, key) for _, at, key in popped if key < len(keys)]
    assert given == expected
    assert len(popped) - len(given) == sum(1 for k in keys if k % 3 == 0)


@njit
def _keys_in_and_out(pushes, pops):
    """Push ``pushes`` onto a heap of keys alone, popping ``pops[i]`` keys after the i-th
    push (as many as there are), then the rest; the keys popped, in order."""
    keys = np.empty(len(pushes), np.int64)
    out = np.empty(len(pushes), np.int64)
    size = n = 0
    for i in range(len(pushes)):
        size = heap.push_key(keys, size, pushes[i])
        for _ in range(min(pops[i], size)):
            out[n], size = heap.pop_key(keys, size)
            n += 1
    while size > 0:
        out[n], size = heap.pop_key(keys, size)
        n += 1
    return out


def test_a_heap_of_keys_pops_what_heapq_pops():
    # The calendar's current cycle keeps keys alone: the same order as a heap of them.
    rng = np.random.default_rng(11)
    pushes = rng.permutation(3000).astype(np.int64)
    pops = rng.integers(0, 3, len(pushes)).astype(np.int64)
    expected, pending = [], []
    for key, count in zip(pushes.tolist(), pops.tolist()):
        heapq.heappush(pending, key)
        for _ in range(min(count, len(pending))):
            expected.append(heapq.heappop(pending))
    expected += [heapq.heappop(pending) for _ in range(len(pending))]
    assert _keys_in_and_out(pushes, pops).tolist() == expected


@njit
def _fill_and_drain(cal, spread, crowded):
    """File one event in each of ``spread`` buckets and ``crowded`` more in one of them (the
    most blocks a number of events can take: one part-filled block per bucket), then pop them
    all; returns the furthest into the block array any filing reached and the number popped."""
    size = 0
    for k in range(spread):
        size = calendar.push(cal, size, 1 + k, k)
    for k in range(crowded):
        size = calendar.push(cal, size, 1, spread + k)
    reached = cal.state[calendar._UNUSED]  # the next block never used, a word offset
    popped = 0
    while size > 0:
        _, _, size = calendar.pop(cal, size)
        popped += 1
    return reached, popped


def test_the_blocks_suffice_for_as_many_events_as_the_calendar_is_made_for():
    # The worst case: every bucket of the window part-filled, and one bucket's list long.
    spread = calendar.WINDOW - 1
    crowded = 3 * calendar.KEYS_PER_BLOCK + 1
    cal = calendar.new_calendar(spread + crowded, 0)
    reached, popped = _fill_and_drain(cal, spread, crowded)
    assert popped == spread + crowded
    assert reached <= len(cal.blocks)
    # one block a bucket, the crowded one's 1 + 22 keys in four: three more
    assert reached == calendar.BLOCK * (spread + 3)
