"""Experts computed through the tiles: each token's top-k experts multiply where their weights
live (the expert strips' PE blocks), the router's weights scale their activations and down's
reduction sums them; tiny Mixtral-, Qwen3-MoE- and gpt-oss-shaped checkpoints follow the
plain-numpy reference token for token, colocated and disaggregated."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import FAMILIES, PROMPT, follows_reference, routed_experts
from naive.reference_forward import ReferenceModel

from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.options import CompileOptions
from wse_emu.hardware.fabric import ClusterSpec, load_fabric
from wse_emu.models import layer as ly
from wse_emu.models.weights import expert_strips, load_checkpoint, random_weights, save_checkpoint
from wse_emu.sim.functional.generate import Generator


def compiled(spec, plan):
    return compile_model(spec, ClusterSpec(load_fabric("mesh16"), 1),
                         CompileOptions(plan=plan, region=(16, 16) if plan == "colocated"
                                        else None))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Each family's seeded weights, saved as a Hugging Face checkpoint and read back."""
    out = {}
    for family, spec in FAMILIES.items():
        directory = tmp_path_factory.mktemp(family)
        save_checkpoint(directory, spec.validate("test"), random_weights(spec, seed=7))
        out[family] = load_checkpoint(directory)
    return out


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("plan", ["colocated", "disaggregated"])
def test_experts_follow_the_reference_token_for_token(checkpoints, family, plan):
    spec, weights = checkpoints[family]
    program = compiled(spec, plan)
    follows_reference(Generator(program, weights, "float32", prefill_tile=8),
                      ReferenceModel(spec, weights), PROMPT, tile=8, steps=6)


def test_expert_strips_hold_each_expert_where_the_layout_puts_it(checkpoints):
    spec, weights = checkpoints["gpt_oss"]
    strips = expert_strips(spec, weights, 1)
    e, h, m = spec.experts.count, spec.hidden_size, spec.experts.intermediate_size
    # One after another along the inputs: gate and up (E x hidden, m), down (E x m, hidden).
    assert strips["experts_gate"].shape == (e * h, m) and strips["experts_down"].shape == (e * m,
                                                                                            h)
    gate_up = weights["model.layers.1.mlp.experts.gate_up_proj"]
    # Expert 3's gate is the even columns of its fused tensor, its up the odd ones.
    assert np.array_equal(strips["experts_gate"][3 * h:4 * h], gate_up[3][:, 0::2])
    assert np.array_equal(strips["experts_up"][3 * h:4 * h], gate_up[3][:, 1::2])


@pytest.mark.slow
def test_only_routed_experts_tiles_reach_the_logits(checkpoints):
    """Damage the first layer's blocks of one expert in its gate strip: the logits move if
    and only if a token of the prompt routed to that expert there."""
    spec, weights = checkpoints["mixtral"]
    prompt, h = PROMPT[:2], spec.hidden_size
    clean = Generator(compiled(spec, "colocated"), weights, "float32").run_prompt(prompt)[-1]
    changed = []
    for expert in range(spec.experts.count):
        generator = Generator(compiled(spec, "colocated"), weights, "float32")
        tiles = generator.prefill.stages[0].matrices["experts_gate"]  # holds layer 0
        bounds = np.concatenate([[0], np.cumsum(tiles.k_sizes)])
        for a in range(len(tiles.k_sizes)):
            lo, hi = max(bounds[a], expert * h), min(bounds[a + 1], (expert + 1) * h)
            if lo < hi:
                tiles.blocks[0, a, :, lo - bounds[a]:hi - bounds[a], :] = 100.0
        changed.append(not np.allclose(generator.run_prompt(prompt)[-1], clean))
    routed = routed_experts(ReferenceModel(spec, weights), 0, prompt)
    assert changed == [expert in routed for expert in range(spec.experts.count)]
    assert 0 < sum(changed) < spec.experts.count




@pytest.mark.slow
def test_experts_share_runs_where_their_outputs_split_unevenly(checkpoints):
    spec, _ = checkpoints["qwen3_moe_paired"]
    op = ly.ops_by_name(spec)["experts_up"]
    per_run = {}
    for plan in ("colocated", "disaggregated"):
        for up in (k for k in compiled(spec, plan).kernels if k.name == "experts_up"):
            per_run[up.grid[1]] = up.matrix[1] // 18
            assert up.matrix == [spec.experts.count // per_run[up.grid[1]] * 64,
                                 per_run[up.grid[1]] * 18]
            assert list(op.run_matrix(up.grid[1])) == up.matrix
    # 4 rows: 5 a row for one expert (11% waste), 9 for two; 7 rows: eight experts, 21 a row.
    assert per_run[4] == 2 and per_run[7] == 8 and per_run[2] == 1
