"""A stage's use per kernel, counted in one pass, is what masking the tasks kernel by kernel
gives."""

import numpy as np
import pytest

from wse_emu.engines.usage import kernel_usage


@pytest.mark.parametrize("seed", range(12))
def test_each_kernels_span_and_busiest_pe_are_numpys(seed):
    rng = np.random.default_rng(seed)
    tasks, kinds, pes = int(rng.integers(0, 400)), int(rng.integers(1, 9)), int(rng.integers(1, 30))
    kind = rng.integers(-1, kinds + 1, tasks)  # a few outside the kernels: counted per PE only
    pe = rng.integers(0, pes, tasks)
    cycles = rng.integers(0, 50, tasks)
    start = rng.integers(0, 1000, tasks)
    end = start + cycles
    busy, count, first, last, busiest = kernel_usage(kind, pe, cycles, start, end, kinds, pes)
    assert np.array_equal(busy, np.bincount(pe, weights=cycles, minlength=pes).astype(np.int64))
    for k in range(kinds):
        sel = kind == k
        assert count[k] == sel.sum()
        if sel.any():
            assert (first[k], last[k]) == (start[sel].min(), end[sel].max())
            assert busiest[k] == np.bincount(pe[sel], weights=cycles[sel]).max()
