"""The prefetch hint changes no result: it only asks for lines ahead of their use."""

import numpy as np
from numba import njit

from wse_emu.engines.prefetch import prefetch


@njit
def _gather(values, order):
    total = 0
    for i in range(len(order)):
        if i + 4 < len(order):
            prefetch(values, order[i + 4])
        total += values[order[i]]
    # Past the end: a request the processor drops, never a fault.
    prefetch(values, len(values) + 1_000_000)
    return total


def test_a_gather_with_prefetches_sums_what_it_gathers():
    rng = np.random.default_rng(3)
    order = rng.integers(0, 10_000, 50_000)
    for dtype in (np.int64, np.int32):  # one intrinsic for arrays of any item size
        values = rng.integers(-1000, 1000, 10_000).astype(dtype)
        assert _gather(values, order) == int(values[order].astype(np.int64).sum())
