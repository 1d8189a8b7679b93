"""Compile options: every knob of the mapping compiler in one validated dataclass, defined in
the core beside the program format that keeps them (``wse_emu.program.options``)."""

from wse_emu.program.options import PLANS, CompileOptions, parse_region

__all__ = ["PLANS", "CompileOptions", "parse_region"]
