"""Tuning each plan before the plans are compared, with the same effort for both.

A plan's configuration is a ``Choice``: its layout (copies of the model per wafer for colocated
serving, the prefill/decode split for disaggregated) and its serving knobs (the colocated
policy, prefill tile, chunk budget, interleave ratio, the cap on running sequences, and the
decode micro-batch limit; disaggregated serving has the last three, each on its own role's
regions). Starting from a default, the knobs are tuned one at a time (coordinate ascent): every
value of the next knob is searched for its highest rate met, with the knobs before it as
chosen, and the best value stays (a tie keeps the earlier choice). Both plans take their steps
together, so that each round's serving runs go to the pool at once. The steps, with the rate of
every value tried, say what each knob bought.

A grid over every combination would cost the product of the knobs' values; coordinate ascent
costs their sum, and can miss a combination whose knobs only pay together.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from wse_emu.runtime.experiment import Config, Point, Search, Targets, evaluate, run_searches
from wse_emu.runtime.serve import RegionModel, ServeOptions
from wse_emu.runtime.workload import Requests


@dataclass(frozen=True)
class Choice:
    """One configuration of one plan: its layout and its serving knobs."""

    plan: str  # colocated or disaggregated
    layout: str  # "1 copy", "2 copies", ...; "share 0.5", "1 prefill system", ...
    policy: str = "prefill-priority"  # colocated only
    prefill_tile: int = 64
    token_budget: int = 256  # chunked prefill only
    interleave: int = 1  # interleaved only
    max_running: int = 0
    batch_limit: int = 64

    @property
    def knob(self) -> str:
        """The configuration as shown after its plan: the layout, the policy, and every knob
        that applies."""
        parts = [self.layout]
        if self.plan == "colocated":
            if self.policy == "chunked":
                parts.append(f"chunked {self.token_budget}")
            else:
                parts.append(self.policy.replace("-", " ")
                             + (f" {self.interleave}:1" if self.policy == "interleaved"
                                and self.interleave != 1 else ""))
        if not (self.plan == "colocated" and self.policy == "chunked"):
            parts.append(f"tile {self.prefill_tile}")
        parts.append(f"batch {self.batch_limit}")
        if self.max_running:
            parts.append(f"cap {self.max_running}")
        return ", ".join(parts)

    @property
    def label(self) -> str:
        return f"{self.plan}, {self.knob}"


@dataclass(frozen=True)
class Knob:
    """A knob to tune: its ``Choice`` field, the values to try, and the plans and policies it
    applies to."""

    name: str  # as shown
    field: str
    values: tuple
    policies: tuple = ()  # colocated policies it applies to (empty: every one)

    def applies(self, choice: Choice) -> bool:
        return not self.policies or (choice.plan == "colocated" and choice.policy
                                     in self.policies)


@dataclass
class Layout:
    """A compiled layout of one plan: its regions, with their stage-time tables."""

    plan: str
    name: str
    regions: list[RegionModel]


def config_of(choice: Choice, layouts: dict, base: ServeOptions) -> Config:
    """The ``Config`` a choice serves with."""
    layout = layouts[(choice.plan, choice.layout)]
    options = replace(base, policy=choice.policy, prefill_tile=choice.prefill_tile,
                      token_budget=choice.token_budget, interleave=choice.interleave,
                      max_running=choice.max_running, batch_limit=choice.batch_limit)
    return Config(choice.plan, choice.knob, layout.regions, options)


def evaluate_choice(layouts: dict, base: ServeOptions, requests: Requests, targets: Targets,
                    choice: Choice, factor: float) -> Point:
    """``evaluate`` of one (choice, factor) job, the form ``pool`` runs: the layouts (the
    large part) go to each worker once."""
    return evaluate(config_of(choice, layouts, base), requests, factor, targets)


@dataclass
class Step:
    """One knob tuned on one plan: the value of every try and its highest rate met."""

    plan: str
    knob: str
    tried: list  # (value, Choice)
    before: Choice | None  # the incumbent (None for the first step)
    chosen: Choice


def tune(initial: dict, knobs: dict, layouts: dict, base: ServeOptions, run_points,
         guess: dict, tolerance: float = 0.05,
         progress=None) -> tuple[dict, list[Step], dict]:
    """Coordinate ascent for every plan at once. ``initial``: plan -> starting Choice;
    ``knobs``: plan -> [Knob] in order; ``guess``: plan -> a factor to start the first searches
    at; ``run_points(jobs)`` evaluates (Choice, factor) jobs. Returns every Search (Choice ->
    Search), the steps taken, and each plan's best Choice."""
    searches: dict = {}
    current = dict(initial)
    steps: list[Step] = []
    for k in range(max(len(v) for v in knobs.values())):
        stage = {}  # plan -> (knob, [(value, choice)])
        for plan, choice in current.items():
            if k >= len(knobs[plan]) or not knobs[plan][k].applies(choice):
                continue
            knob = knobs[plan][k]
            tried = [(v, replace(choice, **{knob.field: v})) for v in knob.values]
            if len(tried) < 2 and all(c in searches for _, c in tried):
                continue  # a fixed knob: nothing to learn
            stage[plan] = (knob, tried)
            start = guess[plan] if not searches else _best_factor(searches, choice, guess[plan])
            for _, c in tried:
                if c not in searches:
                    searches[c] = Search(config_of(c, layouts, base), start=start)
        if not stage:
            continue
        pending = {c: searches[c] for _, tried in stage.values() for _, c in tried}
        run_searches(pending, run_points, tolerance=tolerance,
                     progress=(lambda r, n, name=" and ".join(kn.name for kn, _ in
                                                              stage.values()):
                               progress(f"tuning {name}: round {r}, {n} runs"))
                     if progress else None)
        for plan, (knob, tried) in stage.items():
            before = current[plan] if k else None
            # The highest rate met; ties go to the incumbent, then to the earlier value.
            order = sorted(tried, key=lambda vc: (-_rate(searches[vc[1]]),
                                                  vc[1] != current[plan]))
            current[plan] = order[0][1]
            steps.append(Step(plan, knob.name, tried, before, current[plan]))
    return searches, steps, current


def _rate(search: Search) -> float:
    best = search.best
    return search.points[best].rate if best is not None else 0.0


def _best_factor(searches: dict, choice: Choice, fallback: float) -> float:
    """Where the incumbent's search ended: the next searches start around it."""
    s = searches.get(choice)
    if s is None or s.best is None:
        return fallback
    return s.best
