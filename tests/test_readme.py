"""The README's command examples are what the code prints today."""

import re
import shlex
from pathlib import Path

import pytest

from wse_emu.cli.main import main

README = Path(__file__).resolve().parent.parent / "README.md"


def examples():
    """(command, expected output) for every ``$ wse-emu ...`` block of the README."""
    text = README.read_text()
    for block in re.findall(r"```\n(\$ wse-emu .*?)```", text, flags=re.S):
        command, _, expected = block.partition("\n")
        yield command[2:], expected.rstrip("\n")


@pytest.mark.parametrize("command,expected", list(examples()))
def test_readme_example_is_current(command, expected, capsys):
    # Progress lines (stderr, only on slow runs) are not part of what the example shows; on a
    # terminal they are cleared before the results print.
    code = main(["--quiet"] + shlex.split(command)[1:])
    captured = capsys.readouterr()
    out = (captured.out + captured.err).rstrip("\n")
    assert out == expected, f"README example out of date: {command}"
    assert code in (0, 2)


def test_readme_has_examples():
    assert len(list(examples())) >= 3
