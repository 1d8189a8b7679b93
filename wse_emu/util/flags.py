"""How a field of a configuration is given on the command line, declared beside the field
(``flagged(help=...)`` in place of ``field(...)``). The experiments' flags are generated from
these declarations (``cli/spec_args.py``), as the serving knobs' are from theirs: a new field
is a new flag with no other change, its help written once, where the field is.

A help text names other fields as the Python API does, in backquotes (`percentile`); the
command line shows each as its flag (--slo-percentile)."""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, dataclass

# How a flag's text is read into the field's value:
READS = {
    "value": "one value, of the field's type",
    "numbers": "comma-separated numbers (none: no numbers)",
    "whole numbers": "comma-separated whole numbers, or one of the flag's words",
    "words": "comma-separated words",
    "per kind": "NAME=NUMBER, repeatable, one per name",
    "switch": "no value: given, the field is the opposite of its default",
}


@dataclass(frozen=True)
class Flag:
    """A field's flag: its ``help``; its long name (None: the field's, dashed:
    ``cache_dir`` -> ``--cache-dir``); how its text is ``reads`` (``READS``); the words a
    list of whole numbers also takes (``words``: "matched", "own"); ``choices``; whether it
    is ``required``; the flags it is ``one_of`` (flags sharing a name exclude each other,
    one of them required if any is); the ``section`` of the help it is listed in; and how
    the help states the default (``default_text``; None: the field's default, if it has a
    value)."""

    help: str
    name: str | None = None
    reads: str = "value"
    metavar: str | None = None
    words: tuple = ()
    choices: tuple | None = None
    required: bool = False
    one_of: str | None = None
    section: str | None = None
    default_text: str | None = None

    def __post_init__(self):
        if self.reads not in READS:
            raise ValueError(f"a flag reads one of {', '.join(READS)}, not {self.reads!r}")


def flagged(help: str, default=MISSING, *, default_factory=MISSING, **flag) -> dataclasses.Field:
    """A dataclass field given on the command line as ``Flag(help, **flag)`` says."""
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={"flag": Flag(help, **flag)})


def flag_of(f: dataclasses.Field) -> Flag | None:
    """The flag declared for field ``f``; None if it has none."""
    return f.metadata.get("flag")


__all__ = ["READS", "Flag", "flag_of", "flagged"]
