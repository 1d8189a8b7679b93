"""Every option is checked in the library, by name, whichever way it comes in; the command
line's serving flags are made from the knobs' declarations, with the same defaults."""

import argparse

import pytest
from helpers import SMALL_CHAT

from wse_emu import api
from wse_emu.cli.knob_args import add_serving_args, serving_settings
from wse_emu.cli.spec_args import add_spec_args, spec_from_args
from wse_emu.errors import UserError
from wse_emu.experiments.comparison import Space
from wse_emu.experiments.goodput import Point, Search, Targets, run_searches
from wse_emu.experiments.spec import ExperimentSpec
from wse_emu.serving.knobs import info
from wse_emu.serving.policies import POLICIES, knob_fields
from wse_emu.serving.serve import ServeOptions
from wse_emu.sim.runner import DEFAULT_PREFILL_TILES


@pytest.fixture(scope="module")
def program():
    return api.compile("tiny", "mesh16", region=(8, 8))


def bad_values(f):
    """Values of a knob the library must refuse: below its lowest, not whole numbers."""
    return [info(f).low - 1, 1.5, "8", True, None]


@pytest.mark.parametrize("f", knob_fields(), ids=lambda f: f.name)
def test_every_knob_out_of_range_is_refused_by_name(program, f, tmp_path):
    for value in bad_values(f):
        with pytest.raises(UserError, match=f"`{f.name}`"):
            api.serve(program, SMALL_CHAT, cache_dir=tmp_path, **{f.name: value})
        with pytest.raises(UserError, match=f"`{f.name}`"):
            ServeOptions(clock_hz=1e9, kv_bytes_per_token=0, **{f.name: value})
        with pytest.raises(UserError, match=f"`{f.name}`"):
            Space(**{f.name: (info(f).tune[0], value)})
    with pytest.raises(UserError, match=f"`{f.name}` needs at least one value"):
        Space(**{f.name: ()})


@pytest.mark.parametrize("settings, name", [
    ({"policy": "fastest"}, "policy"), ({"policy": 3}, "policy"),
    ({"prefix_cache": "yes"}, "prefix_cache"), ({"timeline_events": -1}, "timeline_events"),
    ({"batch_limit": 65}, "batch_limit"), ({"prefill_tile": 8192}, "prefill_tile"),
    ({"ttft_s": 0}, "ttft_s"), ({"tpot_s": -1.0}, "tpot_s"), ({"rate": 0}, "rate"),
    ({"requests": 0}, "requests"), ({"loop": "fast"}, "loop"),
    ({"speed": 2}, "speed"),
])
def test_serving_options_are_checked_before_any_work(program, settings, name, tmp_path):
    with pytest.raises(UserError, match=f"`{name}`"):
        api.serve(program, SMALL_CHAT, cache_dir=tmp_path, **settings)
    assert not list(tmp_path.iterdir())  # refused before any table was timed


@pytest.mark.parametrize("settings, name", [
    ({"phase": "both"}, "phase"), ({"batch": 0}, "batch"), ({"context": -5}, "context"),
    ({"tokens": 2.5}, "tokens"), ({"tiles": 0}, "tiles"), ({"tiles": 1000}, "tiles"),
    ({"engine": "exact"}, "engine"), ({"batch": 64, "context": 10**4}, "batch"),
    ({"context": 10**6}, "context"), ({"phase": "prefill", "tokens": 10**6}, "tokens"),
])
def test_a_step_is_checked_by_name(program, settings, name):
    with pytest.raises(UserError, match=f"`{name}"):
        api.run(program, **settings)


