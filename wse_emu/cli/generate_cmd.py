"""``wse-emu generate``: greedy decoding that computes through the compiled program's tiles.

MODEL_OR_CHECKPOINT is a Hugging Face checkpoint directory (``config.json`` and
``*.safetensors``, read from disk, never downloaded) or anything ``compile`` takes (a preset, a
model YAML, a bare ``config.json``), which runs with seeded random weights.
"""

from __future__ import annotations

import time
from pathlib import Path

from wse_emu.cli.compile_cmd import (
    add_cluster_args,
    compile_from_args,
    model_from_args,
)
from wse_emu.errors import UserError
from wse_emu.functional.numerics import DTYPES
from wse_emu.models.spec import formats_text
from wse_emu.models.weights import TOKENIZER_FILE, model_and_weights, tokenizer_for
from wse_emu.rundir.write import save_logits
from wse_emu.sim.functional.generate import DEFAULT_PREFILL_TILE, Generator
from wse_emu.sim.functional.region import check_token_ids
from wse_emu.sim.functional.timing import generation_time
from wse_emu.sim.runner import MAX_PREFILL_TILES as MAX_TILES
from wse_emu.util.atomic import check_writable
from wse_emu.util.fmt import seconds, si


def add_parser(sub, summary: str) -> None:
    p = sub.add_parser("generate", help=summary)
    p.add_argument("model", metavar="MODEL_OR_CHECKPOINT",
                   help="checkpoint directory (config.json + *.safetensors), or a model preset, "
                   "YAML or config.json to run with random weights")
    add_cluster_args(p)
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt-ids", help="comma-separated prompt token ids, e.g. 1,2,3")
    prompt.add_argument("--prompt", help="prompt text (needs tokenizer.json beside the "
                        "checkpoint and the tokenizers library)")
    p.add_argument("--max-new-tokens", type=int, default=16, help="tokens to generate")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32",
                   help="number format the PEs store and send (default float32)")
    p.add_argument("--weights-seed", type=int, default=0,
                   help="seed of the random weights when no checkpoint is given")
    p.add_argument("--prefill-tile", type=int, default=DEFAULT_PREFILL_TILE,
                   help=f"prompt tokens per prefill tile (default {DEFAULT_PREFILL_TILE})")
    p.add_argument("--prefill-region", help="region to prefill in (default: the first)")
    p.add_argument("--decode-region", help="region to decode in (default: the first)")
    p.add_argument("--dump-logits", metavar="FILE.npy",
                   help="save the logits of every generated token, (tokens, vocab) float32")
    p.add_argument("--no-timing", action="store_true",
                   help="skip the timing simulation (emulated seconds per token)")
    p.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    p.set_defaults(func=run)


def parse_ids(text: str) -> list[int]:
    try:
        ids = [int(item) for item in text.replace(" ", "").split(",") if item != ""]
    except ValueError:
        raise UserError(f"--prompt-ids takes comma-separated integers, got {text!r}") from None
    if not ids:
        raise UserError("--prompt-ids is empty: give at least one token id")
    return ids


def prompt_ids(args, tokenizer) -> list[int]:
    if args.prompt_ids is not None:
        return parse_ids(args.prompt_ids)
    if tokenizer is None:
        raise UserError(f"--prompt needs a {TOKENIZER_FILE} beside the checkpoint and the "
                        "tokenizers library (pip install tokenizers); or give --prompt-ids")
    ids = tokenizer.encode(args.prompt).ids
    if not ids:
        raise UserError("--prompt encodes to no tokens")
    return list(ids)


