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


def test_a_knob_that_met_nothing_is_tuned_again_after_the_others():
    """The policy is tried first, on the first layout, where no policy meets anything: the
    tie says nothing, so the policy is tried again once the layout is chosen."""
    knobs = {"colocated": [Knob("policy", "policy", ("prefill-priority", "chunked")),
                           Knob("layout", "layout", ("small", "large"))]}
    initial = {"colocated": Choice("colocated", "small", "prefill-priority")}
    _, steps, best = tune(initial, knobs, LAYOUTS, BASE, run_points, lambda config: 4.0)
    assert [s.knob for s in steps] == ["policy", "layout", "policy", "layout"]
    assert best["colocated"].layout == "large"
    assert best["colocated"].policy == "chunked"


def test_a_knob_that_met_nothing_twice_is_left_as_it_is():
    knobs = {"colocated": [Knob("policy", "policy", ("prefill-priority", "chunked"))]}
    initial = {"colocated": Choice("colocated", "small", "prefill-priority")}
    _, steps, best = tune(initial, knobs, LAYOUTS, BASE, run_points, lambda config: 4.0)
    assert [s.knob for s in steps] == ["policy", "policy"]
    assert best["colocated"].policy == "prefill-priority"
