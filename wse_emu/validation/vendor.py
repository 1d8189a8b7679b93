"""Checks against the vendor's published non-speculative per-user speeds (``programs/
vendor_speeds.yaml``): Llama-3.1-8B at 1,800 tokens/s on one CS-3, Llama-3.1-70B at 450 on
four, both 16-bit, as served in 2024-08. Ours is the fastest a lone sequence decodes on the
compiler's colocated layout of the same footprint: a served speed can only be slower, so the
ratio must be at least 1; far above, our decode would be faster than anything the hardware
has been shown to serve."""

from __future__ import annotations

from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.options import CompileOptions
from wse_emu.experiments.frontier import vendor_speed
from wse_emu.hardware.fabric import ClusterSpec, load_fabric
from wse_emu.models.load import load_model
from wse_emu.sim.steps import run_step
from wse_emu.validation.checks import FAST, SLOW, Check, Reference

CONTEXT = 1024  # about a chat request's context (the chat trace's prompts average 1.1k)


def lone_speed(model: str, systems: int) -> float:
    """Tokens/s of one sequence decoding alone at CONTEXT on the compiler's colocated layout
    of ``model`` over ``systems`` WSE-3."""
    program = compile_model(load_model(model), ClusterSpec(load_fabric("wse3"), systems),
                            CompileOptions())
    return run_step(program, "decode", None, "fast", True, None, batch=1,
                    context=CONTEXT).latency_tokens_per_s()


def vendor_check(model: str, systems: int, speed: str) -> Check:
    published = vendor_speed(model)
    return Check(
        f"vendor speed, {model}, {systems} x WSE-3",
        Reference(published.source, "2024-08-27", f"per-user output speed of {model} served on "
                  f"{systems} CS-3, 16-bit, before speculative decoding", published.tokens_per_s,
                  "tokens/s"),
        f"1 / a lone sequence's decode step at a {CONTEXT:,}-token context on the compiler's "
        f"colocated layout of {systems} x wse3", (1.0, 3.0),
        "a served speed is at most a lone sequence's, so at least 1; at most 3, or our decode "
        "would be far faster than the hardware has served", speed,
        lambda: lone_speed(model, systems))


CHECKS = [vendor_check("llama-3.1-8b", 1, FAST), vendor_check("llama-3.1-70b", 4, SLOW)]
