"""Functional inference through the compiled tiles, against the plain-numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import follows_reference, relative
from naive.reference_forward import ReferenceModel, rope_frequencies

from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.options import CompileOptions
from wse_emu.errors import UserError
from wse_emu.functional.numerics import Numerics
from wse_emu.functional.trees import tree_plan, tree_reduce
from wse_emu.hardware.fabric import ClusterSpec, load_fabric
from wse_emu.kernels.graph import GraphBuilder
from wse_emu.kernels.primitives import line_reduce
from wse_emu.models.layer import MicroBatch
from wse_emu.models.spec import ModelSpec
from wse_emu.models.weights import load_checkpoint, random_weights, save_checkpoint
from wse_emu.program.trees import branching, choose_levels
from wse_emu.sim.functional.generate import Generator, prompt_tiles
from wse_emu.sim.functional.region import FunctionalRegion, inverse_frequencies

# Llama 3.1-style rope scaling, with original positions so few that it matters in 20 tokens.
LLAMA_MHA = ModelSpec.from_fields(name="f-llama", family="llama", hidden_size=64,
                                  intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=4,
                                  head_dim=16, vocab_size=200, rope_theta=10000.0,
                                  rope_scaling="llama3", rope_scaling_factor=4.0,
                                  rope_original_max_positions=16).validate("test")
QWEN2_GQA = ModelSpec.from_fields(name="f-qwen2", family="qwen2", hidden_size=128,
                                  intermediate_size=256, num_layers=3, num_heads=4, num_kv_heads=1,
                                  head_dim=32, vocab_size=300, tie_embeddings=True,
                                  attention_bias=True, rms_norm_eps=1e-6,
                                  rope_theta=1e6).validate("test")
MISTRAL_SWA = ModelSpec.from_fields(name="f-mistral", family="mistral", hidden_size=96,
                                    intermediate_size=160, num_layers=4, num_heads=6,
                                    num_kv_heads=2, head_dim=16, vocab_size=256,
                                    sliding_window=8).validate("test")

# (model, fabric, compile options): several mesh and region shapes, strips from one PE to nine
# along K (nine: two-level reduction trees with members), rows fewer and more than KV heads.
CASES = [
    (LLAMA_MHA, "mesh16", dict(region=(8, 8))),
    (LLAMA_MHA, "mesh64", dict(region=(64, 4))),
    (QWEN2_GQA, "mesh16", {}),
    (QWEN2_GQA, "mesh32", dict(region=(32, 16))),
    (MISTRAL_SWA, "mesh16", dict(region=(16, 16))),
]
PROMPT = [5, 17, 3, 99, 42, 7, 11, 64, 23, 8, 150, 2, 77, 31, 19, 120, 9, 14, 60, 1]




@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Each model's seeded weights, written to safetensors and read back by the real loader."""
    out = {}
    for spec, seed in ((LLAMA_MHA, 1), (QWEN2_GQA, 2), (MISTRAL_SWA, 3)):
        directory = tmp_path_factory.mktemp(spec.name)
        save_checkpoint(directory, spec, random_weights(spec, seed))
        out[spec.name] = load_checkpoint(directory)
    return out


def program_for(spec, fabric, options, plan="colocated"):
    return compile_model(spec, ClusterSpec(load_fabric(fabric), 1),
                         CompileOptions(plan=plan, **options))


def max_grid(program) -> int:
    return max(k.grid[0] for k in program.kernels if k.grid)


@pytest.mark.parametrize("spec,fabric,options", CASES,
                         ids=[f"{c[0].name}-{c[1]}-{c[2].get('region', 'auto')}" for c in CASES])
def test_float32_logits_follow_the_reference_at_every_step(checkpoints, spec, fabric, options):
    model, weights = checkpoints[spec.name]
    program = program_for(model, fabric, options)
    follows_reference(Generator(program, weights, "float32", prefill_tile=8),
                      ReferenceModel(model, weights), PROMPT, tile=8, steps=6)




@pytest.mark.slow
def test_the_cases_cover_real_reduction_trees():
    """At least one case splits K over enough PEs that the tree has members and leaders."""
    depth = [max_grid(program_for(spec, fabric, options)) for spec, fabric, options in CASES]
    assert max(depth) >= 9
    plan = tree_plan(max(depth), max(depth) - 1)
    assert any(receiver != plan.root for receiver, _, _ in plan.steps)


