"""Every public function of ``wse_emu.api`` (and the Space and Targets it takes) refuses an
argument of the wrong type with one ``UserError`` naming it as the API spells it, in
backquotes, before any work: never a TypeError, AttributeError, ValueError or KeyError from
deep inside, after a compile or a table's timing.

The parameters come from each function's signature, and the options a ``**options`` gathers
from the dataclass they fill, so that a new parameter is covered the day it appears; the wrong
values for each come from its annotation (a str where no str goes, a bool where no bool goes,
None where None is not allowed, a list, a dict, an object, a fraction where a whole number
goes, a negative number, a NaN and infinity, which no parameter takes). A parameter without an
annotation fails ``test_every_parameter_says_what_it_takes``. Only the valid arguments each
function is called with are listed by hand (``BASE``).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import types
import typing
from collections import abc
from pathlib import Path

import pytest
import yaml
from helpers import SMALL_CHAT, forbid_work, work_entries

from wse_emu import api
from wse_emu.compiler.options import CompileOptions
from wse_emu.errors import UserError
from wse_emu.serving.serve import ServeOptions, setting_names
from wse_emu.sim.steps import StepShape
from wse_emu.util.checks import type_hints

# What a ``**options`` parameter gathers: the fields of the dataclass it fills.
OPTIONS = {"compile": {f.name for f in dataclasses.fields(CompileOptions)},
           "serve": set(setting_names()), "serve_pools": set(setting_names()),
           "check_serving": set(setting_names()),
           "run": {f.name for f in dataclasses.fields(StepShape)}}
OPTION_HINTS = {"compile": CompileOptions, "serve": ServeOptions, "serve_pools": ServeOptions,
                "check_serving": ServeOptions, "run": StepShape}


def _callable(name: str):
    return getattr(api, name)


def _parameters(name: str) -> list[str]:
    """Every parameter a public name takes, ``**options`` spelled out as its fields."""
    out = []
    for p in inspect.signature(_callable(name)).parameters.values():
        if p.kind == inspect.Parameter.VAR_KEYWORD:
            out += sorted(OPTIONS[name])
        elif p.kind != inspect.Parameter.VAR_POSITIONAL:
            out.append(p.name)
    return out


def _hints(name: str) -> dict:
    thing = _callable(name)
    # (``type_hints``: the face imports the experiments' names when first asked for them)
    hints = (typing.get_type_hints(thing) if inspect.isclass(thing)
             else type_hints(inspect.unwrap(thing)))
    if name in OPTION_HINTS:
        options = typing.get_type_hints(OPTION_HINTS[name])
        hints.update({k: options[k] for k in OPTIONS[name]})
    return hints


CASES = [(name, parameter) for name in api.__all__ for parameter in _parameters(name)]


def _kinds(hint) -> set:
    """The outer types a hint allows: ``Path | str | None`` -> {Path, str, NoneType}."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return {k for a in typing.get_args(hint) for k in _kinds(a)}
    return {typing.get_origin(hint) or hint}


SEQUENCES = {tuple, list, abc.Sequence}


def wrong_values(hint) -> list:
    """Values of the wrong type (or, for a number, out of every parameter's range) for an
    argument annotated ``hint``."""
    kinds = _kinds(hint)
    out = [object(), -1, math.nan, math.inf]
    if not kinds & {str, Path}:
        out.append("8")
    if bool not in kinds:
        out.append(True)
    if type(None) not in kinds:
        out.append(None)
    if not kinds & SEQUENCES:
        out.append([1])
    else:
        out.append([object()])  # a sequence, of things no sequence here holds
    if not kinds & {dict, abc.Mapping}:
        out.append({"a": 1})
    if int in kinds and float not in kinds:
        out.append(2.5)
    return out


@pytest.fixture(scope="module")
def program():
    return api.compile("tiny", "mesh16", region=(8, 8))


def _sweep_file(folder: Path) -> Path:
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump({
        "version": 1, "name": "s", "point": "run",
        "base": {"model": "tiny", "fabric": "mesh16", "region": "8x8"},
        "axes": {"batch": [1, 2]}}))
    return path


def BASE(name: str, program, tmp: Path) -> dict:
    """Arguments each public name is valid with (the others left at their defaults)."""
    cache = tmp / "cache"
    load, execution = api.Load(SMALL_CHAT), api.Execution(workers=1, cache_dir=cache)
    frontier = dict(model="tiny", load=load, ttft_s=0.05, hardware=api.Hardware("mesh16"),
                    execution=execution)
    experiment = {**{k: v for k, v in frontier.items() if k != "ttft_s"},
                  "targets": api.Targets(0.05, 0.001)}
    pairings = {**{k: v for k, v in frontier.items() if k != "hardware"}, "kinds": ["mesh16"]}
    drift = {**experiment, "served_on": ["decode-heavy"]}
    return {
        "load_model": dict(name_or_path="tiny"),
        "load_fabric": dict(name_or_path="mesh16"),
        "compile": dict(model="tiny", fabric="mesh16", region=(8, 8)),
        "run": dict(program=program, phase="decode"),
        "handoff": dict(program=program),
        "check_serving": dict(workload=SMALL_CHAT),
        "serve": dict(program=program, workload=SMALL_CHAT, cache_dir=cache),
        "serve_pools": dict(model="tiny", workload=SMALL_CHAT, sides="mesh16", cache_dir=cache),
        "experiment": dict(spec=api.ExperimentSpec(**experiment)),
        "frontier": dict(spec=api.FrontierSpec(**frontier)),
        "pairings": dict(spec=api.PairingsSpec(**pairings)),
        "drift": dict(spec=api.DriftSpec(**drift)),
        "ExperimentSpec": experiment,
        "FrontierSpec": frontier,
        "PairingsSpec": pairings,
        "DriftSpec": drift,
        "Load": dict(workload=SMALL_CHAT),
        "Hardware": {},
        "Counting": {},
        "WaferTiming": {},
        "Execution": dict(workers=1, cache_dir=cache),
        "Speeds": {},
        "generate": dict(program=program, prompt_ids=[1, 2], new_tokens=1),
        "sweep": dict(sweep=_sweep_file(tmp), output=tmp / "out", workers=1),
        "draw": dict(run_dir=tmp),
        "Space": {},
        "Targets": dict(ttft_s=1.0, tpot_s=0.1),
        "default_cache_dir": {},
    }[name]


