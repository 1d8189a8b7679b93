"""The emulated time of a generation, from the timing simulator (the fast engine).

The prompt's prefill runs as one step of the prefill region in tiles; a disaggregated run adds
the KV handoff; every further token is one decode step of batch 1 at its context.
"""

from __future__ import annotations

from dataclasses import dataclass

from wse_emu.models.layer import MicroBatch
from wse_emu.program.format import WaferProgram
from wse_emu.sim.runner import kv_handoff, run_region


@dataclass
class GenerationTime:
    prefill_s: float
    handoff_s: float
    decode_s: list[float]  # per token after the first

    @property
    def first_token_s(self) -> float:
        """The first token comes out of the prefill's LM head (before any handoff)."""
        return self.prefill_s

    @property
    def per_token(self) -> list[float]:
        """Seconds per generated token: the first waits for the prefill; each later one for
        its decode step (the first of them also for the handoff)."""
        later = [d + (self.handoff_s if i == 0 else 0.0) for i, d in enumerate(self.decode_s)]
        return [self.prefill_s] + later

    def to_dict(self) -> dict:
        decode = self.decode_s
        return {"first_token_s": self.first_token_s, "prefill_s": self.prefill_s,
                "handoff_s": self.handoff_s, "seconds_per_token": self.per_token,
                "decode_tokens_per_s": len(decode) / sum(decode) if decode else None}


def generation_time(program: WaferProgram, prefill_region: str, decode_region: str,
                    prompt_tokens: int, new_tokens: int, prefill_tile: int) -> GenerationTime:
    tiles = -(-prompt_tokens // prefill_tile)
    prefill = run_region(program, prefill_region, MicroBatch("prefill", tokens=prompt_tokens,
                                                       chunks=tiles)).step_seconds
    handoff = 0.0
    if prefill_region != decode_region:
        handoff = kv_handoff(program, prefill_region, decode_region, prompt_tokens).seconds
    decode = [run_region(program, decode_region,
                         MicroBatch("decode", batch=1, context=prompt_tokens + i)).step_seconds
              for i in range(1, new_tokens)]
    return GenerationTime(prefill, handoff, decode)
