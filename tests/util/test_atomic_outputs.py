"""Outputs written whole or not at all: a file (run directory, figure, report, program, sweep
row) is under its name complete or not there; a disk that fills, a folder that cannot be
written or an -o under a file is one line and exit code 2, before any work where it can be
known then; and a following ``viz`` never trusts what a failed write left."""

import ast
import errno
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import SMALL_CHAT, ImageSources

from wse_emu.cli.main import main
from wse_emu.errors import UserError
from wse_emu.program.format import WaferProgram
from wse_emu.sweeps.sweep import RESULTS, read_rows
from wse_emu.util import atomic

ROOT = Path(__file__).resolve().parents[2]


class Disk:
    """Stands in for ``atomic._write``: takes ``room`` more bytes, then fails as a full disk
    (or with ``code``), partway through a write if it falls there."""

    def __init__(self, room: int, code: int = errno.ENOSPC):
        self.room, self.code, self.real = room, code, atomic._write

    def __call__(self, fd, data):
        if self.room <= 0:
            raise OSError(self.code, os.strerror(self.code))
        data = bytes(data)[:self.room]
        self.room -= len(data)
        return self.real(fd, data)


def fill_disk(monkeypatch, room: int, code: int = errno.ENOSPC) -> Disk:
    disk = Disk(room, code)
    monkeypatch.setattr(atomic, "_write", disk)
    return disk


def fill_disk_at(monkeypatch, name: str, room: int) -> None:
    """The disk fills (``room`` bytes left) once the file ``name`` is begun."""
    real = atomic.replacing

    def filling(path, *args, **kwargs):
        if Path(path).name == name:
            fill_disk(monkeypatch, room)
        return real(path, *args, **kwargs)
    monkeypatch.setattr(atomic, "replacing", filling)


