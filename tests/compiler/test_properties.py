"""Property tests of the mapping compiler on random small models, fabrics and options.

For any valid input, ``compile_model`` either returns a program that keeps the compiler's
guarantees (SRAM, weights, geometry, colors) or refuses with a one-line ``CompileError``; it is
deterministic, and a saved program loads back unchanged.
"""

from __future__ import annotations

import functools
import json
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from wse_emu.compiler.mapper import compile_model, verify
from wse_emu.compiler.options import CompileOptions
from wse_emu.compiler.partition import wafers_needed
from wse_emu.compiler.routing import popcount
from wse_emu.errors import CompileError, UserError
from wse_emu.hardware.fabric import ClusterSpec, FabricSpec, load_fabric, with_overrides
from wse_emu.models.spec import ModelSpec
from wse_emu.program.format import SRAM_CATEGORIES, WaferProgram

PROPERTY_SETTINGS = dict(deadline=None, derandomize=True,
                         suppress_health_check=[HealthCheck.too_slow])


# --- strategies -----------------------------------------------------------------------------

@st.composite
def models(draw, max_hidden: int = 512, max_intermediate: int = 1024, min_hidden: int = 8,
           min_intermediate: int = 8, min_layers: int = 1, max_layers: int = 4) -> ModelSpec:
    heads = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
    kv_heads = draw(st.sampled_from([d for d in range(1, heads + 1) if heads % d == 0]))
    return ModelSpec.from_fields(name="prop", family="llama",
                                 hidden_size=draw(st.integers(min_hidden, max_hidden)),
                                 intermediate_size=draw(st.integers(min_intermediate,
                                                                    max_intermediate)),
                                 num_layers=draw(st.integers(min_layers, max_layers)),
                                 num_heads=heads, num_kv_heads=kv_heads,
                                 head_dim=2 * draw(st.integers(4, 16)),
                                 vocab_size=draw(st.integers(16, 512)),
                                 tie_embeddings=draw(st.booleans()),
                                 attention_bias=draw(st.booleans()), ).validate("test")


@functools.lru_cache(maxsize=None)
def fabric(base: str, size: tuple[int, int] | None) -> FabricSpec:
    spec = load_fabric(base)
    if size is not None:
        spec = with_overrides(spec, width=size[0], height=size[1])
    return spec


fabrics = st.builds(
    fabric,
    st.sampled_from(["mesh8", "mesh16", "mesh32"]),
    st.one_of(st.none(), st.tuples(st.integers(4, 32), st.integers(4, 32))),
)


@st.composite
def compile_options(draw) -> CompileOptions:
    plan = draw(st.sampled_from(["colocated", "disaggregated"]))
    share = draw(st.sampled_from([None, 0.3, 0.5, 0.7])) if plan == "disaggregated" else None
    return CompileOptions(plan=plan, prefill_share=share,
                          layers_per_stage=draw(st.sampled_from([None, 1, 2])),
                          anneal_steps=50)


systems = st.integers(1, 3)


