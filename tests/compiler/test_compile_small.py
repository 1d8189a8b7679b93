"""A two-layer model on an 8x8 mesh, pinned exactly and checked by hand."""

import numpy as np

from wse_emu.compiler.geometry import even_split
from wse_emu.compiler.routing import popcount
from wse_emu.program import kvlayout


def kernels_by_name(program, stage):
    return {k.name: k for k in program.stage_kernels(stage)}


def test_stages_tile_the_mesh_in_two_pipelined_rectangles(tiny_8x8):
    p = tiny_8x8
    assert len(p.regions) == 1 and p.regions[0].parts[0].area == 64
    rects = [(s.rect.x, s.rect.y, s.rect.w, s.rect.h) for s in p.stages]
    assert rects == [(0, 0, 3, 8), (3, 0, 5, 8)]
    assert [s.layers for s in p.stages] == [[0, 1], [1, 2]]
    assert [s.has_embedding for s in p.stages] == [True, False]
    assert [s.has_head for s in p.stages] == [False, True]
    # Every PE belongs to exactly one stage.
    assert (p.arrays["stage_id"][0] >= 0).all()
    assert np.array_equal(np.unique(p.arrays["stage_id"]), [0, 1])


def test_matrix_strips_are_rows_of_their_stage(tiny_8x8):
    p = tiny_8x8
    for stage in p.stages:
        ks = kernels_by_name(p, stage)
        strips = [k for k in ks.values() if k.kind in ("matrix", "gather")]
        assert len(strips) == 8
        # Tall stages lay strips along y: each is one full-width row here.
        assert sorted(k.rect.y for k in strips) == list(range(8))
        assert all(k.rect.w == stage.rect.w and k.rect.h == 1 for k in strips)
        assert all(k.grid == [1, stage.rect.w] for k in strips)


def test_weight_bytes_per_pe_by_hand(tiny_8x8):
    p = tiny_8x8
    w = p.arrays["sram_weights"][0]
    s0, s1 = p.stages
    emb = kernels_by_name(p, s0)["embedding"]
    # The 256 x 64 embedding table: all 256 rows on the one column part, 64 outputs split 21/21/22.
    assert list(w[emb.rect.y, 0:3]) == [256 * 21 * 2, 256 * 21 * 2, 256 * 22 * 2]
    head = kernels_by_name(p, s1)["lm_head"]
    # The 64 x 256 LM head over 5 PEs: 256 outputs split 51/51/51/51/52.
    assert list(w[head.rect.y, 3:8]) == [64 * n * 2 for n in (51, 51, 51, 51, 52)]
    # The home row of stage 1 holds down_proj (128 x 64), the input norm and the final norm.
    down = kernels_by_name(p, s1)["down_proj"]
    expect = np.array([128 * n * 2 for n in even_split(64, 5)]) + 2 * even_split(64, 5) * 2
    assert list(w[down.rect.y, 3:8]) == list(expect)
    assert int(w.astype(np.int64).sum()) == p.model.weight_bytes()


def stage_grid(p, stage, name):
    """A per-PE array of one stage as (long side, rows across)."""
    r = stage.rect
    grid = p.arrays[name][r.system, r.y:r.y1, r.x:r.x1].astype(np.int64)
    return grid.T if stage.strip_axis == "x" else grid


def test_sram_plan_fills_each_column_to_its_tightest_pe(tiny_8x8):
    """Each row holds a slice of the K and V features, each column the same tokens on all
    its rows: a PE's KV bytes are whole tokens of its row's slice, and in every column some PE
    is full to within one token."""
    p = tiny_8x8
    total = p.sram_total()[0]
    assert total.max() <= 49152
    assert (p.arrays["sram_reserved"][0] == 4096).all()
    for stage in p.stages:
        kv = stage_grid(p, stage, "sram_kv_cache")
        per_token = kvlayout.token_bytes(p.model.attention.kv_size, kv.shape[1], stage.num_layers,
                                         2)
        tokens = kv // per_token[None, :]
        assert (kv == tokens * per_token[None, :]).all()
        assert (tokens == tokens[:, :1]).all()  # one share of tokens per column
        r = stage.rect
        left = 49152 - total[r.y:r.y1, r.x:r.x1].astype(np.int64)
        left = left.T if stage.strip_axis == "x" else left
        assert ((left < per_token[None, :]).any(axis=1)).all()


