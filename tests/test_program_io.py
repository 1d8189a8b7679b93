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


def _edit_json(directory, change):
    data = json.loads((directory / "program.json").read_text())
    change(data)
    (directory / "program.json").write_text(json.dumps(data))


def _edit_array(directory):
    with np.load(directory / "program.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    name = next(k for k in arrays if k != "format_version" and arrays[k].size)
    arrays[name] = arrays[name].copy()
    arrays[name].flat[0] += 1
    np.savez_compressed(directory / "program.npz", **arrays)


def _truncate_npz(directory):
    data = (directory / "program.npz").read_bytes()
    (directory / "program.npz").write_bytes(data[:len(data) // 2])


@pytest.mark.parametrize("damage, needle", [
    (_truncate_npz, "program.npz is missing or unreadable; recompile"),
    (_edit_array, "changed since it was compiled"),
    (lambda d: _edit_json(d, lambda data: data["model"].update(hidden_size=96)),
     "changed since it was compiled"),
    (lambda d: _edit_json(d, lambda data: data["stages"][0].pop("rect")),
     "changed since it was compiled"),
    # Without its digest (as programs written before digests were kept), a broken structure
    # is still one line, never a traceback.
    (lambda d: _edit_json(d, lambda data: (data.pop("digest"), data["stages"][0].pop("rect"))),
     "damaged"),
    (lambda d: _edit_json(d, lambda data: (data.pop("digest"),
                                           data["regions"][0].update(parts=[[1, 2]]))),
     "damaged"),
])
def test_a_damaged_or_edited_run_directory_is_refused_in_one_line(tiny_8x8, tmp_path, damage,
                                                                  needle):
    tiny_8x8.save(tmp_path)
    damage(tmp_path)
    with pytest.raises(UserError, match=needle) as info:
        WaferProgram.load(tmp_path)
    assert "recompile" in str(info.value) and "\n" not in str(info.value)


def test_a_program_written_without_a_digest_still_loads(tiny_8x8, tmp_path):
    tiny_8x8.save(tmp_path)
    _edit_json(tmp_path, lambda data: data.pop("digest"))
    assert WaferProgram.load(tmp_path).model == tiny_8x8.model
