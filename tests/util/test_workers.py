"""The worker pool: every kind gives the same results as running the points here; a job's
error reaches the caller; Ctrl-C is the parent's alone, and ends every worker at once."""

import operator
import os
import signal
import threading
import time

import pytest

from wse_emu.util import workers as pool_module
from wse_emu.util.workers import point_pool


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


def _alive(pid: int) -> bool:
    """Whether process ``pid`` is still there (a zombie not yet reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_job_error_keeps_its_type_and_says_where_it_was_raised():
    with point_pool(None, 2) as pool:
        with pytest.raises(ZeroDivisionError) as caught:
            pool.bind(operator.truediv, (1,))([(1,), (0,), (2,)])
        assert "ZeroDivisionError" in str(caught.value.__cause__)  # the worker's traceback
        assert pool.bind(operator.add, (1,))([(1,)]) == [2]  # the pool still serves


def test_workers_leave_ctrl_c_to_the_parent():
    """A terminal's Ctrl-C reaches every process of the group: the workers ignore it (no
    traceback of theirs, no job lost), so that only the parent decides what it means."""
    with point_pool(None, 2) as pool:
        run = pool.bind(time.sleep, ())
        pids = []
        threading.Timer(0.4, lambda: [os.kill(w.process.pid, signal.SIGINT) or
                                      pids.append(w.process.pid)
                                      for w in pool.workers]).start()
        assert run([(1.0,), (1.0,)]) == [None, None]
        assert len(pids) == 2


def test_ctrl_c_ends_the_workers_at_once():
    """Ctrl-C in the parent while jobs of a minute run: the call raises KeyboardInterrupt in
    about the time workers get to stop (SIGTERM, then SIGKILL), and no worker is left."""
    pids = []

    def ctrl_c(pool):
        pids.extend(w.process.pid for w in pool.workers)
        # A real SIGINT, as the terminal sends: it also cuts short the wait for results.
        os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        with point_pool(None, 2) as pool:
            run = pool.bind(time.sleep, ())
            threading.Timer(1.0, ctrl_c, (pool,)).start()
            began = time.monotonic()
            try:
                run([(60,), (60,), (60,)])
            finally:
                took = time.monotonic() - began
                left = list(pool.workers)
    assert took < 1.0 + pool_module.END_GRACE_S + 2.0
    assert len(pids) == 2 and not left and not any(_alive(pid) for pid in pids)


def test_a_worker_killed_midway_is_an_error_not_a_hang():
    with point_pool(None, 2) as pool:
        run = pool.bind(time.sleep, ())
        threading.Timer(0.5, lambda: os.kill(pool.workers[0].process.pid,
                                             signal.SIGKILL)).start()
        with pytest.raises(pool_module.WorkerLost):
            run([(30,), (30,)])
        assert not pool.workers  # the other, at work on what nobody will read, was ended


def _noisy_sleep(seconds: float) -> None:
    """A job that prints on its way out, as an extension's import does when a stop lands
    inside it."""
    import sys

    try:
        time.sleep(seconds)
    finally:
        print("a traceback nobody should see", file=sys.stderr, flush=True)


def test_a_worker_told_to_stop_prints_nothing(capfd):
    """Ended at work (SIGTERM), a worker unwinds without a word: the parent's line is the
    only one."""
    with point_pool(None, 2) as pool:
        run = pool.bind(_noisy_sleep, ())
        threading.Timer(0.5, lambda: os.kill(pool.workers[0].process.pid,
                                             signal.SIGTERM)).start()
        with pytest.raises(pool_module.WorkerLost):
            run([(30,), (30,)])
    assert "nobody should see" not in capfd.readouterr().err


def test_workers_start_with_one_blas_thread_and_leave_ours_as_it_was(monkeypatch):
    # One worker per core already: BLAS threads of their own would spin on the others' cores.
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "3")  # a number the user set is kept
    with point_pool(None, 2) as pool:
        seen = pool.bind(os.getenv, ())([("OPENBLAS_NUM_THREADS",), ("MKL_NUM_THREADS",)])
    assert seen == ["1", "3"]
    assert "OPENBLAS_NUM_THREADS" not in os.environ
    assert os.environ["MKL_NUM_THREADS"] == "3"
