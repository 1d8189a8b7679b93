"""Running independent jobs (serving runs, sweep points, stage-table shapes) in parallel, with
dask.distributed.

A serving run holds the interpreter for its setup and its metrics, so threads would share one
core; a local cluster of worker processes (one thread each) uses them all, and a scheduler
address reaches a real cluster, whose workers then also time the stage tables (``remote``).
Without dask installed, local jobs run on worker processes of the standard library instead
(or, with one worker, one after another in this process): the results are the same. Every
pool's ``bind(function, shared)`` gives ``run(jobs, done=None)``, which calls ``done(count)``
as each job finishes, so that progress never waits for a whole round.
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

    remote = False

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

    remote = False

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
    def __init__(self, client, remote: bool):
        self.client = client
        self.remote = remote  # a cluster's: its workers time stage tables too

    def bind(self, function, shared: tuple):
        """``run(jobs, done=None)``: ``function(*shared, *job)`` for every job on the
        cluster, results in job order; ``shared`` (large, the same for every job) goes to each
        worker once."""
        from dask.distributed import as_completed as completed

        handles = self.client.scatter(list(shared), broadcast=True)

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
    if scheduler is None and workers == 1:
        yield _Here()
        return
    if scheduler is None and not dask_available():
        pool = _Processes(workers)
        try:
            yield pool
        finally:
            pool.close()
        return
    if not dask_available():
        raise UserError("`scheduler` needs dask.distributed: pip install -e '.[sweep]'")
    from dask.distributed import Client, LocalCluster

    # The scheduler and nannies log their life story at INFO; keep the output ours.
    logging.getLogger("distributed").setLevel(logging.ERROR)
    cluster = None
    try:
        if scheduler is None:
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                   dashboard_address=":0", silence_logs=logging.ERROR)
            client = Client(cluster)
        else:
            client = Client(scheduler, timeout="5s")
    except (OSError, ValueError, TypeError) as exc:  # unreachable, or a malformed address
        if cluster is not None:
            cluster.close()
        what = f"reach the dask scheduler {scheduler}" if scheduler else \
            "start a local dask cluster"
        raise UserError(f"cannot {what}: {' '.join(str(exc).split())}") from None
    try:
        yield _Dask(client, remote=scheduler is not None)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
