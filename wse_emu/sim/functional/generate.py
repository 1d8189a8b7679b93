"""Greedy generation through a compiled program, colocated or disaggregated.

A colocated program prefills and decodes in one region. A disaggregated one prefills in a
prefill region, hands the prompt's KV cache over layer by layer (read from the prefill PEs'
slots, written into the decode PEs' slots by the decode region's own layout) and decodes in a
decode region, whose tiles and trees may differ from the prefill region's: the tokens must come
out the same either way.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wse_emu.errors import UserError
from wse_emu.functional.numerics import Numerics
from wse_emu.models.spec import check_positions
from wse_emu.program.format import WaferProgram
from wse_emu.sim.functional.region import FunctionalRegion, check_token_ids
from wse_emu.util.checks import short_repr, whole
from wse_emu.util.splits import even_split

DEFAULT_PREFILL_TILE = 64  # prompt tokens per prefill tile, as ``wse-emu serve`` streams them


@dataclass
class Generation:
    prompt_ids: list[int]
    generated_ids: list[int]
    logits: np.ndarray  # (generated, vocab): the logits each generated token was chosen from
    prefill_region: str
    decode_region: str

    @property
    def disaggregated(self) -> bool:
        return self.prefill_region != self.decode_region


def prompt_tiles(tokens: int, tile: int) -> list[tuple[int, int]]:
    """The prompt's tiles, (start, end), split evenly as the timed prefill step splits them."""
    sizes = even_split(tokens, -(-tokens // tile))
    ends = np.cumsum(sizes)
    return [(int(e - n), int(e)) for n, e in zip(sizes, ends)]


class Generator:
    def __init__(self, program: WaferProgram, weights: Mapping[str, np.ndarray],
                 dtype: str = "float32", prefill_region: str | None = None,
                 decode_region: str | None = None, prefill_tile: int = DEFAULT_PREFILL_TILE):
        if prefill_tile < 1:
            raise UserError(f"the prefill tile must be at least 1 token, got {prefill_tile}")
        self.program, self.numerics = program, Numerics(dtype)
        self.prefill_tile = prefill_tile
        pre = program.region_for("prefill", prefill_region)
        dec = program.region_for("decode", decode_region)
        for region, role in ((pre, "prefill"), (dec, "decode")):
            if region.role not in (role, "mixed"):
                raise UserError(f"region {region.name} is a {region.role} region, "
                                f"not a {role} one")
        self.prefill = FunctionalRegion(program, pre.name, weights, self.numerics)
        self.decode = self.prefill if dec.name == pre.name else \
            FunctionalRegion(program, dec.name, weights, self.numerics)

    def run_prompt(self, prompt_ids, all_logits: bool = False) -> list[np.ndarray]:
        """Prefill the prompt tile by tile; per tile, the logits of its last token (of every
        token with ``all_logits``). Then hand the cache to the decode region if it is another."""
        ids = list(prompt_ids)
        if not ids:
            raise UserError("the prompt is empty: give at least one token id")
        self.prefill.reset()
        self.decode.reset()
        out = [self.prefill.forward(ids[a:b], all_logits=all_logits)
               for a, b in prompt_tiles(len(ids), self.prefill_tile)]
        if self.decode is not self.prefill:
            if len(ids) > self.decode.capacity:
                raise UserError(f"decode region {self.decode.name} caches "
                                f"{self.decode.capacity:,} tokens; the prompt has {len(ids):,}")
            self.decode.import_kv(self.prefill.export_kv())
            self.prefill.reset()  # the prefill region's slots are free for the next prompt
        return out

    def step(self, token: int) -> np.ndarray:
        """Decode one token; its logits."""
        return self.decode.forward([token])[0]

    def check(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """Refuse, before computing anything, a generation the regions cannot hold."""
        if max_new_tokens < 1:
            raise UserError(f"`max_new_tokens` must be at least 1, got {max_new_tokens}")
        if prompt_tokens > self.prefill.capacity:
            raise UserError(f"region {self.prefill.name} caches {self.prefill.capacity:,} "
                            f"tokens of one sequence; the prompt has {prompt_tokens:,}")
        total = prompt_tokens + max_new_tokens - 1  # the last token is never fed back
        check_positions(self.program.model, total, f"{prompt_tokens:,} prompt tokens and "
                        f"{max_new_tokens:,} new ones")
        if total > self.decode.capacity:
            raise UserError(f"region {self.decode.name} caches {self.decode.capacity:,} tokens "
                            f"of one sequence; {prompt_tokens:,} prompt tokens and "
                            f"{max_new_tokens:,} new ones need {total:,}")

    def generate(self, prompt_ids, max_new_tokens: int) -> Generation:
        prompt = list(prompt_ids)
        check_token_ids(prompt, self.program.model.vocab_size)
        prompt = [int(i) for i in prompt]
        self.check(len(prompt), max_new_tokens)
        logits = [self.run_prompt(prompt)[-1][-1]]
        tokens = [self._choose(logits[-1])]
        while len(tokens) < max_new_tokens:
            logits.append(self.step(tokens[-1]))
            tokens.append(self._choose(logits[-1]))
        return Generation(prompt, tokens, np.stack(logits), self.prefill.name, self.decode.name)

    def _choose(self, logits: np.ndarray) -> int:
        """Greedy: the first largest logit. Non-finite logits (a float16 overflow) stop the
        run rather than pick a token from garbage."""
        if not np.all(np.isfinite(logits)):
            raise UserError(f"the logits are not finite in {self.numerics.name}: the values "
                            "overflowed; try `dtype=float32`")
        return int(np.argmax(logits))


def generate(program: WaferProgram, prompt_ids, new_tokens: int = 8, checkpoint=None,
             weights_seed: int = 0) -> Generation:
    """Greedy generation computed through ``program``'s tiles, with a checkpoint's weights
    (a directory of config.json and *.safetensors) or random ones drawn from ``weights_seed``,
    every argument checked before the weights are drawn or read."""
    from wse_emu.models.weights import check_memory, load_checkpoint, random_weights

    whole("new_tokens", new_tokens, 1)
    whole("weights_seed", weights_seed, 0)
    ids = list(prompt_ids)
    # Whole numbers of any kind (a tokenizer's NumPy array too), read as Python ints.
    wrong = next((i for i in ids if isinstance(i, bool) or not isinstance(i, numbers.Integral)),
                 None)
    if wrong is not None:
        raise UserError(f"`prompt_ids` must be token ids (whole numbers), got "
                        f"{short_repr(wrong)} among them")
    ids = [int(i) for i in ids]
    vocab = program.model.vocab_size
    if not ids:
        raise UserError("`prompt_ids` is empty: give at least one token id")
    bad = next((i for i in ids if not 0 <= i < vocab), None)
    if bad is not None:
        raise UserError(f"`prompt_ids`: token id {bad} is outside the vocabulary "
                        f"(0..{vocab - 1})")
    # Before the weights are drawn or read: the last new token is never fed back.
    check_positions(program.model, len(ids) + new_tokens - 1,
                    f"{len(ids):,} `prompt_ids` and `new_tokens={new_tokens}`")
    check_memory(program.model)
    if checkpoint is not None:
        _, weights = load_checkpoint(Path(checkpoint))
    else:
        weights = random_weights(program.model, weights_seed)
    return Generator(program, weights).generate(ids, new_tokens)