@st.composite
def multi_wafer_cases(draw):
    """Models too large for one small wafer, on clusters of about as many wafers as one
    replica needs (sometimes too few)."""
    model = draw(models(min_hidden=256, max_hidden=768, min_intermediate=512,
                        max_intermediate=2048, min_layers=4, max_layers=8))
    fab = fabric("mesh16", draw(st.one_of(st.none(), st.tuples(st.integers(12, 24),
                                                                 st.integers(12, 24)))))
    span = wafers_needed(model, fab)
    if draw(st.booleans()):
        plan, prefill_systems = "colocated", None
        n_systems = draw(st.sampled_from([span, span + 1, max(1, span - 1)]))
    else:
        plan = "disaggregated"
        n_systems = draw(st.sampled_from([2 * span, 2 * span + 1, max(2, 2 * span - 1)]))
        prefill_systems = draw(st.sampled_from([n_systems // 2, 1, n_systems]))
    options = CompileOptions(plan=plan, prefill_systems=prefill_systems,
                             layers_per_stage=draw(st.sampled_from([None, 1, 2])),
                             anneal_steps=50)
    return model, fab, n_systems, options


# --- the guarantees of a compiled program ---------------------------------------------------

def check_program(program: WaferProgram, model: ModelSpec, fab: FabricSpec, n_systems: int):
    verify(program)
    shape = (n_systems, fab.height, fab.width)
    for name, array in program.arrays.items():
        assert array.shape == shape, name

    # SRAM: no PE over its capacity; weights add up to one model per region.
    assert int(program.sram_total().max()) <= fab.sram_bytes_per_pe
    assert program.arrays["sram_weights"].astype(int).sum() == \
        model.weight_bytes() * len(program.regions)
    assert len(program.regions) >= 1
    for region in program.regions:
        assert region.kv_capacity_tokens >= 0
        assert region.weight_bytes == model.weight_bytes()

    # Regions do not share PEs.
    parts = [p for r in program.regions for p in r.parts]
    for i, a in enumerate(parts):
        assert 0 <= a.system < n_systems
        assert a.x >= 0 and a.y >= 0 and a.x1 <= fab.width and a.y1 <= fab.height
        for b in parts[i + 1:]:
            assert not a.overlaps(b), (a, b)

    # Kernels inside their stage; stages inside their region, disjoint, covering every layer.
    for kernel in program.kernels:
        assert program.stages[kernel.stage].rect.contains(kernel.rect), kernel.name
    for region in program.regions:
        stages = [program.stages[i] for i in region.stage_ids]
        assert stages, region.name
        for stage in stages:
            assert stage.region == region.name
            assert any(p.contains(stage.rect) for p in region.parts), (stage.rect, region.parts)
            assert (program.arrays["stage_id"][stage.rect.slices()] == stage.id).all()
        for i, a in enumerate(stages):
            for b in stages[i + 1:]:
                assert not a.rect.overlaps(b.rect), (a.rect, b.rect)
        layers = [layer for s in stages for layer in range(*s.layers)]
        assert layers == list(range(model.num_layers))
        assert sum(s.has_embedding for s in stages) == 1
        assert sum(s.has_head for s in stages) == 1

    # Colors: every route has one of the program's colors; routes that share a PE differ;
    # no PE's router holds more colors than the fabric leaves.
    for route in program.routes:
        assert route.color in range(fab.colors_available), (route.name, route.color)
    fp = np.array([r.footprint.to_list() for r in program.routes], dtype=np.int64)
    color = np.array([r.color for r in program.routes])
    s, x0, y0 = fp[:, 0], fp[:, 1], fp[:, 2]
    x1, y1 = x0 + fp[:, 3], y0 + fp[:, 4]
    share_pe = ((s[:, None] == s[None]) & (x0[:, None] < x1[None]) & (x0[None] < x1[:, None])
                & (y0[:, None] < y1[None]) & (y0[None] < y1[:, None]))
    np.fill_diagonal(share_pe, False)
    clash = share_pe & (color[:, None] == color[None])
    assert not clash.any(), [program.routes[i].name for i in np.argwhere(clash)[0]]
    per_pe = popcount(program.arrays["color_mask"])
    assert int(per_pe.max()) <= fab.colors_available
    assert program.summary["colors_max_per_pe"] == int(per_pe.max())


def check_refusal(exc: CompileError):
    message = str(exc)
    assert isinstance(exc, UserError)
    assert message.strip()
    assert "\n" not in message


# --- properties -----------------------------------------------------------------------------

@pytest.mark.slow
@settings(max_examples=300, **PROPERTY_SETTINGS)
@given(model=models(), fab=fabrics, n_systems=systems, options=compile_options())
def test_compile_returns_a_valid_program_or_refuses(model, fab, n_systems, options):
    try:
        program = compile_model(model, ClusterSpec(fab, n_systems), options)
    except CompileError as exc:
        event("refused")
        check_refusal(exc)
        return
    event(f"compiled: {len(program.regions)} region(s), "
          f"{'one wafer' if len(program.regions[0].parts) == 1 else 'spanning wafers'}")
    check_program(program, model, fab, n_systems)


@pytest.mark.slow
@settings(max_examples=80, **PROPERTY_SETTINGS)
@given(case=multi_wafer_cases())
def test_compile_across_wafers_returns_a_valid_program_or_refuses(case):
    model, fab, n_systems, options = case
    try:
        program = compile_model(model, ClusterSpec(fab, n_systems), options)
    except CompileError as exc:
        event("refused")
        check_refusal(exc)
        return
    span = len(program.regions[0].parts)
    event(f"compiled: {'one wafer' if span == 1 else 'spanning wafers'}")
    if span > 1:
        # A region of whole wafers, one per system, each system in one region only.
        systems_used = [p.system for r in program.regions for p in r.parts]
        assert len(systems_used) == len(set(systems_used))
        for region in program.regions:
            assert all((p.x, p.y, p.w, p.h) == (0, 0, fab.width, fab.height)
                       for p in region.parts)
    check_program(program, model, fab, n_systems)


@pytest.mark.slow
@settings(max_examples=10, **PROPERTY_SETTINGS)
@given(model=models(max_hidden=128, max_intermediate=256), fab=fabrics, n_systems=systems,
       options=compile_options())
def test_compile_is_deterministic(model, fab, n_systems, options):
    cluster = ClusterSpec(fab, n_systems)
    try:
        first = compile_model(model, cluster, options)
    except CompileError as exc:
        check_refusal(exc)
        # A refusal is deterministic too.
        with pytest.raises(CompileError) as again:
            compile_model(model, cluster, options)
        assert str(again.value) == str(exc)
        return
    second = compile_model(model, cluster, options)
    assert first.summary == second.summary
    assert [r.color for r in first.routes] == [r.color for r in second.routes]
    assert [k.rect for k in first.kernels] == [k.rect for k in second.kernels]
    for key in first.arrays:
        assert np.array_equal(first.arrays[key], second.arrays[key]), key


@pytest.mark.slow
@settings(max_examples=40, **PROPERTY_SETTINGS)
@given(model=models(max_hidden=128, max_intermediate=256), fab=fabrics, n_systems=systems,
       options=compile_options())
def test_save_and_load_round_trip(model, fab, n_systems, options):
    try:
        program = compile_model(model, ClusterSpec(fab, n_systems), options)
    except CompileError:
        assume(False)
    with tempfile.TemporaryDirectory() as tmp:
        program.save(tmp)
        loaded = WaferProgram.load(tmp)
    assert loaded.summary == json.loads(json.dumps(program.summary))
    assert loaded.summary == program.summary
    assert len(loaded.kernels) == len(program.kernels)
    assert len(loaded.routes) == len(program.routes)
    assert len(loaded.stages) == len(program.stages)
    assert len(loaded.regions) == len(program.regions)
    assert loaded.fabric == program.fabric
    assert loaded.model == program.model
    assert loaded.systems == program.systems
    assert loaded.options == program.options
    assert set(loaded.arrays) == set(program.arrays)
    for key, array in program.arrays.items():
        assert loaded.arrays[key].dtype == array.dtype, key
        assert np.array_equal(loaded.arrays[key], array), key
    assert [k.rect for k in loaded.kernels] == [k.rect for k in program.kernels]
    assert [s.rect for s in loaded.stages] == [s.rect for s in program.stages]
    assert [(r.footprint, r.color) for r in loaded.routes] == \
        [(r.footprint, r.color) for r in program.routes]
    assert [r.parts for r in loaded.regions] == [r.parts for r in program.regions]
    for category in SRAM_CATEGORIES:
        assert f"sram_{category}" in loaded.arrays
    # The loaded program still keeps every guarantee.
    check_program(loaded, model, fab, n_systems)


# --- regressions found by the properties above ------------------------------------------

def test_split_layers_gives_every_wafer_a_layer():
    from wse_emu.compiler.stages import split_layers

    # One byte per layer, three wafers of one byte, a one-byte head on the last wafer:
    # (0, 2), (2, 3), (3, 4) fills the fullest wafer to 2, as does the answer with an empty
    # last wafer.
    ranges = split_layers(1, 4, [1.0, 1.0, 1.0], 0.0, 1.0)
    assert all(l1 > l0 for l0, l1 in ranges), ranges


def test_automatic_replicas_fall_back_to_fewer_replicas():
    model = ModelSpec.from_fields(name="m", family="llama", hidden_size=148, intermediate_size=122,
                                  num_layers=2, num_heads=1, num_kv_heads=1, head_dim=14,
                                  vocab_size=328).validate("test")
    fab = fabric("mesh32", None)
    cluster = ClusterSpec(fab, 1)
    # With at most 32 replicas it maps (16 regions after halving) ...
    capped = compile_model(model, cluster, CompileOptions(max_replicas_per_part=32,
                                                          anneal_steps=50))
    assert len(capped.regions) >= 1
    # ... so the default (at most 64, first try 51) should fall back to fewer, not refuse.
    program = compile_model(model, cluster, CompileOptions(anneal_steps=50))
    check_program(program, model, fab, 1)


def test_role_too_small_advice_names_the_role_option():
    model = ModelSpec.from_fields(name="m", family="llama", hidden_size=512, intermediate_size=1024,
                                  num_layers=8, num_heads=8, num_kv_heads=2, head_dim=64,
                                  vocab_size=512).validate("test")
    fab = fabric("mesh16", None)
    span = wafers_needed(model, fab)
    assert span >= 2
    n_systems = 2 * span + 2
    with pytest.raises(CompileError) as info:
        compile_model(model, ClusterSpec(fab, n_systems),
                      CompileOptions(plan="disaggregated", prefill_systems=1))
    message = str(info.value)
    assert "prefill" in message
    assert f"`systems={span}` or more" not in message, message
