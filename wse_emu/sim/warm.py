"""The engines made ready before a step is timed. Numba compiles an engine the first time a
process calls it (once after install, or after the engine's code changed; loaded from its
cache after that, in under a second). Timed here on two tasks, before the stages are handed
to threads, so that a long compile is said on the command line (``progress.slow``) instead
of passing as a silent wait."""

from __future__ import annotations

from typing import TYPE_CHECKING

from wse_emu.util.progress import slow

if TYPE_CHECKING:
    from wse_emu.engines.taskgraph import TaskGraph

COMPILING = "compiling the simulation engines (once after install: up to a minute; cached after)"
_READY: set[str] = set()


def warm_engine(engine: str) -> None:
    """Compile (or load) ``engine`` ("fast" or "cycle") once per process."""
    if engine in _READY:
        return
    # Imported here: a process serving from cached tables never times a step.
    from wse_emu.engines import cycle, fast

    with slow(COMPILING):
        graph = _two_tasks()
        if engine == "fast":
            fast.run(graph, 1, 1)
        else:
            cycle.run_graph(graph, 1, 4, 1, 1, 1_000)
    _READY.add(engine)


def _two_tasks() -> TaskGraph:
    """A task on one PE sending one message to a task on its neighbour."""
    from wse_emu.engines.taskgraph import Builder

    b = Builder(2, 1)
    first, second = b.task(0, 1), b.task(1, 1)
    b.send(first, 0, 1, 1, [second])
    return b.build()


__all__ = ["COMPILING", "warm_engine"]