def check_lengths(args, model, ids: list[int]) -> None:
    """What can be refused before compiling: ids, positions, and the prefill tiles the timing
    simulator can take."""
    check_token_ids(ids, model.vocab_size)
    new_tokens = args.max_new_tokens
    if args.prefill_tile < 1:
        raise UserError(f"the prefill tile must be at least 1 token, got {args.prefill_tile}")
    tiles = -(-len(ids) // args.prefill_tile)
    if tiles > MAX_TILES and not args.no_timing:
        raise UserError(f"{len(ids)} prompt tokens in tiles of {args.prefill_tile} make {tiles} "
                        f"tiles; the timing takes at most {MAX_TILES}: raise --prefill-tile")
    total = len(ids) + new_tokens - 1  # the last generated token is never fed back
    if total > model.max_position_embeddings:
        raise UserError(f"{len(ids)} prompt tokens and {new_tokens} new ones need "
                        f"{total:,} positions; {model.name} has "
                        f"{model.max_position_embeddings:,} (max_position_embeddings)")


def run(args):
    if args.draft is not None:
        raise UserError("--draft: generation computes the target's own tokens, which a draft "
                        "does not change (its verification keeps them); time speculation with "
                        "serve")
    if args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.weights_seed < 0:
        raise UserError(f"--weights-seed must be at least 0, got {args.weights_seed}")
    if args.dump_logits and Path(args.dump_logits).suffix != ".npy":
        raise UserError(f"--dump-logits writes a .npy file, got {args.dump_logits!r}")
    if args.dump_logits:
        check_writable(args.dump_logits)  # before any work, not after it
    model, weights, source = model_and_weights(args.model, args.weights_seed)
    model = model_from_args(args, model)
    if formats_text(model):
        source += f", stored with {formats_text(model)}"
    tokenizer = tokenizer_for(args.model)
    ids = prompt_ids(args, tokenizer)
    check_lengths(args, model, ids)
    program = compile_from_args(args, model)
    generator = Generator(program, weights, args.dtype, args.prefill_region, args.decode_region,
                          args.prefill_tile)
    del weights  # the tiles hold their own copy
    generator.check(len(ids), args.max_new_tokens)
    began = time.perf_counter()
    result = generator.generate(ids, args.max_new_tokens)
    wall = time.perf_counter() - began
    timing = None if args.no_timing else generation_time(
        program, result.prefill_region, result.decode_region, len(ids), len(result.generated_ids),
        args.prefill_tile)
    if args.dump_logits:
        save_logits(args.dump_logits, result.logits)
    data = {
        "model": model.name, "weights": source, "fabric": program.fabric.name,
        "systems": program.systems, "plan": program.options.plan, "dtype": args.dtype,
        "prefill_region": result.prefill_region, "decode_region": result.decode_region,
        "prompt_ids": result.prompt_ids, "generated_ids": result.generated_ids,
        "functional_wall_s": wall,
        "functional_tokens_per_s": (len(ids) + len(result.generated_ids)) / wall,
        "emulated": None if timing is None else timing.to_dict(),
    }
    if tokenizer is not None:
        data["text"] = tokenizer.decode(result.generated_ids)
    if args.dump_logits:
        data["logits_file"] = args.dump_logits
    return data if args.json else render(data)


def render(d: dict) -> str:
    where = (f"prefill in {d['prefill_region']}, KV handed to {d['decode_region']}"
             if d["prefill_region"] != d["decode_region"] else f"region {d['prefill_region']}")
    lines = [
        f"{d['model']} on {d['systems']} x {d['fabric']}, {d['plan']} ({where}), {d['dtype']}, "
        f"weights {d['weights']}",
        f"  prompt      {_ids(d['prompt_ids'])} ({len(d['prompt_ids'])} tokens)",
        f"  generated   {_ids(d['generated_ids'])} ({len(d['generated_ids'])} tokens)",
    ]
    if "text" in d:
        lines.append(f"  text        {d['text']!r}")
    e = d["emulated"]
    if e is not None:
        lines.append(f"  emulated    first token {seconds(e['first_token_s'])}"
                     + (f", KV handoff {seconds(e['handoff_s'])}" if e["handoff_s"] else ""))
        if e["decode_tokens_per_s"]:
            lines.append(f"              then {seconds(1 / e['decode_tokens_per_s'])} per "
                         f"decode step on average ({si(e['decode_tokens_per_s'])} tokens/s, "
                         "batch 1)")
    if "logits_file" in d:
        lines.append(f"  wrote {d['logits_file']} (logits of each generated token)")
    return "\n".join(lines)


def _ids(ids: list[int], shown: int = 24) -> str:
    text = ",".join(str(i) for i in ids[:shown])
    return text + (",..." if len(ids) > shown else "")
