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
    if options.get("ends_shared"):
        # A program without its embedding and LM head runs only beside one that has them.
        raise UserError("`ends_shared` is the compiler's own, for an mtp draft's strip: give "
                        "`draft=\"mtp\"`")
    names = [f.name for f in fields(CompileOptions) if f.name != "ends_shared"]
    unknown = [name for name in options if name not in names]
    if unknown:
        raise UserError(f"`{unknown[0]}` is not a compile option: the options are "
                        f"{', '.join(names)}")
    return CompileOptions(**options)
