"""Tuning each plan before the plans are compared, with the same effort for both.

A plan's configuration is a ``Choice``: its layout (copies of the model per wafer for colocated
serving, the prefill/decode split for disaggregated), its colocated policy and its serving
knobs (``ServingKnobs``: each applies where the configuration's policy reads it; a split's
regions serve first come first served, with that policy's knobs). Starting from a default,
the knobs are tuned one at a time (coordinate ascent): every value of the next knob is
searched for its highest rate met, with the knobs before it as chosen, and the best value
stays (a tie keeps the earlier choice). Both plans take their steps together, so that each
round's serving runs go to the pool at once. The steps, with the rate of every value tried,
say what each knob bought.

A grid over every combination would cost the product of the knobs' values; coordinate ascent
costs their sum, and can miss a combination whose knobs only pay together.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import product

from wse_emu.experiments.goodput import Config, Run, Search, run_searches, serve_run
from wse_emu.serving.knobs import KNOB_NAMES, ServingKnobs, info, knob_fields, knob_info
from wse_emu.serving.policies import POLICIES, SPLIT_POLICY
from wse_emu.serving.serve import ServeOptions
from wse_emu.serving.workload import Requests


@dataclass(frozen=True)
class Choice(ServingKnobs):
    """One configuration of one plan: its layout ("1 copy", "2 copies", ...; "share 0.5",
    "1 prefill system", ...), the colocated policy, and every serving knob's value (its
    ``ServingKnobs`` fields, each applying where the configuration's policy reads it)."""

    plan: str
    layout: str
    policy: str = SPLIT_POLICY.name

    def policy_class(self):
        """The policy its regions serve with: the colocated one it names, or a split's."""
        return POLICIES[self.policy] if self.plan == "colocated" else SPLIT_POLICY

    @property
    def knob(self) -> str:
        """The configuration as shown after its plan: the layout, the colocated policy, and
        every knob that applies."""
        policy = self.policy_class()
        parts = [self.layout]
        if self.plan == "colocated":
            parts.append(policy.of(self).title())
        names = policy.knob_names()
        for f in knob_fields():
            part = info(f).label_part(getattr(self, f.name)) if f.name in names else None
            if part:
                parts.append(part)
        return ", ".join(parts)

    @property
    def label(self) -> str:
        return f"{self.plan}, {self.knob}"


KNOB_DEFAULTS = {f.name: f.default for f in knob_fields()}


@dataclass(frozen=True)
class Knob:
    """A knob to tune: its ``Choice`` field, the values to try (None: on each layout, those its
    hardware's serving engines use, ``Layout.knob_values``), and its name as shown."""

    name: str
    field: str
    values: tuple | None

    def applies(self, choice) -> bool:
        """The layout and the policy always apply; a policy's knob where the choice's policy
        reads it."""
        return self.field in ("layout", "policy") or \
            self.field in choice.policy_class().knob_names()

    def values_for(self, choice, layouts: dict) -> tuple:
        """The values to try on ``choice``'s layout."""
        if self.values is not None:
            return self.values
        return layouts[(choice.plan, choice.layout)].knob_values(self.field)


@dataclass
class Layout:
    """A compiled layout of one plan: its pools (regions with their stage-time tables)."""

    plan: str
    name: str
    regions: list
    # What it takes of the hardware, in the experiment's unit (None: the cluster's systems),
    # where layouts of one experiment differ (pools of several kinds).
    footprint: float | None = None
    # Speculative decoding: tokens drafted per verify step its decoding regions are built for
    # (0: none), and the draft's KV bytes per token, which a handoff carries too.
    draft_tokens: int = 0
    draft_kv_bytes_per_token: int = 0

    def _serving(self, phase: str | None) -> list:
        """Its pools that serve ``phase`` (None: all)."""
        return [r for r in self.regions if phase is None or r.role in (phase, "mixed")]

    def table_top(self, phase: str) -> int:
        """The largest micro-batch size for ``phase`` that every one of its tables holds."""
        return int(min(getattr(r, phase).axis0[-1] for r in self._serving(phase)))

    def knob_values(self, name: str) -> tuple:
        """The values the default search tries of knob ``name`` here: those the serving engines
        of the pools that serve its phase use (``StagePool.engine``), a micro-batch's size cut
        to what their stage tables hold (a wafer's quick grid stops at 256-token tiles)."""
        declared = knob_info(name)
        pools = self._serving(declared.phase)
        values = sorted({v for r in pools for v in r.engine.values_of(name, declared)})
        if declared.sizes:
            top = self.table_top(declared.phase)
            values = [v for v in values if v <= top] or [top]
        return tuple(values)

    def engine_start(self, name: str) -> int:
        """Knob ``name``'s default on the engines of its pools that serve its phase (the
        declaration's where they name none)."""
        return min(r.engine.start_of(name, KNOB_DEFAULTS[name])
                   for r in self._serving(knob_info(name).phase))

    def knob_start(self, name: str) -> int:
        """Where tuning starts knob ``name`` here: its engines' default (``engine_start``), or
        the nearest value below it tried."""
        values, start = self.knob_values(name), self.engine_start(name)
        return max((v for v in values if v <= start), default=values[0])