@pytest.mark.parametrize("settings, name", [
    ({"seeds": 0}, "seeds"), ({"workers": -1}, "workers"), ({"tolerance": 0}, "tolerance"),
    ({"tolerance": 1.5}, "tolerance"), ({"price_per_system_hour": 0}, "price_per_system_hour"),
    ({"requests": 1}, "requests"), ({"attention_tile": -1}, "attention_tile"),
    ({"ttft_s": 0}, "ttft_s"), ({"attainment": 1.5}, "attainment"), ({"systems": 0}, "systems"),
    ({"space": Space(copies=(1,)), "vary": "speed=1,2"}, "vary"),
    ({"space": "quick"}, "space"),
    # A size beyond the tables of the hardware it would be read from (a wafer's quick grid).
    ({"space": Space(grid="quick", prefill_tile=(64, 512))}, "prefill_tile"),
    ({"space": Space(token_budget=(8192,))}, "token_budget"),
])
def test_experiment_arguments_are_checked_by_name(settings, name, tmp_path):
    arguments = {"ttft_s": 0.05, "tpot_s": 0.001, "fabric": "mesh16", "workers": 1,
                 "cache_dir": tmp_path, **settings}
    with pytest.raises(UserError, match=f"`{name}"):
        api.experiment(api.from_flat(
            api.ExperimentSpec, model="tiny", workload=SMALL_CHAT, **arguments))
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("settings, name", [
    ({"copies": (0,)}, "copies"), ({"policy": ("fastest",)}, "policy"), ({"policy": ()},
                                                                          "policy"),
    ({"window_s": -1}, "window_s"), ({"grid": "fine"}, "grid"), ({"prefix_cache": 1},
                                                                "prefix_cache"),
])
def test_the_search_space_is_checked_by_name(settings, name):
    with pytest.raises(UserError, match=f"`{name}`"):
        Space(**settings)


def test_targets_are_checked_by_name():
    for bad in (0, -1, float("nan"), "1", True):
        with pytest.raises(UserError, match="`tpot_s`"):
            Targets(1.0, bad)


def test_the_command_lines_flags_are_the_knobs_with_their_defaults():
    serve = argparse.ArgumentParser()
    add_serving_args(serve)
    defaults = serving_settings(serve.parse_args([]))
    options = ServeOptions(clock_hz=1.0, kv_bytes_per_token=0)
    assert defaults == {name: getattr(options, name) for name in defaults}
    assert set(defaults) == {f.name for f in knob_fields()} | {
        "policy", "prefix_cache", "router", "kv_tier", "host_kv_bytes", "draft_tokens",
        "acceptance", "acceptance_seed"}
    experiment = argparse.ArgumentParser()
    add_spec_args(experiment, ExperimentSpec)
    parsed = experiment.parse_args(["--workload", "chat", "--ttft-slo", "1", "--tpot-slo", "1"])
    space = spec_from_args(ExperimentSpec, parsed, model="tiny").space
    for f in knob_fields():
        # Left to each kind of hardware's engines (``Layout.knob_values``) unless given.
        assert getattr(space, f.name) is None and getattr(Space(), f.name) is None
    assert space.policy == tuple(POLICIES)


def test_one_default_for_a_steps_prefill_tiles():
    """The API's run takes as many prefill tiles as the command line's by default."""
    from wse_emu.cli.run_cmd import add_parser
    from wse_emu.sim.steps import StepShape

    assert StepShape().tiles == DEFAULT_PREFILL_TILES
    sub = argparse.ArgumentParser().add_subparsers()
    add_parser(sub, "")
    assert sub.choices["run"].parse_args(["tiny"]).tiles == DEFAULT_PREFILL_TILES


def test_a_search_brackets_from_the_ceiling_and_stops_within_the_tolerance():
    """A made-up configuration that meets its targets up to 37% of its ceiling: the first round
    brackets the rate within a factor of two, and the search ends within the tolerance in
    three rounds of three runs."""
    ceiling = 40.0
    runs = []

    def run_points(jobs, done=None):
        runs.extend(jobs)
        return [Point(f, f <= 0.37 * ceiling, None) for _, f in jobs]
    search = Search(config=None, ceiling=ceiling)
    assert search.proposals(3, 0.05) == [10.0, 20.0, 40.0]
    run_searches({0: search}, run_points, tolerance=0.05)
    assert search.best <= 0.37 * ceiling < search.failed <= 1.05 * search.best
    assert len(runs) <= 9
