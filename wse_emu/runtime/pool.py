"""Running independent serving points in parallel with dask.distributed.

Serving runs are plain Python, so threads would share one core; a local cluster of worker
processes (one thread each) uses them all, and a scheduler address reaches a real cluster.
Without dask installed, points run one after another in this process: the results are the same,
only slower.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager

from wse_emu.errors import UserError


def dask_available() -> bool:
    try:
        import dask.distributed  # noqa: F401
    except ImportError:
        return False
    return True


@contextmanager
def point_runner(function, shared: tuple, scheduler: str | None = None, workers: int = 0):
    """Yields ``run(jobs)``: ``function(*shared, *job)`` for every job, results in job order.
    ``shared`` (large, the same for every job) goes to each worker once. ``workers``: local
    worker processes (0: one per core; 1: no cluster, run here)."""
    workers = workers or os.cpu_count() or 1
    if scheduler is None and (workers == 1 or not dask_available()):
        yield lambda jobs: [function(*shared, *job) for job in jobs]
        return
    if not dask_available():
        raise UserError("--scheduler needs dask.distributed: pip install -e '.[sweep]'")
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
            client = Client(scheduler, timeout="10s")
    except OSError as exc:
        if cluster is not None:
            cluster.close()
        raise UserError(f"cannot reach the dask scheduler {scheduler}: {exc}") from None
    try:
        handles = client.scatter(list(shared), broadcast=True)

        def run(jobs):
            futures = [client.submit(function, *handles, *job, pure=False) for job in jobs]
            return client.gather(futures)

        yield run
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
