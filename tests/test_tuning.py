"""Coordinate ascent over the plans' knobs (``tuning.tune``), on a made-up rate surface."""

from wse_emu.runtime.experiment import Point
from wse_emu.runtime.serve import ServeOptions
from wse_emu.runtime.tuning import Choice, Knob, Layout, tune

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


def test_a_knob_that_met_nothing_is_tuned_again_in_a_second_round():
    """The policy is tried first, on the first layout, where no policy meets anything: the
    tie says nothing. One pass keeps the default policy; a second tries the policies again on
    the layout chosen."""
    knobs = {"colocated": [Knob("policy", "policy", ("prefill-priority", "chunked")),
                           Knob("layout", "layout", ("small", "large"))]}
    initial = {"colocated": Choice("colocated", "small", "prefill-priority")}
    _, _, once = tune(initial, knobs, LAYOUTS, BASE, run_points, lambda config: 4.0)
    assert (once["colocated"].layout, once["colocated"].policy) == ("large", "prefill-priority")
    _, steps, best = tune(initial, knobs, LAYOUTS, BASE, run_points, lambda config: 4.0,
                          rounds=3)
    # The third pass changes nothing, and ends the tuning.
    assert [s.knob for s in steps] == ["policy", "layout"] * 3
    assert best["colocated"].layout == "large"
    assert best["colocated"].policy == "chunked"


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
    assert {s.plan for s in steps} == {"colocated"} and len(steps) == 2
