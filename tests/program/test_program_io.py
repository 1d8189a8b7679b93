"""WaferProgram files: versioned, reloadable without recompiling, never half-written."""

import json

import numpy as np
import pytest

from wse_emu.errors import UserError
from wse_emu.program.format import WaferProgram
from wse_emu.program.options import CompileOptions
from wse_emu.rundir.directory import write_run_dir


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


def test_options_are_reloaded_as_the_dataclass_in_the_same_json(tiny_8x8, tmp_path):
    """A program keeps its CompileOptions, writes them as their ``to_dict`` form (which its
    digest and the stage tables' keys are taken over) and reads them back as CompileOptions."""
    assert isinstance(tiny_8x8.options, CompileOptions)
    tiny_8x8.save(tmp_path)
    written = json.loads((tmp_path / "program.json").read_text())["options"]
    assert written == tiny_8x8.options.to_dict() == json.loads(json.dumps(written))
    loaded = WaferProgram.load(tmp_path)
    assert isinstance(loaded.options, CompileOptions) and loaded.options == tiny_8x8.options
    assert CompileOptions.from_json(written) == tiny_8x8.options


def test_options_a_program_was_written_without_take_their_defaults(tiny_8x8, tmp_path):
    tiny_8x8.save(tmp_path)
    _edit_json(tmp_path, lambda data: (data.pop("digest"), data["options"].pop("attention_tile"),
                                       data["options"].pop("patterns")))
    options = WaferProgram.load(tmp_path).options
    assert options.attention_tile == 0 and options.patterns == ()
    assert options.region == tiny_8x8.options.region


def test_a_program_from_before_any_pattern_could_be_chosen_keeps_its_dense_strips(tiny_8x8,
                                                                                 tmp_path):
    """Programs once kept their dense strips' pair of patterns as ``matrix_patterns``."""
    tiny_8x8.save(tmp_path)

    def older(data):
        data.pop("digest")
        data["options"].pop("patterns")
        data["options"]["matrix_patterns"] = ["gemv_tree", "gemm_stream"]
    _edit_json(tmp_path, older)
    assert WaferProgram.load(tmp_path).options == tiny_8x8.options
    options = tiny_8x8.options.to_dict()
    options.pop("patterns")
    chosen = CompileOptions.from_json({**options, "matrix_patterns": ["gemv_tree", "gemv_tree"]})
    assert chosen.patterns == ("matrix=gemv_tree",)
    assert chosen.pattern_names()["matrix"] == {"decode": "gemv_tree", "prefill": "gemv_tree"}


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


def _undigested(change):
    """An edit to a program written without a digest: the schema alone must catch it."""
    def damage(directory):
        _edit_json(directory, lambda data: (data.pop("digest"), change(data)))
    return damage


