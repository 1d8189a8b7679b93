"""Compile options: every knob of the mapping compiler in one validated dataclass, defined
beside the program format that keeps them (``wse_emu.program.options``), and made from
options given by name (``compile_options``)."""

from dataclasses import fields

from wse_emu.errors import UserError
from wse_emu.program.options import DEFAULT_PATTERNS, PLANS, CompileOptions, parse_region

__all__ = ["DEFAULT_PATTERNS", "PLANS", "CompileOptions", "compile_options", "parse_region"]


def compile_options(**options) -> CompileOptions:
    """``CompileOptions`` of the fields given by name (each checked there); a name that is
    not one refused with the names that are."""
    names = [f.name for f in fields(CompileOptions)]
    unknown = [name for name in options if name not in names]
    if unknown:
        raise UserError(f"`{unknown[0]}` is not a compile option: the options are "
                        f"{', '.join(names)}")
    return CompileOptions(**options)
