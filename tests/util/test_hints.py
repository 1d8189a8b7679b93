"""``util.hints.unlikely``: a branch hint that changes no value."""

import numpy as np
from numba import njit

from wse_emu.util.hints import unlikely


@njit(cache=False)
def _recurrence(free, times, enter, hinted):
    """The serving loop's pipeline recurrence, with the stage-busy test hinted or not."""
    t = enter
    for s in range(free.shape[0]):
        f = free[s]
        if hinted:
            if unlikely(f > t):
                t = f
        elif f > t:
            t = f
        t += times[s]
        free[s] = t
    return t


@njit(cache=False)
def _passes(cond):
    return unlikely(cond)


def test_the_condition_passes_through():
    assert _passes(True) is True
    assert _passes(False) is False


def test_a_hinted_recurrence_gives_the_same_floats():
    rng = np.random.default_rng(3)
    times = rng.random(32) * 1e-4
    plain, hinted = np.zeros(32), np.zeros(32)
    for enter in np.cumsum(rng.exponential(5e-5, 2_000)):
        a = _recurrence(plain, times, enter, False)
        b = _recurrence(hinted, times, enter, True)
        assert a == b
    assert np.array_equal(plain, hinted)