def _reshaped_array(directory):
    _edit_json(directory, lambda data: data.pop("digest"))
    with np.load(directory / "program.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["stage_id"] = arrays["stage_id"][:, :-1]
    np.savez_compressed(directory / "program.npz", **arrays)


def _set(path, value):
    """A change setting ``data[path...] = value``."""
    def change(data):
        *head, last = path
        for key in head:
            data = data[key]
        data[last] = value
    return change


@pytest.mark.parametrize("damage, needle", [
    (_undigested(_set(["systems"], "1")), "systems must be a whole number"),
    (_undigested(_set(["stages"], {})), "stages must be a list"),
    (_undigested(_set(["stages", 0, "rect"], [0, 0, 0, 4])),
     "stages[0].rect must be a rectangle [system, x, y, w, h]"),
    (_undigested(_set(["stages", 0, "rect"], [0, 6, 0, 4, 8])),
     "stages[0].rect 4x8 at (6,0) is off the 8 x 8 wafer"),
    (_undigested(_set(["stages", 0, "rect"], [3, 0, 0, 4, 8])),
     "stages[0].rect system 3 is not one of the program's 1"),
    (_undigested(_set(["stages", 0, "layers"], [0, 9])),
     "stages[0].layers [0, 9] is not a range of tiny's 2 layers"),
    (_undigested(_set(["stages", 0, "strip_axis"], "z")), "stages[0].strip_axis 'z' is not"),
    (_undigested(_set(["stages", 0, "id"], 5)), "stages[0].id is 5"),
    (_undigested(_set(["stages", 0, "kernel_ids"], [0, 10_000])),
     "stages[0].kernel_ids 10000 points past"),
    (_undigested(_set(["stages", 0, "kv_slots"], True)), "stages[0].kv_slots must be a whole"),
    (_undigested(_set(["stages", 0, "colour"], 1)), "stages[0] has unknown field(s) 'colour'"),
    (_undigested(lambda data: data["stages"][0].pop("layers")), "stages[0] has no 'layers'"),
    (_undigested(_set(["regions", 0, "role"], "train")), "regions[0].role 'train' is not"),
    (_undigested(_set(["regions", 0, "stage_ids"], [0, 0])), "stage 0 is also in"),
    (_undigested(_set(["regions", 0, "stage_ids"], [])), "belongs to no region"),
    (_undigested(_set(["kernels", 0, "kind"], "fft")), "kernels[0].kind 'fft' is not one of"),
    (_undigested(_set(["kernels", 0, "stage"], -1)), "kernels[0].stage -1 points past"),
    (_undigested(_set(["kernels", 0, "matrix"], [64, 0])),
     "kernels[0].matrix must be two counts of at least 1"),
    (_undigested(_set(["kernels", 0, "weight_ref"], 99_999)), "kernels[0].weight_ref 99999"),
    (_undigested(_set(["kernels", 0, "pattern"], {"decode": 3})),
     "kernels[0].pattern must be dict[str, str]"),
    (_undigested(_set(["routes", 0, "color"], 99)), "routes[0].color 99 is not one of"),
    (_undigested(_set(["options", "colour"], 1)), "options has unknown field(s) 'colour'"),
    (_undigested(_set(["options", "seed"], "0")), "options.seed must be a whole number"),
    (_undigested(_set(["options", "region"], [8])),
     "options.region must be two whole numbers or null"),
    (_undigested(_set(["options", "plan"], "both")), "options: `plan` must be one of"),
    (_undigested(_set(["options"], [])), "options must be a mapping"),
    (_undigested(_set(["routes", 0, "dst"], [-2])), "routes[0].dst -2 points past"),
    (_reshaped_array, "program.npz: stage_id is int32 (1, 7, 8); the program's wafers need "
                      "integers (1, 8, 8)"),
])
def test_a_program_breaking_its_schema_is_refused_by_name(tiny_8x8, tmp_path, damage, needle):
    """A program.json the engines could not take (a field missing or mistyped, a rectangle
    off the wafer, an id pointing nowhere, an array of the wrong shape) names the item and
    what is wrong, in one line, even when no digest was written to catch the edit."""
    tiny_8x8.save(tmp_path)
    damage(tmp_path)
    with pytest.raises(UserError) as info:
        WaferProgram.load(tmp_path)
    message = str(info.value)
    assert needle in message and "damaged" in message and message.endswith("recompile")
    assert "\n" not in message


@pytest.mark.slow
def test_every_compiled_layout_passes_the_schema(tmp_path):
    """The checks hold for what the compiler writes: colocated, disaggregated within a wafer
    and across two, and a mixture of experts with its tied head."""
    from wse_emu import api

    for i, (model, fabric, systems, options) in enumerate([
            ("tiny", "mesh16", 1, {}), ("tiny", "mesh16", 1, {"plan": "disaggregated"}),
            ("tiny", "mesh8", 2, {"plan": "disaggregated", "prefill_systems": 1}),
            ("gpt-oss-20b", "wse3", 1, {})]):
        program = api.compile(model, fabric, systems, **options)
        program.save(tmp_path / str(i))
        assert WaferProgram.load(tmp_path / str(i)).summary == json.loads(
            json.dumps(program.summary))


@pytest.mark.parametrize("damage", [
    _truncate_npz, _edit_array,
    _undigested(_set(["stages", 0, "rect"], [0, 6, 0, 4, 8])),
    _undigested(lambda data: data["kernels"][0].pop("rect")),
])
@pytest.mark.slow
@pytest.mark.parametrize("command", [["run", "RUN"], ["run", "RUN", "--phase", "prefill"],
                                     ["viz", "RUN"]])
def test_a_command_given_a_damaged_run_directory_says_so_in_one_line(tiny_8x8, tmp_path,
                                                                     damage, command):
    import subprocess
    import sys
    import time

    run_dir = tmp_path / "run"
    tiny_8x8.save(run_dir)
    damage(run_dir)
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "wse_emu.cli.main",
                           *[str(run_dir) if a == "RUN" else a for a in command]],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("wse-emu: error:") and "recompile" in proc.stderr
    assert time.perf_counter() - began < 30  # refused on reading, before any work
