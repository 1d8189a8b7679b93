"""An experiment's flags, generated from its spec's declarations (``util.flags``): one flag
per field that declares one, in the spec's parts (``experiments.spec.PARTS``) all the way
down, and the serving knobs' values to try from theirs (``knob_args``). The fields built from
other flags (the model, the fabric, a mixture of experts' routing, the progress lines) are
the command's own; ``spec_from_args`` takes them beside the parsed flags.

A flag not given is left out of the parsed arguments, so the spec's own default applies: the
default lives in one place, the field."""

from __future__ import annotations

import argparse
import dataclasses
import typing

from wse_emu.cli.flag_names import flags_of, in_flags
from wse_emu.cli.knob_args import flag, knob_values_arg
from wse_emu.errors import UserError
from wse_emu.experiments.spec import PARTS, from_flat
from wse_emu.serving.knobs import is_knob
from wse_emu.util.flags import Flag, flag_of

# The help's sections the declarations name, with what each says above its flags.
SECTIONS = {
    "knobs": ("knobs", "values to tune each plan over, comma-separated (one value fixes the "
              "knob); the knobs are tuned one at a time, in this order, for both plans"),
    "pools": ("pools named by their hardware", "the hardware of both plans and how the "
              "footprint they share is counted"),
}
# Fields no flag of their own gives: the command builds them from its shared flags.
BUILT = ("model", "fabric", "routing", "progress")


def declared(cls, leave_out: tuple = ()) -> list[tuple[dataclasses.Field, type]]:
    """Every field of ``cls`` with a flag or a knob's declaration, its parts' in their
    place, with its annotated type; ``leave_out`` names fields left out."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.name in leave_out:
            continue
        if hints.get(f.name) in PARTS:
            out += declared(hints[f.name], leave_out)
        elif flag_of(f) is not None or is_knob(f):
            out.append((f, hints[f.name]))
    return out


def add_spec_args(parser, cls, leave_out: tuple = ()) -> None:
    """The flags of every field ``cls`` declares one for (``declared``)."""
    sections, exclusive = {}, {}
    for f, hint in declared(cls, leave_out):
        declared_flag = flag_of(f)
        section = "knobs" if is_knob(f) else declared_flag.section
        where = parser
        if section is not None:
            if section not in sections:
                sections[section] = parser.add_argument_group(*SECTIONS[section])
            where = sections[section]
        if is_knob(f):
            knob_values_arg(where, f)
            continue
        if declared_flag.one_of is not None:
            key = (section, declared_flag.one_of)
            if key not in exclusive:
                exclusive[key] = where.add_mutually_exclusive_group(
                    required=declared_flag.required)
            where = exclusive[key]
        where.add_argument(declared_flag.name or flag(f.name), dest=f.name,
                           default=argparse.SUPPRESS, **_argument(f, hint, declared_flag))
    # The help names other fields as the API does; here, as the flags they are.
    names = flags_of(parser)
    for action in parser._actions:
        if action.help:
            action.help = in_flags(action.help, names)


def spec_from_args(cls, args, **built):
    """The spec of class ``cls`` the parsed ``args`` give, with the fields ``built`` from
    the command's other flags (``BUILT``)."""
    values = {}
    for f, _ in declared(cls):
        if hasattr(args, f.name):
            values[f.name] = _value(f, getattr(args, f.name))
    return from_flat(cls, **values, **built)


def _argument(f: dataclasses.Field, hint, declared_flag: Flag) -> dict:
    """The ``add_argument`` keywords of field ``f``'s flag."""
    help_text = declared_flag.help + _default_text(f, declared_flag)
    kwargs = {"help": help_text.replace("%", "%%"), "metavar": declared_flag.metavar}
    if declared_flag.reads == "switch":
        return {"help": kwargs["help"], "action": "store_const", "const": not f.default}
    if declared_flag.reads == "per kind":
        return {**kwargs, "action": "append", "help": kwargs["help"] + " (repeatable)"}
    if declared_flag.one_of is None:
        kwargs["required"] = declared_flag.required
    if declared_flag.choices is not None:
        kwargs["choices"] = declared_flag.choices
        kwargs["metavar"] = kwargs["metavar"] or "|".join(map(str, declared_flag.choices))
    if declared_flag.reads == "value":
        kwargs["type"] = _scalar_type(hint)
    return kwargs


def _default_text(f: dataclasses.Field, declared_flag: Flag) -> str:
    """How the help states the field's default: as declared, or its value when it has one
    worth stating (not None, not a switch's)."""
    if declared_flag.default_text is not None:
        return f" (default {declared_flag.default_text})"
    if f.default is dataclasses.MISSING or f.default is None \
            or declared_flag.reads in ("switch", "per kind"):
        return ""
    value = f.default
    shown = ",".join(map(str, value)) if isinstance(value, tuple) else f"{value:g}" \
        if isinstance(value, float) else str(value)
    return f" (default {shown})"


def _scalar_type(hint):
    """The parser of a one-value flag of a field annotated ``hint``: int or float if the
    annotation allows it (``float | None``), else the text as it is (a name or a path); a
    number where the annotation also takes text (``float | str``: a probability or a
    table's path), else the text."""
    allowed = typing.get_args(hint) or (hint,)
    for kind in (int, float):
        if kind in allowed:
            return _number_or_text(kind) if str in allowed else kind
    return str


def _number_or_text(kind):
    def parse(text: str):
        try:
            return kind(text)
        except ValueError:
            return text
    return parse


def _value(f: dataclasses.Field, given):
    """Field ``f``'s value from its flag's parsed text."""
    if is_knob(f):
        return _listed(given, f.name, int)
    declared_flag = flag_of(f)
    reads = declared_flag.reads
    if reads == "numbers":
        return () if given.strip() == "none" else _listed(given, f.name, float)
    if reads == "whole numbers":
        return given if given in declared_flag.words else _listed(given, f.name, int)
    if reads == "words":
        return tuple(v.strip() for v in given.split(",") if v.strip())
    if reads == "per kind":
        return _per_kind(given, declared_flag.name or flag(f.name), declared_flag.metavar)
    return given


def _listed(text: str, name: str, kind) -> tuple:
    try:
        return tuple(kind(v) for v in text.split(",") if v.strip())
    except ValueError:
        what = "whole numbers" if kind is int else "numbers"
        raise UserError(f"`{name}` must be comma-separated {what}, got {text!r}") from None


def _per_kind(items: list[str], flag_name: str, metavar: str) -> dict:
    """NAME=NUMBER flags (--price NAME=PER_HOUR): name -> number; a name given twice is
    refused, not the last kept."""
    out: dict = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        try:
            number = float(value) if sep else None
        except ValueError:
            number = None
        if number is None:
            raise UserError(f"{flag_name} needs {metavar} (a number), got {item!r}")
        if name in out:
            raise UserError(f"{flag_name} {name}=...: given twice ({item!r} after "
                            f"{name}={out[name]:g}); give one per kind")
        out[name] = number
    return out


__all__ = ["BUILT", "SECTIONS", "add_spec_args", "declared", "spec_from_args"]
