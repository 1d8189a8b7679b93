"""Trainium2 against AWS's own measurements: the efficiencies at which our roofline of a Trn2
instance (``pools.kinds.accelerator.step_seconds``) gives the time to first token and the time
per output token AWS measured for Llama-3.3-70B, and how well those efficiencies then predict
Llama-3.1-405B, measured the same way.

The measurements (AWS Neuron documentation, NxD Inference tutorials on trn2.48xlarge, served
by vLLM and measured with LLMPerf: one request at a time, 10,000 input tokens, 1,500 output
tokens requested, tensor parallelism over all 16 chips, P50 of 50 requests, 16-bit weights,
no speculative decoding) are whole-system times: the server's overhead, the collectives'
latency and padding to the compiled prompt bucket are in them. Efficiencies fitted to them
fold all of that in, so they are what an instance delivered, not what its kernels reach; the
roofline (efficiency 1) stays the bound. The prompt runs in the 12,288-token bucket the
tutorials compile for it; a token is decoded at the middle of the output's context."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cache

from wse_emu.hardware.accelerator import AcceleratorSpec, load_accelerator
from wse_emu.models import layer as ly
from wse_emu.models.load import load_model
from wse_emu.models.spec import ModelSpec
from wse_emu.pools.kinds.accelerator import step_seconds
from wse_emu.validation.checks import FAST, Check, Reference

SOURCE_70B = ("AWS Neuron documentation, NxD Inference tutorial 'Llama-3.3-70B on Trn2' "
              "(trn2-llama3.3-70b-tutorial; llama70b_perf_comparison.csv), docs v2.22 to v2.32")
SOURCE_405B = ("AWS Neuron documentation, NxD Inference tutorial 'Llama-3.1-405B speculative "
               "decoding on Trn2' (trn2-llama3.1-405b-speculative-tutorial; "
               "llama405b_perf_comparison.csv), its baseline without speculation")
DATE = "2025-2026"
PROMPT, OUTPUT, BUCKET = 10_000, 1_500, 12_288
DECODE_CONTEXT = PROMPT + OUTPUT // 2


@dataclass(frozen=True)
class Measured:
    """One of AWS's measurements: the model, its TTFT and ITL (P50, seconds)."""

    model: str
    ttft_s: float
    itl_s: float
    source: str


# Llama-3.3-70B has Llama-3.1-70B's shapes; Llama-3.1-405B's (meta-llama/Llama-3.1-405B
# config.json): hidden 16,384, MLP 53,248, 126 layers, 128 heads, 8 KV heads of 128.
LLAMA_70B = Measured("llama-3.1-70b", 0.8142, 0.0196, SOURCE_70B)
LLAMA_405B = Measured("llama-3.1-405b", 2.442, 0.0379, SOURCE_405B)


def model_of(name: str) -> ModelSpec:
    if name == "llama-3.1-405b":
        return load_model("llama-3.1-70b").replaced(
            name="llama-3.1-405b", hidden_size=16384, intermediate_size=53248, num_layers=126,
            num_heads=128, num_kv_heads=8, head_dim=128)
    return load_model(name)


def whole_instance(spec: AcceleratorSpec) -> AcceleratorSpec:
    """The tutorials' layout: one copy over all the instance's chips."""
    return replace(spec, tensor_parallel=spec.devices)


def times(spec: AcceleratorSpec, model: ModelSpec) -> tuple[float, float]:
    """Our TTFT (the bucket's prefill) and ITL (one decode step) for one request, seconds."""
    prefill = step_seconds(spec, model, ly.MicroBatch("prefill", tokens=BUCKET))
    decode = step_seconds(spec, model, ly.MicroBatch("decode", batch=1,
                                                     context=DECODE_CONTEXT))
    return prefill, decode


def _solve(target: float, time_at) -> float:
    """The efficiency in (0, 1] at which ``time_at(efficiency)`` is ``target`` (bisection on
    its log; the time falls as the efficiency grows)."""
    lo, hi = math.log(1e-4), 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if time_at(math.exp(mid)) > target:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


@cache
def fitted(measured: Measured = LLAMA_70B) -> tuple[float, float]:
    """(matrix_efficiency, memory_efficiency) at which our roofline of the whole instance
    gives ``measured``'s TTFT and ITL: each solved with the other held, in turn, until both
    settle (prefill leans on the first, decode on the second)."""
    base = whole_instance(load_accelerator("trn2"))
    model = model_of(measured.model)
    matrix, memory = 1.0, 1.0
    for _ in range(8):
        matrix = _solve(measured.ttft_s, lambda e: times(
            replace(base, matrix_efficiency=e, memory_efficiency=memory), model)[0])
        memory = _solve(measured.itl_s, lambda e: times(
            replace(base, matrix_efficiency=matrix, memory_efficiency=e), model)[1])
    return matrix, memory


def predicted(measured: Measured, which: int, efficiencies: tuple | None = None) -> float:
    """Our TTFT (``which`` 0) or ITL (1) for ``measured``'s setup, at the roofline or at
    ``efficiencies`` (matrix, memory)."""
    spec = whole_instance(load_accelerator("trn2"))
    if efficiencies is not None:
        spec = replace(spec, matrix_efficiency=efficiencies[0],
                       memory_efficiency=efficiencies[1])
    return times(spec, model_of(measured.model))[which]


def _check(measured: Measured, which: int) -> Check:
    phase = "TTFT" if which == 0 else "ITL"
    what = "time to first token" if which == 0 else "time per output token (ITL)"
    shown = SHOWN[measured.model]
    return Check(
        f"Trn2 roofline, {shown}, {phase}",
        Reference(measured.source, DATE, f"{what} of {shown} on trn2.48xlarge, 16-bit, one "
                  f"request, {PROMPT:,} input tokens, P50",
                  measured.ttft_s if which == 0 else measured.itl_s, "s"),
        "the trn2 preset's roofline (efficiencies 1) of one copy over all 16 chips",
        (0.05, 1.0), "a roofline is a lower bound on the time: at most 1 (and not so far "
        "below that it says nothing)", FAST, lambda: predicted(measured, which))


def transfer() -> list[dict]:
    """The efficiencies fitted to each measurement, and what those fitted to Llama-3.3-70B
    predict for Llama-3.1-405B against its measurement."""
    rows = []
    for measured in (LLAMA_70B, LLAMA_405B):
        matrix, memory = fitted(measured)
        rows.append({"model": SHOWN[measured.model], "matrix_efficiency": matrix,
                     "memory_efficiency": memory,
                     "ttft_ratio": predicted(measured, 0, fitted(LLAMA_70B)) / measured.ttft_s,
                     "itl_ratio": predicted(measured, 1, fitted(LLAMA_70B)) / measured.itl_s})
    return rows


SHOWN = {"llama-3.1-70b": "Llama-3.3-70B", "llama-3.1-405b": "Llama-3.1-405B"}
CHECKS = [_check(m, which) for m in (LLAMA_70B, LLAMA_405B) for which in (0, 1)]
