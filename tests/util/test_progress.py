"""Progress on stderr: plain lines in a log, a heartbeat when nothing new comes, the time left
as of each line, a word before a long compile, nothing with --quiet."""

import io
import sys
import time

import pytest

from wse_emu.experiments.goodput import Search, run_searches
from wse_emu.util import progress


@pytest.mark.slow
def test_a_log_never_goes_quiet(monkeypatch, capsys):
    """One long step (a serving run, a table's shape) says nothing new for a while: the latest
    status comes again every period, marked as still going."""
    monkeypatch.setattr(progress, "PERIOD_S", 0.2)
    progress.begin()
    try:
        progress.status("timing the decode stage table of region mixed0")
        time.sleep(1.5)
    finally:
        progress.clear()
        progress.begin(silent=True)  # the heartbeat stops
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 4
    assert all(line.startswith("[") and "timing the decode stage table" in line for line in lines)
    assert lines[-1].endswith("(still at it)") and not lines[0].endswith("(still at it)")


def test_quiet_prints_nothing(monkeypatch, capsys):
    monkeypatch.setattr(progress, "PERIOD_S", 0.0)
    progress.begin(silent=True)
    progress.status("compiling")
    time.sleep(0.3)
    assert capsys.readouterr().err == ""


def test_the_clock_reads_minutes_and_seconds():
    assert progress.clock(42.4) == "42 s"
    assert progress.clock(543.2) == "9 min 03 s"


class FakeClock:
    """``time.monotonic`` that moves only when the test moves it."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(time, "monotonic", fake)
    return fake


@pytest.fixture
def reporter(monkeypatch, clock):
    """A reporter without its heartbeat thread (the test calls ``tick`` as the heartbeat
    would), started at the fake clock's time, lines every 5 s."""
    monkeypatch.setattr(progress, "PERIOD_S", 5.0)
    fresh = progress._Reporter()
    monkeypatch.setattr(progress, "_REPORTER", fresh)
    return fresh


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_time_left_grows_while_nothing_finishes(clock, reporter, capsys):
    """A log shows the time left as of each line, from the work done so far: the heartbeat's
    lines while one step goes on say more time left, not the estimate made when the last step
    finished; nothing done yet says so."""
    phase = progress.Phase("timing", 4)
    clock.now += 5
    reporter.tick()
    clock.now += 5
    phase.update()  # 1 of 4 in 10 s
    clock.now += 5
    reporter.tick()
    clock.now += 10
    reporter.tick()
    clock.now += 5
    phase.update(3)  # 3 of 4 in 30 s
    clock.now += 5
    phase.update()
    bar = "timing [{}{}]".format
    assert capsys.readouterr().err.splitlines() == [
        f"[5 s] {bar('', '.' * 20)} 0/4, no estimate yet",
        f"[10 s] {bar('#' * 5, '.' * 15)} 1/4, about 30 s left",
        f"[15 s] {bar('#' * 5, '.' * 15)} 1/4, about 45 s left (still at it)",
        f"[25 s] {bar('#' * 5, '.' * 15)} 1/4, about 75 s left (still at it)",
        f"[30 s] {bar('#' * 15, '.' * 5)} 3/4, about 10 s left",
        f"[35 s] {bar('#' * 20, '')} 4/4",
    ]


def test_work_left_never_reads_as_no_time_left(clock, reporter, capsys):
    """Steps of no weight (cheap ones, last) may remain once the weights are all done: their
    time left is at least a second, never "0 s"."""
    phase = progress.Phase("timing", 3, weights=[1.0, 1.0, 0.0])
    clock.now += 30
    phase.update(2)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(" 2/3, about 1 s left")


def test_steps_of_no_weight_alone_read_as_done_when_done(clock, reporter, capsys):
    """Every step of no weight (the cheap ones, all cached but them): once all are done the
    line shows the count done, not "no estimate yet"."""
    phase = progress.Phase("timing", 3, weights=[0.0, 0.0, 0.0])
    clock.now += 30
    phase.update(3)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(" 3/3") and "#" * 20 in line


