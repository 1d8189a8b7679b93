"""Running independent jobs (serving runs, sweep points, stage-table shapes) in parallel: on
this machine's worker processes, or on a dask.distributed cluster given by its scheduler's
address.

A serving run holds the interpreter for its setup and its metrics, so threads would share one
core; worker processes (one per core, started fresh) use them all. Locally they are processes
of this module's own small pool, not a local dask cluster, whose scheduler shares the cores and
the parent's interpreter with the work: the 8B frontier, its stage tables cached (thousands of
serving runs of about 80 ms each), took 128 s on the standard library's process pool and 215 s
on a local dask cluster (one run of each). A scheduler address reaches a real cluster.
Stage-table shapes are timed on the pool's workers too (``parallel``): building a shape's task
graph holds the interpreter, so threads would leave a core idle. With one worker, serving runs
go one after another in this process (and table shapes on its threads, the engine releasing
the GIL). The results are the same on every pool.
Every pool's ``bind(function, shared)`` gives ``run(jobs, done=None)``, which calls
``done(count)`` as each job finishes, so that progress never waits for a whole round.

Why a pool of our own rather than ``concurrent.futures.ProcessPoolExecutor``: Ctrl-C. The
executor's workers took the terminal's SIGINT too and died printing tracebacks, one of them
sometimes while holding the lock of the queue the others read, and the parent then waited
forever in the executor's shutdown (or in its management thread, joined at exit). Here each
worker has a pipe of its own, ignores SIGINT from its first instruction (so only this process
decides what Ctrl-C means), and is ended (SIGTERM, then SIGKILL) when the work it holds is
abandoned; no thread of ours outlives a call.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import pickle
import signal
import threading
import time
import traceback
from collections import deque
from contextlib import contextmanager
from multiprocessing.connection import wait

from wse_emu.errors import UserError, WorkerLost
from wse_emu.util import progress
from wse_emu.util.checks import whole

# The variables that set how many threads numpy's BLAS starts (OpenBLAS, MKL, Apple's).
# Each worker is one of as many as there are cores: BLAS threads of its own (a long dot
# product or a least-squares fit starts one per core, which then spin a while waiting for
# more) could only take time from the other workers' cores.
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")

# How long ended workers get to stop by themselves (a SIGTERM is handled between two Python
# instructions: at once, unless inside a long compiled call, whose work is of no use anyway)
# before they are killed.
END_GRACE_S = 1.0


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

    def close(self) -> None:
        pass


class RemoteTraceback(Exception):
    """Where a job's error was raised in its worker (set as the error's cause)."""

    def __str__(self) -> str:
        return self.args[0]


class _Worker:
    """A worker process, the parent's end of its pipe, and the binding it holds."""

    def __init__(self, process, conn):
        self.process, self.conn = process, conn
        self.token = None  # the binding whose (function, shared) the worker has unpickled

    def give(self, binding: tuple, job: tuple) -> None:
        token, blob = binding
        try:
            self.conn.send((token, None if token == self.token else blob, job))
        except OSError:  # it ended while it waited for work
            raise self._lost() from None
        self.token = token

    def take(self):
        """The job's result, or its error raised here."""
        try:
            reply = self.conn.recv()
        except (EOFError, OSError):
            raise self._lost() from None
        ok, value, where = reply
        if ok:
            return value
        self.token = None  # the binding may be what failed: it goes again with the next job
        value.__cause__ = RemoteTraceback(where)
        raise value

    def _lost(self) -> WorkerLost:
        self.process.join(END_GRACE_S)
        return WorkerLost(f"a worker process ended while running a job (exit code "
                          f"{self.process.exitcode}; out of memory?)")


