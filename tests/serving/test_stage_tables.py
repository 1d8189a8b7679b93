"""Stage-time tables: interpolation against direct simulation, and the disk cache."""

import numpy as np
import pytest
from helpers import RecordingPool

from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.options import CompileOptions
from wse_emu.errors import UserError
from wse_emu.hardware.fabric import ClusterSpec, load_fabric
from wse_emu.models.layer import MicroBatch
from wse_emu.models.spec import ModelSpec
from wse_emu.pools.kinds.wafer import WAFER
from wse_emu.serving.policies import check_in_tables
from wse_emu.serving.tables import build_table, grid_axes
from wse_emu.sim.runner import run_region

SMALL = ModelSpec.from_fields(name="small", family="llama", hidden_size=512, intermediate_size=1536,
                              num_layers=2, num_heads=8, num_kv_heads=2, head_dim=64,
                              vocab_size=2048).validate("test")
DECODE_AXES = ((1, 2, 4, 8, 16), (64, 256, 1024, 4096))
PREFILL_AXES = ((16, 64, 256, 1024), (0, 256, 1024, 4096))


@pytest.fixture(scope="module")
def program():
    return compile_model(SMALL, ClusterSpec(load_fabric("mesh64"), 1),
                         CompileOptions(region=(64, 64)))


def direct(program, step):
    return np.array([s.cycles for s in run_region(program, "mixed0", step).stages], dtype=float)


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_interpolation_within_five_percent_of_direct_simulation(program, phase, tmp_path):
    axes = DECODE_AXES if phase == "decode" else PREFILL_AXES
    table = build_table(program, "mixed0", phase, axes=axes, cache_dir=tmp_path)
    # On the grid the table is the simulation itself.
    a, b = axes[0][1], axes[1][2]
    step = (MicroBatch("decode", batch=a, context=b) if phase == "decode"
            else MicroBatch("prefill", tokens=a, prefix=b))
    assert np.allclose(table.stage_cycles(a, b), direct(program, step))
    rng = np.random.default_rng(7)
    for _ in range(8):
        a = int(rng.integers(axes[0][0], axes[0][-1] + 1))
        b = int(rng.integers(axes[1][0], axes[1][-1] + 1))
        step = (MicroBatch("decode", batch=a, context=b) if phase == "decode"
                else MicroBatch("prefill", tokens=a, prefix=b))
        # A prefill tile's queries are split over the stage's columns (64 here), so its
        # attention steps up each time the tile outgrows a multiple of them; between steps,
        # and for every tile up to the default 64 tokens serving uses, the table is within
        # 5%; across a step, linear interpolation can miss the jump by a little more.
        within = 0.05 if phase == "decode" or a <= 64 else 0.10
        assert table.stage_cycles(a, b) == pytest.approx(direct(program, step), rel=within)
    if phase == "prefill":
        for a in (24, 40, 56):  # tiles of a prompt served 64 tokens at a time
            b = int(rng.integers(axes[1][0], axes[1][-1] + 1))
            step = MicroBatch("prefill", tokens=a, prefix=b)
            assert table.stage_cycles(a, b) == pytest.approx(direct(program, step), rel=0.05)


def entries(cache, kind="stage-table"):
    """The cache's entries of one kind: ``stage-table`` (a region's), ``stage-times`` (a
    stage's, shared by every region holding a stage like it)."""
    return sorted(cache.glob(f"{kind}-*.npz"))


@pytest.mark.slow
def test_tables_are_cached_by_program(program, tmp_path):
    first = build_table(program, "mixed0", "decode", axes=DECODE_AXES, cache_dir=tmp_path)
    assert len(entries(tmp_path)) == 1
    stages = entries(tmp_path, "stage-times")
    assert 1 <= len(stages) <= len(first.cycles)
    again = build_table(program, "mixed0", "decode", axes=DECODE_AXES, cache_dir=tmp_path)
    assert np.array_equal(first.cycles, again.cycles)
    assert len(list(tmp_path.iterdir())) == 1 + len(stages)
    other = compile_model(SMALL, ClusterSpec(load_fabric("mesh64"), 1),
                          CompileOptions(region=(64, 64), seed=3))
    build_table(other, "mixed0", "decode", axes=((1, 2), (64, 128)), cache_dir=tmp_path)
    assert len(entries(tmp_path)) == 2


