"""Analytic lower bounds on kernel and stage times, in cycles.

A kernel's bound is its pattern's (``kernels.patterns``; their common form:
``kernels.bounds``). A stage's bound holds for any schedule: its busiest strip of PEs must do
the work of every kernel on it for all the stage's layers, and one token must cross the layer's
kernels in order (``token_latency``: streaming where a kernel can start on partial input, but a
norm waits for its whole input, and a matrix kernel's root must multiply its whole block for
the token first). The simulator's times must never be lower.
"""

from __future__ import annotations

from wse_emu.hardware.fabric import FabricSpec
from wse_emu.kernels import patterns
from wse_emu.models import layer as ly
from wse_emu.models.layer import MicroBatch
from wse_emu.models.spec import ModelSpec
from wse_emu.program.format import Kernel, Rect, WaferProgram


def kernel_bound(kernel: Kernel, stage_rect: Rect, model: ModelSpec, fabric: FabricSpec,
                 mb: MicroBatch, layers: range | None = None,
                 part: tuple[int, int] | None = None) -> dict:
    """Lower bound on one execution of ``kernel`` for one layer of the step (the cheapest of
    ``layers``, the model layers the kernel serves, where they differ; ``part``: the experts of
    a split layer the stage holds), as its pattern works it out (``kernels.patterns``)."""
    ops = ly.kernel_ops(model, part)[kernel.name]
    return patterns.of(kernel, mb.phase).bound(kernel, ops, model, fabric, mb, layers, part)


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
    """Per stage of a simulated step (a ``wse_emu.sim.runner.RegionRun``), each kernel's lower
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
