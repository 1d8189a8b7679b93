"""Analytic lower bounds on kernel and stage times, in cycles.

A kernel cannot finish before its busiest PE has done its FLOPs (compute), read and written its
bytes through the SRAM ports (sram), and taken its inputs in through its one ramp (link); nor
before a wavelet has crossed its longest dependent path (path: hops plus the ramp in and out).
Its bound is the largest of these. A stage's bound holds for any schedule: its busiest strip of
PEs must do the work of every kernel on it for all the stage's layers, and one token must cross
every kernel's path in order. The simulator's times must never be lower.
"""

from __future__ import annotations

import math

from compiler import opgraph as og
from compiler.intensity import RMSNORM_FLOPS, ROPE_FLOPS, SILU_MUL_FLOPS, Workload, op_cost
from wse_emu.fabric import FabricSpec
from wse_emu.model import ModelSpec
from wse_emu.program import Kernel, Rect

ELEMENTWISE_FLOPS = {"rope_q": ROPE_FLOPS, "rope_k": ROPE_FLOPS, "silu_mul": SILU_MUL_FLOPS,
                     "residual_attn": 1, "residual_mlp": 1}
# Operands read per output element.
ELEMENTWISE_INPUTS = {"rope_q": 1, "rope_k": 1, "silu_mul": 2, "residual_attn": 2,
                      "residual_mlp": 2}
ATTENTION_OPS = (og.KV_APPEND, og.ATTN_SCORES, og.SOFTMAX, og.ATTN_WEIGHTED_SUM)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _result(fabric: FabricSpec, compute: float, sram: float, link: float, path: float) -> dict:
    parts = {"compute": compute, "sram": sram, "link": link, "path": path}
    total = max(parts.values())
    dominant = max(parts, key=parts.get)
    return {**{k: float(math.ceil(v)) for k, v in parts.items()},
            "cycles": float(math.ceil(total)), "dominant": dominant}


def kernel_bound(kernel: Kernel, stage_rect: Rect, model: ModelSpec, fabric: FabricSpec,
                 work: Workload) -> dict:
    """Lower bound on one execution of ``kernel`` for one layer of the step."""
    d = model.dtype_bytes
    fpc = fabric.flops_per_cycle(d)
    rd, wr = fabric.sram_read_bytes_per_cycle, fabric.sram_write_bytes_per_cycle
    link = fabric.link_bytes_per_cycle
    hop, ramp = fabric.hop_latency_cycles, fabric.ramp_latency_cycles
    t = work.new_tokens
    if work.phase == "prefill" and kernel.name == "final_norm":
        t = 1  # only the last position goes on to the LM head
    if kernel.kind in ("matrix", "gather"):
        k, n = kernel.matrix
        kp, np_ = kernel.grid
        kc, nr = _ceil(k, kp), _ceil(n, np_)
        if kernel.kind == "gather":
            # A token's row may sit in the root's own column: only writing the gathered
            # slices is certain.
            seg = nr if kernel.weight_ref is None else kc
            return _result(fabric, 0, t * seg * d / wr, 0, 0)
        rows = 1 if (kernel.name == "lm_head" and work.phase == "prefill") else t
        bias = nr if kernel.name in ("q_proj", "k_proj", "v_proj") and model.attention_bias else 0
        compute = rows * (2 * kc * nr + bias) / fpc
        sram = max((kc * nr * d + rows * kc * d) / rd, rows * nr * d / wr)
        # Inputs enter a line across the strip at one PE and must reach its farthest PE (at
        # least half the line away); partial sums travel the strip to its root edge. Some PE
        # takes a whole input segment, or a whole partial sum, in through its ramp.
        hops = _ceil(np_ - 1, 2) + (kp - 1)
        path = hop * hops + (2 * ramp if hops else 0)
        ramp_in = rows * max(kc if np_ > 1 else 0, nr if kp > 1 else 0) * d / link
        return _result(fabric, compute, sram, ramp_in, path)
    if kernel.kind in ("norm", "elementwise"):
        pes = kernel.rect.area
        seg = _ceil(kernel.length, pes)
        if kernel.kind == "norm":
            compute = t * RMSNORM_FLOPS * seg / fpc
            sram = max((t * seg * d + seg * d) / rd, t * seg * d / wr)
            # The sum of squares meets somewhere on the line and returns: at least the
            # line's radius each way.
            radius = _ceil(pes - 1, 2)
            path = 2 * hop * radius + (2 * ramp if pes > 1 else 0)
            return _result(fabric, compute, sram, t * 4 / link if pes > 1 else 0, path)
        # Elementwise ops work where their operands already are.
        flops = ELEMENTWISE_FLOPS[kernel.name]
        compute = t * flops * seg / fpc
        sram = max(t * ELEMENTWISE_INPUTS[kernel.name] * seg * d / rd, t * seg * d / wr)
        return _result(fabric, compute, sram, 0, 0)
    if kernel.kind == "attention":
        pes = kernel.rect.area
        flops = reads = writes = 0
        for kind in ATTENTION_OPS:
            c = op_cost({"kind": kind, "op": kind}, model, work)
            flops += c.flops
            reads += c.read_bytes
            writes += c.write_bytes
        # The KV cache is spread evenly over the stage; queries reach every PE and partial
        # results (softmax max and sum, weighted values) are reduced across it.
        radius = _ceil(kernel.rect.w - 1, 2) + _ceil(kernel.rect.h - 1, 2)
        path = 2 * hop * radius + 2 * ramp
        q_in = t * model.q_size * d / pes
        return _result(fabric, flops / (pes * fpc), max(reads / (pes * rd), writes / (pes * wr)),
                       q_in / link, path)
    raise ValueError(f"no bound for kernel kind {kernel.kind!r}")