def one_line(capsys, *needles) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("wse-emu: error:"), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def leftovers(directory: Path) -> list[str]:
    """Files a failed write might leave: partial files, staging folders of a run directory
    or of figures."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*")
                  if p.name.endswith(atomic.PARTIAL) or p.name.startswith((".viz-", ".run.")))


# --- the helper itself ---------------------------------------------------------------------

@pytest.mark.parametrize("room", [0, 1, 4095, 4096, 20_000])
def test_a_file_the_disk_cannot_take_is_not_there_and_the_old_one_stays(tmp_path, monkeypatch,
                                                                        room):
    target = tmp_path / "results.json"
    target.write_text("old")
    fill_disk(monkeypatch, room)
    with pytest.raises(UserError, match="cannot write .*results.json: No space left on device"):
        atomic.write_bytes(target, b"x" * 50_000)
    assert target.read_text() == "old"
    assert list(tmp_path.iterdir()) == [target]


def test_a_file_written_whole_replaces_the_old_one_with_the_users_mode(tmp_path):
    target = tmp_path / "a.csv"
    target.write_text("old")
    before = os.umask(0o022)
    try:
        with atomic.replacing(target, text=True, newline="") as fh:
            fh.write("a,b\r\n1,2\r\n")
    finally:
        os.umask(before)
    assert target.read_bytes() == b"a,b\r\n1,2\r\n"
    assert target.stat().st_mode & 0o777 == 0o644
    assert list(tmp_path.iterdir()) == [target]


def test_an_error_while_writing_leaves_nothing_and_keeps_its_own_kind(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with atomic.replacing(tmp_path / "x.npz") as fh:
            np.savez_compressed(fh, a=np.arange(10))
            1 / 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("room", [0, 10, 70])
def test_a_line_the_disk_cannot_take_is_cut_back(tmp_path, monkeypatch, room):
    path = tmp_path / RESULTS
    with atomic.LineAppender(path) as out:
        out.write_line(json.dumps({"key": "a", "n": 1}))
    fill_disk(monkeypatch, room)
    with atomic.LineAppender(path) as out, pytest.raises(UserError, match="No space left"):
        out.write_line(json.dumps({"key": "b", "text": "x" * 100}))
    assert path.read_text() == '{"key": "a", "n": 1}\n'
    monkeypatch.undo()
    with atomic.LineAppender(path) as out:
        out.write_line('{"key": "c"}')
    assert [r.key for r in read_rows(tmp_path)] == ["a", "c"]


def test_every_writer_goes_through_the_helper():
    """No file of wse_emu, the compiler or the figures writes around ``wse_emu.util.atomic``:
    no ``.write_text``/``.write_bytes``, no ``open`` for writing, and ``savefig``, ``imsave``,
    ``np.save``/``savez`` and ``json.dump`` only into a file object (a name), not a path.
    The stage tables and the weights keep their own whole-or-nothing writes."""
    own = {"wse_emu/util/atomic.py", "wse_emu/serving/tables.py", "wse_emu/models/weights.py"}
    offenders = []
    for path in sorted([*ROOT.glob("wse_emu/**/*.py"), *ROOT.glob("compiler/**/*.py"),
                        *ROOT.glob("visualize/**/*.py")]):
        name = str(path.relative_to(ROOT))
        if name in own:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and _writes_around(node):
                offenders.append(f"{name}:{node.lineno}")
    assert not offenders


def _writes_around(call: ast.Call) -> bool:
    func = call.func
    attr = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if isinstance(func, ast.Attribute) and attr in ("write_text", "write_bytes"):
        return True
    if attr == "open":
        modes = [a for a in call.args[1:2]] + [k.value for k in call.keywords if k.arg == "mode"]
        # Reading, or truncating a sweep's cut-short last line in place ("r+b").
        return any(isinstance(m, ast.Constant) and set(str(m.value)) & set("wax")
                   for m in modes)
    if attr in ("savefig", "imsave", "save", "savez", "savez_compressed"):
        return bool(call.args) and not isinstance(call.args[0], ast.Name)
    if attr == "dump" and isinstance(func, ast.Attribute) and getattr(func.value, "id", "") \
            == "json":
        return len(call.args) > 1 and not isinstance(call.args[1], ast.Name)
    return False


def test_the_check_sees_a_writer_around_the_helper():
    for text in ('(d / "x.json").write_text("{}")', 'open(p, "w")', 'open(p, mode="a")',
                 'fig.savefig(out / "a.png")', 'np.savez_compressed(d / "m.npz", a=a)',
                 'json.dump(data, open(p))'):
        assert _writes_around(ast.parse(text).body[0].value), text
    for text in ('open(p)', 'open(p, "rb")', 'fig.savefig(fh, format="png")',
                 'write_text(d / "x.json", "{}")', 'json.dump(data, fh)'):
        assert not _writes_around(ast.parse(text).body[0].value), text


# --- -o where nothing can be written: refused before any work -------------------------------

COMMANDS = [
    ["inspect", "tiny", "-o", "OUT"],
    ["compile", "tiny", "--fabric", "mesh16", "-o", "OUT"],
    ["run", "tiny", "--fabric", "mesh16", "--phase", "decode", "--batch", "1", "--context",
     "64", "-o", "OUT"],
    ["serve", "tiny", "--fabric", "mesh16", "--workload", str(SMALL_CHAT), "-o", "OUT"],
    ["experiment", "disagg", "tiny", "--fabric", "mesh16", "--workload", str(SMALL_CHAT),
     "--ttft-slo", "1", "--tpot-slo", "0.01", "-o", "OUT"],
    ["sweep", str(ROOT / "programs" / "sweeps" / "sram_clock_decode.yaml"), "-o", "OUT"],
    ["generate", "tiny", "--fabric", "mesh16", "--prompt-ids", "1,2", "--dump-logits",
     "OUT.npy"],
    ["demo", "-o", "OUT"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_an_output_under_a_regular_file_is_one_line(tmp_path, capsys, command):
    blocker = tmp_path / "somefile"
    blocker.write_text("not a folder")
    out = str(blocker / "sub")
    began = time.perf_counter()
    assert main([a.replace("OUT", out) for a in command]) == 2
    assert "not a directory" in one_line(capsys, "somefile").lower()
    assert time.perf_counter() - began < 20  # refused before the work, not after it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["somefile"]
    assert blocker.read_text() == "not a folder"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_output_in_a_read_only_folder_is_one_line_before_any_work(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        assert main(["serve", "tiny", "--fabric", "mesh16", "--workload", str(SMALL_CHAT),
                     "-o", str(locked / "run")]) == 2
        one_line(capsys, "is not writable")
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o755)


def test_a_read_only_folder_is_refused_by_the_library_check(tmp_path, monkeypatch):
    """(As root, where the folder above cannot be made read-only: the check asks
    ``os.access``, which answers for a read-only file system even to root.)"""
    from wse_emu.rundir.directory import check_run_dir

    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == tmp_path
                        else real(p, mode))
    with pytest.raises(UserError, match=f"{tmp_path} is not writable"):
        check_run_dir(tmp_path / "run")


# --- the disk fills while a run directory or its figures are written ------------------------

class Counting:
    """Stands in for ``atomic._write`` and counts the bytes written through it."""

    def __init__(self):
        self.bytes, self.real = 0, atomic._write

    def __enter__(self):
        atomic._write = self
        return self

    def __exit__(self, *exc):
        atomic._write = self.real

    def __call__(self, fd, data):
        self.bytes += len(data)
        return self.real(fd, data)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


def serve_args(cache, out) -> list[str]:
    return ["-q", "serve", "tiny", "--fabric", "mesh16", "--workload", str(SMALL_CHAT),
            "--ttft-slo", "0.05", "--tpot-slo", "0.001", "--cache-dir", cache, "-o", str(out)]


@pytest.fixture(scope="module")
def served(tmp_path_factory, cache):
    """A serving run directory, and how many bytes writing it took."""
    out = tmp_path_factory.mktemp("served") / "run"
    with Counting() as counted:
        assert main(serve_args(cache, out)) == 0
    return out, counted.bytes


@pytest.mark.parametrize("share, code, reason", [
    (0.0, errno.ENOSPC, "No space left on device"),
    pytest.param(0.3, errno.ENOSPC, "No space left on device", marks=pytest.mark.e2e),
    pytest.param(0.9, errno.ENOSPC, "No space left on device", marks=pytest.mark.e2e),
    pytest.param(0.5, errno.EROFS, "Read-only file system", marks=pytest.mark.e2e)])
def test_a_serving_run_the_disk_cannot_take_leaves_no_run_directory(tmp_path, monkeypatch,
                                                                    capsys, cache, served,
                                                                    share, code, reason):
    """The disk fills (or turns read-only) after ``share`` of what the run writes."""
    fill_disk(monkeypatch, int(share * served[1]), code)
    out = tmp_path / "run"
    assert main(serve_args(cache, out)) == 2
    line = one_line(capsys, f"cannot create run directory {out}", reason, "(writing ")
    assert ".run." not in line  # named as it was to be, not by its staging folder
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    assert main(["viz", str(out)]) == 2  # nothing there to trust
    one_line(capsys, "not a run directory")


@pytest.fixture(scope="module")
def drawn_bytes(served, tmp_path_factory):
    """format -> bytes a ``viz`` of the serving run writes (drawn once, on a copy)."""
    import shutil

    sizes = {}
    for fmt in ("png", "svg"):
        run = tmp_path_factory.mktemp(f"drawn_{fmt}") / "run"
        shutil.copytree(served[0], run)
        with Counting() as counted:
            assert main(["-q", "viz", str(run), "--format", fmt]) == 0
        sizes[fmt] = counted.bytes
    return sizes


@pytest.mark.e2e
@pytest.mark.parametrize("share, fmt", [
    (0.0, "png"), (0.5, "png"), (0.999, "png"), (0.5, "svg")])
def test_figures_the_disk_cannot_take_leave_no_half_report(served, drawn_bytes, tmp_path,
                                                           monkeypatch, capsys, share, fmt):
    """The disk fills after ``share`` of what drawing writes through ``atomic._write`` (the
    maps' arrays, the captions, the report; matplotlib writes the figures' own files, as the
    next test has it): one line naming the file it was to be, nothing half-written under a
    name that is read, no report; a later ``viz`` draws it all."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(served[0], run)
    fill_disk(monkeypatch, int(share * drawn_bytes[fmt]))
    assert main(["viz", str(run), "--format", fmt]) == 2
    line = one_line(capsys, "No space left on device", f"cannot write {run}{os.sep}")
    assert ".viz-" not in line
    assert leftovers(run) == []
    # The report is not there, and every figure moved into figures/ (none, when the drawing
    # failed) is whole.
    assert not (run / "report.html").exists()
    figures = sorted((run / "figures").glob(f"*.{fmt}")) if (run / "figures").exists() else []
    if share == 0:
        assert figures == []
    if fmt == "png":
        for figure in figures:
            assert figure.read_bytes().endswith(b"IEND\xaeB`\x82")  # a PNG's last chunk
    monkeypatch.undo()
    assert main(["-q", "viz", str(run), "--format", fmt]) == 0
    parser = ImageSources()
    parser.feed((run / "report.html").read_text())
    drawn = [f for f in (run / "figures").glob(f"*.{fmt}") if ".pixels" not in f.name]
    assert len(parser.sources) == len(drawn) > 5