def fitted(choice, knobs: list, layouts: dict):
    """``choice`` with each knob tried at its layout's own values (``Knob.values`` None) set to
    the layout's start where its value is not among them: a layout of another kind of hardware
    is not judged at values its engines do not run."""
    layout = layouts[(choice.plan, choice.layout)]
    changes = {k.field: layout.knob_start(k.field) for k in knobs if k.values is None
               and getattr(choice, k.field) not in layout.knob_values(k.field)}
    return replace(choice, **changes) if changes else choice


def config_of(choice, layouts: dict, base: ServeOptions) -> Config:
    """The ``Config`` a choice serves with."""
    layout = layouts[(choice.plan, choice.layout)]
    options = replace(base, policy=choice.policy,
                      **{name: getattr(choice, name) for name in KNOB_NAMES})
    if layout.draft_tokens:
        options = replace(options, draft_tokens=layout.draft_tokens,
                          kv_bytes_per_token=base.kv_bytes_per_token
                          + layout.draft_kv_bytes_per_token)
    return Config(choice.plan, choice.knob, layout.regions, options, layout.footprint)


def serve_choice(layouts: dict, base: ServeOptions, requests: Requests, choice,
                 factor: float) -> Run:
    """``serve_run`` of one (choice, factor) job, the form ``pool`` runs: the layouts (the
    large part) go to each worker once."""
    return serve_run(config_of(choice, layouts, base), requests, factor)


@dataclass
class Step:
    """One knob tuned on one plan: the value of every try and its highest rate met; on a
    line of ascent with some knobs fixed (``line``: their values, as shown), or across the
    lines, comparing their best (``line`` empty, ``before`` None)."""

    plan: str
    knob: str
    tried: list  # (value, Choice)
    before: object | None  # the incumbent Choice (None for the first step)
    chosen: object
    line: str = ""


