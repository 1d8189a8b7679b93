"""A check: one published measurement (``Reference``), how the emulator's figure for the same
quantity is obtained, and the band the ratio of the two (ours / published) is held to. A check
whose figure needs an optional extra is not run where the extra is not installed, and says so
(``NOT_RUN``): it neither passes nor fails."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from dataclasses import dataclass

FAST, SLOW = "fast", "slow"
NOT_RUN = "not run"


@dataclass(frozen=True)
class Reference:
    """What was measured, where and when it was published, and its value."""

    source: str
    date: str
    measured: str
    value: float
    unit: str


@dataclass(frozen=True)
class Check:
    """One row: its ``name``, the ``reference``, what our figure is (``ours``, in the
    reference's unit), the band [low, high] its ratio to the reference is held to and why,
    whether it is ``fast`` (seconds: the test suite runs it) or ``slow``, ``figure``, which
    computes our figure, and the optional ``extra`` it needs (its modules ``needs``)."""

    name: str
    reference: Reference
    ours: str
    band: tuple[float, float]
    why_band: str
    speed: str
    figure: Callable[[], float]
    extra: str | None = None
    needs: tuple[str, ...] = ()

    def missing(self) -> str | None:
        """Why it cannot run here (the extra it needs is not installed), or None."""
        if all(importlib.util.find_spec(m) is not None for m in self.needs):
            return None
        return f"needs the {self.extra} extra: pip install -e '.[{self.extra}]'"


@dataclass(frozen=True)
class Outcome:
    """A check run: our figure, the ratio, and whether it lies in its band ("pass" or
    "fail"); or, where it cannot run, ``NOT_RUN`` and why."""

    check: Check
    ours: float | None
    ratio: float | None
    status: str
    seconds: float
    why_not_run: str | None = None

    def to_json(self) -> dict:
        c, r = self.check, self.check.reference
        return {"name": c.name, "speed": c.speed,
                "reference": {"source": r.source, "date": r.date, "measured": r.measured,
                              "value": r.value, "unit": r.unit},
                "ours": {"what": c.ours, "value": self.ours},
                "ratio": self.ratio, "band": list(c.band), "why_band": c.why_band,
                "status": self.status, "seconds": self.seconds,
                **({"why_not_run": self.why_not_run} if self.why_not_run else {})}


def run_check(check: Check) -> Outcome:
    """Our figure for ``check``, its ratio to the reference, and whether it is in band."""
    missing = check.missing()
    if missing:
        return Outcome(check, None, None, NOT_RUN, 0.0, missing)
    began = time.perf_counter()
    ours = float(check.figure())
    ratio = ours / check.reference.value
    low, high = check.band
    status = "pass" if low <= ratio <= high else "fail"
    return Outcome(check, ours, ratio, status, time.perf_counter() - began)