def test_a_stage_timed_for_one_program_is_not_timed_again_for_another(program, tmp_path,
                                                                      monkeypatch):
    """Stages alike in shape and kernels take the same time in any program: another program
    with the same stages (here: other reference workloads for its stored bounds) reads their
    times back, and works out only the transfers between its stages."""
    import wse_emu.serving.tables as tables

    first = build_table(program, "mixed0", "decode", axes=((1, 2), (64, 128)),
                        cache_dir=tmp_path)
    other = compile_model(SMALL, ClusterSpec(load_fabric("mesh64"), 1),
                          CompileOptions(region=(64, 64), bound_decode_context=1024))
    assert other.to_json() != program.to_json()

    def timed(*args, **kwargs):
        raise AssertionError("a stage was simulated")
    monkeypatch.setattr(tables, "stage_cycles", timed)
    again = build_table(other, "mixed0", "decode", axes=((1, 2), (64, 128)),
                        cache_dir=tmp_path)
    assert np.array_equal(first.cycles, again.cycles)
    assert np.array_equal(first.transfers, again.transfers)
    assert len(entries(tmp_path)) == 2  # a region entry each
    # Over another grid, the stages are timed.
    with pytest.raises(AssertionError, match="a stage was simulated"):
        build_table(other, "mixed0", "decode", axes=((1, 4), (64, 128)), cache_dir=tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_quick_grid_within_five_percent_of_direct_simulation(program, phase, tmp_path):
    """The quick grid (fewer shapes, for a first look) interpolates within its range as
    closely as the full grid's cells do."""
    axes = grid_axes("quick", phase)
    table = build_table(program, "mixed0", phase, axes=axes, cache_dir=tmp_path)
    rng = np.random.default_rng(11)
    for _ in range(6):
        a = int(rng.integers(axes[0][0], axes[0][-1] + 1))
        b = int(rng.integers(axes[1][0], axes[1][-1] + 1))
        step = (MicroBatch("decode", batch=a, context=b) if phase == "decode"
                else MicroBatch("prefill", tokens=min(a, 64), prefix=b))
        a = step.batch if phase == "decode" else step.new_tokens
        assert table.stage_cycles(a, b) == pytest.approx(direct(program, step), rel=0.05)


def test_grids_are_named_and_bound_the_micro_batches():
    assert len(grid_axes("quick", "decode")[0]) < len(grid_axes("full", "decode")[0])
    with pytest.raises(UserError, match="`grid` must be one of full, quick"):
        grid_axes("fine", "decode")
    quick, full = WAFER.table_tops("quick"), WAFER.table_tops("full")
    check_in_tables({"batch_limit": 64, "prefill_tile": 256, "token_budget": 256}, quick, "q")
    with pytest.raises(UserError, match=r"`prefill_tile` must be between 1 and 256 \(the range "
                                        "of the quick grid"):
        check_in_tables({"batch_limit": 64, "prefill_tile": 512}, quick, "the quick grid")
    check_in_tables({"batch_limit": 64, "prefill_tile": 512}, full, "the full grid")
    # A knob that is not a micro-batch's size, and a phase left out, are not bounded.
    check_in_tables({"max_running": 10_000, "batch_limit": 10_000}, {"prefill": 256}, "q")


def _damaged(path, how):
    data = path.read_bytes()
    if how == "truncated":  # a crash or a full disk while it was written
        path.write_bytes(data[:len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "edited":  # one stored time changed, the digest left as it was
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        arrays["cycles"] = arrays["cycles"].copy()
        arrays["cycles"].flat[0] += 1.0
        with path.open("wb") as fh:
            np.savez(fh, **arrays)
    elif how == "reshaped":  # whole and self-consistent, but not the table its name says
        from wse_emu.serving.tables import StageTable
        table = StageTable.from_npz(path)
        StageTable(table.phase, table.axis0, table.axis1[:1], table.cycles[:, :, :1],
                   table.transfers[:, :1]).to_npz(path)


@pytest.mark.parametrize("kind", ["stage-table", "stage-times"])
@pytest.mark.parametrize("how", ["truncated", "empty", "edited", "reshaped"])
def test_a_damaged_cache_entry_is_reported_and_timed_again(program, tmp_path, capsys, how,
                                                           kind):
    first = build_table(program, "mixed0", "decode", axes=((1, 2), (64, 128)), cache_dir=tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    path = entries(tmp_path, kind)[0]
    _damaged(path, how)
    if kind == "stage-times":  # a stage's entry is read when its region's is not there
        entries(tmp_path)[0].unlink()
    capsys.readouterr()
    again = build_table(program, "mixed0", "decode", axes=((1, 2), (64, 128)), cache_dir=tmp_path)
    warning, *others = capsys.readouterr().err.splitlines()
    assert warning.startswith("wse-emu: warning: the cached stage table")
    assert path.name in warning and "timing it again" in warning
    # One warning line; the rebuild's progress lines only, should it take over ten seconds.
    assert all(line.startswith("[") and "timing the stage tables" in line for line in others)
    assert np.array_equal(first.cycles, again.cycles)
    assert np.array_equal(first.transfers, again.transfers)
    # ... and replaced: read back quietly the next time.
    build_table(program, "mixed0", "decode", axes=((1, 2), (64, 128)), cache_dir=tmp_path)
    assert capsys.readouterr().err == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no temporary file left


def test_an_entry_is_written_whole_or_not_at_all(program, tmp_path, monkeypatch):
    """A failure while writing (a full disk) leaves no entry and no partial file behind."""
    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(np, "savez", full_disk)
    with pytest.raises(OSError):
        build_table(program, "mixed0", "decode", axes=((1, 2), (64, 128)), cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_engine_is_made_ready_before_the_workers_get_shapes(program, monkeypatch):
    """On a pool of workers, the engine is compiled (or loaded) here first, its line said,
    so that the workers load it rather than each compile it with nothing said."""
    import wse_emu.serving.tables as tables

    seen: list = []
    monkeypatch.setattr(tables, "warm_engine", lambda engine: seen.append(("warm", engine)))
    build_table(program, "mixed0", "decode", axes=((1,), (64,)), pool=RecordingPool(seen))
    assert seen == [("warm", "fast"), "jobs"]


def test_a_table_is_keyed_by_its_own_engines_code_alone():
    """A change to one engine keeps the other's tables: each engine's timing code holds its
    own module and what the engines share, not the other's, nor the plain-Python twins."""
    from pathlib import Path

    from wse_emu.engines import cycle, fast, reference, taskgraph
    from wse_emu.serving.tables import _timing_sources

    def held(engine, module):
        return Path(module.__file__).read_bytes() in _timing_sources(engine)

    assert held("fast", fast) and not held("fast", cycle)
    assert held("cycle", cycle) and not held("cycle", fast)
    assert held("fast", taskgraph) and held("cycle", taskgraph)
    assert not held("fast", reference) and not held("cycle", reference)
