"""Every command runs with only its required arguments: each option's default works with the
others' (a knob's default values with the default grid, a fabric's default region with a
chat workload's longest request). The required arguments are read from the parsers, so a
command or a required argument added later is run here too, or this test says what it lacks.
The values are the smallest that fill them (the tiny model, a workload of 40 requests); every
option is left at its default."""

import argparse
import shlex

import pytest
from helpers import FIXTURES, SMALL_CHAT

from wse_emu.cli import reference
from wse_emu.cli.main import main

# A sweep of two points, each a decode step of the tiny model.
SWEEP = """version: 1
name: minimal
point: run
base: {model: tiny, fabric: mesh16}
axes:
  batch: [1, 2]
"""
# Commands left out, and why: the demo runs in CI's first step (``.ci/run``); a benchmark
# measures the project's speed targets, minutes each (``tests/kernels/test_bench_kernels.py`` runs
# the kernels' own).
LEFT_OUT = {"demo", "bench"}


def required(parser: argparse.ArgumentParser) -> list:
    """(dest, option or None) of every argument the parser requires: positionals, required
    options, and the first of a required group of alternatives."""
    out = []
    grouped = set()
    for group in parser._mutually_exclusive_groups:
        if group.required:
            first = group._group_actions[0]
            out.append((first.dest, first.option_strings[-1]))
            grouped.update(a.dest for a in group._group_actions)
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.dest in grouped:
            continue
        if not action.option_strings:
            out.append((action.dest, None))
        elif action.required:
            out.append((action.dest, action.option_strings[-1]))
    return out


def forms() -> dict:
    """Command words -> its required arguments, for every command and subcommand."""
    out = {}

    def walk(words, parser):
        sub = reference._subparsers(parser)
        if sub is None:
            out[words] = required(parser)
            return
        for name, child in sub.choices.items():
            walk(f"{words} {name}", child)
    for name, parser in reference.command_parsers().items():
        if name not in LEFT_OUT:
            walk(name, parser)
    return out


FORMS = forms()


@pytest.fixture(scope="module")
def values(tmp_path_factory):
    """A value for every required argument any command takes."""
    where = tmp_path_factory.mktemp("minimal")
    sweep = where / "sweep.yaml"
    sweep.write_text(SWEEP)
    compiled = where / "compiled"
    assert main(["--quiet", "compile", "tiny", "--fabric", "mesh16", "-o", str(compiled)]) == 0
    return {"model": "tiny", "target": "tiny", "workload": str(SMALL_CHAT), "ttft_s": "1",
            "tpot_s": "0.005", "kinds": "wse3,trn2", "prompt_ids": "1,2,3",
            "sweep": str(sweep), "run_dir": str(compiled),
            "served_on": str(FIXTURES / "small_long.yaml")}


def test_every_command_is_run_here_or_left_out_with_why():
    assert {words.split()[0] for words in FORMS} | LEFT_OUT == set(reference.command_parsers())


@pytest.mark.e2e
@pytest.mark.parametrize("words", list(FORMS))
def test_a_command_runs_with_only_its_required_arguments(words, values, tmp_path, capsys,
                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)  # whatever it writes by default stays here
    missing = [dest for dest, _ in FORMS[words] if dest not in values]
    assert not missing, f"no value for {missing}: add one to `values`"
    args = shlex.split(words)
    for dest, option in FORMS[words]:
        args += [values[dest]] if option is None else [option, values[dest]]
    code = main(["--quiet", *args])
    captured = capsys.readouterr()
    assert code == 0, f"wse-emu {' '.join(args)}: {captured.err}"