def test_the_terminal_line_keeps_its_time_left_current(clock, reporter, monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    phase = progress.Phase("timing", 4)
    clock.now += 10
    phase.update()
    assert terminal.getvalue().rstrip().endswith("1/4, about 30 s left")
    clock.now += 10
    reporter.tick()  # nothing finished: the line is rewritten with the time left of now
    assert terminal.getvalue().rstrip().endswith("1/4, about 60 s left")


def test_the_searches_report_the_time_left_as_of_each_line(clock, reporter, capsys):
    """An experiment's rounds of serving runs: the time left grows while the runs in flight
    take longer than the pace so far."""

    class Enough(Exception):
        pass

    def run_points(jobs, done):
        clock.now += 5
        done(1)  # 1 of the round's runs in 5 s
        clock.now += 15
        reporter.tick()
        raise Enough

    with pytest.raises(Enough):
        run_searches({0: Search("config")}, run_points, progress=progress.status, label="tuning")
    lines = capsys.readouterr().err.splitlines()
    total = len(Search("config").proposals(3, 0.05))
    assert lines == [f"[5 s] tuning: round 1, 1 of {total} runs done, about "
                     f"{5 * (total - 1):.0f} s left",
                     f"[20 s] tuning: round 1, 1 of {total} runs done, about "
                     f"{progress.duration(20 * (total - 1))} left (still at it)"]


def test_a_slow_step_says_what_it_does_once_it_takes_long(clock, reporter, capsys):
    """A compile Numba's cache does not hold: said at once (not at the next periodic line)
    once it has taken ``SLOW_S``, and the status before it comes back when it ends."""
    progress.status("timing the stage tables")
    with progress.slow("compiling the serving loop"):
        clock.now += 1
        reporter.tick()
        clock.now += progress.SLOW_S
        reporter.tick()
        clock.now += 1
    clock.now += 10
    reporter.tick()
    assert capsys.readouterr().err.splitlines() == [
        f"[{1 + progress.SLOW_S:.0f} s] compiling the serving loop",
        f"[{12 + progress.SLOW_S:.0f} s] timing the stage tables"]


def test_a_quick_step_says_nothing(clock, reporter, capsys):
    """Loading what Numba's cache holds takes under ``SLOW_S``: no line about compiling."""
    with progress.slow("compiling the serving loop"):
        clock.now += progress.SLOW_S / 2
        reporter.tick()
    clock.now += 10
    reporter.tick()
    assert capsys.readouterr().err == ""


def test_the_serving_loop_says_it_compiles(clock, reporter, monkeypatch, capsys):
    """The serving loop's first compile (tens of seconds) is announced while it runs."""
    from wse_emu.serving.loops import compiled as compiled_loop

    def slow_njit(*args, **kwargs):
        def compile_(function):
            clock.now += 30
            reporter.tick()  # the heartbeat, while Numba compiles
            return function
        return compile_

    monkeypatch.setattr(compiled_loop, "_compiled", {})
    monkeypatch.setattr(compiled_loop, "njit", slow_njit)
    monkeypatch.setattr(compiled_loop, "_CALLED", ())
    compiled_loop.compile_dispatch(len)
    (line,) = capsys.readouterr().err.splitlines()
    assert line == "[30 s] " + compiled_loop.COMPILING
    assert "compiling the serving loop" in compiled_loop.COMPILING


def test_quiet_says_nothing_of_a_slow_step(clock, monkeypatch, capsys):
    progress.begin(silent=True)
    with progress.slow("compiling the serving loop"):
        clock.now += 60
        progress._REPORTER.tick()
    assert capsys.readouterr().err == ""


def test_nothing_comes_after_the_end(clock, reporter, capsys):
    """A command ending (Ctrl-C) ends its progress: its own last line stays last."""
    progress.status("timing the stage tables")
    progress.end()
    clock.now += 60
    reporter.tick()
    progress.status("serving")
    assert capsys.readouterr().err == ""
    assert reporter.stop.is_set()
