"""Checks against WaferLLM (He et al., "WaferLLM: Large Language Model Inference at Wafer
Scale", OSDI 2025), measured on a real Cerebras WSE-2 in 16-bit: MeshGEMV (Table 6), decode
throughput per request of LLaMA3-8B (Table 4) and prefill throughput per request of a
4,096-token prompt (Table 3).

The paper runs one layer at a time over the whole core grid; so do these checks: one layer of
Llama-3.1-8B (LLaMA3-8B's shapes) compiled onto a P x P region of ``wse2``, its step times 32
for the model's 32 layers. The LM head is left out (the paper's figures include it), which
leans our throughputs slightly fast. A prefill is timed as the paper's MeshGEMM computes it:
the whole prompt as one tile."""

from __future__ import annotations

from functools import cache

from wse_emu.hardware.fabric import load_fabric
from wse_emu.kernels.stage import kernel_graph
from wse_emu.models.layer import MicroBatch
from wse_emu.sim.runner import run_region
from wse_emu.validation.checks import FAST, SLOW, Check, Reference
from wse_emu.validation.grids import gemv_program, graph_cycles, one_layer

PAPER = "WaferLLM (He et al., OSDI 2025), measured on a Cerebras WSE-2, 16-bit"
DATE = "2025-07"
LAYERS = 32  # LLaMA3-8B
PROMPT = 4096  # Table 3's input length
CONTEXT = 4096  # Table 4: the paper's decode configuration holds a 4K context
# Table 6: MeshGEMV [1, K] x [K, K], microseconds, by K (the grid not stated; see gemv_check)
PUBLISHED_GEMV_US = {16384: 1.2, 32768: 2.03}


def gemv_us(k: int, side: int = 512) -> float:
    """A [1, K] x [K, K] GEMV on a side x side grid of WSE-2, in microseconds."""
    fabric = load_fabric("wse2")
    program, stage, _ = gemv_program(fabric, side, k)
    graph = kernel_graph(program, stage, "q_proj", MicroBatch("decode", batch=1, context=1))
    return graph_cycles(graph, fabric) / fabric.clock_hz * 1e6


@cache
def layer_run(side: int, phase: str, tiles: int = 1):
    """One layer of Llama-3.1-8B on a side x side region of WSE-2: a decode step of one
    sequence at CONTEXT, or a prefill of PROMPT tokens in ``tiles`` tiles (``RegionRun``)."""
    program = one_layer(load_fabric("wse2"), side)
    step = MicroBatch("decode", batch=1, context=CONTEXT) if phase == "decode" \
        else MicroBatch("prefill", tokens=PROMPT, chunks=tiles)
    return run_region(program, program.regions[0].name, step)


def layer_step_s(side: int, phase: str, tiles: int = 1) -> float:
    """``layer_run``'s step, in seconds."""
    run = layer_run(side, phase, tiles)
    return sum(s.cycles for s in run.stages) / run.clock_hz


def prefill_by_tile(side: int = 480, tiles=(1, 2, 4, 8)) -> list[dict]:
    """Our prefill of the 4,096-token prompt on a side x side region in each number of
    tiles: its throughput (as the prefill checks count it) against WaferLLM's, and the share
    of the region's PE-cycles computing. The paper's MeshGEMM runs each operation over the
    whole grid in turn; our layer lays its operations out side by side in strips, a
    pipeline, which one tile leaves mostly idle and tiles streaming through keep busy."""
    published = dict(PREFILL)[side]
    out = []
    for n in tiles:
        run = layer_run(side, "prefill", n)
        tokens_per_s = PROMPT / (LAYERS * layer_step_s(side, "prefill", n))
        out.append({"tiles": n, "tile_tokens": PROMPT // n, "tokens_per_s": tokens_per_s,
                    "ratio": tokens_per_s / published,
                    "compute_utilization": run.compute_utilization()})
    return out


def gemv_check(k: int, published_us: float) -> Check:
    size = f"{k // 1024}K"
    return Check(
        f"WaferLLM MeshGEMV [1,{size}]x[{size},{size}]",
        Reference(f"{PAPER}, Table 6", DATE, f"MeshGEMV [1,{size}]x[{size},{size}], FP16 "
                  "(the grid is not stated; 512x512 is the one grid its code allows for both "
                  "sizes)", published_us, "us"),
        "the same GEMV laid out as the compiler lays a matrix strip out, on a 512x512 grid "
        "of wse2, fast engine", (1 / 1.35, 1.35),
        "the grid is not published, and our reduction tree is the compiler's, not MeshGEMV's "
        "own: within a factor of 1.35 either way", FAST, lambda: gemv_us(k))


def decode_check() -> Check:
    return Check(
        "WaferLLM decode, LLaMA3-8B, 420x420",
        Reference(f"{PAPER}, Table 4", DATE, "decode throughput per request (1 / TPOT) of "
                  "LLaMA3-8B on 420x420 cores, batch 1, a 4K context", 2699.9, "tokens/s"),
        "1 / (32 x one layer's decode step) on a 420x420 region of wse2, batch 1, context "
        "4,096 (no LM head)", (0.85, 1.15),
        "the wafer's decode is what the answer rests on: within 15%",
        FAST, lambda: 1.0 / (LAYERS * layer_step_s(420, "decode")))


def prefill_check(side: int, published: float) -> Check:
    return Check(
        f"WaferLLM prefill, LLaMA3-8B, {side}x{side}",
        Reference(f"{PAPER}, Table 3", DATE, f"prefill throughput per request of LLaMA3-8B, "
                  f"a 4,096-token prompt on {side}x{side} cores", published, "tokens/s"),
        f"4,096 / (32 x one layer's prefill of 4,096 tokens in one tile) on a {side}x{side} "
        "region of wse2 (no LM head)", (0.7, 1.15),
        "known to be slow by 20-30% in one 4,096-token tile (and 1.5x fast in tiles of 512): "
        "held from 0.7 so that a change that moves it further is seen; docs/accuracy.md says "
        "what is known of why", SLOW, lambda: PROMPT / (LAYERS * layer_step_s(side, "prefill")))


PREFILL = ((480, 20320.6), (600, 25037.2), (720, 27686.5))  # Table 3: grid side, tokens/s
CHECKS = [*(gemv_check(k, us) for k, us in PUBLISHED_GEMV_US.items()), decode_check(),
          *(prefill_check(side, published) for side, published in PREFILL)]