@pytest.mark.parametrize("spec,fabric,options", [
    (LLAMA_MHA, "mesh16", dict(region=(8, 8))),
    (QWEN2_GQA, "mesh16", {}),
    (MISTRAL_SWA, "mesh32", dict(region=(16, 16))),
], ids=["llama", "qwen2", "mistral"])
@pytest.mark.slow
def test_greedy_tokens_match_the_reference_colocated_and_disaggregated(checkpoints, spec, fabric,
                                                                       options):
    model, weights = checkpoints[spec.name]
    reference = ReferenceModel(model, weights)
    logits = reference.prefill(PROMPT)[-1]
    want = [int(np.argmax(logits))]
    for _ in range(7):
        want.append(int(np.argmax(reference.decode(want[-1]))))
    results = {}
    for plan in ("colocated", "disaggregated"):
        program = program_for(model, fabric, options, plan)
        results[plan] = Generator(program, weights, "float32", prefill_tile=8).generate(PROMPT, 8)
        assert results[plan].generated_ids == want
    dis = results["disaggregated"]
    assert dis.disaggregated and not results["colocated"].disaggregated
    assert relative(dis.logits, results["colocated"].logits) < 1e-4


def test_a_corrupted_tile_on_one_pe_changes_the_logits(checkpoints):
    model, weights = checkpoints[LLAMA_MHA.name]
    program = program_for(model, "mesh64", dict(region=(64, 4)))
    region = FunctionalRegion(program, program.regions[0].name, weights, Numerics("float32"))
    reference = ReferenceModel(model, weights).prefill(PROMPT[:6])
    clean = region.forward(PROMPT[:6], all_logits=True)
    assert relative(clean, reference) < 1e-4
    stage = program.stages[program.regions[0].stage_ids[-1]]
    down = next(k for k in program.stage_kernels(stage) if k.name == "down_proj")
    assert down.grid[0] > 1, "the test wants a strip with several PEs along K"
    x, y = down.rect.x + down.rect.w - 1, down.rect.y  # a PE away from the strip's first line
    blocks = region.tile_at(down.rect.system, x, y)
    key = ("down_proj", stage.layers[1] - 1)
    assert key in blocks and blocks[key].size
    saved = blocks[key].copy()
    blocks[key][...] *= -1.0
    region.reset()
    broken = region.forward(PROMPT[:6], all_logits=True)
    assert relative(broken, reference) > 1e-3
    blocks[key][...] = saved
    region.reset()
    assert relative(region.forward(PROMPT[:6], all_logits=True), reference) < 1e-4


def test_float16_rounds_like_the_hardware_and_stays_close(checkpoints):
    model, weights = checkpoints[QWEN2_GQA.name]
    program = program_for(model, "mesh16", {})
    exact = Generator(program, weights, "float32").generate(PROMPT, 4)
    half = Generator(program, weights, "float16").generate(PROMPT, 4)
    difference = relative(half.logits[0], exact.logits[0])
    assert 1e-5 < difference < 3e-2  # rounded (not float32 in disguise), but close
    assert half.generated_ids[0] == exact.generated_ids[0]


def test_same_inputs_give_the_same_logits(checkpoints):
    model, weights = checkpoints[MISTRAL_SWA.name]
    program = program_for(model, "mesh16", dict(region=(16, 16)))
    first = Generator(program, weights, "float16").generate(PROMPT, 3)
    second = Generator(program, weights, "float16").generate(PROMPT, 3)
    assert np.array_equal(first.logits, second.logits)


def test_a_sequence_longer_than_the_kv_slots_is_refused_in_one_line(checkpoints):
    model, weights = checkpoints[LLAMA_MHA.name]
    program = program_for(model, "mesh16", dict(region=(8, 8)))
    region = FunctionalRegion(program, program.regions[0].name, weights, Numerics("float32"))
    with pytest.raises(UserError, match="caches") as excinfo:
        region.forward(np.zeros(region.capacity + 1, dtype=np.int64))
    assert "\n" not in str(excinfo.value)


def test_token_ids_outside_the_vocabulary_are_refused(checkpoints):
    model, weights = checkpoints[LLAMA_MHA.name]
    program = program_for(model, "mesh16", dict(region=(8, 8)))
    generator = Generator(program, weights)
    with pytest.raises(UserError, match="outside the vocabulary"):
        generator.generate([1, model.vocab_size], 2)


# --- rotary frequencies -------------------------------------------------------------------