@pytest.mark.e2e
def test_a_figure_the_disk_cannot_take_leaves_no_half_figure(served, tmp_path, monkeypatch,
                                                            capsys):
    """matplotlib writes a figure's file itself: the disk full halfway through the third
    figure is one line naming it, with nothing under its name, no figures moved in and no
    report; a later ``viz`` draws it all."""
    import shutil

    from matplotlib.figure import Figure

    run = tmp_path / "run"
    shutil.copytree(served[0], run)
    real, saved = Figure.savefig, []

    def full_at_the_third(fig, fname, *args, **kwargs):
        if len(saved) == 2:
            Path(fname).write_bytes(b"\x89PNG\r\n\x1a\n half a figure")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        saved.append(Path(fname).name)
        return real(fig, fname, *args, **kwargs)
    monkeypatch.setattr(Figure, "savefig", full_at_the_third)
    assert main(["viz", str(run)]) == 2
    third = one_line(capsys, "No space left on device").split("cannot write ")[1].split(":")[0]
    assert Path(third).parent == run / "figures" and Path(third).name not in saved
    assert leftovers(run) == [] and not (run / "report.html").exists()
    assert not (run / "figures").exists()
    monkeypatch.undo()
    assert main(["-q", "viz", str(run)]) == 0
    assert Path(third).read_bytes().endswith(b"IEND\xaeB`\x82")


