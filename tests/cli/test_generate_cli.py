"""wse-emu generate: tokens and logits computed through the compiled tiles match a plain-numpy
forward pass, colocated and disaggregated; presets run on seeded random weights; bad
checkpoints and bad inputs give one line on stderr and exit code 2.

Successful runs call ``wse_emu.cli.main.main`` in-process (fast); error runs go through a
subprocess, as the other command-line error tests do, so the one-line, no-traceback contract is
checked on the real console script.
"""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest
from helpers import assert_one_line_error, run_cli
from naive.reference_forward import ReferenceModel

from wse_emu.cli.main import main
from wse_emu.models.load import load_model
from wse_emu.models.weights import expected_shapes, hf_config, load_checkpoint, random_weights

FABRIC = ["--fabric", "mesh16", "--region", "8x8"]
PROMPT = [3, 1, 4, 1, 5, 9]
NEW_TOKENS = 5
# Not the preset itself: another vocabulary size and rotary base, so a checkpoint's config.json
# must really be read (hidden 64, 2 layers, as the tiny preset).
SPEC = load_model("tiny").replaced(name="gen-test", vocab_size=200,
                                   rope_theta=50000.0, dtype_bytes=4)


def generate(capsys, *args) -> dict:
    """Run ``wse-emu generate ... --json`` in-process; its JSON result."""
    capsys.readouterr()
    code = main(["generate", *map(str, args), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err == ""
    return json.loads(out)


def assert_quiet_error(proc, *needles) -> str:
    """One line on stderr and exit 2 (``assert_one_line_error``), and nothing on stdout."""
    line = assert_one_line_error(proc, *needles)
    assert proc.stdout == ""
    return line


def reference_greedy(spec, weights, prompt, new_tokens):
    """Greedy tokens of the reference model, and the logits each was chosen from."""
    ref = ReferenceModel(spec, weights)
    logits = [ref.prefill(prompt)[-1]]
    tokens = []
    while True:
        top2 = np.sort(logits[-1])[-2:]
        # The test's own premise: no near-tie a float32 rounding could flip.
        assert top2[1] - top2[0] > 1e-3 * np.max(np.abs(logits[-1]))
        tokens.append(int(np.argmax(logits[-1])))
        if len(tokens) == new_tokens:
            return tokens, np.stack(logits)
        logits.append(ref.decode(tokens[-1]))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A saved checkpoint of SPEC, and the reference's greedy tokens and logits on the weights
    loaded back from it."""
    pytest.importorskip("safetensors")
    from wse_emu.models.weights import save_checkpoint

    path = tmp_path_factory.mktemp("generate") / "ckpt"
    save_checkpoint(path, SPEC, random_weights(SPEC, seed=11))
    spec, weights = load_checkpoint(path)
    assert spec.vocab_size == SPEC.vocab_size and spec.rope.theta == SPEC.rope.theta
    tokens, logits = reference_greedy(spec, weights, PROMPT, NEW_TOKENS)
    return path, tokens, logits


def prompt_args():
    return ["--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", NEW_TOKENS]


# --- 1, 2: a checkpoint, colocated and disaggregated ----------------------------------------

@pytest.fixture(scope="module")
def colocated(checkpoint, tmp_path_factory):
    path, _, _ = checkpoint
    dump = tmp_path_factory.mktemp("logits") / "l.npy"
    # A module-scoped fixture cannot use capsys: capture the in-process run by hand.
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["generate", str(path), *FABRIC, *map(str, prompt_args()), "--json",
                     "--dump-logits", str(dump)])
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue()), dump


def test_checkpoint_tokens_match_the_reference(checkpoint, colocated):
    path, tokens, _ = checkpoint
    d, dump = colocated
    assert d["model"] == "gen-test"
    assert d["weights"] == str(path)
    assert (d["plan"], d["fabric"], d["systems"], d["dtype"]) == \
        ("colocated", "mesh16", 1, "float32")
    assert d["prompt_ids"] == PROMPT
    assert d["generated_ids"] == tokens
    assert d["prefill_region"] == d["decode_region"]
    assert d["logits_file"] == str(dump)


def test_dumped_logits_match_the_reference(checkpoint, colocated):
    _, _, reference = checkpoint
    _, dump = colocated
    assert not list(dump.parent.glob("*.partial"))  # written whole, under its own name
    logits = np.load(dump)
    assert logits.dtype == np.float32
    assert logits.shape == (NEW_TOKENS, SPEC.vocab_size)
    for i in range(NEW_TOKENS):
        scale = np.max(np.abs(reference[i]))
        error = np.max(np.abs(logits[i] - reference[i])) / scale
        assert error < 1e-4, (i, error)
    # Each row is the distribution its token was picked from, not a copy of one row.
    assert not np.allclose(logits[0], logits[1])


def test_emulated_time_per_token(colocated):
    e = colocated[0]["emulated"]
    assert e["first_token_s"] > 0
    assert e["first_token_s"] == e["prefill_s"] == e["seconds_per_token"][0]
    assert len(e["seconds_per_token"]) == NEW_TOKENS
    assert all(s > 0 for s in e["seconds_per_token"])
    assert e["handoff_s"] == 0.0  # colocated: no KV handoff
    per = e["seconds_per_token"][1:]
    assert e["decode_tokens_per_s"] == pytest.approx(len(per) / sum(per))


def test_disaggregated_gives_the_same_tokens(checkpoint, colocated, capsys):
    path, tokens, _ = checkpoint
    d = generate(capsys, path, *FABRIC, *prompt_args(), "--plan", "disaggregated")
    assert d["plan"] == "disaggregated"
    assert d["prefill_region"] != d["decode_region"]
    assert d["prefill_region"].startswith("prefill") and d["decode_region"].startswith("decode")
    assert d["generated_ids"] == colocated[0]["generated_ids"] == tokens
    e = d["emulated"]
    assert e["handoff_s"] > 0
    assert len(e["seconds_per_token"]) == NEW_TOKENS
    # The first token waits for the prefill, the second for the KV handoff and its decode step,
    # each later one for its decode step: the total is prefill + handoff + the decode steps.
    assert e["seconds_per_token"][0] == e["first_token_s"] == e["prefill_s"]
    decode_total = (NEW_TOKENS - 1) / e["decode_tokens_per_s"]
    assert sum(e["seconds_per_token"]) == pytest.approx(
        e["prefill_s"] + e["handoff_s"] + decode_total, rel=1e-9)
    assert "logits_file" not in d


def test_prompt_split_into_several_prefill_tiles(checkpoint, capsys):
    """Prefilled 2 tokens a tile (3 tiles) and handed off: still the reference's tokens."""
    path, tokens, _ = checkpoint
    d = generate(capsys, path, *FABRIC, *prompt_args(), "--plan", "disaggregated",
                 "--prefill-tile", 2, "--no-timing")
    assert d["generated_ids"] == tokens


# --- 3: a preset, on seeded random weights --------------------------------------------------

@pytest.mark.e2e
def test_preset_runs_on_seeded_random_weights(capsys):
    spec = load_model("tiny")
    args = ["tiny", *FABRIC, "--prompt-ids", "7,8,9", "--max-new-tokens", 4]
    first = generate(capsys, *args, "--weights-seed", 7)
    again = generate(capsys, *args, "--weights-seed", 7, "--no-timing")
    other = generate(capsys, *args, "--weights-seed", 8, "--no-timing")
    assert first["weights"] == "random (seed 7)" and other["weights"] == "random (seed 8)"
    assert len(first["generated_ids"]) == 4
    assert first["generated_ids"] == again["generated_ids"]
    assert first["generated_ids"] == reference_greedy(spec, random_weights(spec, 7),
                                                      [7, 8, 9], 4)[0]
    assert other["generated_ids"] == reference_greedy(spec, random_weights(spec, 8),
                                                      [7, 8, 9], 4)[0]
    assert other["generated_ids"] != first["generated_ids"]
    assert first["emulated"] is not None and first["emulated"]["first_token_s"] > 0
    assert again["emulated"] is None


def test_text_output_names_the_regions(capsys, checkpoint):
    path, tokens, _ = checkpoint
    capsys.readouterr()
    assert main(["generate", str(path), *FABRIC, *map(str, prompt_args()),
                 "--plan", "disaggregated"]) == 0
    out = capsys.readouterr().out
    assert "prefill in prefill0, KV handed to decode0" in out
    assert f"generated   {','.join(map(str, tokens))} ({NEW_TOKENS} tokens)" in out


# --- 4: bad checkpoints ---------------------------------------------------------------------

@pytest.mark.parametrize("field,value,tensor", [
    ("intermediate_size", 96, "model.layers.0.mlp.gate_proj.weight"),
    ("hidden_size", 32, "model.embed_tokens.weight"),
])
@pytest.mark.e2e
def test_config_disagreeing_with_the_tensors(tmp_path, field, value, tensor):
    pytest.importorskip("safetensors")
    from wse_emu.models.weights import save_checkpoint

    ckpt = tmp_path / "ckpt"
    save_checkpoint(ckpt, SPEC, random_weights(SPEC, seed=1))
    config = json.loads((ckpt / "config.json").read_text())
    config[field] = value
    (ckpt / "config.json").write_text(json.dumps(config))
    dump = tmp_path / "l.npy"
    proc = run_cli("generate", ckpt, *FABRIC, "--prompt-ids", "1,2", "--dump-logits", dump)
    line = assert_quiet_error(proc, tensor, "config.json")
    assert str(ckpt) in line
    assert list(tmp_path.iterdir()) == [ckpt]  # no logits file, not even a partial one


@pytest.mark.e2e
def test_missing_tensor_is_named(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    weights = random_weights(SPEC, seed=1)
    missing = "model.layers.1.self_attn.v_proj.weight"
    assert missing in expected_shapes(SPEC)
    del weights[missing]
    safetensors_numpy.save_file(weights, str(ckpt / "model.safetensors"),
                                metadata={"format": "pt"})
    (ckpt / "config.json").write_text(json.dumps(hf_config(SPEC)))
    dump = tmp_path / "l.npy"
    proc = run_cli("generate", ckpt, *FABRIC, "--prompt-ids", "1,2", "--dump-logits", dump)
    assert_quiet_error(proc, f"missing tensor {missing}")
    assert list(tmp_path.iterdir()) == [ckpt]


# --- 5: bad inputs --------------------------------------------------------------------------

@pytest.mark.parametrize("args,needle", [
    (["--prompt-ids", "1,x"], "--prompt-ids takes comma-separated integers"),
    (["--prompt-ids", "1,256"], "token id 256 is outside the vocabulary (0..255)"),
    (["--prompt-ids", "1,-1"], "token id -1 is outside the vocabulary"),
    (["--prompt-ids", ","], "--prompt-ids is empty"),
    (["--prompt-ids", "1", "--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
    (["--prompt-ids", "1", "--dump-logits", "out.txt"], "--dump-logits writes a .npy file"),
    (["--prompt", "hello"], "--prompt needs a tokenizer.json"),
    (["--prompt-ids", "1", "--prefill-tile", "0"], "prefill tile must be at least 1"),
    (["--prompt-ids", "99999999999999999999"], "outside the vocabulary"),
    (["--prompt-ids", "1", "--weights-seed", "-1"], "--weights-seed must be at least 0"),
    (["--prompt-ids", "1,2", "--max-new-tokens", "17000"], "max_position_embeddings"),
    (["--prompt-ids", ",".join(["1"] * 130), "--prefill-tile", "1"], "raise --prefill-tile"),
], ids=["not-an-int", "past-vocab", "negative", "empty", "zero-tokens", "not-npy",
        "no-tokenizer", "zero-tile", "past-int64", "negative-seed", "past-positions",
        "too-many-tiles"])
@pytest.mark.e2e
def test_bad_input_is_one_line(tmp_path, args, needle):
    proc = run_cli("generate", "tiny", *FABRIC, *args, cwd=tmp_path)
    assert_quiet_error(proc, needle)
    assert list(tmp_path.iterdir()) == []  # out.txt (or anything else) not written


@pytest.mark.e2e
def test_a_model_too_large_to_hold_is_refused_before_loading(tmp_path):
    # 70.6 B parameters, 282 GB in float32: more than any machine this runs on.
    proc = run_cli("generate", "llama-3.1-70b", "--prompt-ids", "1,2", cwd=tmp_path)
    assert_quiet_error(proc, "llama-3.1-70b: its 70.6 B parameters take 282 GB in float32, "
                             "more than this machine's")
    assert list(tmp_path.iterdir()) == []


# --- 6: a tokenizer beside the checkpoint ---------------------------------------------------

def test_prompt_text_through_the_checkpoint_tokenizer(checkpoint, tmp_path, capsys):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    path, _, _ = checkpoint
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for file in path.iterdir():
        (ckpt / file.name).write_bytes(file.read_bytes())
    vocab = {"[UNK]": 0, "the": 17, "cat": 42, "sat": 99, "mat": 150}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(ckpt / "tokenizer.json"))

    d = generate(capsys, ckpt, *FABRIC, "--prompt", "the cat sat", "--max-new-tokens", 3)
    assert d["prompt_ids"] == tok.encode("the cat sat").ids == [17, 42, 99]
    spec, weights = load_checkpoint(ckpt)
    assert d["generated_ids"] == reference_greedy(spec, weights, [17, 42, 99], 3)[0]
    assert isinstance(d["text"], str)
    assert d["text"] == tok.decode(d["generated_ids"])
