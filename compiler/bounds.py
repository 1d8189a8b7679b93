"""Analytic lower bounds on kernel and stage times, in cycles.

A kernel cannot finish before its busiest PE has done its FLOPs (compute), read and written its
bytes through the SRAM ports (sram), and taken its inputs in through its one ramp (link); nor
before a wavelet has crossed its longest dependent path (path: hops plus the ramp in and out).
Its bound is the largest of these. A stage's bound holds for any schedule: its busiest strip of
PEs must do the work of every kernel on it for all the stage's layers, and one token must cross
the layer's kernels in order (``token_latency``: streaming where a kernel can start on partial
input, but a norm waits for its whole input, and a matrix kernel's root must multiply its whole
block for the token first). The simulator's times must never be lower.
"""

from __future__ import annotations

import math

from wse_emu import layer as ly
from wse_emu.fabric import FabricSpec
from wse_emu.layer import MicroBatch
from wse_emu.model import ModelSpec
from wse_emu.program import Kernel, Rect, WaferProgram


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _result(fabric: FabricSpec, compute: float, sram: float, link: float, path: float,
            drain: float = 0.0, whole_input: bool = False) -> dict:
    """``drain``: the least time from a kernel's first input to its last output for one
    token; ``whole_input``: the kernel cannot start before its whole input is in (a norm's
    sum of squares), so it waits for its producers' last outputs."""
    parts = {"compute": compute, "sram": sram, "link": link, "path": path}
    total = max(parts.values())
    dominant = max(parts, key=parts.get)
    return {**{k: float(math.ceil(v)) for k, v in parts.items()},
            "cycles": float(math.ceil(total)), "dominant": dominant,
            "drain": float(math.ceil(drain)), "whole_input": whole_input}


def _port_cycles(work: ly.Work, fabric: FabricSpec, fpc: float) -> tuple[float, float]:
    """(compute, SRAM) cycles of one PE's work."""
    return work.flops / fpc, max(work.reads / fabric.sram_read_bytes_per_cycle,
                                 work.writes / fabric.sram_write_bytes_per_cycle)


