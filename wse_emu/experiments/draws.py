"""How many draws of the workload an experiment runs: a fixed number, or draws added until the
ratio it reports is precise enough (its 95% interval on the log scale within a share of it,
``intervals.ratio_interval``) or a cap is reached; and, where the cap comes first, why.

Each draw is a whole search of the tuned configurations on a fresh draw (a synthetic
workload's next seed, a trace's next window), paired: both plans see the same draws. Draws
are added, never replaced: the first n draws are the same whatever the cap, so an answer over
more draws extends the one over fewer (the serving runs already made are kept, ``RunBook``).
The number added each time is the estimate of what the precision needs if the draws' spread
stays as it is (Student's quantile and one over the root of the draws both shrink the
interval), at least one. Stopping at the first count precise enough leans the interval
slightly narrow, as any sequential rule does; the report gives the draws it took."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from wse_emu.experiments.intervals import t975

MIN_ADDED_DRAWS = 3  # draws added from: fewer give an interval too wide to judge by
DEFAULT_MAX_SEEDS = 20
DEFAULT_PRECISION = 0.1  # +-10% of the ratio, on the log scale


@dataclass(frozen=True)
class DrawPlan:
    """Draws to run first (``start``), the most (``cap``), and the precision asked (None:
    the ``start`` draws, fixed)."""

    start: int
    cap: int
    precision: float | None

    @property
    def fixed(self) -> bool:
        return self.precision is None

    def within(self, windows: int) -> "DrawPlan":
        """The plan on a trace that holds ``windows`` windows: added draws no more than that
        (fixed draws stay as asked: a window past the trace's end is refused where drawn)."""
        if self.fixed:
            return self
        cap = max(1, min(self.cap, windows))
        return DrawPlan(min(self.start, cap), cap, self.precision)


@dataclass(frozen=True)
class Swing:
    """What one experiment's draws give the ratio: its interval (``ratio_interval``, None
    when some draw has no ratio), each plan's value per draw, and each draw's requests."""

    interval: dict | None
    per_plan: dict  # plan -> value per draw (None where the plan reached nothing)
    draws: list  # the Requests of each draw
    undefined: str | None = None  # why there is no ratio on every draw


def run_until_precise(plan: DrawPlan, run: Callable, swing_of: Callable,
                      progress=None) -> tuple:
    """``run(n)`` on the first n draws, n from ``plan.start``, adding draws until the ratio
    (``swing_of(result)``, a Swing) is within ``plan.precision`` or ``plan.cap`` draws ran:
    the last result and the precision's account (``precision_report``)."""
    n = plan.start
    while True:
        result = run(n)
        swing = swing_of(result)
        wanted = _draws_wanted(plan, n, swing)
        if wanted is None:
            return result, precision_report(plan, n, swing)
        if progress:
            progress(f"the ratio's interval is +-{relative_width(swing.interval):.0%} over {n} "
                     f"draws, more than +-{plan.precision:.0%}: {wanted} draws")
        n = wanted


def _draws_wanted(plan: DrawPlan, n: int, swing: Swing) -> int | None:
    """The draws to run next, or None when these are enough (or no more would help)."""
    if plan.fixed or n >= plan.cap or swing.undefined is not None:
        return None
    width = relative_width(swing.interval)
    if width is None or width <= plan.precision:
        return None
    return min(plan.cap, max(n + 1, _draws_for(swing.interval, n, plan.precision, plan.cap)))


def _draws_for(iv: dict, n: int, precision: float, cap: int) -> int:
    """The fewest draws whose interval would be within ``precision`` if the draws' spread
    stayed as it is: on the log scale the half-width is t(m - 1) x sd / sqrt(m), and both the
    quantile and the root fall as draws m are added. (A linear interval, or one widened by the
    rate search's step, is estimated the same way from its half-width.)"""
    if "log_half_width" in iv:
        half, target = iv["log_half_width"], math.log1p(precision)
    else:
        half, target = iv["high"] - iv["mean"], precision * iv["mean"]
    spread = half * math.sqrt(n) / t975(n - 1)  # the draws' standard deviation
    for m in range(n + 1, cap + 1):
        if t975(m - 1) * spread / math.sqrt(m) <= target:
            return m
    return cap


def relative_width(iv: dict | None) -> float | None:
    """How far an interval's upper end lies above its centre, as a share of it (None: no
    interval)."""
    if not iv or "low" not in iv or not iv.get("mean"):
        return None
    if "relative_half_width" in iv:
        return iv["relative_half_width"]
    return (iv["high"] - iv["mean"]) / iv["mean"]


def precision_report(plan: DrawPlan, n: int, swing: Swing) -> dict:
    """The precision asked and reached over ``n`` draws, and, when not reached, why."""
    width = relative_width(swing.interval)
    out = {"asked": plan.precision, "draws": n, "max_draws": plan.cap,
           "relative_half_width": width,
           "reached": width is not None and plan.precision is not None
           and width <= plan.precision}
    if plan.fixed or out["reached"]:
        return out
    out["why"] = swing.undefined or (
        f"{n} draws, the most allowed, leave the interval at +-{width:.1%}" if width is not None
        else "one draw gives no interval")
    spread = plan_spread(swing)
    if spread:
        out["spread"] = spread
    return out


def plan_spread(swing: Swing) -> dict | None:
    """Which plan's capacity swings more between the draws (coefficient of variation), and
    the draws where the ratio was lowest and highest, with what their requests carried."""
    cvs = {}
    for plan, values in swing.per_plan.items():
        v = np.asarray([x for x in values if x is not None], dtype=float)
        if len(v) >= 2 and v.mean() > 0:
            cvs[plan] = float(v.std(ddof=1) / v.mean())
    if not cvs:
        return None
    out = {"coefficient_of_variation": cvs, "swings_most": max(cvs, key=cvs.get)}
    ratios = (swing.interval or {}).get("values") or []
    if len(ratios) >= 2 and len(ratios) == len(swing.draws):
        for name, k in (("lowest", int(np.argmin(ratios))), ("highest", int(np.argmax(ratios)))):
            r = swing.draws[k]
            out[f"{name}_draw"] = {"draw": k, "ratio": ratios[k],
                                   "mean_prompt_tokens": float(r.prompt_tokens.mean()),
                                   "mean_output_tokens": float(r.output_tokens.mean())}
    return out


def precision_text(report: dict | None) -> str | None:
    """One sentence on the draws and the precision (None: nothing to say)."""
    if not report or report.get("asked") is None:
        return None
    n, width = report["draws"], report.get("relative_half_width")
    shown = "no interval" if width is None else f"+-{width:.1%}"
    where = ""
    if report.get("judged_at") is not None:  # a frontier whose headline neither plan reaches
        where = (f" at {report['judged_at']:,.0f} tokens/s per user (neither plan reaches "
                 f"{report['headline_unreached']:,.0f} on any draw; this is the fastest rung "
                 "both reach on each)")
    if report["reached"]:
        return (f"Draws added until the ratio's 95% interval{where} was within "
                f"+-{report['asked']:.0%}: {n} draws, {shown}.")
    text = (f"Precision +-{report['asked']:.0%} not reached{where} ({shown} over {n} draws of "
            f"at most {report['max_draws']}): {report['why']}.")
    spread = report.get("spread")
    if spread:
        cv = spread["coefficient_of_variation"]
        most = spread["swings_most"]
        text += f" {most.capitalize()} swings most between draws (" + ", ".join(
            f"{plan} {value:.0%}" for plan, value in cv.items()) + " coefficient of variation)"
        low, high = spread.get("lowest_draw"), spread.get("highest_draw")
        if low and high:
            text += (f"; the ratio was lowest on draw {low['draw'] + 1} ({low['ratio']:.2f}x: "
                     f"mean prompt {low['mean_prompt_tokens']:,.0f} tokens, output "
                     f"{low['mean_output_tokens']:,.0f}) and highest on draw {high['draw'] + 1} "
                     f"({high['ratio']:.2f}x: {high['mean_prompt_tokens']:,.0f} and "
                     f"{high['mean_output_tokens']:,.0f})")
        text += "."
    return text
