"""Running independent jobs (serving runs, sweep points, stage-table shapes) in parallel: on
this machine's worker processes, or on a dask.distributed cluster given by its scheduler's
address.

A serving run holds the interpreter for its setup and its metrics, so threads would share one
core; worker processes (one per core, started fresh) use them all. Locally they are the standard
library's, not a local dask cluster, whose scheduler shares the cores and the parent's
interpreter with the work: the 8B frontier, its stage tables cached (thousands of serving runs
of about 80 ms each), took 128 s on them and 215 s on a local dask cluster (one run of each). A
scheduler address reaches a real cluster. Stage-table shapes are timed on the pool's workers
too (``parallel``): building a shape's task graph holds the interpreter, so threads would leave
a core idle. With one worker, serving runs go one after another in this process (and table
shapes on its threads, the engine releasing the GIL). The results are the same on every pool.
Every pool's ``bind(function, shared)`` gives ``run(jobs, done=None)``, which calls
``done(count)`` as each job finishes, so that progress never waits for a whole round.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import pickle
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager

from wse_emu.errors import UserError


def dask_available() -> bool:
    try:
        import dask.distributed  # noqa: F401
    except ImportError:
        return False
    return True


class _Here:
    """Runs jobs in this process, one after another."""

    parallel = False

    def bind(self, function, shared: tuple):
        def run(jobs, done=None):
            out = []
            for job in jobs:
                out.append(function(*shared, *job))
                if done:
                    done(len(out))
            return out

        return run

    def imap(self, function, jobs):
        """``function(*job)`` of every job, yielded as each finishes."""
        for job in jobs:
            yield function(*job)


class _Processes:
    """Runs jobs on local worker processes (started fresh, not forked: the parent may hold
    threads)."""

    parallel = True

    def __init__(self, workers: int):
        self.executor = ProcessPoolExecutor(workers,
                                            mp_context=multiprocessing.get_context("spawn"))
        self.tokens = itertools.count()

    def bind(self, function, shared: tuple):
        """``run(jobs, done=None)``: ``function(*shared, *job)`` for every job, results in job
        order. ``shared`` travels pickled with each job but is unpickled once per worker."""
        token = (os.getpid(), next(self.tokens))
        blob = pickle.dumps((function, shared))

        def run(jobs, done=None):
            futures = [self.executor.submit(_bound_call, token, blob, job) for job in jobs]
            return gathered(futures, as_completed, done)

        return run

    def imap(self, function, jobs):
        """``function(*job)`` of every job, yielded as each finishes (not in job order)."""
        futures = [self.executor.submit(function, *job) for job in jobs]
        try:
            for future in as_completed(futures):
                yield future.result()
        finally:
            for future in futures:
                future.cancel()

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)


HERE = _Here()  # jobs in this process, one after another (for a caller given no pool)


_BOUND: dict = {}  # in a worker process: token -> (function, shared) of the latest binding


def _bound_call(token: tuple, blob: bytes, job: tuple):
    if token not in _BOUND:
        _BOUND.clear()
        _BOUND[token] = pickle.loads(blob)
    function, shared = _BOUND[token]
    return function(*shared, *job)


def gathered(futures: list, completed, done) -> list:
    """The futures' results in their order, ``done(count)`` told as each finishes; on an error
    (or Ctrl-C) the others are cancelled."""
    try:
        for count, _ in enumerate(completed(futures), 1):
            if done:
                done(count)
        return [f.result() for f in futures]
    except BaseException:
        for f in futures:
            f.cancel()
        raise


class _Dask:
    """Runs jobs on a dask.distributed cluster's workers."""

    parallel = True

    def __init__(self, client):
        self.client = client

    def bind(self, function, shared: tuple):
        """``run(jobs, done=None)``: ``function(*shared, *job)`` for every job on the
        cluster, results in job order; ``shared`` (large, the same for every job) goes to each
        worker once."""
        from dask.distributed import as_completed as completed

        # dask refuses to scatter nothing, and a job with nothing shared needs no handles.
        handles = self.client.scatter(list(shared), broadcast=True) if shared else []

        def run(jobs, done=None):
            futures = [self.client.submit(function, *handles, *job, pure=False) for job in jobs]
            return gathered(futures, completed, done)

        return run

    def imap(self, function, jobs):
        """``function(*job)`` of every job on the cluster, yielded as each finishes (not in
        job order)."""
        from dask.distributed import as_completed

        futures = [self.client.submit(function, *job, pure=False) for job in jobs]
        for future in as_completed(futures):
            yield future.result()


@contextmanager
def point_pool(scheduler: str | None = None, workers: int = 0):
    """Yields a pool whose ``bind(function, shared)`` gives ``run(jobs, done=None)``.
    ``workers``: local worker processes (0: one per core; 1: no cluster, run here). Connects
    at once, so that a bad scheduler address fails before any work."""
    workers = workers or os.cpu_count() or 1
    if scheduler is None:
        pool = _Here() if workers == 1 else _Processes(workers)
        try:
            yield pool
        finally:
            if isinstance(pool, _Processes):
                pool.close()
        return
    if not dask_available():
        raise UserError("`scheduler` needs dask.distributed: pip install -e '.[sweep]'")
    from dask.distributed import Client

    # The scheduler and nannies log their life story at INFO; keep the output ours.
    logging.getLogger("distributed").setLevel(logging.ERROR)
    try:
        client = Client(scheduler, timeout="5s")
    except (OSError, ValueError, TypeError) as exc:  # unreachable, or a malformed address
        raise UserError(f"cannot reach the dask scheduler {scheduler}: "
                        f"{' '.join(str(exc).split())}") from None
    try:
        yield _Dask(client)
    finally:
        client.close()
