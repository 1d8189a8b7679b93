"""Coordinate ascent over the plans' knobs (``tuning.tune``), on a made-up rate surface."""

from dataclasses import fields, replace
from typing import get_type_hints

import numpy as np

from wse_emu.experiments.comparison import Space
from wse_emu.experiments.goodput import Point
from wse_emu.experiments.tuning import KNOB_DEFAULTS, Choice, Knob, Layout, fitted, tune
from wse_emu.pools.kinds.base import SERVER_KNOBS
from wse_emu.serving.knobs import KNOB_NAMES, EngineKnobs, info, knob_fields
from wse_emu.serving.pools import StagePool
from wse_emu.serving.serve import ServeOptions
from wse_emu.serving.tables import StageTable

BASE = ServeOptions(clock_hz=1.0, kv_bytes_per_token=1)
LAYOUTS = {("colocated", name): Layout("colocated", name, []) for name in ("small", "large")}


def capacity(choice) -> float:
    """The highest rate met: nothing on the small layout, whatever the policy; on the large
    one, chunked serving twice as much as the others."""
    if choice.layout == "small":
        return 0.0
    return 2.0 if choice.policy == "chunked" else 1.0


def run_points(jobs, done=None):
    # A factor of the (unit) offered rate met when it lies under the choice's capacity.
    return [Point(f, f <= capacity(c), None) for c, f in jobs]


def test_each_policy_is_tuned_on_its_own_before_the_policies_are_compared():
    """On the first layout no policy meets anything: compared there, the tie says nothing
    and the default policy would stay. Each policy's line tunes the layout itself, and the
    policies are compared at their own best."""
    knobs = {"colocated": [Knob("policy", "policy", ("prefill-priority", "chunked")),
                           Knob("layout", "layout", ("small", "large"))]}
    initial = {"colocated": Choice("colocated", "small", "prefill-priority")}
    _, steps, best = tune(initial, knobs, LAYOUTS, BASE, run_points, lambda config: 4.0)
    assert (best["colocated"].layout, best["colocated"].policy) == ("large", "chunked")
    # The layout tuned on each policy's line, then what each policy bought at its best.
    assert [s.knob for s in steps] == ["layout", "layout", "policy"]
    assert [(v, c.layout) for v, c in steps[-1].tried] == [("prefill-priority", "large"),
                                                           ("chunked", "large")]
    assert steps[-1].chosen == best["colocated"]


def test_a_knob_that_met_nothing_is_tuned_again_in_a_second_round():
    """The chunk budget is tried first, on the small layout, where nothing meets anything:
    one pass keeps the default budget on the large layout; a second tries the budgets again
    there."""
    def capacity(c):
        if c.layout == "small":
            return 0.0
        return 2.0 if c.token_budget == 512 else 1.0

    def run(jobs, done=None):
        return [Point(f, f <= capacity(c), None) for c, f in jobs]
    knobs = {"colocated": [Knob("chunk budget", "token_budget", (256, 512)),
                           Knob("layout", "layout", ("small", "large"))]}
    initial = {"colocated": Choice("colocated", "small", "chunked")}
    _, _, once = tune(initial, knobs, LAYOUTS, BASE, run, lambda config: 4.0)
    assert (once["colocated"].layout, once["colocated"].token_budget) == ("large", 256)
    _, steps, best = tune(initial, knobs, LAYOUTS, BASE, run, lambda config: 4.0, rounds=3)
    # The third pass changes nothing, and ends the tuning.
    assert [s.knob for s in steps] == ["chunk budget", "layout"] * 3
    assert (best["colocated"].layout, best["colocated"].token_budget) == ("large", 512)


def test_a_knob_that_met_nothing_anywhere_is_left_as_it_is():
    knobs = {"colocated": [Knob("policy", "policy", ("prefill-priority", "chunked"))]}
    initial = {"colocated": Choice("colocated", "small", "prefill-priority")}
    _, steps, best = tune(initial, knobs, LAYOUTS, BASE, run_points, lambda config: 4.0,
                          rounds=3)
    assert [s.knob for s in steps] == ["policy"]  # nothing changed: no second pass
    assert best["colocated"].policy == "prefill-priority"


def test_a_second_round_takes_up_a_layout_that_a_later_knob_made_better():
    """The deeper layout loses at the default chunk; the larger chunk, chosen after it on
    the shallow layout, makes the deeper one win: one pass keeps the shallow layout, a
    second takes the deeper one, a third changes nothing and is not taken."""
    def capacity(c):
        if c.layout == "large":
            return 3.0 if c.token_budget == 512 else 1.0
        return 2.1 if c.token_budget == 512 else 2.0

    def run(jobs, done=None):
        return [Point(f, f <= capacity(c), None) for c, f in jobs]
    knobs = {"colocated": [Knob("layout", "layout", ("small", "large")),
                           Knob("chunk budget", "token_budget", (256, 512))]}
    initial = {"colocated": Choice("colocated", "small", "chunked")}
    _, _, once = tune(initial, knobs, LAYOUTS, BASE, run, lambda config: 4.0)
    assert (once["colocated"].layout, once["colocated"].token_budget) == ("small", 512)
    _, steps, best = tune(initial, knobs, LAYOUTS, BASE, run, lambda config: 4.0, rounds=5)
    assert (best["colocated"].layout, best["colocated"].token_budget) == ("large", 512)
    assert len(steps) == 6  # three passes of two knobs: the third changed nothing


