"""Our logits against Hugging Face transformers' own: a small Llama checkpoint, written by
transformers from weights it drew, read back the way any checkpoint is (its config.json and
safetensors), compiled onto a 16 x 16 mesh and run through the tiles by the functional engine
(``api.generate``), greedy, beside transformers' forward pass of the same weights on the same
tokens. Where torch and transformers are installed (the reference extra); the test suite checks
the plain reference forward pass against transformers for every family it models
(``tests/naive``), and the engine against that reference."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.options import CompileOptions
from wse_emu.hardware.fabric import ClusterSpec, load_fabric
from wse_emu.models.load import load_model
from wse_emu.sim.functional.generate import generate
from wse_emu.validation.checks import FAST, Check, Reference

PROMPT = [5, 99, 17, 3, 64, 127, 0, 42, 8, 71, 200, 13]
NEW_TOKENS = 6
SHAPE = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             max_position_embeddings=128, tie_word_embeddings=False)


def agreement(seed: int = 0) -> float:
    """1 minus the largest difference between our logits and transformers' over every
    generated token, relative to the largest of theirs; 0 if the tokens chosen differ."""
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()  # its bars would break the table
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**SHAPE, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).eval()
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        spec = load_model(Path(tmp) / "config.json")
        program = compile_model(spec, ClusterSpec(load_fabric("mesh16"), 1), CompileOptions())
        ours = generate(program, PROMPT, NEW_TOKENS, checkpoint=tmp)
    ids, theirs = list(PROMPT), []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):  # the whole sequence again each step: no cache of theirs
            row = model(torch.tensor([ids])).logits[0, -1].double().numpy()
            theirs.append(row)
            ids.append(int(row.argmax()))
    if ids[len(PROMPT):] != list(ours.generated_ids):
        return 0.0
    theirs = np.array(theirs)
    return 1.0 - float(np.abs(np.asarray(ours.logits, dtype=np.float64) - theirs).max()
                       / np.abs(theirs).max())


CHECKS = [
    Check("functional logits against transformers, Llama",
          Reference("Hugging Face transformers' forward pass (eager attention, float32) of the "
                    "same checkpoint", "the version installed",
                    f"logits of {NEW_TOKENS} greedy tokens after a {len(PROMPT)}-token prompt, "
                    "a 2-layer Llama of hidden size 64 with weights transformers drew, as "
                    "agreement with itself", 1.0, "x"),
          "1 - the largest difference of our logits from theirs, relative to their largest "
          "(0 if a token chosen differs), computed through the tiles of a 16 x 16 mesh in "
          "float32", (0.9999, 1.0),
          "the same arithmetic in another order: float32 rounding, no more", FAST, agreement,
          extra="reference", needs=("torch", "transformers")),
]
