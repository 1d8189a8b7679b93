"""Serving knobs, each declared once.

A knob is a field of the knob dataclass of the policy (or policies) that reads it, declared
with ``knob(...)``: its default, the smallest value it takes, the values the experiment tries,
how the tuning table names it and how a configuration's label shows it. Everything else is made
from these declarations: the options the runtime takes (``ServeOptions``), the API's
parameters, the command line's flags, the tuning's knobs and the experiment's search space
(``Space``), and every check of a value, which raises a ``UserError`` naming the parameter.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from wse_emu.errors import UserError
from wse_emu.util.checks import short_repr, whole


@dataclass(frozen=True)
class KnobInfo:
    """What a knob's declaration says besides its default."""

    label: str  # as the experiment's tuning table names it: "prefill tile"
    help: str  # the command line's help text
    low: int  # the smallest value allowed
    tune: tuple  # the values the experiment tries by default
    shown: str | None = None  # how a configuration's label shows it ("tile {}"); None: its
    # policy's title shows it
    unshown: int | None = None  # a value a label leaves out (a running cap of 0: none)
    # The phase whose pools it shapes ("prefill", "decode"; None: both): on a split, the
    # hardware of that side says which values its engines use (``EngineKnobs``).
    phase: str | None = None
    # Whether it is a micro-batch's size, read off its phase's stage tables: it must lie
    # within their range (interpolated inside it, never guessed beyond).
    sizes: bool = False

    def label_part(self, value: int) -> str | None:
        if self.shown is None or value == self.unshown:
            return None
        return self.shown.format(value)


@dataclass(frozen=True)
class EngineKnobs:
    """The knob values a kind of hardware's serving engines use, which the experiment's default
    search tries on it: per knob, the values (``values``) and where tuning starts (``start``,
    the engines' own default). A knob it does not name takes its declaration's (``tune`` and
    the default). Pairs, not dicts, so that it hashes and pickles as a constant."""

    values: tuple = ()  # ((knob name, (value, ...)), ...)
    start: tuple = ()  # ((knob name, value), ...)

    def values_of(self, name: str, declared: KnobInfo) -> tuple:
        return dict(self.values).get(name, declared.tune)

    def start_of(self, name: str, default: int) -> int:
        return dict(self.start).get(name, default)


def knob(default: int, *, label: str, help: str, low: int, tune: tuple, shown: str | None = None,
         unshown: int | None = None, phase: str | None = None, sizes: bool = False):
    """A knob field of a policy's knob dataclass (an integer of at least ``low``)."""
    info = KnobInfo(label, help, low, tuple(tune), shown, unshown, phase, sizes)
    for value in (default, *info.tune):
        check_value(f"the declaration of {label}", info, value)
    return field(default=default, metadata={"knob": info})


def info(f: dataclasses.Field) -> KnobInfo:
    return f.metadata["knob"]


def is_knob(f: dataclasses.Field) -> bool:
    return "knob" in f.metadata


def check_value(name: str, knob_info: KnobInfo, value) -> None:
    """``value`` is a whole number of at least the knob's lowest, or a UserError names
    ``name``."""
    whole(name, value, knob_info.low)


def check_values(name: str, knob_info: KnobInfo, values) -> tuple:
    """A search space's values of one knob: one or more, each valid, duplicates dropped."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise UserError(f"`{name}` must be a sequence of values, got {short_repr(values)}")
    values = tuple(values)
    if not values:
        raise UserError(f"`{name}` needs at least one value")
    for value in values:
        check_value(name, knob_info, value)
    return tuple(dict.fromkeys(values))