def test_kv_capacity_is_the_tightest_stage(tiny_8x8):
    p = tiny_8x8
    per_stage = []
    for s in p.stages:
        kv = stage_grid(p, s, "sram_kv_cache")
        per_token = kvlayout.token_bytes(p.model.attention.kv_size, kv.shape[1], s.num_layers, 2)
        tokens = int((kv[:, 0] // per_token[0]).sum())
        assert tokens == s.kv_capacity_tokens
        per_stage.append(tokens)
    assert p.regions[0].kv_capacity_tokens == min(per_stage)
    assert min(per_stage) > 6000  # most of what weights leave on an 8x8 tiny model


def test_colors(tiny_8x8):
    p = tiny_8x8
    counts = popcount(p.arrays["color_mask"])[0]
    assert counts.max() == p.summary["colors_max_per_pe"] == 12
    assert counts.min() >= 1
    assert all(0 <= r.color < 18 for r in p.routes)
    # Routes sharing a PE never share a color.
    for i, a in enumerate(p.routes):
        for b in p.routes[i + 1:]:
            if a.footprint.overlaps(b.footprint):
                assert a.color != b.color, (a.name, b.name)


def test_popcount_counts_every_bit():
    """Each mask's set bits, bit by bit, whatever its bytes hold (every one of 32 bits, on
    masks of any shape)."""
    rng = np.random.default_rng(5)
    masks = rng.integers(0, 2 ** 32, size=(2, 9, 13), dtype=np.uint64).astype(np.uint32)
    masks[0, 0, :3] = [0, 2 ** 32 - 1, 2 ** 31]
    by_bit = sum(((masks >> np.uint32(b)) & np.uint32(1)).astype(np.int32) for b in range(32))
    counts = popcount(masks)
    assert counts.dtype == np.int32 and np.array_equal(counts, by_bit)
    assert list(counts[0, 0, :3]) == [0, 32, 1]


def test_bounds_are_positive_and_consistent(tiny_8x8):
    for s in tiny_8x8.stages:
        for phase in ("prefill", "decode"):
            b = s.bounds[phase]
            assert b["cycles"] == max(b["resource_cycles"], b["latency_cycles"]) > 0
            assert b["serial_cycles"] >= b["latency_cycles"]
    for k in tiny_8x8.kernels:
        for phase in ("prefill", "decode"):
            kb = k.bounds[phase]
            assert kb["cycles"] == max(kb[r] for r in ("compute", "sram", "link", "path"))


def test_verify_catches_a_broken_program(tiny_8x8):
    import copy

    import pytest

    from wse_emu.compiler.mapper import verify

    verify(tiny_8x8)
    broken = copy.deepcopy(tiny_8x8)
    broken.arrays["sram_weights"][0, 7, 7] += 2
    with pytest.raises(AssertionError, match="weights sum"):
        verify(broken)
    broken = copy.deepcopy(tiny_8x8)
    q = next(k for k in broken.kernels if k.name == "q_proj")
    q.name = "k_proj"  # two owners of k_proj in one layer, none of q_proj
    with pytest.raises(AssertionError, match="exactly once"):
        verify(broken)


def test_color_check_catches_a_clash(tiny_8x8):
    import copy

    import pytest

    from wse_emu.compiler.routing import check_colors

    routes = copy.deepcopy(tiny_8x8.routes)
    check_colors(routes)
    a = routes[0]
    b = next(r for r in routes[1:] if r.footprint.overlaps(a.footprint))
    b.color = a.color
    with pytest.raises(AssertionError, match="share color"):
        check_colors(routes)
