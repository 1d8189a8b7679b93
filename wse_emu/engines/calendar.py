"""The engines' event calendar: pending events filed by the cycle they are due.

Events are due at whole cycles, never before the cycle being handled, and a step has a few
hundred thousand of them pending at once. A heap of that size costs about ten cache misses a
pop. The calendar files each event under its cycle instead: a ring of ``WINDOW`` buckets, one
per cycle from the current one on, each a list of blocks of keys (a cache line each, seven
keys and the link to the next block, so that emptying a bucket waits for memory once per
seven events, where a list of single events waited once per event); an event due further
ahead waits in a small overflow heap. When the current cycle's events are used up, the next
bucket that holds any (or the overflow's earliest, if sooner) is emptied into a heap of that
cycle's events alone, a few dozen, from which they pop in key order. A bucket's blocks and
the current heap are all of one cycle, so they keep keys alone (the cycle is the bucket's,
or the current one). Filing an event is a write to its bucket; a pop works on a heap that
stays in the nearest cache. The fast engine pops the next event whenever it comes; the
cycle engine asks, cycle by cycle, whether one is due (``due``).

It pops exactly the sequence (cycle, key) a heap of every pending event pops: every event of
a cycle is in the current heap before the first of them pops, and an event filed for the
current cycle while it is being handled (a DISPATCH, a zero-cycle task's DONE) joins that heap.
Keys are distinct, so the order is total.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from wse_emu.engines import heap
from wse_emu.engines.heap import EventHeap
from wse_emu.engines.prefetch import prefetch
from wse_emu.engines.records import Fill, make, record

WINDOW = 1 << 16  # buckets: cycles ahead filed directly (a decode step's tasks take fewer)
_MASK = WINDOW - 1
# A block of a bucket's list: eight words, a cache line, at a word offset of ``blocks`` that
# is a multiple of eight (the bucket heads, the free list and the links all hold offsets).
# In a bucket's list its first word holds the next block's offset plus one (0: none) above
# ``_USED_BITS`` bits counting its keys, which follow; on the free list, the next free
# block's offset plus one, unshifted.
BLOCK = 8
KEYS_PER_BLOCK = BLOCK - 1
_USED_BITS = 3
_USED_MASK = (1 << _USED_BITS) - 1
assert KEYS_PER_BLOCK <= _USED_MASK
# Entries of ``Calendar.state``: the cycle being handled, events in the buckets, the head of
# the list of freed blocks, the next block never used, and the sizes of the two heaps.
_NOW, _FILED, _FREE, _UNUSED, _LATER, _CURRENT = range(6)
_NEVER = (1 << 62)  # a cycle no run reaches


@record
class Calendar:
    """Pending events: the current cycle's keys in a heap (``now_key``), the next
    ``WINDOW`` - 1 cycles' in per-cycle lists of blocks (``bucket``, ``blocks``), later ones
    in a heap (``later_*``)."""

    state: np.int64  # (6,): see _NOW ... _CURRENT
    # (WINDOW,): the cycle's (cycle % WINDOW) first block, the one being filled; -1: none
    bucket: np.int64
    # (BLOCK * blocks,): the blocks, one a cache line: the link and count word, then the keys
    # of events filed (their cycle is their bucket's); a freed block's link word links the
    # list of free blocks
    blocks: np.int64
    now_key: np.int64  # (capacity,): the current cycle's heap of keys (``heap.push_key``)
    later_time: np.int64  # (capacity,): the heap of events due WINDOW cycles or more ahead
    later_key: np.int64


def new_calendar(tasks: int, pes: int, releases: int = 0) -> Calendar:
    """An empty calendar at cycle 0 with room for every event that can be pending at once, so
    that it never grows: per task one READY or DONE (READY is queued once, when its last
    input arrives, and DONE once it has started), per PE one DISPATCH
    (``cores.dispatch_due``), and the ``releases`` of external messages the fast engine queues
    at the start. Its arrays are left as the allocator hands them out; only what is used is
    touched."""
    capacity = max(tasks + pes + releases, 1)
    # Blocks: every full one, and at most one being filled per bucket that holds any.
    blocks = capacity // KEYS_PER_BLOCK + min(capacity, WINDOW) + 1
    state = np.zeros(6, dtype=np.int64)
    state[_FREE] = -1
    # ``Fill`` starts each array on a cache line, so a block is one line.
    return make(Calendar, state=state, bucket=Fill(WINDOW, -1), blocks=Fill(BLOCK * blocks),
                now_key=Fill(capacity), later_time=Fill(capacity), later_key=Fill(capacity))


@njit(cache=True, inline="always")
def push(cal, size, t, key):
    """File the event (``t``, ``key``), due no earlier than the cycle being handled, among
    ``size`` pending ones. Returns the new number pending."""
    state = cal.state
    now = state[_NOW]
    if t == now:
        state[_CURRENT] = heap.push_key(cal.now_key, state[_CURRENT], key)
    elif t - now < WINDOW:
        blocks = cal.blocks
        b = t & _MASK
        first = cal.bucket[b]
        if first < 0 or (blocks[first] & _USED_MASK) == KEYS_PER_BLOCK:
            # a new block at the head of the bucket's list, from the free list or unused
            block = state[_FREE]
            if block >= 0:
                state[_FREE] = blocks[block] - 1
            else:
                block = state[_UNUSED]
                state[_UNUSED] = block + BLOCK
            blocks[block] = (first + 1) << _USED_BITS
            cal.bucket[b] = first = block
        used = blocks[first] & _USED_MASK
        blocks[first + 1 + used] = key
        blocks[first] += 1
        state[_FILED] += 1
    else:
        state[_LATER] = heap.push(EventHeap(cal.later_time, cal.later_key), state[_LATER], t,
                                  key)
    return size + 1


@njit(cache=True, inline="always")
def pop(cal, size):
    """Remove the earliest (cycle, key) of the ``size`` >= 1 pending events. Returns its
    cycle, its key and the number left."""
    state = cal.state
    if state[_CURRENT] == 0:
        _next_cycle(cal, _NEVER)
    key, state[_CURRENT] = heap.pop_key(cal.now_key, state[_CURRENT])
    return state[_NOW], key, size - 1


@njit(cache=True, inline="always")
def current(cal):
    """The cycle being handled and how many of its events are still to pop; they are the
    first that many entries of ``cal.now_key``, in no order (a caller may read them ahead,
    as the fast engine does to prefetch what they will read)."""
    return cal.state[_NOW], cal.state[_CURRENT]


# Cycles after the current one whose first block ``prefetch_ahead`` asks for.
AHEAD = 4


@njit(cache=True, inline="always")
def prefetch_ahead(cal):
    """Ask for the first block of each of the next ``AHEAD`` cycles' buckets (``prefetch``):
    the buckets' heads lie side by side, their blocks anywhere, so a bucket's first block is
    the read that waits for memory when its cycle comes."""
    now = cal.state[_NOW]
    for c in range(now + 1, now + 1 + AHEAD):
        block = cal.bucket[c & _MASK]
        if block >= 0:
            prefetch(cal.blocks, block)


@njit(cache=True, inline="always")
def due(cal, t):
    """Whether an event is due by cycle ``t`` (then ``pop`` returns it), for a caller that
    handles the cycles in turn, filing nothing before the cycle it handles (the cycle
    engine)."""
    return cal.state[_CURRENT] > 0 or _next_cycle(cal, t)


@njit(cache=True, inline="always")
def _next_cycle(cal, until):
    """Move on to the next cycle that has events, if it comes by cycle ``until`` (the current
    one has none left): empty its bucket, and the later heap's events of that cycle, into the
    current heap, and return True. If none comes by then, the calendar moves on to ``until``
    and returns False."""
    state = cal.state
    now = state[_NOW]
    t = until + 1  # none due by ``until``, unless one is found below
    if state[_LATER] > 0 and cal.later_time[0] < t:
        t = cal.later_time[0]
    if state[_FILED] > 0:
        # The first bucket with events before ``t``; every filed event is due in the window.
        end = min(t, now + WINDOW)
        c = now + 1
        while c < end and cal.bucket[c & _MASK] < 0:
            c += 1
        if c < end:
            t = c
    if t > until:
        if until > now:
            state[_NOW] = until
        return False
    state[_NOW] = t
    now_keys = cal.now_key
    blocks = cal.blocks
    count = 0
    b = t & _MASK
    block = cal.bucket[b]
    while block >= 0:  # the bucket holds cycle t's events alone
        word = blocks[block]
        used = word & _USED_MASK
        for k in range(block + 1, block + 1 + used):
            count = heap.push_key(now_keys, count, blocks[k])
        state[_FILED] -= used
        blocks[block] = state[_FREE] + 1  # onto the free list
        state[_FREE] = block
        block = (word >> _USED_BITS) - 1
    cal.bucket[b] = -1
    later = EventHeap(cal.later_time, cal.later_key)
    waiting = state[_LATER]
    while waiting > 0 and cal.later_time[0] == t:
        _, key, waiting = heap.pop(later, waiting)
        count = heap.push_key(now_keys, count, key)
    state[_LATER] = waiting
    state[_CURRENT] = count
    return True
