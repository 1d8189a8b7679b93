"""Progress of long work, on stderr.

On a terminal, one status line rewritten in place: what is being done and, for work with a
known size, a bar, the count and the time left at the pace so far. Otherwise (a log file, CI,
``nohup``) a plain line with the time elapsed, every ``PERIOD_S`` seconds once the command has
run that long, so that quick commands (and their one-line errors) print nothing else; a
heartbeat repeats the latest status when nothing new came for that long (inside one long
serving run or stage-table shape), so a log never goes quiet. ``begin(silent=True)``
silences it all.
"""

from __future__ import annotations

import sys
import threading
import time

PERIOD_S = 10.0  # seconds between lines when stderr is not a terminal
BAR = 20  # characters of a terminal bar


class _Reporter:
    def __init__(self):
        self.silent = False
        self.started = time.monotonic()
        self.printed = self.started  # when the last plain line went out
        self.shown = ""  # the status line on the terminal, if any
        self.latest = ""  # the latest status, for the heartbeat
        self.last_line = ""  # the status the last plain line showed
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def status(self, text: str) -> None:
        if self.silent:
            return
        with self.lock:
            self.latest = text
            stream = sys.stderr
            if stream.isatty():
                stream.write("\r" + text.ljust(len(self.shown)))
                stream.flush()
                self.shown = text
                return
            self._line(text)

    def _line(self, text: str, again: bool = False) -> None:
        now = time.monotonic()
        if now - self.printed >= PERIOD_S:
            note = " (still at it)" if again and text == self.last_line else ""
            print(f"[{clock(now - self.started)}] {text}{note}", file=sys.stderr, flush=True)
            self.printed = now
            self.last_line = text

    def beat(self) -> None:
        """The latest status again whenever no line went out for ``PERIOD_S``."""
        while not self.stop.wait(min(1.0, PERIOD_S / 2) or 0.05):
            if self.silent or not self.latest or sys.stderr.isatty():
                continue
            with self.lock:
                self._line(self.latest, again=True)

    def done(self) -> None:
        """End the terminal status line, so that what follows starts on a line of its own."""
        if self.shown and not self.silent:
            sys.stderr.write("\r" + " " * len(self.shown) + "\r")
            sys.stderr.flush()
        self.shown = ""


_REPORTER = _Reporter()


def begin(silent: bool = False) -> None:
    """A command starts: its first plain line comes ``PERIOD_S`` from now (none with
    ``silent``, for ``--quiet``), and a heartbeat keeps the lines coming."""
    global _REPORTER
    _REPORTER.stop.set()
    _REPORTER = _Reporter()
    _REPORTER.silent = silent
    if not silent:
        threading.Thread(target=_REPORTER.beat, daemon=True, name="progress").start()


def status(text: str) -> None:
    """What is being done now."""
    _REPORTER.status(text)


def warn(text: str) -> None:
    """One line that something went wrong and was dealt with (shown even with ``--quiet``):
    the status line, if any, is taken off first."""
    with _REPORTER.lock:
        _REPORTER.done()
        print(f"wse-emu: warning: {text}", file=sys.stderr, flush=True)


def clear() -> None:
    """Before printing results: take the status line off the terminal (and stop repeating
    the latest status)."""
    _REPORTER.latest = ""
    _REPORTER.done()


class Phase:
    """Work of ``total`` steps, shown with a bar, the count and the time left. With
    ``weights`` (one per step, in the order they tend to finish) the bar and the time left
    follow the steps' weights done, not their count: steps that differ in size (the largest
    first) would otherwise make the first estimates far too long."""

    def __init__(self, label: str, total: int, weights=None):
        self.label, self.total, self.count = label, max(total, 1), 0
        self.done_weight = None
        if weights is not None:
            cumulative = [0.0]
            for w in weights:
                cumulative.append(cumulative[-1] + float(w))
            self.done_weight = [c / (cumulative[-1] or 1.0) for c in cumulative]
        self.started = time.monotonic()
        status(f"{label}...")

    def update(self, count: int | None = None) -> None:
        """One more step done, or ``count`` in all."""
        self.count = self.count + 1 if count is None else count
        share = min(self.count / self.total, 1.0)
        if self.done_weight is not None:
            share = self.done_weight[min(self.count, len(self.done_weight) - 1)]
        elapsed = time.monotonic() - self.started
        left = elapsed * (1 - share) / share if share > 0 else 0.0
        filled = int(round(share * BAR))
        status(f"{self.label} [{'#' * filled}{'.' * (BAR - filled)}] {self.count}/{self.total}"
               f", about {duration(left)} left")


def clock(seconds: float) -> str:
    """Time elapsed, as a log line starts: ``42 s``, ``9 min 03 s``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min"
