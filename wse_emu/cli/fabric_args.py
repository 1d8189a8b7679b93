"""The fabric a command runs on: a preset or YAML (``--fabric``) with fields overridden
(``--set FIELD=VALUE``). Apart from the compile command's other flags, so that a command that
compiles nothing (``noc``) loads none of the compiler."""

from __future__ import annotations

from wse_emu.errors import UserError
from wse_emu.hardware.fabric import FabricSpec, load_fabric, with_overrides


def add_fabric_args(p) -> None:
    p.add_argument("--fabric", default="wse3", help="fabric preset or YAML (default wse3)")
    p.add_argument("--set", dest="fabric_set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a fabric field, e.g. --set clock_hz=850e6 (repeatable)")


def fabric_from_args(args) -> FabricSpec:
    fabric = load_fabric(args.fabric)
    if not args.fabric_set:
        return fabric
    overrides = {}
    for item in args.fabric_set:
        key, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"--set needs FIELD=VALUE, got {item!r}")
        overrides[key] = _scalar(value)
    return with_overrides(fabric, **overrides)


def _scalar(text: str):
    """'850e6' -> 850000000.0, '2' -> 2, 'true' -> True, anything else stays a string."""
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


__all__ = ["add_fabric_args", "fabric_from_args"]
