"""Progress of long work, on stderr.

On a terminal, one status line rewritten in place: what is being done and, for work with a
known size, a bar, the count and the time left at the pace so far. Otherwise (a log file, CI,
``nohup``) a plain line with the time elapsed, every ``PERIOD_S`` seconds once the command has
run that long, so that quick commands (and their one-line errors) print nothing else; a
heartbeat repeats the latest status when nothing new came for that long (inside one long
serving run or stage-table shape), so a log never goes quiet. The time left is worked out
whenever a line is shown, from the work done so far and the time elapsed by then: while
nothing finishes it grows, rather than a stale estimate counting down to "0 s" with work still
to do. A step that is usually quick but sometimes long (a compile Numba's cache does not hold
yet) says so once it has taken ``SLOW_S`` (``slow``). ``begin(silent=True)`` silences it all.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager

PERIOD_S = 10.0  # seconds between lines when stderr is not a terminal
SLOW_S = 2.0  # a step taking longer than this says what it is doing (``slow``)
BAR = 20  # characters of a terminal bar


class Live(str):
    """Status text ending in the time left, worked out again each time it is shown: ``head``,
    then the time left at the pace of ``share`` of the work done since ``began`` (a
    ``time.monotonic()``). As a str it is the text as of when it was made, for any other
    reader of progress texts."""

    def __new__(cls, head: str, share: float, began: float):
        text = super().__new__(cls, with_time_left(head, share, began))
        text.head, text.share, text.began = head, share, began
        return text

    def now(self) -> str:
        return with_time_left(self.head, self.share, self.began)


def with_time_left(head: str, share: float, began: float) -> str:
    """``head`` and the time left at the pace so far: ``share`` (0 to 1) of the work done
    since ``began``. Nothing done yet gives no estimate; work left never reads as "0 s"."""
    if share >= 1:
        return head
    if share <= 0:
        return f"{head}, no estimate yet"
    elapsed = time.monotonic() - began
    left = max(elapsed * (1 - share) / share, 1.0)
    return f"{head}, about {duration(left)} left"


def _text(status) -> str:
    return status.now() if isinstance(status, Live) else status


def _key(status) -> str:
    """What a status says apart from its time left: the same key again means nothing new."""
    return status.head if isinstance(status, Live) else status


class _Reporter:
    def __init__(self):
        self.silent = False
        self.started = time.monotonic()
        self.printed = self.started  # when the last plain line went out
        self.shown = ""  # the status line on the terminal, if any
        self.latest = ""  # the latest status (a str or a Live), for the heartbeat
        self.last_key = None  # the status the last plain line showed (``_key``)
        self.pending = None  # a slow step's _Note, not yet shown (``slow``)
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def status(self, text) -> None:
        if self.silent:
            return
        with self.lock:
            self.latest = text
            self._show()

    def _show(self, again: bool = False, at_once: bool = False) -> None:
        """The latest status, its time left as of now: on the terminal's status line, or as a
        plain line if one is due (``at_once``: whether due or not). Called under the lock."""
        if self.silent:  # checked again here: ``end`` may have come while waiting for the lock
            return
        text = _text(self.latest)
        stream = sys.stderr
        if stream.isatty():
            if text != self.shown:
                stream.write("\r" + text.ljust(len(self.shown)))
                stream.flush()
                self.shown = text
            return
        now = time.monotonic()
        if at_once or now - self.printed >= PERIOD_S:
            key = _key(self.latest)
            note = " (still at it)" if again and key == self.last_key else ""
            # One write for the whole line: a Ctrl-C cannot leave half a line before the
            # command's last one.
            stream.write(f"[{clock(now - self.started)}] {text}{note}\n")
            stream.flush()
            self.printed = now
            self.last_key = key

    def beat(self) -> None:
        """The heartbeat's thread: ``tick`` every second (more often for a short period)."""
        while not self.stop.wait(min(1.0, PERIOD_S / 2) or 0.05):
            self.tick()

    def tick(self) -> None:
        """A slow step's text once it is due; else the latest status again if no line went
        out for ``PERIOD_S`` (on a terminal, its time left refreshed)."""
        with self.lock:
            note = self.pending
            if note is not None and time.monotonic() >= note.due:
                note.covered, self.latest, self.pending = self.latest, note.text, None
                note.shown = True
                self._show(at_once=True)
            elif self.latest:
                self._show(again=True)

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


def end() -> None:
    """No more progress from this command (it is ending, e.g. interrupted): the heartbeat
    stops and the status line is taken off, so that the command's own last line is last."""
    reporter = _REPORTER
    with reporter.lock:
        reporter.stop.set()
        reporter.done()
        reporter.silent = True


def status(text) -> None:
    """What is being done now (a str, or a ``Live`` whose time left is kept current)."""
    _REPORTER.status(text)


@contextmanager
def slow(text: str, after_s: float | None = None):
    """A step that is usually quick but sometimes long (a compile Numba's cache may hold or
    not): ``text`` becomes the status, at once a line of its own, if the step is still going
    after ``after_s`` (``SLOW_S``); when it ends, the status before it comes back. Shown by
    the heartbeat, so only while a command reports progress (``begin``)."""
    reporter = _REPORTER
    note = _Note(text, time.monotonic() + (SLOW_S if after_s is None else after_s))
    with reporter.lock:
        outer, reporter.pending = reporter.pending, note
    try:
        yield
    finally:
        with reporter.lock:
            if reporter.pending in (note, None):  # an outer step not shown yet waits again
                reporter.pending = outer
            # Back to what it covered, unless something newer came since.
            if note.shown and reporter.latest is note.text:
                reporter.latest = note.covered
                if note.covered:
                    reporter._show()
                else:
                    reporter.done()


class _Note:
    """A slow step's text, when it is due, and once shown, the status it covers."""

    def __init__(self, text: str, due: float):
        self.text, self.due = text, due
        self.shown, self.covered = False, ""


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
        status(self._status())

    def update(self, count: int | None = None) -> None:
        """One more step done, or ``count`` in all."""
        self.count = self.count + 1 if count is None else count
        status(self._status())

    def _status(self) -> Live:
        share = min(self.count / self.total, 1.0)
        if self.done_weight is not None:
            share = self.done_weight[min(self.count, len(self.done_weight) - 1)]
        if self.count < self.total:
            # Steps of no weight (cheap ones, last) may remain when the weights are all done.
            share = min(share, 0.999)
        else:  # all done, whatever the weights said (steps of no weight alone: all zero)
            share = 1.0
        filled = int(round(share * BAR))
        return Live(f"{self.label} [{'#' * filled}{'.' * (BAR - filled)}] "
                    f"{self.count}/{self.total}", share, self.started)


def clock(seconds: float) -> str:
    """Time elapsed, as a log line starts: ``42 s``, ``9 min 03 s``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min"