class _Processes:
    """Runs jobs on local worker processes, at most ``workers`` at a time, each started fresh
    (spawned, not forked: the parent may hold threads) when first needed and kept for the
    pool's life."""

    parallel = True

    def __init__(self, workers: int):
        self.size = workers
        self.context = multiprocessing.get_context("spawn")
        self.workers: list[_Worker] = []  # alive
        self.idle: list[_Worker] = []  # alive and holding no job
        self.tokens = itertools.count()

    def bind(self, function, shared: tuple):
        """``run(jobs, done=None)``: ``function(*shared, *job)`` for every job, results in job
        order. ``shared`` is pickled once here, and sent to and unpickled by each worker once
        (again only if another binding ran on it in between)."""
        binding = ((os.getpid(), next(self.tokens)), pickle.dumps((function, shared)))

        def run(jobs, done=None):
            out = [None] * len(jobs)
            each = self._each(binding, list(jobs))
            try:
                for count, (index, result) in enumerate(each, 1):
                    out[index] = result
                    if done:
                        done(count)
            finally:
                each.close()  # if ``done`` raised: the jobs still running are ended
            return out

        return run

    def imap(self, function, jobs):
        """``function(*job)`` of every job, yielded as each finishes (not in job order)."""
        binding = ((os.getpid(), next(self.tokens)), pickle.dumps((function, ())))
        each = self._each(binding, list(jobs))
        try:
            for _, result in each:
                yield result
        finally:
            each.close()

    def _each(self, binding: tuple, jobs: list):
        """(index, result) of every job as each finishes. On an error (a job's, or Ctrl-C) or
        when the caller stops asking, the workers still running a job are ended: nothing is
        left computing what nobody will read."""
        waiting = deque(enumerate(jobs))
        busy: dict = {}  # a busy worker's connection -> (worker, index of its job)
        try:
            while waiting or busy:
                # A worker for every waiting job, up to the pool's size; more only if every
                # worker is held by a caller that stopped midway (an ``imap`` not read to its
                # end), so that this call still moves.
                while waiting and (self.idle or len(self.workers) < self.size or not busy):
                    worker = self.idle.pop() if self.idle else self._start()
                    index, job = waiting.popleft()
                    busy[worker.conn] = (worker, index)  # before sending: a send cut short
                    try:  # leaves it busy, and so ended below
                        worker.give(binding, job)
                    except WorkerLost:
                        del busy[worker.conn]
                        self._forget(worker)
                        raise
                for conn in wait(list(busy)):
                    worker, index = busy[conn]
                    try:
                        result = worker.take()
                    except WorkerLost:
                        del busy[conn]
                        self._forget(worker)
                        raise
                    except Exception:
                        del busy[conn]
                        self.idle.append(worker)  # a job's error leaves its worker sound
                        raise
                    del busy[conn]
                    self.idle.append(worker)
                    yield index, result
        finally:
            self._end([worker for worker, _ in busy.values()])

    def _start(self) -> _Worker:
        ours, theirs = self.context.Pipe()
        process = self.context.Process(target=_serve, args=(theirs,), daemon=True,
                                       name="wse-emu worker")
        worker = _Worker(process, ours)
        # Started with SIGINT blocked, which it inherits: a Ctrl-C to the process group while
        # it starts stays pending until it ignores SIGINT, and is then dropped, rather than
        # raising in its imports. Here, a Ctrl-C waits until the worker is known, so that it
        # is ended with the others.
        with _interrupts_deferred(), _sigint_blocked(), _one_blas_thread():
            process.start()
            self.workers.append(worker)
        theirs.close()  # so that a dead worker reads as the end of its pipe
        return worker

    def _end(self, workers: list[_Worker], stop: bool = False) -> None:
        """Ends ``workers``: asks them (``stop``, when idle) or tells them (SIGTERM: they
        raise SystemExit, so that a table half-written is removed by its ``finally``) to stop;
        kills those still there after ``END_GRACE_S``."""
        if not workers:
            return
        with _interrupts_deferred():  # a second Ctrl-C must not leave workers behind
            for worker in workers:
                try:
                    if stop:
                        worker.conn.send(None)
                    else:
                        worker.process.terminate()
                except (OSError, ValueError):  # already gone
                    pass
            deadline = time.monotonic() + END_GRACE_S
            for worker in workers:
                worker.process.join(max(0.0, deadline - time.monotonic()))
            for worker in workers:
                if worker.process.is_alive():
                    worker.process.kill()
                    worker.process.join()
                self._forget(worker)

    def _forget(self, worker: _Worker) -> None:
        worker.conn.close()
        if worker.process.exitcode is not None:
            worker.process.close()  # its handles, now rather than when collected
        if worker in self.workers:
            self.workers.remove(worker)
        if worker in self.idle:
            self.idle.remove(worker)

    def close(self) -> None:
        """Ends every worker (those at work, if a caller left any, at once)."""
        busy = [w for w in self.workers if w not in self.idle]
        self._end(busy)
        self._end(list(self.idle), stop=True)


