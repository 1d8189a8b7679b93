"""WaferProgram files: versioned, reloadable without recompiling, never half-written."""

import json

import numpy as np
import pytest

from wse_emu.errors import UserError
from wse_emu.program import WaferProgram, write_run_dir


def test_round_trip(tiny_8x8, tmp_path):
    tiny_8x8.save(tmp_path)
    loaded = WaferProgram.load(tmp_path)
    assert loaded.summary == json.loads(json.dumps(tiny_8x8.summary))
    assert loaded.model == tiny_8x8.model and loaded.fabric == tiny_8x8.fabric
    assert [k.rect for k in loaded.kernels] == [k.rect for k in tiny_8x8.kernels]
    assert [r.color for r in loaded.routes] == [r.color for r in tiny_8x8.routes]
    assert [s.rect for s in loaded.stages] == [s.rect for s in tiny_8x8.stages]
    for key, value in tiny_8x8.arrays.items():
        assert np.array_equal(loaded.arrays[key], value)


def test_version_mismatch_is_refused(tiny_8x8, tmp_path):
    tiny_8x8.save(tmp_path)
    data = json.loads((tmp_path / "program.json").read_text())
    data["version"] = 99
    (tmp_path / "program.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match="recompile"):
        WaferProgram.load(tmp_path)


def test_missing_program(tmp_path):
    with pytest.raises(UserError, match="no program.json"):
        WaferProgram.load(tmp_path)


def test_run_dir_is_atomic(tmp_path):
    target = tmp_path / "run"

    def failing(tmp):
        (tmp / "partial.json").write_text("{}")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_run_dir(target, failing)
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []
    write_run_dir(target, lambda tmp: (tmp / "ok.txt").write_text("ok"))
    assert (target / "ok.txt").read_text() == "ok"
    with pytest.raises(UserError, match="exists and is not empty"):
        write_run_dir(target, lambda tmp: None)
    assert (target / "ok.txt").exists()
