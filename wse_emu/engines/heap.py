"""The event heap: pending events kept in a min-heap on (cycle, key). The engines' calendar
(``calendar``) keeps the current cycle's events in one, and those due far ahead in another.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from wse_emu.engines.records import record


@record
class EventHeap:
    """The pending events: a min-heap on (cycle, key) whose first ``size`` entries (kept by
    the caller) are in use."""

    time: np.int64  # (capacity,): cycle of each entry
    key: np.int64  # (capacity,): event kind << ID_BITS | an id whose meaning depends on the kind


# A 4-ary heap: half the levels of a binary one, and a node's four children share a cache
# line or two, so a pop from a heap of 10^5 events waits on memory half as often. Any
# min-heap pops the same sequence of (cycle, key) pairs, so the shape changes no result.

@njit(cache=True, inline="always")
def push(heap, size, t, key):
    """Add the event (``t``, ``key``) to a ``heap`` of ``size`` entries (which has room for
    it: see ``calendar.new_calendar``). Equal cycles pop in increasing key order. Returns the
    new size."""
    ht, hk = heap.time, heap.key
    i = size
    while i > 0:  # sift up: move parents down until the new entry's place is found
        parent = (i - 1) >> 2
        pt, pk = ht[parent], hk[parent]
        if t < pt or (t == pt and key < pk):
            ht[i], hk[i] = pt, pk
            i = parent
        else:
            break
    ht[i], hk[i] = t, key
    return size + 1


@njit(cache=True, inline="always")
def pop(heap, size):
    """Remove the smallest (cycle, key) entry of a ``heap`` of ``size`` >= 1 entries.
    Returns its cycle, its key and the new size."""
    ht, hk = heap.time, heap.key
    t, key = ht[0], hk[0]
    size -= 1
    lt, lk = ht[size], hk[size]  # the last entry, sifted down from the root
    i = 0
    while True:
        first = 4 * i + 1
        if first >= size:
            break
        child = first
        ct, ck = ht[first], hk[first]
        for c in range(first + 1, min(first + 4, size)):
            if ht[c] < ct or (ht[c] == ct and hk[c] < ck):
                child, ct, ck = c, ht[c], hk[c]
        if ct < lt or (ct == lt and ck < lk):
            ht[i], hk[i] = ct, ck
            i = child
        else:
            break
    ht[i], hk[i] = lt, lk
    return t, key, size


# The calendar's current cycle (``calendar``) holds events of one cycle alone: a heap of their
# keys, without the cycle beside each, pops them in the same order with half the memory read.

@njit(cache=True, inline="always")
def push_key(keys, size, key):
    """``push`` for a heap of keys alone (every entry of one cycle): ``keys`` has room for
    one more. Returns the new size."""
    i = size
    while i > 0:
        parent = (i - 1) >> 2
        pk = keys[parent]
        if key < pk:
            keys[i] = pk
            i = parent
        else:
            break
    keys[i] = key
    return size + 1


@njit(cache=True, inline="always")
def pop_key(keys, size):
    """``pop`` for a heap of keys alone. Returns the smallest key and the new size."""
    key = keys[0]
    size -= 1
    last = keys[size]
    i = 0
    while True:
        first = 4 * i + 1
        if first >= size:
            break
        child, ck = first, keys[first]
        for c in range(first + 1, min(first + 4, size)):
            if keys[c] < ck:
                child, ck = c, keys[c]
        if ck < last:
            keys[i] = ck
            i = child
        else:
            break
    keys[i] = last
    return key, size