def kernel_bound(kernel: Kernel, stage_rect: Rect, model: ModelSpec, fabric: FabricSpec,
                 mb: MicroBatch, layers: range | None = None,
                 part: tuple[int, int] | None = None) -> dict:
    """Lower bound on one execution of ``kernel`` for one layer of the step (the cheapest of
    ``layers``, the model layers the kernel serves, where they differ; ``part``: the experts of
    a split layer the stage holds)."""
    d = model.dtype_bytes
    fpc = fabric.flops_per_cycle(d)
    link = fabric.link_bytes_per_cycle
    hop, ramp = fabric.hop_latency_cycles, fabric.ramp_latency_cycles
    ops = ly.kernel_ops(model, part)[kernel.name]
    first = ops[0]
    t = ly.op_tokens(first, mb)
    if kernel.kind == "matrix" and first.experts:
        return _expert_bound(kernel, first, t, d, fabric, fpc)
    if kernel.kind in ("matrix", "gather"):
        k, n = kernel.matrix
        kp, np_ = kernel.grid
        kc, nr = _ceil(k, kp), _ceil(n, np_)
        if kernel.kind == "gather":
            # A token's row may sit in the root's own column: only writing the gathered
            # slices is certain.
            seg = nr if kernel.weight_ref is None else kc
            return _result(fabric, 0, t * seg * d / fabric.sram_write_bytes_per_cycle, 0, 0)
        work = ly.matrix_work(kc, nr, t, d)
        if first.bias:
            work = work + ly.bias_work(nr, t, d)  # on the root edge, after the reduction
        compute, sram = _port_cycles(work, fabric, fpc)
        # Inputs enter a line across the strip at one PE and must reach its farthest PE (at
        # least half the line away); partial sums travel the strip to its root edge. Some PE
        # takes a whole input segment, or a whole partial sum, in through its ramp.
        hops = _ceil(np_ - 1, 2) + (kp - 1)
        path = hop * hops + (2 * ramp if hops else 0)
        # Every tree ends with the root adding a partial sum it has just received: at least
        # one wavelet's worth of values (a schedule may cut the outputs finely).
        last = min(t * nr, max(1, 4 // d))
        add_last = _port_cycles(ly.Work(last, 2 * last * d, last * d), fabric, fpc)[1] \
            if kp > 1 else 0.0
        path += add_last
        # The root multiplies its whole block for a token (after that token's first input
        # value arrives) before that token's last output can exist.
        drain = max(_port_cycles(ly.matrix_work(kc, nr, 1, d), fabric, fpc)) + add_last
        ramp_in = t * max(kc if np_ > 1 else 0, nr if kp > 1 else 0) * d / link
        return _result(fabric, compute, sram, ramp_in, path, drain)
    if kernel.kind == "route":
        # Each PE scores its share of the experts' logits; the candidates meet on the line.
        pes = kernel.rect.area
        cost = ly.op_cost(first, model, mb)
        compute = cost.flops / (pes * fpc)
        radius = _ceil(pes - 1, 2)
        path = 2 * hop * radius + (2 * ramp if pes > 1 else 0)
        sram = cost.act_in_bytes / (pes * fabric.sram_read_bytes_per_cycle)
        return _result(fabric, compute, sram, 0, path, whole_input=True)
    site = ly.kernel_ops(model, part).get(first.site)  # the strip the op runs on
    if kernel.kind == "elementwise" and site and site[0].kind == ly.EXPERT_GEMM:
        # Where an expert strip's runs leave their outputs: only the routed tokens' values
        # are worked on, which the strip's PEs share at best evenly (a split layer's part:
        # only the pairs no routing can send to the other part's experts).
        held = site[0]
        pairs = max(0, held.top_k - (held.total_experts - held.experts)) / held.top_k
        compute, sram = _port_cycles(ly.elementwise_work(
            ly.ELEMENTWISE[first.kind], t * first.length * pairs / kernel.rect.area, d),
            fabric, fpc)
        return _result(fabric, compute, sram, 0, 0)
    if kernel.kind in ("norm", "elementwise"):
        pes = kernel.rect.area
        seg = _ceil(kernel.length, pes)
        if kernel.kind == "norm":
            work = ly.elementwise_work(ly.NORM_SQUARES, t * seg, d) + ly.elementwise_work(
                ly.NORM_SCALE, t * seg, d)
            compute, sram = _port_cycles(work, fabric, fpc)
            # The sum of squares meets somewhere on the line and returns: at least the
            # line's radius each way. A norm over the whole vector needs all of it first; a
            # per-head norm only its head.
            radius = _ceil(pes - 1, 2)
            path = 2 * hop * radius + (2 * ramp if pes > 1 else 0)
            return _result(fabric, compute, sram, t * ly.SUM_BYTES / link if pes > 1 else 0,
                           path, whole_input=first.kind != ly.HEAD_RMSNORM)
        # Elementwise ops work where their operands already are.
        compute, sram = _port_cycles(ly.elementwise_work(ly.ELEMENTWISE[first.kind], t * seg, d),
                                     fabric, fpc)
        return _result(fabric, compute, sram, 0, 0)
    if kernel.kind == "attention":
        pes = kernel.rect.area
        candidates = []
        for layer in (layers if layers is not None and len(layers) else [None]):
            total = ly.ZERO
            for op in ops:
                total = total + ly.op_cost(op, model, mb, layer)
            candidates.append(total)
        cost = min(candidates, key=lambda c: c.flops)
        # The KV cache is spread evenly over the stage; queries reach every PE and partial
        # results (softmax max and sum, weighted values) are reduced across it.
        radius = _ceil(kernel.rect.w - 1, 2) + _ceil(kernel.rect.h - 1, 2)
        path = 2 * hop * radius + 2 * ramp
        q_in = t * model.q_size * d / pes
        return _result(fabric, cost.flops / (pes * fpc),
                       max(cost.read_bytes / (pes * fabric.sram_read_bytes_per_cycle),
                           cost.write_bytes / (pes * fabric.sram_write_bytes_per_cycle)),
                       q_in / link, path)
    raise ValueError(f"no bound for kernel kind {kernel.kind!r}")


def _expert_bound(kernel: Kernel, op: ly.Op, t: int, d: int, fabric: FabricSpec,
                  fpc: float) -> dict:
    """An expert strip, whatever the routing: the step's token-expert pairs share its PEs at
    best evenly (a split layer's part: the pairs no routing can send elsewhere, a token's
    choices beyond the experts held in the other part); where each expert's sums stay its own
    (gate, up), they still cross the expert's run of columns."""
    k, n = op.matrix
    kp, np_ = kernel.grid
    pairs = t * max(0, op.top_k - (op.total_experts - op.experts))
    pes = kp * np_
    work = ly.routed_matrix_work(pairs * k * n / pes, 0, 0, d)
    compute, sram = _port_cycles(work, fabric, fpc)
    hops = 0 if op.experts_summed else max(0, kp // op.experts - 1)
    path = fabric.hop_latency_cycles * hops + (2 * fabric.ramp_latency_cycles if hops else 0)
    return _result(fabric, compute, sram, 0, path)


def transfer_cycles(hops: int, fabric: FabricSpec) -> float:
    return float(hops * fabric.hop_latency_cycles)


def _walk(kernels: dict[str, dict], dependencies: dict[str, list[str]],
          hops: dict[tuple[str, str], int], key: str,
          fabric: FabricSpec) -> tuple[float, dict[str, str | None]]:
    """Longest path through one layer's kernel graph, weighting kernels by ``key``."""
    finish: dict[str, float] = {}
    via: dict[str, str | None] = {}
    for name, deps in dependencies.items():
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
    return finish.get(ly.LAYER_OUTPUT, 0.0), via


def token_latency(kernels: dict[str, dict], dependencies: dict[str, list[str]],
                  hops: dict[tuple[str, str], int], fabric: FabricSpec) -> float:
    """Least time for one token through one layer, whatever the schedule: kernels may stream
    (start on their producers' first outputs), except where an input must be whole (a norm);
    a kernel's first output follows its first input by its path, and its last output follows
    its first input by at least its drain and its last input by at least its path."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for name, deps in dependencies.items():
        if name not in kernels:
            continue
        b = kernels[name]
        first_in = last_in = 0.0
        for dep in deps:
            if dep in first:
                gap = transfer_cycles(hops.get((dep, name), 0), fabric)
                first_in = max(first_in, first[dep] + gap)
                last_in = max(last_in, last[dep] + gap)
        if b.get("whole_input"):
            first_in = last_in
        first[name] = first_in + b["path"]
        last[name] = max(first[name], last_in + b["path"], first_in + b.get("drain", 0.0))
    return last.get(ly.LAYER_OUTPUT, 0.0)


def stage_bound(layer_kernels: dict[str, dict], dependencies: dict[str, list[str]],
                extras: list[dict], strip_loads: list[dict],
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
    layer_latency = token_latency(layer_kernels, dependencies, hops, fabric)
    latency = layers * layer_latency + entry + sum(e["path"] for e in extras)
    layer_serial, _ = _walk(layer_kernels, dependencies, hops, "cycles", fabric)
    serial = layers * layer_serial + entry + sum(e["cycles"] for e in extras)
    cycles = max(busiest, latency)
    return {"cycles": float(cycles), "seconds": cycles / fabric.clock_hz,
            "dominant": resource if busiest >= latency else "path",
            "resource_cycles": float(busiest), "latency_cycles": float(latency),
            "serial_cycles": float(serial)}


def stage_bounds(program: WaferProgram, run) -> dict[int, dict[str, float]]:
    """Per stage of a simulated step (a ``wse_emu.runner.RegionRun``), each kernel's lower
    bound at the step's workload, in cycles: one layer, one token tile."""
    step = run.step
    work = MicroBatch(step.phase, tokens=max(step.tiles()[0].tokens, 1), batch=step.batch,
                    context=step.context)
    out = {}
    for sr in run.stages:
        stage = program.stages[sr.stage]
        out[sr.stage] = {k.name: kernel_bound(k, stage.rect, program.model, program.fabric,
                                              work, range(*stage.layers),
                                              stage.part)["cycles"]
                         for k in program.stage_kernels(stage)}
    return out
