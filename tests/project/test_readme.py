"""The examples of the README and of the manual (docs/) are what the code prints today, and
their Python examples run."""

import re
import shlex
from pathlib import Path

import pytest

from wse_emu.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README] + sorted((ROOT / "docs").glob("*.md"))


def examples(path: Path = README):
    """(command, expected output) for every ``$ wse-emu ...`` block of one page: a fence with
    no language whose first line is the command. (A ```text block is shown, not run.)"""
    text = path.read_text()
    for block in re.findall(r"```\n(\$ wse-emu .*?)```", text, flags=re.S):
        command, _, expected = block.partition("\n")
        yield command[2:], expected.rstrip("\n")


def python_blocks():
    """(page, source) for every ```python block of the README and the manual."""
    for path in PAGES:
        for source in re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M):
            yield path.relative_to(ROOT).as_posix(), source


def _by_command():
    """Each command shown once or more, with where it is shown and what each place expects:
    a command shown on two pages runs once."""
    shown = {}
    for path in PAGES:
        for command, expected in examples(path):
            shown.setdefault(command, []).append((path.relative_to(ROOT).as_posix(), expected))
    return shown


SHOWN = _by_command()


@pytest.mark.e2e
@pytest.mark.parametrize("command", list(SHOWN), ids=lambda c: c[len("wse-emu "):][:60])
def test_example_is_current(command, capsys, tmp_path, monkeypatch):
    # Run from a folder of its own, as a reader of a fresh install would: an example may read
    # nothing of the checkout's. Progress lines (stderr, only on slow runs) are not part of
    # what the example shows; on a terminal they are cleared before the results print.
    monkeypatch.chdir(tmp_path)
    code = main(["--quiet"] + shlex.split(command)[1:])
    captured = capsys.readouterr()
    out = (captured.out + captured.err).rstrip("\n")
    for page, expected in SHOWN[command]:
        assert out == expected, f"{page}: example out of date: {command}"
    assert code in (0, 2)


def test_readme_has_examples():
    assert len(list(examples())) >= 3


def test_no_example_hides_in_another_fence():
    # A block that starts like an example but is fenced otherwise would never be checked.
    for path in PAGES:
        text = path.read_text()
        fenced = len(re.findall(r"^```[a-z]*\n\$ wse-emu ", text, flags=re.M))
        untagged_or_text = len(list(examples(path))) + len(
            re.findall(r"^```text\n\$ wse-emu ", text, flags=re.M))
        assert fenced == untagged_or_text, f"{path.name}: an example in a fence that is not run"


PYTHON = list(python_blocks())


@pytest.mark.e2e
@pytest.mark.parametrize("page,source", PYTHON,
                         ids=[f"{page}:{n}" for n, (page, _) in enumerate(PYTHON, 1)])
def test_python_example_runs(page, source, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(source, page, "exec"), {"__name__": "__example__"})
    capsys.readouterr()


def test_the_readme_has_a_python_example():
    assert any(page == "README.md" for page, _ in PYTHON)
