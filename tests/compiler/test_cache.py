"""Compiled programs kept between processes (``compiler.cache``): read back the same, keyed on
everything a program is made from, and never trusted over compiling."""

import json

import numpy as np
import pytest

from wse_emu.compiler import cache
from wse_emu.compiler.mapper import compile_model
from wse_emu.hardware.fabric import ClusterSpec, load_fabric
from wse_emu.kernels.patterns import PATTERNS
from wse_emu.kernels.patterns.vector import Elementwise
from wse_emu.models.load import load_model
from wse_emu.program.options import CompileOptions


@pytest.fixture
def inputs():
    return load_model("tiny"), ClusterSpec(load_fabric("mesh16"), 1), CompileOptions()


class Counted:
    """compile_model, counting its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        return compile_model(*args)


def same(a, b) -> bool:
    return a.to_json() == b.to_json() and a.arrays.keys() == b.arrays.keys() and all(
        np.array_equal(a.arrays[k], b.arrays[k]) for k in a.arrays)


def test_second_compile_reads_the_same_program_back(tmp_path, inputs):
    compile_fn = Counted()
    first = cache.compile_cached(*inputs, compile_fn, tmp_path)
    second = cache.compile_cached(*inputs, compile_fn, tmp_path)
    assert compile_fn.calls == 1
    assert same(first, second)
    assert same(first, compile_model(*inputs))


def test_other_options_are_another_entry(tmp_path, inputs):
    model, cluster, _ = inputs
    compile_fn = Counted()
    cache.compile_cached(model, cluster, CompileOptions(), compile_fn, tmp_path)
    other = cache.compile_cached(model, cluster, CompileOptions(plan="disaggregated"),
                                 compile_fn, tmp_path)
    assert compile_fn.calls == 2
    assert other.options.plan == "disaggregated"
    assert len([p for p in tmp_path.iterdir() if not p.name.startswith(".")]) == 2


def test_damaged_entry_is_compiled_again_and_replaced(tmp_path, inputs):
    compile_fn = Counted()
    first = cache.compile_cached(*inputs, compile_fn, tmp_path)
    entry = tmp_path / cache.program_key(*inputs)
    (entry / "program.npz").write_bytes(b"not a zip")
    again = cache.compile_cached(*inputs, compile_fn, tmp_path)
    assert compile_fn.calls == 2 and same(first, again)
    cache.compile_cached(*inputs, compile_fn, tmp_path)
    assert compile_fn.calls == 2  # the entry written over is whole again


def test_a_folder_that_cannot_be_written_still_compiles(tmp_path, inputs):
    blocked = tmp_path / "file"
    blocked.write_text("x")
    program = cache.compile_cached(*inputs, compile_model, blocked / "programs")
    assert program.model.name == "tiny"
    assert blocked.read_text() == "x"


def test_a_pattern_from_outside_the_package_turns_the_cache_off(tmp_path, inputs,
                                                                  monkeypatch):
    class Outside(Elementwise):
        name = "outside"

    monkeypatch.setitem(PATTERNS, ("elementwise", "outside"), Outside())
    assert cache.program_key(*inputs) is None
    compile_fn = Counted()
    cache.compile_cached(*inputs, compile_fn, tmp_path)
    cache.compile_cached(*inputs, compile_fn, tmp_path)
    assert compile_fn.calls == 2 and not list(tmp_path.iterdir())


def test_least_recently_used_programs_go_first(tmp_path, inputs, monkeypatch):
    model, cluster, _ = inputs
    monkeypatch.setattr(cache, "MAX_PROGRAMS", 1)
    cache.compile_cached(model, cluster, CompileOptions(), compile_model, tmp_path)
    cache.compile_cached(model, cluster, CompileOptions(plan="disaggregated"), compile_model,
                         tmp_path)
    kept = [p.name for p in tmp_path.iterdir()]
    assert kept == [cache.program_key(model, cluster, CompileOptions(plan="disaggregated"))]


def test_an_entry_its_digest_proves_unchanged_is_not_schema_checked_again(tmp_path, inputs,
                                                                        monkeypatch):
    """Read back from the cache, a program whose digest matches is the one this code wrote
    and checked; loaded from any other folder, or without its digest, it is checked."""
    from wse_emu.program import format as program_format
    from wse_emu.program.format import WaferProgram

    compile_fn = Counted()
    first = cache.compile_cached(*inputs, compile_fn, tmp_path)
    checked = []
    monkeypatch.setattr(program_format, "check_program", lambda *a: checked.append(a))
    again = cache.compile_cached(*inputs, compile_fn, tmp_path)
    assert compile_fn.calls == 1 and same(first, again) and checked == []
    entry = tmp_path / cache.program_key(*inputs)
    WaferProgram.load(entry)  # a program named on the command line: checked
    assert len(checked) == 1
    data = json.loads((entry / "program.json").read_text())
    del data["digest"]
    (entry / "program.json").write_text(json.dumps(data))
    cache.compile_cached(*inputs, compile_fn, tmp_path)
    assert compile_fn.calls == 2  # not proven unchanged: compiled again, and written over