@pytest.fixture
def no_work(monkeypatch):
    """Every way into work fails the test: compiling, timing a step or a table, serving,
    starting workers, drawing, generating."""
    def work(*args, **kwargs):
        raise AssertionError("work started before every argument was checked")
    from wse_emu.sim.functional import generate
    from wse_emu.visualize import rundraw

    forbid_work(monkeypatch, work_entries(), "work started before every argument was checked")
    monkeypatch.setattr(generate, "Generator", work)
    # Drawing checks its kinds of figures first (``check_kinds``), then reads the directory.
    monkeypatch.setattr(rundraw, "load_run", work)
    monkeypatch.setattr(rundraw, "draw_all", work)


def test_every_public_name_is_covered():
    assert {name for name, _ in CASES} == set(api.__all__)


@pytest.mark.parametrize("name", api.__all__)
def test_every_parameter_says_what_it_takes(name):
    """The annotation is what the wrong values are made from (and what the API checks)."""
    hints = _hints(name)
    assert not [p for p in _parameters(name) if p not in hints], \
        f"{name}: annotate every parameter"


@pytest.mark.parametrize("name, parameter", CASES, ids=[f"{n}-{p}" for n, p in CASES])
def test_a_wrong_type_is_refused_by_name_before_any_work(name, parameter, program, tmp_path,
                                                         no_work):
    function = _callable(name)
    base = BASE(name, program, tmp_path)
    for value in wrong_values(_hints(name)[parameter]):
        with pytest.raises(UserError) as caught:
            function(**{**base, parameter: value})
        assert f"`{parameter}`" in str(caught.value), (value, str(caught.value))
        assert "\n" not in str(caught.value).strip()
    cache = tmp_path / "cache"
    assert not cache.exists() or not list(cache.iterdir())  # no table was timed
    assert not (tmp_path / "out").exists()  # no sweep folder was claimed


@pytest.mark.parametrize("call, name", [
    # The cases of issue 43: a model's name where a program goes, and so on.
    (lambda p: api.run("tiny", "decode"), "program"),
    (lambda p: api.serve("tiny", SMALL_CHAT), "program"),
    (lambda p: api.generate("tiny", [1, 2]), "program"),
    (lambda p: api.run(p, batch="8"), "batch"),
    (lambda p: api.compile("tiny", "mesh16", systems=True), "systems"),
    (lambda p: api.serve(p, SMALL_CHAT, requests=2.5), "requests"),
    (lambda p: api.draw(None), "run_dir"),
    (lambda p: api.sweep(None), "sweep"),
    (lambda p: api.compile(["tiny"]), "model"),
    (lambda p: api.compile("tiny", fabric=3), "fabric"),
    # An option that is none, in a function gathering its options by name.
    (lambda p: api.compile("tiny", "mesh16", regoin=(8, 8)), "regoin"),
    (lambda p: api.serve(p, SMALL_CHAT, batch_limt=8), "batch_limt"),
    # A keyword no function takes.
    (lambda p: api.run(p, batches=2), "batches"),
    # Ranges of what is checked only on use otherwise.
    (lambda p: api.run(p, "prefill", context=-5), "context"),
    (lambda p: api.generate(p, [], 1), "prompt_ids"),
    (lambda p: api.generate(p, [10**9], 1), "prompt_ids"),
    (lambda p: api.generate(p, [1], 0), "new_tokens"),
    (lambda p: api.generate(p, [1], 1, weights_seed=-1), "weights_seed"),
    (lambda p: api.compile("tiny", "mesh16", bound_decode_batch=0), "bound_decode_batch"),
    (lambda p: api.frontier(api.from_flat(
        api.FrontierSpec, model="tiny", workload=SMALL_CHAT, ttft_s=1, user_speeds=[math.inf])),
     "user_speeds"),
    (lambda p: api.frontier(api.from_flat(
        api.FrontierSpec, model="tiny", workload=SMALL_CHAT, ttft_s=1, user_speeds=[1e-320])),
     "user_speeds"),
    (lambda p: api.frontier(api.from_flat(
        api.FrontierSpec, model="tiny", workload=SMALL_CHAT, ttft_s=1, user_speed=1e-320)),
        "user_speed"),
    (lambda p: api.serve(p, SMALL_CHAT, cache_dir=""), "cache_dir"),
    (lambda p: api.serve(p, SMALL_CHAT, cache_dir=Path(__file__)), "cache_dir"),
    (lambda p: api.serve(p, SMALL_CHAT, cache_dir=Path(__file__) / "tables"), "cache_dir"),
])
def test_the_reported_cases_name_the_argument(call, name, program, no_work):
    with pytest.raises(UserError, match=f"`{name}`"):
        call(program)
