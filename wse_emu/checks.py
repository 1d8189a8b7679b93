"""Checks of the library's arguments, each a ``UserError`` that names the parameter as the
Python API spells it, in backquotes (the command line writes it as its flag)."""

from __future__ import annotations

import math

from wse_emu.errors import UserError


def short_repr(value, limit: int = 40) -> str:
    """``repr(value)``, cut to ``limit`` characters: a message quotes what it was given
    without printing a whole array."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def is_number(value) -> bool:
    """A real number that is not a bool (True is 1 to Python, never to a user)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and not (isinstance(value, float) and math.isnan(value))


def whole(name: str, value, low: int) -> int:
    """``value`` if it is a whole number of at least ``low``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise UserError(f"`{name}` must be a whole number, got {short_repr(value)}")
    if value < low:
        raise UserError(f"`{name}` must be at least {low}, got {value}")
    return value


def positive(name: str, value) -> float:
    """``value`` if it is a finite number above zero."""
    if not is_number(value) or not 0 < value < math.inf:
        raise UserError(f"`{name}` must be a positive number, got {short_repr(value)}")
    return value


def at_least_zero(name: str, value) -> float:
    """``value`` if it is a finite number of at least zero."""
    if not is_number(value) or not 0 <= value < math.inf:
        raise UserError(f"`{name}` must be a number of at least 0, got {short_repr(value)}")
    return value


def flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise UserError(f"`{name}` must be True or False, got {short_repr(value)}")
    return value


def one_of(name: str, value, allowed) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise UserError(f"`{name}` must be one of {', '.join(allowed)}, got "
                        f"{short_repr(value)}")
    return value
