"""Ctrl-C at any moment of a command at work on worker processes (compiling its layouts, timing
stage tables, serving runs): the command ends within seconds, with one line on stderr
(`wse-emu: interrupted`) and exit code 130; no process of it is left; nothing it wrote is
half-written, so that run again on what it left, it gives the results of a run never
interrupted. SIGINT goes to the whole process group, as a terminal sends it, or to the
command alone."""

import json
import os
import pty
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import assert_whole

from wse_emu import api
from wse_emu.cli.main import main
from wse_emu.util import progress

SMALL_CHAT = Path(__file__).parents[1] / "fixtures" / "small_chat.yaml"
# Six layouts compiled on two workers, then a few seconds of stage tables timed on them, then
# serving runs on them: about 15 s in all.
COMMAND = ["experiment", "disagg", "tiny", "--fabric", "mesh8", "--workload", str(SMALL_CHAT),
           "--ttft-slo", "1", "--tpot-slo", "0.01", "--workers", "2", "--copies", "1",
           "--layers-per-stage", "own", "--json"]
# Each interrupt: once the status line shows the work named, a moment later, to the group or
# to the command alone. The tables are written only when all are timed, so the attempts before
# the serving runs' find none, and the serving runs' attempts the tables of the first of them.
ATTEMPTS = [("compiling", "command"), ("timing the stage tables", "group"),
            ("tuning", "command"), ("searching the best again", "group")]
EXIT_WITHIN_S = 10.0  # from SIGINT to the exit (it takes under a second when all is well)
INTERRUPTED = "wse-emu: interrupted"


def start(cache: Path, out: Path, stderr) -> subprocess.Popen:
    """The command in a session (and process group) of its own, with SIGINT as a shell at a
    terminal starts a command: at its default. (A test run started in the background by a
    shell without job control inherits SIGINT ignored, and would pass that on: the command
    would then rightly keep ignoring Ctrl-C.)"""
    return subprocess.Popen(
        [sys.executable, "-m", "wse_emu.cli.main", *COMMAND, "--cache-dir", str(cache), "-o",
         str(out)], stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def finish(proc: subprocess.Popen) -> str:
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr
    assert "unusable" not in stderr  # no damaged table was met, let alone used
    return stdout


class Terminal:
    """The command's stderr on a pseudo-terminal, as a user at a terminal has it: what it
    wrote, and the status line it shows now."""

    def __init__(self):
        self.master, self.slave = pty.openpty()
        self.written = bytearray()
        self.reader = threading.Thread(target=self._read, daemon=True)

    def started(self) -> None:
        os.close(self.slave)  # the command (and its workers) hold it now
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every process that held the terminal has ended
                break
            if not chunk:
                break
            self.written += chunk
        os.close(self.master)

    def status(self) -> str:
        shown = [s.strip() for s in re.split(r"[\r\n]", self.written[-4000:].decode(
            errors="replace")) if s.strip()]
        return shown[-1] if shown else ""

    def text(self) -> str:
        self.reader.join(EXIT_WITHIN_S)
        return self.written.decode(errors="replace").replace("\r\n", "\n")


def in_group(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` still running (zombies count as ended)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.e2e
def test_ctrl_c_ends_the_command_at_once_with_one_line_and_nothing_damaged(tmp_path):
    reference = finish(start(tmp_path / "fresh", tmp_path / "fresh-out", subprocess.PIPE))
    cache = tmp_path / "cache"
    rng = random.Random(43)  # the same moments on every run of the test
    landed = []
    for attempt, (work, whom) in enumerate(ATTEMPTS):
        out = tmp_path / f"interrupted-{attempt}"
        terminal = Terminal()
        proc = start(cache, out, terminal.slave)
        terminal.started()
        began = time.monotonic()
        while work not in terminal.status():
            assert proc.poll() is None, f"the command ended before {work!r}"
            assert time.monotonic() - began < 300, f"no {work!r} in 300 s"
            time.sleep(0.02)
        time.sleep(rng.uniform(0.05, 1.0))
        assert proc.poll() is None, f"the command ended before the interrupt ({work!r})"
        landed.append(terminal.status())
        if whom == "group":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGINT)
        sent = time.monotonic()
        try:
            stdout, _ = proc.communicate(timeout=EXIT_WITHIN_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"still running {EXIT_WITHIN_S} s after Ctrl-C at {landed[-1]!r}")
        took = time.monotonic() - sent
        text = terminal.text()
        # The terminal shows one line: the status line taken off, then ours, and nothing else
        # (no traceback from the command or its workers, no progress after it).
        assert proc.returncode == 130, (landed[-1], text)
        assert stdout == "" and "Traceback" not in text, text
        assert text.endswith(INTERRUPTED + "\n") and text.count("\n") == 1, text
        overwritten = text[:-1].split("\r")
        assert overwritten[-1] == INTERRUPTED and not overwritten[-2].strip(), text
        for _ in range(50):  # the resource tracker leaves once the command has gone
            if not in_group(proc.pid):
                break
            time.sleep(0.1)
        assert not in_group(proc.pid), f"left running after Ctrl-C at {landed[-1]!r}"
        assert took < EXIT_WITHIN_S
        assert_whole(cache, out)
    # Every stretch of work was interrupted (the moments fell where they were meant to).
    for work, _ in ATTEMPTS:
        assert any(work in status for status in landed), (work, landed)
    out = tmp_path / "rerun"
    assert json.loads(finish(start(cache, out, subprocess.PIPE))) == json.loads(reference)
    assert_whole(cache, out)


def test_ctrl_c_in_a_log_is_one_line_after_the_progress(monkeypatch, capsys):
    """Interrupted at work, the command prints its progress lines so far, then one line, and
    nothing after it (the heartbeat, which would repeat the status, has stopped)."""
    def interrupted(**settings):
        progress.status("serving")
        raise KeyboardInterrupt

    monkeypatch.setattr(progress, "PERIOD_S", 0.0)
    monkeypatch.setattr(api, "check_serving", interrupted)
    args = ["serve", "tiny", "--fabric", "mesh8", "--region", "8x8", "--workload",
            str(SMALL_CHAT)]
    assert main(args) == 130
    time.sleep(0.2)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and lines[-1] == INTERRUPTED, err
    assert lines[:-1] and all(line.startswith("[") and "serving" in line for line in lines[:-1])
