"""Checks of the library's arguments, each a ``UserError`` that names the parameter as the
Python API spells it, in backquotes (the command line writes it as its flag)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import os
import sys
import types
import typing
from collections import abc
from pathlib import Path

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


# --- an argument against its annotation ---------------------------------------------------
#
# The Python API's functions (and the options dataclasses they build) state what each argument
# must be in its annotation; ``typed`` holds them to it, so that a model name where a program
# goes, or "8" where a whole number goes, is refused by name at entry, not met as a TypeError
# or an AttributeError deep inside after minutes of work. Ranges stay with the functions.

_UNIONS = (typing.Union, types.UnionType)
_NONE = type(None)
_SEQUENCES = (tuple, list, abc.Sequence, abc.Iterable)
_MAPPINGS = (dict, abc.Mapping)
_CALLABLES = (abc.Callable, typing.Callable)
_PLURALS = {bool: "True or False values", int: "whole numbers", float: "numbers",
            str: "strings", Path: "paths"}


def _parts(hint) -> list:
    """The alternatives of a union (``int | None``: int, NoneType); a hint that is none, alone."""
    if typing.get_origin(hint) in _UNIONS:
        return [p for a in typing.get_args(hint) for p in _parts(a)]
    return [hint]


def fits(value, hint) -> bool:
    """Whether ``value`` is of the type ``hint`` annotates (a float a number, not NaN; an int a
    whole one; neither a bool; a sequence's items and a mapping's keys and values of theirs).
    A hint this does not read (``Literal``, a type variable) is left to the function."""
    if hint is typing.Any:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in _UNIONS:
        return any(fits(value, a) for a in args)
    if hint is _NONE or hint is None:
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        # Infinity is a number; where it is out of range the function says so, in its terms
        # (a speed with no TPOT target), as it does for zero and below.
        return is_number(value)
    if hint is Path or hint is os.PathLike:
        return isinstance(value, os.PathLike)
    if origin in _CALLABLES or hint in _CALLABLES:
        return callable(value)
    if origin in _MAPPINGS or hint in _MAPPINGS:
        if not isinstance(value, abc.Mapping):
            return False
        key, item = args if len(args) == 2 else (typing.Any, typing.Any)
        return all(fits(k, key) and fits(v, item) for k, v in value.items())
    if origin in _SEQUENCES or hint in _SEQUENCES:
        if isinstance(value, (str, bytes, abc.Mapping)):
            return False
        if origin in (tuple, list) or hint in (tuple, list):
            # Either, as Python code writes a pair ((8, 8) or [8, 8]); nothing else, since
            # such a field is kept as given.
            if not isinstance(value, (tuple, list)):
                return False
        elif not isinstance(value, abc.Iterable) or not isinstance(value, abc.Sized):
            return False  # read twice (checked, then used): a generator would be spent
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(fits(v, a) for v, a in zip(value, args))
        return not args or all(fits(v, args[0]) for v in value)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def described(hint) -> str:
    """What ``hint`` asks for, as a message says it: 'a whole number or None'."""
    words = list(dict.fromkeys(_described(p) for p in _parts(hint)))
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _described(hint) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is _NONE or hint is None:
        return "None"
    if hint is bool:
        return "True or False"
    if hint is int:
        return "a whole number"
    if hint is float:
        return "a number"
    if hint is str:
        return "a string"
    if hint is Path or hint is os.PathLike:
        return "a path"
    if origin in _CALLABLES or hint in _CALLABLES:
        return "a function"
    if origin in _MAPPINGS or hint in _MAPPINGS:
        return f"a mapping of {_plural(args[0])} to {_plural(args[1])}" if len(args) == 2 \
            else "a mapping"
    if origin in _SEQUENCES or hint in _SEQUENCES:
        if origin is tuple and args and args[-1] is not Ellipsis:
            same = len(set(args)) == 1
            return f"a sequence of {len(args)} {_plural(args[0])}" if same else \
                f"a sequence of ({', '.join(described(a) for a in args)})"
        return f"a sequence of {_plural(args[0])}" if args else "a sequence"
    if isinstance(hint, type):
        return f"a {hint.__name__}"
    return str(hint)


def _plural(hint) -> str:
    return _PLURALS.get(hint) or (f"{hint.__name__}s" if isinstance(hint, type)
                                  else described(hint))


def of_type(name: str, value, hint):
    """``value`` if it is of the type ``hint`` annotates, else a UserError naming ``name``."""
    if not fits(value, hint):
        raise UserError(f"`{name}` must be {described(hint)}, got {short_repr(value)}")
    return value


def check_fields(instance) -> None:
    """Every field of a dataclass ``instance`` of its annotated type (a ``__post_init__``
    calls it before checking ranges, which assume the types)."""
    hints = typing.get_type_hints(type(instance))
    for f in dataclasses.fields(instance):
        if f.name in hints:
            of_type(f.name, getattr(instance, f.name), hints[f.name])


def type_hints(function) -> dict:
    """``function``'s annotations resolved, a name its module imports on first use (a
    module ``__getattr__``, PEP 562) imported when an annotation names it."""
    module = sys.modules[function.__module__]
    while True:
        try:
            return typing.get_type_hints(function)
        except NameError as missing:
            if missing.name in vars(module) or not hasattr(module, missing.name):
                raise


def typed(function):
    """``function`` with every argument it is given checked against its annotation before
    its body runs, refused by name (``of_type``); an argument it does not take, refused
    with the ones it does. Defaults are not checked (they are the function's own); what is
    gathered by ``**options`` is checked where it is used (the options' dataclass)."""
    signature = inspect.signature(function)
    params = signature.parameters
    gathers = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values())
    taken = ", ".join(p.name for p in params.values()
                      if p.kind not in (inspect.Parameter.VAR_POSITIONAL,
                                        inspect.Parameter.VAR_KEYWORD))
    hints: dict = {}

    @functools.wraps(function)
    def checked(*args, **kwargs):
        if not hints:  # resolved on first use: the annotations name classes defined later
            hints.update(type_hints(function))
        unknown = next((k for k in kwargs if k not in params), None)
        if unknown is not None and not gathers:
            raise UserError(f"`{unknown}` is not an argument of {function.__name__} (it takes "
                            f"{taken})")
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:  # one missing, or too many given in order
            raise UserError(f"{function.__name__}: {exc} (it takes {taken})") from None
        for name, value in bound.arguments.items():
            kind = signature.parameters[name].kind
            if name in hints and kind not in (inspect.Parameter.VAR_POSITIONAL,
                                              inspect.Parameter.VAR_KEYWORD):
                of_type(name, value, hints[name])
        return function(*args, **kwargs)
    return checked
