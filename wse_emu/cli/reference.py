"""The command-line reference (``docs/cli.md``), made from the parsers the command line uses.

    python -m wse_emu.cli.reference > docs/cli.md

Each command's parser is built by ``wse_emu.cli.main.build_parser`` exactly as when that
command runs (it adds only the named command's arguments, so it is built once per command),
and rendered as Markdown: the command, its usage line, and every argument and option with its
help text, its subcommands (``experiment disagg``) after it. The rendering is this module's own,
not argparse's help formatter, so that the page is the same on every Python version and at any
terminal width.
"""

from __future__ import annotations

import argparse
import re
import sys

from wse_emu.cli.commands import COMMANDS
from wse_emu.cli.main import build_parser

WIDTH = 88  # usage lines are wrapped at this many characters

HEADER = """\
# Command-line reference

Generated from the command line's own parsers by `python -m wse_emu.cli.reference >
docs/cli.md`; a test checks that this page is what the generator writes today. Every command
also takes `-h` (`--help`). For what the commands do and what their output means, see
[the commands](commands.md) and the other pages listed in [the manual](index.md).
"""


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each command's parser, in the order ``wse-emu --help`` lists them."""
    parsers = {}
    for name in COMMANDS:
        top = build_parser([name])
        parsers[name] = _subparsers(top).choices[name]
    return parsers


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def render() -> str:
    """The whole reference, as Markdown."""
    top = build_parser([])
    parts = [HEADER, _section(top, "", level=2, commands=True)]
    for name, parser in command_parsers().items():
        parts.append(_section(parser, COMMANDS[name][1], level=2))
    return "\n".join(parts).rstrip("\n") + "\n"


def _section(parser: argparse.ArgumentParser, summary: str, level: int,
             commands: bool = False) -> str:
    """One command's heading, what it does, its usage, arguments and options; then its
    subcommands' sections (``commands``: the top level, whose commands have their own)."""
    lines = [f"{'#' * level} {parser.prog}", ""]
    summary = parser.description or summary
    if summary:
        lines += [_escape(summary), ""]
    lines += ["```text", _usage(parser), "```", ""]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions
                   if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]
        if not actions:
            continue
        if group is parser._positionals:
            heading = "Arguments"
        elif group is parser._optionals:
            heading = "Options"
        else:
            heading = f"Options: {group.title}"
        lines += [f"**{heading}**", ""]
        if group.description and heading.startswith("Options: "):
            lines += [_escape(group.description), ""]
        lines += [_item(action, parser) for action in actions]
        lines.append("")
    sub = _subparsers(parser)
    if sub is not None and not commands:
        helps = {choice.dest: choice.help or "" for choice in sub._choices_actions}
        for name, child in sub.choices.items():
            lines.append(_section(child, helps.get(name, ""), level + 1))
    return "\n".join(lines)


def _item(action: argparse.Action, parser: argparse.ArgumentParser) -> str:
    """One argument or option as a list item: its forms, whether it is required, its help."""
    if isinstance(action, argparse._SubParsersAction):
        names = [f"[`{name}`](#{_anchor(f'{parser.prog} {name}')})" for name in action.choices]
        text = f"- `{_metavar(action)}`: one of " + ", ".join(names)
        return text + (f"; {_escape(_help(action, parser.prog))}" if action.help else "")
    if action.option_strings:
        arg = _args(action)
        forms = ", ".join(f"`{s} {arg}`" if arg else f"`{s}`" for s in action.option_strings)
    else:
        forms = f"`{_args(action)}`"
    notes = []
    if action.option_strings and action.required:
        notes.append("required")
    group = _exclusive_group(action, parser)
    if group is not None:
        others = [o.option_strings[-1] if o.option_strings else _args(o)
                  for o in group._group_actions if o is not action]
        others = ", ".join(f"`{o}`" for o in others)
        notes.append(f"this or {others} is required" if group.required else f"not with {others}")
    text = f"- {forms}"
    if notes:
        text += f" ({'; '.join(notes)})"
    help_text = _help(action, parser.prog)
    if help_text:
        text += f": {_escape(help_text)}"
    return text


def _exclusive_group(action, parser):
    return next((g for g in parser._mutually_exclusive_groups if action in g._group_actions),
                None)


def _help(action: argparse.Action, prog: str) -> str:
    """The help text with argparse's %-placeholders filled in, as ``--help`` shows it."""
    if not action.help:
        return ""
    params = dict(vars(action), prog=prog)
    for name in list(params):
        if params[name] is argparse.SUPPRESS:
            del params[name]
        elif hasattr(params[name], "__name__"):
            params[name] = params[name].__name__
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(c) for c in params["choices"])
    return " ".join((action.help % params).split())


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    return action.dest if not action.option_strings else action.dest.upper()


def _args(action: argparse.Action) -> str:
    """The values an argument takes, as argparse's usage writes them."""
    if action.nargs == 0:
        return ""
    if isinstance(action, argparse._SubParsersAction):
        return f"{_metavar(action)} ..."
    m = _metavar(action)
    if action.nargs is None:
        return m
    if action.nargs == argparse.OPTIONAL:
        return f"[{m}]"
    if action.nargs == argparse.ZERO_OR_MORE:
        return f"[{m} ...]"
    if action.nargs == argparse.ONE_OR_MORE:
        return f"{m} [{m} ...]"
    if action.nargs == argparse.REMAINDER:
        return "..."
    if isinstance(action.nargs, int):
        return " ".join([m] * action.nargs)
    return m


def _usage(parser: argparse.ArgumentParser) -> str:
    """The usage line: options in the order they were added (a mutually exclusive group's at
    its first member), then the positional arguments; wrapped between items."""
    items, seen = [], set()
    optionals = [a for a in parser._actions if a.option_strings]
    positionals = [a for a in parser._actions if not a.option_strings]
    for action in optionals:
        if id(action) in seen:
            continue
        group = _exclusive_group(action, parser)
        if group is not None:
            members = [a for a in group._group_actions if a.option_strings]
            seen.update(id(a) for a in members)
            body = " | ".join(_usage_option(a) for a in members)
            items.append(f"({body})" if group.required else f"[{body}]")
            continue
        seen.add(id(action))
        text = _usage_option(action)
        items.append(text if action.required else f"[{text}]")
    items += [_args(a) for a in positionals]
    return _wrap(f"usage: {parser.prog}", items)


def _usage_option(action: argparse.Action) -> str:
    arg = _args(action)
    return f"{action.option_strings[0]} {arg}" if arg else action.option_strings[0]


def _wrap(prefix: str, items: list[str]) -> str:
    indent = " " * (len(prefix) + 1)
    lines, line = [], prefix
    for item in items:
        if len(line) + 1 + len(item) > WIDTH and line.strip() and line != prefix:
            lines.append(line)
            line = indent + item
        else:
            line = f"{line} {item}"
    lines.append(line)
    return "\n".join(lines)


def _anchor(heading: str) -> str:
    """The anchor a Markdown renderer (GitHub's rule) gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


_SPECIAL = re.compile(r"([\\`*<\[\]])|(?<!\w)_|_(?!\w)")


def _escape(text: str) -> str:
    """Help text as literal Markdown (no emphasis, code, links or HTML read into it; an
    underscore inside a word, as in clock_hz, is literal already)."""
    return _SPECIAL.sub(lambda m: "\\" + m.group(0), text)


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