def tune(initial: dict, knobs: dict, layouts: dict, base: ServeOptions, run_points,
         ceiling_of, tolerance: float = 0.05, progress=None, rounds: int = 1,
         each_layout: bool = False) -> tuple[dict, list[Step], dict]:
    """Coordinate ascent for every plan at once. ``initial``: plan -> starting Choice;
    ``knobs``: plan -> [Knob] in order; ``ceiling_of(config)``: the factor at a
    configuration's analytic ceiling, where its search starts bracketing; ``run_points(jobs,
    done)`` evaluates (Choice, factor) jobs. Returns every Search (Choice -> Search), the steps
    taken, and each plan's best Choice.
    Each colocated policy has its own knobs tuned before the policies are compared: a policy
    judged at the knobs another one tuned, or on a layout where none meets the targets, would
    lose for want of its own (chunks of 8,192 tokens judged at a wafer's 256). Up to
    ``rounds`` passes over the knobs, a further one only while the last changed some line's
    choice: a knob tuned where nothing could meet the targets is tuned again on the layout
    chosen after it, and knobs that pay only together get a second look (a deeper copy that
    needs a larger chunk); a configuration searched once is not searched again. With
    ``each_layout``, every layout of a plan has its other knobs tuned so too, and the plan
    takes the best of them: a layout that needs other knobs than the default's (a wider copy,
    a larger chunk) is not judged at the default's, for as many tunings as there are
    layouts."""
    searches: dict = {}
    steps: list[Step] = []
    # One line of ascent per plan and each value of the knobs tuned apart (fixed on the
    # line): the colocated policies always, the layouts with ``each_layout``.
    lines, line_knobs, apart = {}, {}, {}
    for plan, choice in initial.items():
        apart[plan] = [k for k in knobs[plan]
                       if (k.field == "policy" and len(k.values) > 1)
                       or (each_layout and k.field == "layout")]
        rest = [k for k in knobs[plan] if k not in apart[plan]]
        for values in product(*(k.values for k in apart[plan])):
            line = replace(choice, **{k.field: v for k, v in zip(apart[plan], values)})
            lines[(plan, *values)] = fitted(line, knobs[plan], layouts)
            line_knobs[(plan, *values)] = rest
    for _ in range(rounds):
        before = dict(lines)
        _one_pass(lines, line_knobs, layouts, base, run_points, ceiling_of, tolerance,
                  progress, searches, steps)
        if lines == before:
            break
    configs = {c: config_of(c, layouts, base) for c in lines.values() if c not in searches}
    unsearched = {c: Search(config, ceiling=ceiling_of(config)) for c, config in configs.items()}
    if unsearched:  # a line with no knob left to tune: its one configuration
        searches.update(unsearched)
        run_searches(unsearched, run_points, tolerance=tolerance, progress=progress,
                     label="searching each layout")
    best = {}
    for choice in lines.values():  # the highest rate met; ties to the earlier line
        incumbent = best.get(choice.plan)
        if incumbent is None or _rate(searches[choice]) > _rate(searches[incumbent]):
            best[choice.plan] = choice
    for plan, kept in best.items():  # what each knob tuned apart bought, at its lines' best
        for knob in apart[plan]:
            tried = []
            for value in knob.values:
                mine = [c for c in lines.values()
                        if c.plan == plan and getattr(c, knob.field) == value]
                tried.append((value, max(mine, key=lambda c: _rate(searches[c]))))
            steps.append(Step(plan, knob.name, tried, None, kept))
    return searches, steps, best


def _one_pass(current: dict, knobs: dict, layouts: dict, base: ServeOptions, run_points,
              ceiling_of, tolerance: float, progress, searches: dict, steps: list) -> None:
    """One pass of coordinate ascent over every line's knobs (``current``: line -> Choice, a
    line being a plan, or a plan at one layout), ``current`` updated."""
    first = not steps
    for k in range(1, max(len(v) for v in knobs.values()) + 1):
        stage = {}  # plan -> (knob, [(value, choice)])
        for plan, choice in current.items():
            if k > len(knobs[plan]) or not knobs[plan][k - 1].applies(choice):
                continue
            knob = knobs[plan][k - 1]
            tried = [(v, fitted(replace(choice, **{knob.field: v}), knobs[plan], layouts))
                     for v in knob.values_for(choice, layouts)]
            if len(tried) < 2 and all(c in searches for _, c in tried):
                continue  # a fixed knob: nothing to learn
            stage[plan] = (knob, tried)
            for _, c in tried:
                if c not in searches:
                    config = config_of(c, layouts, base)
                    searches[c] = Search(config, ceiling=ceiling_of(config))
        if not stage:
            continue
        pending = {c: searches[c] for _, tried in stage.values() for _, c in tried}
        run_searches(pending, run_points, tolerance=tolerance, progress=progress,
                     label="tuning " + " and ".join(  # each knob once (``each_layout``)
                         dict.fromkeys(kn.name for kn, _ in stage.values())))
        for plan, (knob, tried) in stage.items():
            before = current[plan] if k > 1 or not first else None
            # The highest rate met; ties go to the incumbent, then to the earlier value.
            order = sorted(tried, key=lambda vc: (-_rate(searches[vc[1]]),
                                                  vc[1] != current[plan]))
            current[plan] = order[0][1]
            steps.append(Step(current[plan].plan, knob.name, tried, before, current[plan],
                              ", ".join(str(v).replace("-", " ") for v in plan[1:])))


def _rate(search: Search) -> float:
    """The highest rate met, per unit of the configuration's footprint where layouts differ
    in it (pools of several kinds)."""
    best = search.best
    rate = search.points[best].rate if best is not None else 0.0
    return rate / (search.config.footprint or 1)
