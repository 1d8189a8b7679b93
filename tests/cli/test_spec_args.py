"""The experiments' flags are generated from their specs' declarations: every field has its
flag (or is built from the command's shared flags), a flag not given leaves the field's own
default, and the flags give the spec the API would be given."""

import argparse
import dataclasses
import typing

import pytest

from wse_emu.cli.flag_names import PARAMETER
from wse_emu.cli.spec_args import BUILT, add_spec_args, declared, spec_from_args
from wse_emu.errors import UserError
from wse_emu.experiments.spec import (
    PARTS,
    ExperimentSpec,
    FrontierSpec,
    PairingsSpec,
    from_flat,
)
from wse_emu.serving.knobs import is_knob
from wse_emu.util.flags import flag_of

SPECS = (ExperimentSpec, FrontierSpec, PairingsSpec)
REQUIRED = {ExperimentSpec: ["--workload", "chat", "--ttft-slo", "1", "--tpot-slo", "0.01"],
            FrontierSpec: ["--trace", "azure-conv", "--ttft-slo", "1"],
            PairingsSpec: ["--workload", "chat", "--ttft-slo", "1", "--kinds", "wse3,trn2"]}


def _parser(spec) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_spec_args(parser, spec)
    return parser


def _every_field(cls):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if hints.get(f.name) in PARTS:
            yield from _every_field(hints[f.name])
        else:
            yield f


@pytest.mark.parametrize("spec", SPECS)
def test_every_field_is_a_flag_or_built_from_the_commands_own(spec):
    for f in _every_field(spec):
        assert flag_of(f) is not None or is_knob(f) or f.name in BUILT, f.name


@pytest.mark.parametrize("spec", SPECS)
def test_flags_not_given_leave_the_specs_defaults(spec):
    parsed = _parser(spec).parse_args(REQUIRED[spec])
    # Only the flags given are parsed: every other field keeps its spec's default.
    assert set(vars(parsed)) <= {"workload", "trace", "ttft_s", "tpot_s", "kinds"}
    flat = {"ttft_s": 1.0, "kinds": ("wse3", "trn2")} if spec is PairingsSpec else \
        {"ttft_s": 1.0} if spec is FrontierSpec else {"ttft_s": 1.0, "tpot_s": 0.01}
    source = {"trace": "azure-conv"} if spec is FrontierSpec else {"workload": "chat"}
    assert spec_from_args(spec, parsed, model="tiny") == from_flat(spec, model="tiny",
                                                                    **flat, **source)


def test_the_flags_give_the_spec_the_api_is_given():
    parsed = _parser(ExperimentSpec).parse_args(REQUIRED[ExperimentSpec] + [
        "--copies", "1,2", "--layers-per-stage", "own", "--policy", "chunked",
        "--no-prefix-cache", "--each-layout", "--prefill-tile", "128,256", "--seeds", "2",
        "--workers", "1", "--slo-percentile", "50", "--systems", "2", "--tolerance", "0.1"])
    spec = spec_from_args(ExperimentSpec, parsed, model="tiny")
    assert spec == from_flat(ExperimentSpec, model="tiny", workload="chat", ttft_s=1.0,
                             tpot_s=0.01, copies=(1, 2), layers_per_stage="own",
                             policy=("chunked",), prefix_cache=False, each_layout=True,
                             prefill_tile=(128, 256), seeds=2, workers=1, percentile=50,
                             systems=2, tolerance=0.1)


def test_pools_count_their_footprint_by_the_numbers_per_kind():
    parsed = _parser(FrontierSpec).parse_args(REQUIRED[FrontierSpec] + [
        "--prefill-pool", "trn2", "--decode-pool", "wse3", "--footprint", "cost",
        "--price", "trn2=3", "--price", "wse3=100", "--step-scales", "none"])
    spec = spec_from_args(FrontierSpec, parsed, model="tiny")
    assert spec.hardware.counting.prices == {"trn2": 3.0, "wse3": 100.0}
    assert spec.speeds.step_scales == ()


def test_a_kind_priced_twice_is_refused_not_the_last_kept():
    parsed = _parser(FrontierSpec).parse_args(REQUIRED[FrontierSpec] + [
        "--price", "trn2=3", "--price", "trn2=4"])
    with pytest.raises(UserError, match="--price trn2=...: given twice"):
        spec_from_args(FrontierSpec, parsed, model="tiny")


@pytest.mark.parametrize("flag, value, name", [("--copies", "1,x", "copies"),
                                               ("--user-speeds", "100,fast", "user_speeds")])
def test_a_list_that_does_not_read_is_refused_by_name(flag, value, name):
    parsed = _parser(FrontierSpec).parse_args(REQUIRED[FrontierSpec] + [flag, value])
    with pytest.raises(UserError, match=f"`{name}` must be comma-separated"):
        spec_from_args(FrontierSpec, parsed, model="tiny")


def test_the_pairings_take_no_step_scales():
    assert "step_scales" not in {f.name for f, _ in declared(PairingsSpec, ("step_scales",))}
    with pytest.raises(UserError, match="`step_scales`"):
        from_flat(PairingsSpec, model="tiny", workload="chat", kinds=("wse3",), ttft_s=1.0,
                  step_scales=(0.7,))


@pytest.mark.parametrize("spec", SPECS)
def test_the_help_names_flags_not_the_apis_names(spec):
    for action in _parser(spec)._actions:
        assert not PARAMETER.search(action.help or ""), action.help
