"""The frontier: each plan's output tokens/s per system against tokens/s per user, as the field
reads the trade-off (NVIDIA's AIConfigurator and SemiAnalysis' InferenceMAX plot throughput per
GPU against interactivity), and the answer at the vendor's own token speed.

Each rung of a ladder of per-user speeds S is one experiment (``comparison``): both plans
tuned alike at a p90 TPOT target of 1/S, each plan's best searched again on long runs, over the
draws. Its point per plan is that best: its output tokens/s per system over the steady window,
the per-user speeds it gave (p50, p90, mean), its goodput, its configuration and what binds it.
A serving run does not depend on the target, so the rungs share every run they have in common
(``RunBook``): the rungs cost far less than as many experiments.

The headline is high-speed token capacity: the output tokens/s per system a plan sustains with
the per-user speed of at least 90% of requests at or above S (p90 TPOT <= 1/S), at S = the
model's published vendor speed (``vendor_speed``). A plan that reaches S at no rate has a
capacity of 0, and a ratio over a zero is reported as unbounded, never as a number.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import yaml

from wse_emu.checks import short_repr
from wse_emu.errors import UserError
from wse_emu.runtime.experiment import interval

VENDOR_SPEEDS = Path(str(resources.files("wse_emu.programs"))) / "vendor_speeds.yaml"
SLOWEST_TPOT_S = 0.02  # the ladder's slow end: 50 tokens/s per user
RUNGS = 8  # rungs between the fastest a lone sequence allows and the slow end
FLOOR_MARGIN = 1.1  # the fastest rung's TPOT target: this many lone decode steps
PLANS = ("colocated", "disaggregated")


@dataclass(frozen=True)
class VendorSpeed:
    """A per-user output speed the vendor sells for a model, with where it is published."""

    tokens_per_s: float
    source: str


def vendor_speed(model_name: str) -> VendorSpeed | None:
    """The model's published vendor speed (``programs/models/vendor_speeds.yaml``), if any."""
    data = yaml.safe_load(VENDOR_SPEEDS.read_text()) or {}
    entry = data.get(model_name)
    if entry is None:
        return None
    return VendorSpeed(float(entry["tokens_per_s"]), str(entry["source"]))


def speed_ladder(floor_s: float, vendor: float | None = None, rungs: int = RUNGS) -> list[float]:
    """Per-user speeds (tokens/s) to aim at, fastest first: from 1/(FLOOR_MARGIN lone decode
    steps) down to 1/SLOWEST_TPOT_S in even steps of log, with the vendor's speed among them
    when it is reachable at all (slower than a lone sequence's step)."""
    fastest = 1.0 / (FLOOR_MARGIN * floor_s)
    slowest = 1.0 / SLOWEST_TPOT_S
    speeds = list(np.geomspace(fastest, slowest, rungs)) if fastest > slowest else [fastest]
    if vendor is not None and vendor < 1.0 / floor_s:
        speeds.append(float(vendor))
    return sorted({round(float(s), 6) for s in speeds}, reverse=True)


def check_speeds(speeds) -> tuple[float, ...]:
    """Per-user speeds given by hand: positive numbers, fastest first, each once."""
    if isinstance(speeds, (str, bytes)) or not hasattr(speeds, "__iter__"):
        raise UserError(f"`user_speeds` must be a sequence of tokens/s, got "
                        f"{short_repr(speeds)}")
    values = tuple(speeds)
    if not values or any(not isinstance(v, (int, float)) or not v > 0 for v in values):
        raise UserError(f"`user_speeds` must be one or more positive tokens/s, got "
                        f"{short_repr(values)}")
    return tuple(sorted(set(float(v) for v in values), reverse=True))


def plan_point(data: dict, plan: str) -> dict:
    """One plan's point on one rung, from the rung's experiment report: its best
    configuration's sustained output tokens/s per system, per-user speeds, goodput and what
    binds it, with 95% intervals over the draws where there are several."""
    cmp_ = data["comparison"]
    label = cmp_.get(plan)
    rows = {c["configuration"]: c for c in data["final"]}
    row = rows.get(label, {})
    met = row.get("max_rate_per_system", 0.0) > 0
    point = {"plan": plan, "configuration": label, "reached": met,
             "tokens_per_s_per_system": row.get("window_output_tokens_per_s_per_system", 0.0)
             if met else 0.0,
             "goodput_per_system": row.get("max_rate_per_system", 0.0),
             "user_tokens_per_s": row.get("user_tokens_per_s") if met else None,
             "limited_by": row.get("limited_by"),
             "prefill_utilization": row.get("prefill_utilization"),
             "decode_utilization": row.get("decode_utilization")}
    reasons = cmp_.get("reasons") or []
    point["why"] = next((r for r in reasons if label and r.startswith(label + ":")), None)
    if "over_replicates" in data:
        over = {c["configuration"]: c for c in data["over_replicates"]["configurations"]}
        if label in over:
            point["tokens_per_s_per_system_interval"] = \
                over[label]["window_output_tokens_per_s_per_system"]
            point["goodput_per_system_interval"] = over[label]["max_rate_per_system"]
    return point


