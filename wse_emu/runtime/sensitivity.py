"""Sensitivity of the disaggregation answer: the experiment repeated with one input varied.

The ratio of disaggregated to colocated goodput is not one number: it moves with the token-speed
target (how many decode steps' worth of time a token may take), with the shape of the requests
(prompt against output length) and with the cluster. ``VARIABLES`` names what can be varied and
how a value changes the experiment's inputs; the TPOT target is also given in units of one
decode step of the model alone, so that answers for different models and fabrics line up.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from wse_emu.errors import UserError
from wse_emu.runtime.experiment import Targets
from wse_emu.runtime.workload import Requests

VARIABLES = {
    "tpot": "the p90 TPOT target, seconds",
    "systems": "systems (wafers) in the cluster",
    "prompt-scale": "every prompt's length times this factor",
    "output-scale": "every output's length times this factor",
}


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
    if not values or any(not v > 0 for v in values):
        raise UserError(f"`vary={name}`: give one or more positive values, got {rest!r}")
    if name == "systems" and any(v != int(v) for v in values):
        raise UserError(f"`vary=systems`: whole numbers only, got {rest!r}")
    return Variation(name, values)


def scaled(requests: Requests, prompt: float = 1.0, output: float = 1.0) -> Requests:
    """The same requests with prompt and output lengths scaled (at least one token each).
    An agentic session's later calls keep carrying their whole context: their prompts scale
    like every other."""
    def scale(tokens: np.ndarray, factor: float) -> np.ndarray:
        return np.maximum(1, np.rint(tokens * factor)).astype(np.int64)
    return replace(requests, prompt_tokens=scale(requests.prompt_tokens, prompt),
                   output_tokens=scale(requests.output_tokens, output))


def apply(variation: Variation, value: float, requests: Requests, targets: Targets,
          systems: int) -> tuple[Requests, Targets, int]:
    """The experiment's inputs at one value of the variable."""
    if variation.name == "tpot":
        return requests, replace(targets, tpot_s=value), systems
    if variation.name == "systems":
        return requests, targets, int(value)
    if variation.name == "prompt-scale":
        return scaled(requests, prompt=value), targets, systems
    return scaled(requests, output=value), targets, systems


def decode_step_s(regions, requests: Requests, clock_hz: float) -> float:
    """One decode step of one sequence through a colocated region (batch 1, at the requests'
    mean context halfway through their outputs): the unit TPOT targets are measured in."""
    region = next(r for r in regions if r.decode is not None)
    context = float(np.mean(requests.prompt_tokens + requests.output_tokens / 2))
    stages, between = region.decode.at(1, context)
    return (float(stages.sum()) + between) / clock_hz
