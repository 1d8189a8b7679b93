"""A check: one published measurement (``Reference``), how the emulator's figure for the same
quantity is obtained, and the band the ratio of the two (ours / published) is held to."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

FAST, SLOW = "fast", "slow"


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
    whether it is ``fast`` (seconds: the test suite runs it) or ``slow``, and ``figure``,
    which computes our figure."""

    name: str
    reference: Reference
    ours: str
    band: tuple[float, float]
    why_band: str
    speed: str
    figure: Callable[[], float]


@dataclass(frozen=True)
class Outcome:
    """A check run: our figure, the ratio, and whether it lies in its band ("pass" or
    "fail")."""

    check: Check
    ours: float
    ratio: float
    status: str
    seconds: float

    def to_json(self) -> dict:
        c, r = self.check, self.check.reference
        return {"name": c.name, "speed": c.speed,
                "reference": {"source": r.source, "date": r.date, "measured": r.measured,
                              "value": r.value, "unit": r.unit},
                "ours": {"what": c.ours, "value": self.ours},
                "ratio": self.ratio, "band": list(c.band), "why_band": c.why_band,
                "status": self.status, "seconds": self.seconds}


def run_check(check: Check) -> Outcome:
    """Our figure for ``check``, its ratio to the reference, and whether it is in band."""
    began = time.perf_counter()
    ours = float(check.figure())
    ratio = ours / check.reference.value
    low, high = check.band
    status = "pass" if low <= ratio <= high else "fail"
    return Outcome(check, ours, ratio, status, time.perf_counter() - began)