@contextmanager
def _one_blas_thread():
    """The environment a worker starts with (and imports numpy in): one BLAS thread, unless
    the user set a number; this process's own is left as it was."""
    saved = {name: os.environ.get(name) for name in BLAS_THREADS}
    for name in BLAS_THREADS:
        os.environ.setdefault(name, "1")
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _serve(conn) -> None:
    """A worker process: runs the jobs that come down ``conn``, sending back each result (or
    its error, with where it was raised), until told to stop or the parent is gone."""
    # Ctrl-C is the parent's to handle: it ends the workers (with SIGTERM, as below). SIGINT
    # arrives blocked (``_start``); ignoring it first drops one that came while starting.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGTERM, _terminated)
    progress.begin(silent=True)  # the parent reports progress; workers print nothing
    bound = None  # (token, (function, shared))
    try:
        while True:
            message = conn.recv()
            if message is None:
                return
            token, blob, job = message
            try:
                if blob is not None:
                    bound = None  # the old binding's objects go before the new ones come
                    bound = (token, pickle.loads(blob))
                function, shared = bound[1]
                reply = (True, function(*shared, *job), "")
            except Exception as exc:  # noqa: BLE001 - the caller's to handle, with its type
                reply = (False, _sendable(exc), traceback.format_exc())
            try:
                conn.send(reply)
            except (pickle.PicklingError, TypeError, AttributeError) as exc:
                conn.send((False, RuntimeError(f"a job's result cannot be sent back: {exc}"),
                           traceback.format_exc()))
    except (EOFError, OSError):  # the parent is gone: nobody to answer
        return


def _terminated(signum, frame):
    # Told to stop: nothing it would print from here on is anyone's to read (its results go
    # down the pipe), and a stop that lands inside an extension's import (numpy's, say) makes
    # that import print a traceback on the way out, over the parent's one line.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
    except OSError:
        pass
    raise SystemExit(128 + signum)


def _sendable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling (some errors take arguments they do not keep), else a
    RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any failure means: send the text instead
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


@contextmanager
def _interrupts_deferred():
    """A Ctrl-C during the block takes effect at its end (in the main thread; signal
    handlers can only be set there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        # None: a handler set outside Python, which cannot be put back; the default then.
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
        if caught:
            signal.raise_signal(signal.SIGINT)  # whatever the handler before would do


@contextmanager
def _sigint_blocked():
    """SIGINT blocked for this thread (and what it starts) during the block."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


HERE = _Here()  # jobs in this process, one after another (for a caller given no pool)


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
        try:
            for future in as_completed(futures):
                yield future.result()
        finally:  # on an error, Ctrl-C or a caller that stops: the cluster stops them too
            self.client.cancel(futures)


@contextmanager
def point_pool(scheduler: str | None = None, workers: int = 0):
    """Yields a pool whose ``bind(function, shared)`` gives ``run(jobs, done=None)``.
    ``workers``: local worker processes (0: one per core; 1: no cluster, run here). Connects
    at once, so that a bad scheduler address fails before any work. On the way out (an error
    or Ctrl-C included) the local workers are ended, or the cluster's jobs cancelled and the
    client closed."""
    workers = workers or os.cpu_count() or 1
    if scheduler is None:
        pool = _Here() if workers == 1 else _Processes(workers)
        try:
            yield pool
        finally:
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
        with _interrupts_deferred():  # a second Ctrl-C must not leave the client open
            client.close()


# Local worker processes past a few per core only share the cores, and each holds its own
# interpreter (about 100 MB measured before any work) and tables: a typo of 10**6 would start
# processes until memory ran out.
WORKERS_PER_CORE = 4


def check_workers(workers) -> int:
    """``workers``, a whole number from 0 (one per core) to WORKERS_PER_CORE per core."""
    cores = os.cpu_count() or 1
    if whole("workers", workers, 0) > WORKERS_PER_CORE * cores:
        raise UserError(f"`workers` must be at most {WORKERS_PER_CORE * cores} "
                        f"({WORKERS_PER_CORE} per core, {cores} cores here), got {workers:,}")
    return workers
