"""The engines are made ready once per process, before a step's stages go to threads, so that
a first compile is said on the command line instead of passing as a silent wait."""

import pytest

from wse_emu.engines import cycle, fast
from wse_emu.sim import warm


@pytest.mark.parametrize("engine", ["fast", "cycle"])
def test_an_engine_is_made_ready_once(monkeypatch, engine):
    monkeypatch.setattr(warm, "_READY", set())
    warm.warm_engine(engine)
    assert engine in warm._READY

    def again(*args, **kwargs):
        raise AssertionError("the engine was run again")
    monkeypatch.setattr(fast, "run", again)
    monkeypatch.setattr(cycle, "run_graph", again)
    warm.warm_engine(engine)


def test_the_two_tasks_run_as_the_engines_run_any_graph():
    graph = warm._two_tasks()
    res = fast.run(graph, 1, 1)
    # The second task starts when the message lands: after the first task, the ramp out, one
    # hop and the ramp in.
    assert res.task_end[0] == 1 and res.task_start[1] > res.task_end[0]
    assert res.unfinished() == 0
