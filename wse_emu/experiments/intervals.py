"""95% confidence intervals over independent draws of a workload: for rates and throughputs on
the linear scale (``interval``), for ratios of two plans on the log scale (``ratio_interval``).

A ratio is a quotient of two positive quantities: its error is multiplicative, and a
symmetric interval on the linear scale can reach below zero (three draws of 1.7x, 3.6x and
5.5x give -1.1x to 8.3x). On the log scale the interval is symmetric in log(ratio): its centre
is the draws' geometric mean and its ends are that times and divided by one factor, so it
never goes below zero and "within 10%" means the upper end is at most 1.1 times the centre."""

from __future__ import annotations

import math

import numpy as np

# Two-sided 95% quantiles of Student's t by degrees of freedom (standard tables); between
# entries the next smaller degrees of freedom is used, which widens the interval.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 40: 2.021, 60: 2.000,
        120: 1.980}


def interval(values, lower=None, upper=None, floor: float | None = None) -> dict:
    """Mean and 95% confidence interval (Student's t) of independent replicates; the interval
    is absent with fewer than two. With ``lower`` and ``upper`` (each replicate's value is only
    known to lie between them, as a searched rate lies between the highest rate met and the
    next that failed), the ends are the same interval's ends over them: the search's step is
    part of what is not known, and draws that land on the same step do not make it exact.
    With ``floor``, the lower end is cut there: a rate or a throughput is never negative,
    however wide its spread over few draws."""
    v = _present(values)
    out = {"n": int(len(v)), "values": v.tolist(), "mean": float(v.mean()) if len(v) else None}
    if len(v) >= 2:
        half = half_width(v)
        out.update(low=out["mean"] - half, high=out["mean"] + half, half_width=half)
        for name, bound, side in (("lower", lower, -1), ("upper", upper, 1)):
            ends = _bound(bound, len(v))
            if ends is None:
                continue
            end = float(ends.mean()) + side * half_width(ends)
            key = "low" if side < 0 else "high"
            out[key] = min(out[key], end) if side < 0 else max(out[key], end)
            out[f"{name}_values"] = ends.tolist()
        if floor is not None:
            out["low"] = max(out["low"], floor)
    return out


def ratio_interval(values, lower=None, upper=None) -> dict:
    """A ratio's centre and 95% interval over independent draws, on the log scale: the
    geometric mean, and Student's t on the draws' logarithms (``interval`` there, bounds and
    all, taken back by exp). ``relative_half_width`` is how far the upper end lies above the
    centre, as a share of it (0.1: within +-10% on the log scale). A draw whose ratio is 0
    (one plan reached nothing) has no logarithm: the interval is then the linear one, cut at
    0, and says so (``scale``)."""
    v = _present(values)
    if len(v) and (v <= 0).any():
        out = interval(v, lower, upper)
        if "low" in out:
            out["low"] = max(out["low"], 0.0)
        return {**out, "scale": "linear (a draw's ratio is 0)"}
    logs = interval(np.log(v), _logs(lower, len(v)), _logs(upper, len(v)))
    out = {"n": logs["n"], "values": v.tolist(),
           "mean": math.exp(logs["mean"]) if logs["mean"] is not None else None, "scale": "log"}
    if "low" in logs:
        out.update(low=math.exp(logs["low"]), high=math.exp(logs["high"]),
                   log_half_width=logs["half_width"],
                   relative_half_width=math.exp(logs["high"] - logs["mean"]) - 1.0)
        for name in ("lower", "upper"):
            if f"{name}_values" in logs:
                out[f"{name}_values"] = np.exp(logs[f"{name}_values"]).tolist()
    return out


def t975(freedom: int) -> float:
    """Student's two-sided 95% quantile for ``freedom`` degrees of freedom (the table's
    entry at or below it)."""
    return T975[max(k for k in T975 if k <= freedom)]


def half_width(v: np.ndarray) -> float:
    """The 95% interval's half-width of the mean of ``v`` (two values at least)."""
    return float(t975(len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))


def has_interval(iv: dict | None) -> bool:
    """Whether ``iv`` (either kind) has ends: two draws or more."""
    return bool(iv) and "low" in iv


def _present(values) -> np.ndarray:
    return np.asarray([x for x in values if x is not None], dtype=float)


def _bound(bound, n: int) -> np.ndarray | None:
    """A bound's values, when every draw has one (a bound missing for some draw: none)."""
    ends = [x for x in bound if x is not None] if bound is not None else []
    return np.asarray(ends, dtype=float) if len(ends) == n else None


def _logs(bound, n: int) -> list | None:
    """A bound's logarithms, when every draw has a positive one."""
    ends = _bound(bound, n)
    return None if ends is None or (ends <= 0).any() else np.log(ends).tolist()
