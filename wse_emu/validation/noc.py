"""Checks of the cycle engine's network against closed forms and a flit-level reference
simulator (``VALIDATION.md``): zero-load latency, and the saturation throughput of uniform and
transpose traffic on k x k meshes with dimension-order routing, one wavelet per link per
cycle."""

from __future__ import annotations

from wse_emu.hardware.fabric import load_fabric
from wse_emu.sim.noc import DEFAULT_FABRIC, find_saturation, run_noc, saturation_bound
from wse_emu.validation.checks import FAST, Check, Reference

CLOSED_FORMS = "closed forms of a k x k mesh with dimension-order routing (VALIDATION.md)"
REFERENCE_SIM = ("a widely used flit-level NoC simulator (4 virtual channels x 8-flit buffers, "
                 "dimension-order routing, single-flit packets), as VALIDATION.md quotes it")


def zero_load_ratio(k: int = 16, rate: float = 0.01) -> float:
    """Mean latency at 1% load over the closed-form zero-load latency of the same messages:
    H x hop + 2 x ramp + (M - 1), M = 1 wavelet."""
    fabric = load_fabric(DEFAULT_FABRIC)
    run = run_noc(k, "uniform", rate)
    zero = run.hops_mean * fabric.hop_latency_cycles + 2 * fabric.ramp_latency_cycles
    return run.latency_mean / zero


def saturation_share(k: int, pattern: str) -> float:
    """The highest stable offered rate the engine finds, as a share of the closed-form
    bound (flits per node per cycle)."""
    rate, _ = find_saturation(k, pattern)
    return (rate or 0.0) / saturation_bound(pattern, k)


CHECKS = [
    Check("NoC zero-load latency, 16x16",
          Reference(CLOSED_FORMS, "textbook", "zero-load latency H x t_hop + 2 x ramp + (M-1), "
                    "as a ratio to itself", 1.0, "x"),
          "mean latency of uniform traffic at 1% load over the closed form of the same "
          "messages, cycle engine", (1.0, 1.03),
          "exact on an idle network; 1% load adds a little queueing, never less than zero",
          FAST, zero_load_ratio),
    Check("NoC saturation, uniform, 8x8",
          Reference(REFERENCE_SIM, "VALIDATION.md", "saturation throughput of uniform traffic "
                    "on 8x8, as a share of the 4/k bound", 0.84, "of the bound"),
          "the highest stable rate the cycle engine finds (bisection), as a share of 4/k, "
          "the wse3 routers", (0.85, 1.1),
          "practical routers reach 75-100% of the bound; held within 15% of the reference's "
          "(our routers are the wse3 fabric's, not its configuration)", FAST,
          lambda: saturation_share(8, "uniform")),
    Check("NoC saturation, transpose, 8x8",
          Reference(REFERENCE_SIM, "VALIDATION.md", "saturation throughput of transpose "
                    "traffic on 8x8, as a share of the 1/(k-1) bound", 1.0, "of the bound"),
          "the same search, transpose traffic", (0.85, 1.0),
          "never above the bound; within 15% of the reference's", FAST,
          lambda: saturation_share(8, "transpose")),
]
