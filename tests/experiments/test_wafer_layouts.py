"""An experiment's wafer layouts compiled through the program cache kept beside its stage
tables (``wafer_layouts.compile_or_why``): a second experiment reads them back, a cache given
by hand holds them, and a layout that does not compile says why and keeps nothing."""

from wse_emu.compiler import cache
from wse_emu.experiments import wafer_layouts
from wse_emu.hardware.fabric import ClusterSpec, load_fabric
from wse_emu.models.load import load_model
from wse_emu.program.options import CompileOptions


def _inputs():
    return load_model("tiny"), ClusterSpec(load_fabric("mesh16"), 1)


def test_programs_are_kept_under_the_cache_folder_given(tmp_path):
    assert cache.programs_in(tmp_path) == tmp_path / cache.PROGRAMS
    assert cache.programs_in(None).name == cache.PROGRAMS


def test_a_layout_compiled_once_is_read_back(tmp_path, monkeypatch):
    model, cluster = _inputs()
    folder = cache.programs_in(tmp_path)
    first, why = wafer_layouts.compile_or_why(model, cluster, tmp_path, CompileOptions())
    assert why is None and len(list(folder.iterdir())) == 1

    def refuse(*args):
        raise AssertionError("compiled again, where the cache holds the program")
    monkeypatch.setattr(wafer_layouts, "compile_model", refuse)
    second, why = wafer_layouts.compile_or_why(model, cluster, tmp_path, CompileOptions())
    assert why is None
    assert second.to_json() == first.to_json()


def test_without_a_folder_nothing_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model, cluster = _inputs()
    program, why = wafer_layouts.compile_or_why(model, cluster, None, CompileOptions())
    assert program is not None and why is None
    assert not any(tmp_path.iterdir())


def test_a_layout_that_does_not_compile_says_why_and_keeps_nothing(tmp_path):
    model, cluster = _inputs()
    folder = cache.programs_in(tmp_path)
    # A region too small for the weights.
    program, why = wafer_layouts.compile_or_why(model, cluster, tmp_path,
                                                CompileOptions(region=(2, 2)))
    assert program is None and "do not fit" in why
    assert not folder.exists() or not any(p for p in folder.iterdir()
                                          if not p.name.startswith("."))
