"""The README and the manual (docs/) hold together: every relative link and #anchor resolves,
the command-line reference is what its generator writes today, and the README stays short."""

import argparse
import re
from pathlib import Path

import pytest

from wse_emu.cli import reference
from wse_emu.cli.commands import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = [README] + sorted(DOCS.glob("*.md"))

FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^()\s]+)\)")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$", re.M)


def prose(text: str) -> str:
    """The page without its fenced code blocks (nothing in them is a link or a heading)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: links and images by their text, lower case, every
    character but letters, digits, spaces, hyphens and underscores dropped, spaces as hyphens."""
    text = LINK.sub(lambda m: m.group(1), heading)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, title in HEADING.findall(prose(path.read_text())):
        base = slug(title)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path):
    """(line number, target) of every Markdown link and image outside code."""
    text = prose(path.read_text())
    for m in LINK.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, m.group(2)


def test_slug_follows_github():
    assert slug("Architectures: what is modelled, what is refused") == \
        "architectures-what-is-modelled-what-is-refused"
    assert slug("Run: one decode step of Llama-3.1-8B on a WSE-3") == \
        "run-one-decode-step-of-llama-31-8b-on-a-wse-3"
    assert slug("`wse-emu experiment disagg`") == "wse-emu-experiment-disagg"
    assert slug("Colocated or disaggregated? The experiment") == \
        "colocated-or-disaggregated-the-experiment"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_and_anchor_resolves(page):
    broken = []
    for line, target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"line {line}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"line {line}: {target} (no such heading)")
        elif not dest.is_relative_to(ROOT):
            broken.append(f"line {line}: {target} (outside the repository)")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_every_page_is_linked_from_the_index_and_the_readme():
    index = {t.partition("#")[0] for _, t in links(DOCS / "index.md")}
    readme = {t.partition("#")[0] for _, t in links(README)}
    for page in DOCS.glob("*.md"):
        if page.name != "index.md":
            assert page.name in index, f"docs/index.md does not link {page.name}"
            assert f"docs/{page.name}" in readme, f"README.md does not link docs/{page.name}"
    assert "docs/index.md" in readme


def test_the_cli_reference_is_current():
    expected = reference.render()
    assert (DOCS / "cli.md").read_text() == expected, (
        "docs/cli.md differs from the parsers: run "
        "`python -m wse_emu.cli.reference > docs/cli.md`")


def test_the_cli_reference_has_every_command_and_option():
    text = (DOCS / "cli.md").read_text()
    sections = {}
    for title, body in re.findall(r"^#+ (wse-emu[^\n]*)\n(.*?)(?=^#+ wse-emu|\Z)", text,
                                  flags=re.S | re.M):
        sections[title] = body

    def check(parser):
        assert parser.prog in sections, f"no section for {parser.prog}"
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    check(child)
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in sections[parser.prog], f"{parser.prog} {option}"

    for parser in reference.command_parsers().values():
        check(parser)


def test_the_readme_lists_every_command():
    text = README.read_text()
    for name in COMMANDS:
        assert f"[`wse-emu {name}`](docs/cli.md#wse-emu-{name})" in text


def test_the_readme_is_short():
    assert len(README.read_text().splitlines()) < 250


def test_no_page_names_a_path_of_the_machine_it_was_written_on():
    for page in PAGES:
        text = page.read_text()
        assert not re.search(r"(?<![\w.])/(home|work|tmp|Users|root)/", text), page.name


# Each recipe of the contributing page, and the test that follows it once.
RECIPES = {"A new architecture family": ("models/test_families.py", "RENAMED"),
           "A new serving policy": ("serving/test_serve_twin.py", "DecodeFirst"),
           "A new pool": ("pools/test_pools.py", "StepModelPool"),
           "A new kernel pattern": ("kernels/test_patterns.py", "GemvWhole")}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_every_recipe_of_the_contributing_page_is_followed_in_a_test(recipe):
    page = (DOCS / "contributing.md").read_text()
    test_file, example = RECIPES[recipe]
    section = page.split(f"## {recipe}\n", 1)[1].split("\n## ", 1)[0]
    assert f"tests/{test_file}" in section and f"`{example}`" in section
    assert re.search(rf"^(class {example}\b|{example} = )", (ROOT / "tests" / test_file)
                     .read_text(), re.M)


def commands(page: Path):
    """(line, words, before) of every ``wse-emu`` command a page shows: a fenced line starting
    with it (``$ `` or not, continued by a trailing backslash: a whole command; ``before``,
    the lines of its block before it), or an inline code span starting with it (in prose,
    often a command's name or a part of one; ``before`` None)."""
    text = page.read_text()
    for block in re.finditer(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M):
        start = text.count("\n", 0, block.start(1)) + 1
        lines = block.group(1).split("\n")
        k = 0
        while k < len(lines):
            line, first = lines[k].removeprefix("$ "), k
            while line.endswith("\\") and k + 1 < len(lines):
                k += 1
                line = line[:-1] + lines[k]
            k += 1
            if line.startswith("wse-emu "):
                yield start + first, line.split("  #")[0], "\n".join(lines[:first])
    for m in re.finditer(r"`(wse-emu [^`]+)`", prose(text)):
        yield text.count("\n", 0, m.start()) + 1, m.group(1), None


def placeholder(value: str) -> bool:
    """A value a reader fills in: written in capitals (DIR, CSV, SWEEP.yaml) or a path/to."""
    return any(c.isupper() for c in value) or value.startswith("path/to")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_command_a_page_shows_parses_and_names_only_what_ships(page, tmp_path,
                                                                     monkeypatch):
    """Run from a folder of its own on a fresh install, every command shown is one the
    command line takes, and every model, fabric, workload, trace, sweep and pool it names is a
    shipped preset (or a value the reader fills in): nothing outside the installed project."""
    import contextlib
    import io
    import shlex

    from wse_emu.cli.main import build_parser
    from wse_emu.pools.names import parse_pool
    from wse_emu.serving.workload import trace_path
    from wse_emu.util.configfile import find_named

    monkeypatch.chdir(tmp_path)
    shipped = {"model": ("models", "model"), "fabric": ("fabrics", "fabric"),
               "workload": ("workloads", "workload"), "sweep": ("sweeps", "sweep")}
    bad = []
    for line, command, before in commands(page):
        if any(mark in command for mark in ("[", "...", "|", "{")):  # a usage line's syntax
            continue
        argv = shlex.split(command)[1:]
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                args = build_parser(argv).parse_args(argv)
        except SystemExit:
            if before is not None:  # prose may name a command, or a part of one
                bad.append(f"line {line}: {command} (the command line refuses it)")
            continue
        for name, value in vars(args).items():
            if not isinstance(value, str) or placeholder(value) \
                    or (before and value in before):  # made by a line before it
                continue
            try:
                if name in shipped:
                    find_named(*shipped[name], value)
                elif name == "trace":
                    trace_path(value)
                elif name.endswith("pool") or name == "pool":
                    parse_pool(value)
            except Exception as exc:  # noqa: BLE001 - any refusal is what this looks for
                if "pip install -e '.[" in str(exc):
                    continue  # it names an optional extra this machine has not installed
                bad.append(f"line {line}: {command} ({name} {value}: {exc})")
    assert not bad, "\n".join(bad)