def capacity_ratio(data: dict) -> dict:
    """Disaggregated over colocated sustained output tokens/s per system on one rung, over
    its draws: the mean and 95% interval where both plans reached it on every draw; else
    "unbounded" (only disaggregated reached it) or "neither"."""
    draws = data.get("replicates") or [{"configurations": data["final"],
                                        "comparison": data["comparison"]}]
    values, unbounded, neither = [], 0, 0
    for d in draws:
        rows = {c["configuration"]: c for c in d["configurations"]}
        got = {}
        for plan in PLANS:
            row = rows.get(d["comparison"].get(plan), {})
            got[plan] = row.get("window_output_tokens_per_s_per_system", 0.0) \
                if row.get("max_rate_per_system", 0.0) > 0 else 0.0
        if got["colocated"] > 0:
            values.append(got["disaggregated"] / got["colocated"])
        elif got["disaggregated"] > 0:
            unbounded += 1
        else:
            neither += 1
    out = {"draws": len(draws), "unbounded_draws": unbounded, "neither_draws": neither}
    if unbounded or neither:
        out["ratio"] = "unbounded" if unbounded and not values else None
        out["interval"] = interval(values) if values else None
        return out
    out["interval"] = interval(values)
    out["ratio"] = out["interval"]["mean"]
    return out


def pareto(points: list[dict]) -> list[dict]:
    """The points no other beats on both per-user speed (p90) and output tokens/s per system,
    fastest first: along it, a faster per-user speed never gives more throughput."""
    reached = [p for p in points if p["reached"]]
    reached.sort(key=lambda p: (-p["user_tokens_per_s"]["p90"], -p["tokens_per_s_per_system"]))
    front, best = [], -1.0
    for p in reached:
        if p["tokens_per_s_per_system"] > best:
            front.append(p)
            best = p["tokens_per_s_per_system"]
    return front


def rung_row(speed: float, data: dict) -> dict:
    """One rung: its target, each plan's point, the capacity ratio and DistServe's goodput
    ratio at the same target."""
    row = {"user_speed": speed, "tpot_target_s": 1.0 / speed,
           "plans": {plan: plan_point(data, plan) for plan in PLANS},
           "capacity_ratio": capacity_ratio(data),
           "goodput_ratio": data["comparison"].get("goodput_ratio")}
    if "over_replicates" in data:
        row["goodput_ratio_interval"] = data["over_replicates"]["goodput_ratio"]
    return row


def summarize(rungs: list[dict], vendor: VendorSpeed | None, speed: float | None) -> dict:
    """Each plan's frontier and fastest reachable speed, and the headline at ``speed``."""
    out = {"frontier": {}, "fastest_reached": {}}
    for plan in PLANS:
        points = [{**r["plans"][plan], "user_speed_target": r["user_speed"]} for r in rungs]
        out["frontier"][plan] = pareto(points)
        fastest = [p for p in points if p["reached"]]
        out["fastest_reached"][plan] = max(
            (p["user_tokens_per_s"]["p90"] for p in fastest), default=0.0)
    if speed is not None:
        rung = next(r for r in rungs if np.isclose(r["user_speed"], speed))
        out["headline"] = {
            "user_speed": speed, "tpot_target_s": 1.0 / speed,
            "vendor": None if vendor is None else {"tokens_per_s": vendor.tokens_per_s,
                                                   "source": vendor.source},
            "capacity_per_system": {p: rung["plans"][p]["tokens_per_s_per_system"]
                                    for p in PLANS},
            "capacity_ratio": rung["capacity_ratio"],
            "goodput_ratio": rung["goodput_ratio"],
            "goodput_ratio_interval": rung.get("goodput_ratio_interval"),
            "configurations": {p: rung["plans"][p]["configuration"] for p in PLANS},
            "why": {p: rung["plans"][p]["why"] for p in PLANS}}
    return out
