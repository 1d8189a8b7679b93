"""Sensitivity of the disaggregation answer: the experiment repeated with one input varied.

The ratio of disaggregated to colocated goodput is not one number: it moves with the token-speed
target (how many decode steps' worth of time a token may take), with the shape of the requests
(prompt against output length) and with the cluster. ``VARIABLES`` names what can be varied and
how a value changes the experiment's inputs; the TPOT target is also given in units of one
decode step of the model alone, so that answers for different models and fabrics line up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from wse_emu.errors import UserError
from wse_emu.experiments.goodput import Targets
from wse_emu.hardware.fabric import MAX_SYSTEMS
from wse_emu.serving.speculation import speculating
from wse_emu.serving.workload import Requests

VARIABLES = {
    "tpot": "the TPOT target (at --slo-percentile, p90 by default), seconds",
    "systems": "systems (wafers) in the cluster",
    "prompt-scale": "every prompt's length times this factor",
    "output-scale": "every output's length times this factor",
    "prefill-time": "every prefill step's time times this factor (the hardware unchanged)",
    "decode-time": "every decode step's time times this factor (the hardware unchanged)",
}


@dataclass(frozen=True)
class StepScale:
    """Factors on the stage tables' prefill and decode times: how far an answer leans on the
    model's error in each (1: as simulated)."""

    prefill: float = 1.0
    decode: float = 1.0

    def __bool__(self) -> bool:
        return (self.prefill, self.decode) != (1.0, 1.0)

    def describe(self) -> str:
        return ", ".join(f"{phase} step times x{f:g}" for phase, f in
                         (("prefill", self.prefill), ("decode", self.decode)) if f != 1.0)

    def layouts(self, layouts: dict) -> dict:
        """``layouts`` ((plan, name) -> Layout) with their pools' tables scaled."""
        if not self:
            return layouts
        return {key: replace(layout, regions=[self.pool(r) for r in layout.regions])
                for key, layout in layouts.items()}

    def pool(self, region):
        # A decode riding in a chunk's step (``Pool.riding``) and a verify step's later tiles
        # (``Pool.verify``) are decode work: they scale with it.
        return replace(region, **{table: getattr(region, table).scaled(factor)
                                  for table, factor in (("prefill", self.prefill),
                                                        ("decode", self.decode),
                                                        ("riding", self.decode),
                                                        ("verify", self.decode))
                                  if getattr(region, table, None) is not None
                                  and factor != 1.0})


@dataclass(frozen=True)
class Variation:
    name: str
    values: tuple[float, ...]


def parse_vary(text: str) -> Variation:
    """``NAME=V1,V2,...`` (one of ``VARIABLES``), values positive; systems whole."""
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or name not in VARIABLES:
        raise UserError(f"`vary` must be NAME=V1,V2,... with NAME one of "
                        f"{', '.join(VARIABLES)}, got {text!r}")
    try:
        values = tuple(float(v) for v in rest.split(",") if v.strip())
    except ValueError:
        raise UserError(f"`vary={name}`: values must be numbers, got {rest!r}") from None
    # Finite, here: an infinite TPOT target or factor would pass until its value's turn came,
    # after every value before it had run, and fail there naming the target, not `vary`.
    if not values or any(not 0 < v < math.inf for v in values):
        raise UserError(f"`vary={name}`: give one or more positive, finite values, got {rest!r}")
    if name == "systems" and any(v != int(v) for v in values):
        raise UserError(f"`vary=systems`: whole numbers only, got {rest!r}")
    if name == "systems" and max(values) > MAX_SYSTEMS:
        raise UserError(f"`vary=systems`: at most {MAX_SYSTEMS} systems, got {rest!r}")
    return Variation(name, values)


def scaled(requests: Requests, prompt: float = 1.0, output: float = 1.0) -> Requests:
    """The same requests with prompt and output lengths scaled (at least one token each).
    An agentic session's later calls keep carrying their whole context: their prompts scale
    like every other."""
    def scale(tokens: np.ndarray, factor: float) -> np.ndarray:
        return np.maximum(1, np.rint(tokens * factor)).astype(np.int64)
    return replace(requests, prompt_tokens=scale(requests.prompt_tokens, prompt),
                   output_tokens=scale(requests.output_tokens, output))


@dataclass(frozen=True)
class Applied:
    """The variable at ``value`` applied to a confirming run's requests (``apply``'s first)."""

    variation: Variation
    value: float
    targets: Targets
    systems: int

    def __call__(self, requests: Requests) -> Requests:
        return apply(self.variation, self.value, requests, self.targets, self.systems)[0]


def apply(variation: Variation, value: float, requests: Requests, targets: Targets,
          systems: int) -> tuple[Requests, Targets, int, StepScale]:
    """The experiment's inputs at one value of the variable."""
    name = variation.name
    if name == "tpot":
        targets = replace(targets, tpot_s=value)
    elif name == "systems":
        systems = int(value)
    elif name == "prompt-scale":
        requests = scaled(requests, prompt=value)
    elif name == "output-scale":
        requests = scaled(requests, output=value)
    scale = {"prefill-time": StepScale(prefill=value),
             "decode-time": StepScale(decode=value)}.get(name, StepScale())
    return requests, targets, systems, scale


def decode_step_s(regions, requests: Requests, clock_hz: float,
                  tokens_per_step: float = 1.0) -> float:
    """One decode step of one sequence through a colocated region (batch 1, at the requests'
    mean context halfway through their outputs): the unit TPOT targets are measured in.
    Speculating, the time per token of its verify rounds alone: the draft's steps, the
    verify step's first tile and its later tiles at its slowest stage's pace, over the
    ``tokens_per_step`` a round yields on average."""
    region = next(r for r in regions if r.decode is not None)
    context = float(np.mean(requests.prompt_tokens + requests.output_tokens / 2))
    stages, between = region.decode.at(1, context)
    step = float(stages.sum()) + between
    verify, drafts = speculating(region)
    if drafts:
        later, _ = verify.at(1, context)
        step += drafts * float(later.max())
    return step / tokens_per_step / clock_hz
