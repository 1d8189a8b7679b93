"""The shared form of a kernel's analytic lower bound (each pattern works out its own parts:
``kernels.patterns``).

A kernel cannot finish before its busiest PE has done its FLOPs (compute), read and written its
bytes through the SRAM ports (sram), and taken its inputs in through its one ramp (link); nor
before a wavelet has crossed its longest dependent path (path: hops plus the ramp in and out).
Its bound is the largest of these. The simulator's times must never be lower.
"""

from __future__ import annotations

import math

from wse_emu.hardware.fabric import FabricSpec
from wse_emu.models import layer as ly


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def result(fabric: FabricSpec, compute: float, sram: float, link: float, path: float,
           drain: float = 0.0, whole_input: bool = False) -> dict:
    """A kernel's bound from its parts, in whole cycles, with the part that dominates.
    ``drain``: the least time from a kernel's first input to its last output for one token;
    ``whole_input``: the kernel cannot start before its whole input is in (a norm's sum of
    squares), so it waits for its producers' last outputs."""
    parts = {"compute": compute, "sram": sram, "link": link, "path": path}
    total = max(parts.values())
    dominant = max(parts, key=parts.get)
    return {**{k: float(math.ceil(v)) for k, v in parts.items()},
            "cycles": float(math.ceil(total)), "dominant": dominant,
            "drain": float(math.ceil(drain)), "whole_input": whole_input}


def port_cycles(work: ly.Work, fabric: FabricSpec, fpc: float) -> tuple[float, float]:
    """(compute, SRAM) cycles of one PE's work."""
    return work.flops / fpc, max(work.reads / fabric.sram_read_bytes_per_cycle,
                                 work.writes / fabric.sram_write_bytes_per_cycle)
