"""The worker pool: every kind gives the same results as running the points here."""

import operator

import pytest

from wse_emu.runtime import workers as pool_module
from wse_emu.runtime.workers import point_pool


def test_without_dask_points_run_on_worker_processes(monkeypatch):
    monkeypatch.setattr(pool_module, "dask_available", lambda: False)
    with point_pool(None, 2) as pool:
        assert isinstance(pool, pool_module._Processes)
        add_ten = pool.bind(operator.add, (10,))
        assert add_ten([(1,), (2,), (3,)]) == [11, 12, 13]  # in job order
        times = pool.bind(operator.mul, (3,))  # a new binding replaces the old in the workers
        assert times([(1,), (2,)]) == [3, 6]
        assert add_ten([(5,)]) == [15]
        assert sorted(pool.imap(pow, [(2, 3), (3, 2), (2, 2)])) == [4, 8, 9]
        with pytest.raises(ZeroDivisionError):  # a job's error reaches the caller
            pool.bind(operator.truediv, (1,))([(0,)])


def test_one_worker_runs_here():
    with point_pool(None, 1) as pool:
        assert isinstance(pool, pool_module._Here)
        assert pool.bind(operator.add, (1,))([(1,)]) == [2]