@pytest.mark.e2e
def test_a_report_the_disk_cannot_take_keeps_the_one_before(served, tmp_path, monkeypatch,
                                                            capsys):
    """Figures drawn, then the report: the disk full at the report leaves the earlier report
    whole (each report embeds its own figures, so it stays true to itself)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(served[0], run)
    assert main(["viz", str(run), "--what", "serving"]) == 0
    before = (run / "report.html").read_bytes()
    fill_disk_at(monkeypatch, "report.html", 100)
    assert main(["viz", str(run), "--what", "serving"]) == 2
    one_line(capsys, f"cannot write {run / 'report.html'}: No space left on device")
    assert (run / "report.html").read_bytes() == before
    assert leftovers(run) == []


def test_a_program_saved_over_another_when_the_disk_fills_is_refused_not_mixed(
        tiny_8x8, tmp_path, monkeypatch):
    """program.npz is replaced before program.json: a disk full between them leaves the
    new arrays beside the old structure, which the digest refuses by name."""
    from dataclasses import replace

    tiny_8x8.save(tmp_path)
    other = replace(tiny_8x8, arrays={k: v + 1 if k.startswith("sram_") else v
                                      for k, v in tiny_8x8.arrays.items()})
    fill_disk_at(monkeypatch, "program.json", 0)
    with pytest.raises(UserError, match="program.json: No space left on device"):
        other.save(tmp_path)
    monkeypatch.undo()
    assert leftovers(tmp_path) == []
    with pytest.raises(UserError, match="changed since it was compiled"):
        WaferProgram.load(tmp_path)


@pytest.mark.e2e
def test_a_sweep_row_the_disk_cannot_take_is_left_out_and_run_on_resume(tmp_path, monkeypatch,
                                                                        capsys):
    sweep = tmp_path / "clock.yaml"
    sweep.write_text("version: 1\nname: clock\npoint: run\nbase: {model: tiny, fabric: mesh16, "
                     "phase: decode, batch: 1, context: 64}\naxes:\n  fabric.clock_hz: "
                     "[1.0e+9, 2.0e+9]\n")
    out = tmp_path / "sweep"
    real, calls = atomic._write, []

    def second_row_fails(fd, data):  # writes: sweep.json, the first row, the second row
        calls.append(len(data))
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)
    monkeypatch.setattr(atomic, "_write", second_row_fails)
    assert main(["-q", "sweep", str(sweep), "-o", str(out), "--workers", "1"]) == 2
    written = (out / RESULTS).read_text()
    one_line(capsys, f"cannot write {out / RESULTS}: No space left on device")
    assert written.endswith("\n") and len(written.splitlines()) == 1  # the first row, whole
    assert len(read_rows(out)) == 1
    monkeypatch.undo()
    assert main(["-q", "sweep", str(sweep), "-o", str(out), "--workers", "1"]) == 0
    rows = read_rows(out)
    assert len(rows) == 2 and not any(r.failed for r in rows)
    assert leftovers(out) == []