@pytest.mark.parametrize("scaling", [None, "linear", "llama3"])
def test_rope_frequencies_agree_with_the_reference(scaling):
    spec = LLAMA_MHA.replaced(head_dim=128, rope_theta=500000.0,
                              rope_scaling=scaling, rope_scaling_factor=8.0,
                              rope_original_max_positions=8192)
    assert np.allclose(inverse_frequencies(spec), rope_frequencies(spec), rtol=1e-12)


def test_llama3_scaling_keeps_high_frequencies_and_divides_low_ones():
    spec = LLAMA_MHA.replaced(head_dim=128, rope_theta=500000.0,
                              rope_scaling_factor=8.0, rope_original_max_positions=8192)
    plain = inverse_frequencies(spec.replaced(rope_scaling=None))
    scaled = inverse_frequencies(spec)
    wavelength = 2 * np.pi / plain
    assert np.array_equal(scaled[wavelength < 8192 / 4], plain[wavelength < 8192 / 4])
    assert np.allclose(scaled[wavelength > 8192], plain[wavelength > 8192] / 8)
    between = (wavelength > 8192 / 4) & (wavelength < 8192)
    assert between.any()
    assert np.all((scaled[between] < plain[between]) & (scaled[between] > plain[between] / 8))


def test_an_unmodelled_rope_scaling_is_refused_in_one_line(checkpoints):
    model, weights = checkpoints[LLAMA_MHA.name]
    dynamic = model.replaced(rope_scaling="dynamic")
    program = program_for(dynamic, "mesh16", dict(region=(8, 8)))
    with pytest.raises(UserError, match="dynamic"):
        Generator(program, weights)


# --- the reduction trees ----------------------------------------------------------------------

@pytest.mark.parametrize("levels", [1, 2, 3, 4])
@pytest.mark.parametrize("length", [1, 2, 3, 5, 6, 10, 17, 40])
def test_tree_plan_sends_the_messages_the_timed_program_sends(length, levels):
    for root in {0, length // 2, length - 1}:
        g = GraphBuilder(length, 1)
        line = g.pe(np.arange(length), 0)[None, :]
        ready = g.tasks(line, 1, 0).reshape(1, length)
        line_reduce(g, line, np.array([root]), ready, np.array([1]), np.array([1]), 0,
                    levels=levels)
        sent = sorted((int(s), int(d)) for m in g._msgs for s, d in zip(m[1], m[2]))
        assert sent == sorted(tree_plan(length, root, levels).edges())
        # Every position but the root sends once; no receiver takes more than the branching
        # (twice it at the root, which has two sides).
        plan = tree_plan(length, root, levels)
        assert sorted(s for s, _ in plan.edges()) == [p for p in range(length) if p != root]
        g_ = branching(length, levels)
        assert all(len(senders) <= (2 * g_ if r == root else g_) for r, senders, _ in plan.steps)


@pytest.mark.parametrize("levels", [1, 2, 3])
@pytest.mark.parametrize("length,root", [(1, 0), (4, 3), (9, 0), (9, 4), (16, 15), (31, 7)])
def test_tree_reduce_adds_every_position_once(length, root, levels):
    values = 2.0 ** np.arange(length)  # each position a distinct bit: a lost or double shows
    assert tree_reduce(values, root, np.add, levels=levels) == values.sum()


def test_deeper_trees_pay_off_for_long_lines_and_big_messages():
    assert choose_levels(4, 100, 50, 1) <= 2
    assert choose_levels(700, 300, 100, 1) >= 3
    assert choose_levels(700, 300, 100, 1, most=2) == 2


def test_tree_reduce_rounds_what_travels():
    values = np.array([0.0, 1.0, 1e-3, 1e-3], np.float32)  # 1 + 1e-3 travels as float16
    rounded = tree_reduce(values, 0, np.add, lambda v: np.float32(np.float16(v)))
    assert abs(rounded - values.sum()) > 1e-5
    assert tree_reduce(values, 0, np.add) == pytest.approx(values.sum())


@pytest.mark.parametrize("tokens,tile", [(20, 8), (3, 64), (128, 64), (129, 64)])
def test_prompt_tiles_split_like_the_timed_prefill(tokens, tile):
    timed = MicroBatch("prefill", tokens=tokens, chunks=-(-tokens // tile)).tiles()
    assert prompt_tiles(tokens, tile) == [(t.prefix, t.prefix + t.tokens) for t in timed]
    assert all(b - a <= tile for a, b in prompt_tiles(tokens, tile))
