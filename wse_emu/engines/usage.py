"""What a stage's tasks used, per kernel, after either engine has timed them."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def kernel_usage(kind: np.ndarray, pe: np.ndarray, cycles: np.ndarray, start: np.ndarray,
                 end: np.ndarray, kinds: int, pes: int):
    """Per PE, the core cycles of all its tasks; and per kernel (task kind ``0..kinds-1``;
    a task of another kind counts only to its PE) its tasks' count, first start, last end and
    the core cycles of its busiest PE.

    The tasks are grouped by kernel once (a counting sort), and each kernel's cycles summed
    per PE in one scratch row, cleared behind it: numpy masked every task array once per
    kernel instead (seventeen times for a layer with its LM head)."""
    busy = np.zeros(pes, dtype=np.int64)
    count = np.zeros(kinds, dtype=np.int64)
    for t in range(len(kind)):
        busy[pe[t]] += cycles[t]
        if 0 <= kind[t] < kinds:
            count[kind[t]] += 1
    offset = np.zeros(kinds + 1, dtype=np.int64)
    for k in range(kinds):
        offset[k + 1] = offset[k] + count[k]
    order = np.empty(offset[kinds], dtype=np.int64)
    fill = offset[:-1].copy()
    for t in range(len(kind)):
        k = kind[t]
        if 0 <= k < kinds:
            order[fill[k]] = t
            fill[k] += 1
    first = np.zeros(kinds, dtype=np.int64)
    last = np.zeros(kinds, dtype=np.int64)
    busiest = np.zeros(kinds, dtype=np.int64)
    row = np.zeros(pes, dtype=np.int64)
    for k in range(kinds):
        for i in range(offset[k], offset[k + 1]):
            t = order[i]
            if i == offset[k] or start[t] < first[k]:
                first[k] = start[t]
            if i == offset[k] or end[t] > last[k]:
                last[k] = end[t]
            row[pe[t]] += cycles[t]
        for i in range(offset[k], offset[k + 1]):
            p = pe[order[i]]
            if row[p] > busiest[k]:
                busiest[k] = row[p]
            row[p] = 0
    return busy, count, first, last, busiest
