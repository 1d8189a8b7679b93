"""Giving up on a tree depth at the first stage whose routes crowd one PE past the fabric's
colors: the bound is the routes' true crowding, no coloring beats it, and a compile that gives
up early makes the same program as one that colors every depth it tries."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wse_emu.compiler.template as template
from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.options import compile_options
from wse_emu.compiler.routing import ColorsExhausted, _greedy, _neighbours, crowding
from wse_emu.hardware.fabric import ClusterSpec, load_fabric
from wse_emu.models.load import load_model
from wse_emu.program.format import Rect, Route
from wse_emu.serving.tables import program_text

rects = st.tuples(st.integers(0, 1), st.integers(0, 11), st.integers(0, 9), st.integers(1, 8),
                  st.integers(1, 6))


def routes_of(footprints) -> list[Route]:
    return [Route(id=i, kind="transfer", name=f"r{i}", footprint=Rect(*f))
            for i, f in enumerate(footprints)]


def most_at_one_pe(footprints, area: Rect) -> int:
    """Counted PE by PE."""
    held = np.zeros((area.h, area.w), dtype=np.int64)
    for s, x, y, w, h in footprints:
        if s != area.system:
            continue
        for yy in range(max(y, area.y), min(y + h, area.y1)):
            for xx in range(max(x, area.x), min(x + w, area.x1)):
                held[yy - area.y, xx - area.x] += 1
    return int(held.max(initial=0))


@settings(max_examples=200, deadline=None)
@given(st.lists(rects, max_size=25), rects)
def test_crowding_counts_the_routes_over_the_most_crowded_pe(footprints, area):
    area = Rect(*area)
    count, x, y = crowding(routes_of(footprints), area)
    assert count == most_at_one_pe(footprints, area)
    if count:
        assert area.contains(Rect(area.system, x, y, 1, 1))
        assert sum(Rect(*f).contains(Rect(area.system, x, y, 1, 1)) for f in footprints) == count
    # No coloring of the routes does with fewer colors (the greedy one included).
    if footprints:
        fp = np.array(footprints, dtype=np.int64)
        colors = _greedy(_neighbours(fp), np.arange(len(fp)))
        assert colors.max() + 1 >= count


@pytest.mark.parametrize("plan", ["colocated", "disaggregated"])
def test_giving_up_early_makes_the_same_program(monkeypatch, plan):
    # Llama-3.1-8B on one WSE-3 runs out of colors at trees of four levels, which the early
    # bound proves at its second stage, and fits at two.
    model, cluster = load_model("llama-3.1-8b"), ClusterSpec(load_fabric("wse3"), 1)
    gave_up = []
    assemble = template.assemble

    def watched(*args, give_up_early=False):
        try:
            return assemble(*args, give_up_early=give_up_early)
        except ColorsExhausted as exc:
            gave_up.append(give_up_early and "routes cross PE" in str(exc))
            raise

    monkeypatch.setattr(template, "assemble", watched)
    early = program_text(compile_model(model, cluster, compile_options(plan=plan)))
    assert any(gave_up)
    monkeypatch.setattr(template, "assemble", lambda *args, give_up_early=False:
                        assemble(*args, give_up_early=False))
    assert program_text(compile_model(model, cluster, compile_options(plan=plan))) == early
