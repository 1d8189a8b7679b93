"""Progress on stderr: plain lines in a log, a heartbeat when nothing new comes, nothing with
--quiet."""

import time

import pytest

from wse_emu import progress


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