def test_each_layout_tuned_finds_a_layout_that_needs_other_knobs():
    """The deeper layout wins only with the larger chunk, which the shallow one does not
    want: tuned layout first, the shallow one stays; each layout tuned, the deeper wins."""
    def capacity(c):
        if c.layout == "large":
            return 3.0 if c.token_budget == 512 else 1.0
        return 2.0 if c.token_budget == 256 else 1.5

    def run(jobs, done=None):
        return [Point(f, f <= capacity(c), None) for c, f in jobs]
    knobs = {"colocated": [Knob("layout", "layout", ("small", "large")),
                           Knob("chunk budget", "token_budget", (256, 512))]}
    initial = {"colocated": Choice("colocated", "small", "chunked")}
    _, _, once = tune(initial, knobs, LAYOUTS, BASE, run, lambda config: 4.0, rounds=3)
    assert (once["colocated"].layout, once["colocated"].token_budget) == ("small", 256)
    _, steps, each = tune(initial, knobs, LAYOUTS, BASE, run, lambda config: 4.0,
                          each_layout=True)
    assert (each["colocated"].layout, each["colocated"].token_budget) == ("large", 512)
    # The budget tuned on each layout's line, then what each layout bought at its best.
    assert [s.knob for s in steps] == ["chunk budget", "chunk budget", "layout"]
    assert [(v, c.token_budget) for v, c in steps[-1].tried] == [("small", 256),
                                                                 ("large", 512)]


def _pool(role: str, engine, prefill_top: int = 256, decode_top: int = 64):
    """A pool whose stage tables stop at the given largest sizes (their times unused)."""
    def table(phase, top):
        return StageTable(phase, np.array([1.0, top]), np.array([0.0, 1.0]),
                          np.ones((1, 2, 2)), np.zeros((2, 2)))
    return StagePool("p", role, 1000, table("prefill", prefill_top) if role != "decode" else None,
                     table("decode", decode_top) if role != "prefill" else None,
                     engine=engine)


def test_a_layout_tries_the_values_its_hardwares_engines_use_within_its_tables():
    wafer = Layout("colocated", "wafer", [_pool("mixed", EngineKnobs(), 256, 64)])
    declared = {f.name: info(f).tune for f in knob_fields()}
    # A wafer's are the declarations', a micro-batch's size cut to its tables.
    assert wafer.knob_values("token_budget") == tuple(
        v for v in declared["token_budget"] if v <= 256)
    assert wafer.knob_values("interleave") == declared["interleave"]
    server = Layout("colocated", "gpu", [_pool("mixed", SERVER_KNOBS, 8192, 256)])
    assert server.knob_values("token_budget")[-1] == 8192
    assert server.knob_values("batch_limit")[-1] == 256
    # Its engines' own defaults are where tuning starts, within what it tries.
    assert server.knob_start("token_budget") == 8192
    assert wafer.knob_start("token_budget") == KNOB_DEFAULTS["token_budget"]
    # A split: prefill knobs from the prefill side's hardware, decode knobs from the decode's.
    split = Layout("disaggregated", "gpu / wafer", [_pool("prefill", SERVER_KNOBS, 8192),
                                                    _pool("decode", EngineKnobs(), 256, 64)])
    assert split.knob_values("prefill_tile")[-1] == 8192
    assert split.knob_values("batch_limit") == (16, 32, 64)
    # Tables smaller than every value an engine uses: their largest size, nothing beyond.
    small = Layout("colocated", "small", [_pool("mixed", SERVER_KNOBS, 128, 8)])
    assert small.knob_values("token_budget") == (128,)
    assert small.knob_values("batch_limit") == (8,)


def test_a_choice_moved_to_another_kinds_layout_starts_its_knobs_where_that_kind_does():
    layouts = {("colocated", "wafer"): Layout("colocated", "wafer",
                                              [_pool("mixed", EngineKnobs(), 256, 64)]),
               ("colocated", "gpu"): Layout("colocated", "gpu",
                                            [_pool("mixed", SERVER_KNOBS, 8192, 256)])}
    knobs = [Knob("layout", "layout", ("wafer", "gpu")),
             Knob("chunk budget", "token_budget", None),
             Knob("decode batch limit", "batch_limit", (16, 32))]
    on_gpu = Choice("colocated", "gpu", "chunked", token_budget=8192, batch_limit=32)
    moved = fitted(replace(on_gpu, layout="wafer"), knobs, layouts)
    # 8,192 tokens is beyond a wafer's tables: its engines' start; a knob given values stays.
    assert (moved.token_budget, moved.batch_limit) == (256, 32)
    assert fitted(on_gpu, knobs, layouts) == on_gpu
    assert knobs[1].values_for(moved, layouts) == layouts[("colocated", "wafer")].knob_values(
        "token_budget")


def test_the_search_space_has_one_field_of_values_per_declared_knob():
    """``Space`` writes the knobs out again, as values to try: these fields and the
    declarations must not drift apart."""
    hints = get_type_hints(Space)
    to_try = [f.name for f in fields(Space) if hints[f.name] == tuple | None]
    assert to_try == list(KNOB_NAMES)
    assert all(getattr(Space(), name) is None for name in KNOB_NAMES)


def test_a_choice_holds_every_knob_at_its_declared_default():
    choice = Choice("colocated", "small")
    assert {name: getattr(choice, name) for name in KNOB_NAMES} == KNOB_DEFAULTS
    assert choice.policy == "prefill-priority"
    assert choice.label == "colocated, small, prefill priority, tile 64, batch 64"
