"""The library names parameters as the Python API spells them, in backquotes (`systems`,
`prefill_share=0.6`); a command writes each as its flag (--systems, --prefill-share 0.6), or
the bare name where it has no such flag, in its errors, its reports' reasons and the help its
flags' declarations give (``spec_args``)."""

from __future__ import annotations

import argparse
import re


def flags_of(command: argparse.ArgumentParser | None) -> dict[str, str]:
    """Parameter name -> the command's flag for it (its long form), its subcommands'
    (``experiment disagg``) included."""
    if command is None:
        return {}
    flags = {}
    for action in command._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                flags.update(flags_of(child))
        elif action.option_strings and action.dest != "help":
            flags[action.dest] = max(action.option_strings, key=len)
    return flags


PARAMETER = re.compile(r"`([A-Za-z_][A-Za-z0-9_.]*)(?:=([^`]*))?`")


def in_flags(message: str, flags: dict[str, str]) -> str:
    """``message`` with each `name` or `name=value` written as the command's flag (the name
    alone where the command has no flag for it)."""
    def flag(m: re.Match) -> str:
        name, value = m.group(1), m.group(2)
        if name not in flags:
            return name if value is None else f"{name}={value}"
        return flags[name] if value is None else f"{flags[name]} {value}"
    return PARAMETER.sub(flag, message)


__all__ = ["flags_of", "in_flags"]
