"""Progress of long work, on stderr.

On a terminal, one status line rewritten in place: what is being done and, for work with a
known size, a bar, the count and the time left at the pace so far. Otherwise (a log file, CI,
``nohup``) a plain line with the time elapsed, at most every ``PERIOD_S`` seconds and only once
the command has run that long, so that quick commands (and their one-line errors) print nothing
else. ``begin(silent=True)`` silences it all.
"""

from __future__ import annotations

import sys
import time

PERIOD_S = 10.0  # seconds between lines when stderr is not a terminal
BAR = 20  # characters of a terminal bar


class _Reporter:
    def __init__(self):
        self.silent = False
        self.started = time.monotonic()
        self.printed = self.started  # when the last plain line went out
        self.shown = ""  # the status line on the terminal, if any

    def status(self, text: str) -> None:
        if self.silent:
            return
        stream = sys.stderr
        if stream.isatty():
            stream.write("\r" + text.ljust(len(self.shown)))
            stream.flush()
            self.shown = text
            return
        now = time.monotonic()
        if now - self.printed >= PERIOD_S:
            print(f"[{now - self.started:.0f} s] {text}", file=stream, flush=True)
            self.printed = now

    def done(self) -> None:
        """End the terminal status line, so that what follows starts on a line of its own."""
        if self.shown and not self.silent:
            sys.stderr.write("\r" + " " * len(self.shown) + "\r")
            sys.stderr.flush()
        self.shown = ""


_REPORTER = _Reporter()


def begin(silent: bool = False) -> None:
    """A command starts: its first plain line comes ``PERIOD_S`` from now (none with
    ``silent``, for ``--quiet``)."""
    global _REPORTER
    _REPORTER = _Reporter()
    _REPORTER.silent = silent


def status(text: str) -> None:
    """What is being done now."""
    _REPORTER.status(text)


def clear() -> None:
    """Before printing results: take the status line off the terminal."""
    _REPORTER.done()


class Phase:
    """Work of ``total`` steps, shown with a bar, the count and the time left."""

    def __init__(self, label: str, total: int):
        self.label, self.total, self.count = label, max(total, 1), 0
        self.started = time.monotonic()
        status(f"{label}...")

    def update(self, count: int | None = None) -> None:
        """One more step done, or ``count`` in all."""
        self.count = self.count + 1 if count is None else count
        share = min(self.count / self.total, 1.0)
        elapsed = time.monotonic() - self.started
        left = elapsed * (1 - share) / share if share > 0 else 0.0
        filled = int(round(share * BAR))
        status(f"{self.label} [{'#' * filled}{'.' * (BAR - filled)}] {self.count}/{self.total}"
               f", about {_duration(left)} left")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min"