def transfer_cycles(hops: int, fabric: FabricSpec) -> float:
    return float(hops * fabric.hop_latency_cycles)


# The kernel graph of one layer inside a stage: kernel -> the kernels it waits for.
LAYER_DEPENDENCIES = {
    "input_norm": [],
    "q_proj": ["input_norm"], "k_proj": ["input_norm"], "v_proj": ["input_norm"],
    "rope_q": ["q_proj"], "rope_k": ["k_proj"],
    "attention": ["rope_q", "rope_k", "v_proj"],
    "o_proj": ["attention"],
    "residual_attn": ["o_proj"],
    "post_attn_norm": ["residual_attn"],
    "gate_proj": ["post_attn_norm"], "up_proj": ["post_attn_norm"],
    "silu_mul": ["gate_proj", "up_proj"],
    "down_proj": ["silu_mul"],
    "residual_mlp": ["down_proj"],
}


def _walk(kernels: dict[str, dict], hops: dict[tuple[str, str], int], key: str,
          fabric: FabricSpec) -> tuple[float, dict[str, str | None]]:
    """Longest path through one layer's kernel graph, weighting kernels by ``key``."""
    finish: dict[str, float] = {}
    via: dict[str, str | None] = {}
    for name, deps in LAYER_DEPENDENCIES.items():
        if name not in kernels:
            continue
        start, prev = 0.0, None
        for dep in deps:
            if dep in finish:
                arrive = finish[dep] + transfer_cycles(hops.get((dep, name), 0), fabric)
                if arrive >= start:
                    start, prev = arrive, dep
        finish[name] = start + kernels[name][key]
        via[name] = prev
    return finish.get("residual_mlp", 0.0), via


def stage_bound(layer_kernels: dict[str, dict], extras: list[dict], strip_loads: list[dict],
                hops: dict[tuple[str, str], int], layers: int, entry_hops: int,
                fabric: FabricSpec) -> dict:
    """Lower bound on a stage's time for one micro-batch, whatever the schedule.

    ``layer_kernels`` maps a layer's kernel names to their bounds, ``extras`` are the bounds of
    the kernels that run once (embedding, final norm, LM head), and ``strip_loads`` gives, per
    strip of PEs, the resource cycles every kernel on it adds up to for the whole stage. The
    bound is the larger of the busiest strip's busiest resource and the latency of one token
    through the stage (kernel paths plus hops between kernels). ``serial_cycles`` is what a
    schedule that starts each kernel only when its inputs are complete could at best reach.
    """
    busiest, resource = 0.0, "compute"
    for load in strip_loads:
        for r in ("compute", "sram", "link"):
            if load[r] > busiest:
                busiest, resource = load[r], r
    entry = transfer_cycles(entry_hops, fabric)
    layer_latency, _ = _walk(layer_kernels, hops, "path", fabric)
    latency = layers * layer_latency + entry + sum(e["path"] for e in extras)
    layer_serial, _ = _walk(layer_kernels, hops, "cycles", fabric)
    serial = layers * layer_serial + entry + sum(e["cycles"] for e in extras)
    cycles = max(busiest, latency)
    return {"cycles": float(cycles), "seconds": cycles / fabric.clock_hz,
            "dominant": resource if busiest >= latency else "path",
            "resource_cycles": float(busiest), "latency_cycles": float(latency),
            "serial_cycles": float(serial)}
