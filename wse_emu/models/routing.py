"""How a step's tokens pick their experts: a stated distribution, seeded, so that the load on
each expert (and its imbalance) can be seen.

``uniform``: every expert is equally likely. ``skewed``: popularity follows a Zipf law: the
i-th most popular expert (in an order drawn from the seed) has weight (i + 1) ** -skew, so skew
0 is uniform and a larger skew crowds more tokens onto fewer experts. Each token takes its
top-k experts without replacement, in proportion to those weights (drawn as the k largest of
log weight plus Gumbel noise, which picks them exactly so).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wse_emu.errors import UserError

KINDS = ("uniform", "skewed")


@dataclass(frozen=True)
class Routing:
    kind: str = "uniform"
    skew: float = 0.0
    seed: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise UserError(f"`routing` must be uniform or skewed:S, got {self.kind!r}")
        if not (self.skew >= 0 and np.isfinite(self.skew)):
            raise UserError(f"a skewed routing's skew must be at least 0, got {self.skew}")
        if self.kind == "uniform" and self.skew:
            raise UserError("uniform routing has no skew")
        if self.seed < 0:
            raise UserError(f"`routing_seed` must be 0 or more, got {self.seed}")

    def popularity(self, experts: int, layer: int = 0) -> np.ndarray:
        """Each expert's share of the choices in ``layer``, summing to one (each layer ranks
        its experts in its own order)."""
        seed = self.seed if layer == 0 else [self.seed, layer]
        ranks = np.random.default_rng(seed).permutation(experts)
        weights = (ranks + 1.0) ** -self.skew
        return weights / weights.sum()

    def draw(self, experts: int, top_k: int, tokens: int, layer: int = 0,
             offset: int = 0) -> np.ndarray:
        """The experts of each of ``tokens`` tokens in ``layer``: (tokens, top_k), distinct
        per token (``offset``: where the tokens start in their step, for a prefill's tiles)."""
        key = [self.seed, experts, top_k, tokens] + ([layer, offset] if layer or offset else [])
        rng = np.random.default_rng(key)
        keys = np.log(self.popularity(experts, layer)) + rng.gumbel(size=(tokens, experts))
        return np.argsort(-keys, axis=1, kind="stable")[:, :top_k]

    def loads(self, experts: int, top_k: int, tokens: int, layer: int = 0,
              offset: int = 0) -> np.ndarray:
        """Tokens routed to each expert in one drawn step."""
        return np.bincount(self.draw(experts, top_k, tokens, layer, offset).ravel(),
                           minlength=experts)

    def spec(self) -> str:
        """As ``parse_routing`` reads it."""
        return "uniform" if self.kind == "uniform" else f"skewed:{self.skew:g}"

    def describe(self) -> str:
        shape = "uniform" if self.kind == "uniform" else f"skewed {self.skew:g}"
        return f"{shape} routing, seed {self.seed}"


def parse_routing(text: str, seed: int = 0) -> Routing:
    """``uniform`` or ``skewed:S`` (S the Zipf exponent, 0 or more)."""
    kind, _, value = text.partition(":")
    if kind == "uniform" and not value:
        return Routing(seed=seed)
    if kind == "skewed" and value:
        try:
            skew = float(value)
        except ValueError:
            raise UserError(f"`routing` skewed:S needs a number S, got {value!r}") from None
        return Routing("skewed", skew, seed)
    raise UserError(f"`routing` must be uniform or skewed:S, got {text!r}")


def routing_for(model, text: str, seed: int = 0) -> Routing:
    """The routing ``--routing`` and ``--routing-seed`` state for ``model``, refused by name
    on a dense model (it has no experts to route to)."""
    routing = parse_routing(text, seed)
    if not model.is_moe and routing != Routing():
        raise UserError(f"--routing and --routing-seed apply to a mixture of experts; "
                        f"{model.name} is dense")
    return routing


def routing_of(options) -> Routing:
    """The routing a program's timed steps draw, from its compile options
    (``CompileOptions``)."""
    return parse_routing(options.routing, options.routing_seed)


def load_summary(routing: Routing, experts: int, top_k: int, tokens: int) -> dict:
    """One drawn step's expert loads: how many experts receive tokens, the busiest one's
    tokens, and the mean over the experts that receive any."""
    loads = routing.loads(experts, top_k, tokens)
    active = loads[loads > 0]
    return {"routing": routing.describe(), "tokens": tokens, "experts": experts,
            "active_experts": int(active.size), "busiest_tokens": int(loads.max()),
            "mean_tokens_per_active_expert": float(active.mean())}
