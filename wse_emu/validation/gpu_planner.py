"""Checks against a peer's answer to our question on GPUs: AIConfigurator's `cli default`
(NVIDIA's planner) for Llama-3.1-8B on eight H200s with TensorRT-LLM, ISL 1,024, OSL 256, TTFT
1 s, TPOT 5 ms, its best aggregated and disaggregated plans in output tokens/s per GPU. Its
answers are recorded here as version 0.12.0 gave them (``tests/pools/test_peer_check.py`` runs
the planner itself, where the peer extra is installed, and holds ours to the same bands).

Ours is our experiment on the same GPU pools, their steps timed from AIConfigurator's measured
databases (the gpu extra), every knob at its default values, the targets held at the median
request, as its steady-state estimate reads them (docs/serving.md, "A check against
AIConfigurator", says where the two differ and why)."""

from __future__ import annotations

from wse_emu.experiments.comparison import Space
from wse_emu.experiments.run import experiment
from wse_emu.experiments.spec import ExperimentSpec, from_flat
from wse_emu.validation.checks import SLOW, Check, Reference

GPUS = 8
SOURCE = "AIConfigurator 0.12.0, `aiconfigurator cli default` (NVIDIA, Apache-2.0)"
DATE = "version 0.12.0, its answer recorded 2026-12-05"
SETUP = "Llama-3.1-8B on 8 x H200 (TensorRT-LLM), ISL 1,024, OSL 256, TTFT 1 s, TPOT 5 ms"
# Its answers: the first row of its table of best configurations for each plan.
AGGREGATED = 2557.378  # tp4, batch 56, 8,192 context tokens per step
DISAGGREGATED = 2429.889  # 4 x tp1 prefill, 1 x tp4 decode at batch 104
SPLIT = ("h200x4tp1", "h200x4tp4", 104)  # that split as our pools name it, and its batch
BAND = (0.8, 1.2)
WHY = ("both time steps from the same measured databases, but its TTFT and TPOT are one "
       "steady-state estimate per configuration and ours come from serving requests one by "
       "one; held within 20%, as the live check in the tests is")


def _tokens_per_gpu(plan: str, **hardware) -> float:
    """Steady-window output tokens/s per GPU of ``plan``'s best, served on ``steady-1024-256``
    at the check's targets held at the median, one draw."""
    report = experiment(from_flat(
        ExperimentSpec, model="llama-3.1-8b", workload="steady-1024-256", ttft_s=1.0,
        tpot_s=0.005, percentile=50, seeds=1, workers=1, **hardware,
        space=Space(window_s=0, **({"batch_limit": (SPLIT[2],)}
                                   if "decode_pool" in hardware else {}))))
    row = next(r for r in report.final if r.plan == plan)
    return row.window_output_tokens_per_s_per_system / GPUS


def _check(name: str, measured: str, value: float, ours: str, figure) -> Check:
    return Check(name, Reference(SOURCE, DATE, f"{measured}; {SETUP}", value, "tok/s/GPU"),
                 ours, BAND, WHY, SLOW, figure, extra="gpu", needs=("aiconfigurator_core",))


CHECKS = [
    _check("GPU planner, aggregated, Llama-3.1-8B, 8 x H200",
           "output tokens/s per GPU of its best aggregated plan", AGGREGATED,
           "our colocated best on eight H200s, every split and knob at their defaults tried",
           lambda: _tokens_per_gpu("colocated", split_pool=f"h200x{GPUS}")),
    _check("GPU planner, disaggregated at its split, Llama-3.1-8B, 8 x H200",
           "output tokens/s per GPU of its best disaggregated plan", DISAGGREGATED,
           f"our split at its configuration ({SPLIT[0]} prefill, {SPLIT[1]} decode, decode "
           f"batch {SPLIT[2]})",
           lambda: _tokens_per_gpu("disaggregated", prefill_pool=SPLIT[0],
                                   decode_pool=SPLIT[1])),
]
