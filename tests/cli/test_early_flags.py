"""Every flag of ``wse-emu experiment`` is checked before any work and refused under the name
it was typed as: a per-user speed with no TPOT target (inf) refused as --user-speeds, not as
--tpot-slo after the tables are timed; a price or a rack's units refused as --price h200=2 and
--per-rack trn2=0, not as the API's `units_per_rack['trn2']`; a number given for a kind of
hardware no pool is on refused, not ignored; a --vary value that would end the experiment
half-way refused at the start; a --cache-dir no folder can be made at refused before the
tables are timed, not met as a traceback after.

Each runs the command in this process with every way into work made to fail the test
(``no_work``), and a cache folder that must stay empty; one runs it as a user does.
"""

from __future__ import annotations

import pytest
from helpers import SMALL_CHAT, assert_one_line_error, forbid_work, run_cli, work_entries

from wse_emu import api
from wse_emu.cli.main import main
from wse_emu.errors import UserError

TINY = ["tiny", "--fabric", "mesh16", "--workload", SMALL_CHAT, "--ttft-slo", "1",
        "--workers", "1"]
POOLS = ["llama-3.1-8b", "--prefill-pool", "wse3", "--decode-pool", "trn2", "--workload",
         SMALL_CHAT, "--ttft-slo", "0.05", "--tpot-slo", "0.01", "--workers", "1"]


@pytest.fixture
def no_work(monkeypatch):
    """Every way into work fails the test: compiling, timing a table, starting workers."""
    import wse_emu.cli.main  # noqa: F401 - every module the command line reaches, loaded

    forbid_work(monkeypatch, work_entries(), "work started before every flag was checked")


def refused(capsys, tmp_path, *argv) -> str:
    """The one line ``wse-emu ARGV`` exits 2 with, the cache folder it was given left
    empty."""
    cache = tmp_path / "cache"
    code = main(["--quiet", *map(str, argv), "--cache-dir", str(cache)])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("wse-emu: error: "), err
    assert not cache.exists() or not list(cache.iterdir())
    return lines[0]


# --- experiment frontier: speeds and step scales ------------------------------------------

@pytest.mark.parametrize("flags, named", [
    (["--user-speeds", "0,abc"], "--user-speeds"),
    (["--user-speeds", "5,-1"], "--user-speeds"),
    (["--user-speeds", "0"], "--user-speeds"),
    (["--user-speeds", ","], "--user-speeds"),
    (["--user-speeds", "inf"], "--user-speeds"),  # 1/inf: no TPOT target at all
    (["--user-speeds", "nan"], "--user-speeds"),
    (["--user-speeds", "1e-320"], "--user-speeds"),  # 1/1e-320 overflows to inf
    (["--user-speed", "0"], "--user-speed"),
    (["--user-speed", "-5"], "--user-speed"),
    (["--user-speed", "inf"], "--user-speed"),
    (["--user-speed", "1e-320"], "--user-speed"),
    (["--step-scales", "0"], "--step-scales"),
    (["--step-scales", "1,abc"], "--step-scales"),
    (["--step-scales=-1,2"], "--step-scales"),
    (["--step-scales", "inf"], "--step-scales"),
])
def test_a_frontiers_speeds_and_scales_are_refused_by_their_own_flag(capsys, tmp_path, no_work,
                                                                     flags, named):
    line = refused(capsys, tmp_path, "experiment", "frontier", *TINY, *flags)
    assert named in line and "--tpot-slo" not in line, line


# --- pools named by their hardware: the footprint's numbers per kind ----------------------

@pytest.mark.parametrize("flags, says", [
    (["--footprint", "racks", "--per-rack", "trn2=0", "--per-rack", "wse3=1"],
     "--per-rack trn2=0: units per rack must be a positive number"),
    (["--footprint", "racks", "--per-rack", "trn2=-1", "--per-rack", "wse3=1"],
     "--per-rack trn2=-1: units per rack must be a positive number"),
    (["--footprint", "cost", "--price", "wse3=abc"], "--price needs NAME=PER_HOUR"),
    (["--footprint", "cost", "--price", "wse3=1", "--price", "trn2=nan"],
     "--price trn2=nan: a price per hour must be a positive number"),
    (["--footprint", "cost", "--price", "wse3=1", "--price", "trn2=inf"],
     "--price trn2=inf: a price per hour must be a positive number"),
    # A kind no pool is on: a typo, or a kind left out, is not ignored.
    (["--footprint", "cost", "--price", "wse3=1", "--price", "trn2=2", "--price", "h200=2"],
     "--price h200=2: no pool of this experiment is on h200; its pools are on wse3, trn2"),
    (["--footprint", "racks", "--per-rack", "wse3=1", "--per-rack", "trn2=2", "--per-rack",
      "trn=2"], "--per-rack trn=2: no pool of this experiment is on trn"),
    (["--footprint", "cost", "--price", "wse3=1", "--price", "wse3=2", "--price", "trn2=1"],
     "--price wse3=...: given twice"),
    (["--footprint", "cost", "--price", "=1"], "--price =1: name the kind of hardware"),
    (["--footprint", "cost", "--price", "wse3=1"],
     "needs the price per hour of one trn2: --price trn2=PER_HOUR"),
    (["--footprint", "racks"], "--per-rack wse3=N"),
    (["--price", "wse3=1"], "(--price) are only for a footprint in cost (--footprint cost)"),
    (["--footprint", "cost", "--per-rack", "wse3=1", "--price", "wse3=1", "--price",
      "trn2=1"], "(--per-rack) are only for a footprint in racks (--footprint racks)"),
])
def test_a_footprints_numbers_are_refused_as_the_flags_they_were_typed_as(capsys, tmp_path,
                                                                          no_work, flags, says):
    line = refused(capsys, tmp_path, "experiment", "disagg", *POOLS, *flags)
    assert says in line, line
    assert "units_per_rack" not in line and "prices=" not in line and "`" not in line, line


@pytest.mark.parametrize("flags, says", [
    (["--fabric", "mesh16"], "--fabric and --systems describe one compiled cluster"),
    (["--set", "clock_hz=1e9"], "--fabric and --systems describe one compiled cluster"),
    (["--systems", "2"], "--fabric and --systems describe one compiled cluster"),
    (["--splits", "middle"], "--splits chooses among one compiled cluster's splits"),
])
def test_a_compiled_clusters_flags_are_refused_beside_pools(capsys, tmp_path, no_work, flags,
                                                            says):
    line = refused(capsys, tmp_path, "experiment", "disagg", *POOLS, *flags)
    assert says in line, line


def test_a_footprint_is_refused_on_one_compiled_cluster(capsys, tmp_path, no_work):
    line = refused(capsys, tmp_path, "experiment", "disagg", *TINY, "--tpot-slo", "1",
                   "--footprint", "kw")
    assert "--footprint, --price and --per-rack are for pools named by their hardware" in line


def test_the_api_names_them_as_it_spells_them(no_work, tmp_path):
    arguments = dict(ttft_s=0.05, tpot_s=0.01, prefill_pool="wse3", decode_pool="trn2",
                     workers=1, cache_dir=tmp_path)
    with pytest.raises(UserError, match=r"^`units_per_rack=trn2=0`: units per rack must be"):
        api.experiment(api.from_flat(
            api.ExperimentSpec, model="llama-3.1-8b", workload=SMALL_CHAT, footprint="racks",
                       units_per_rack={"wse3": 1, "trn2": 0}, **arguments))
    with pytest.raises(UserError, match=r"^`prices=h200=2`: no pool of this experiment is on "
                                        r"h200; its pools are on wse3, trn2"):
        api.experiment(api.from_flat(
            api.ExperimentSpec, model="llama-3.1-8b", workload=SMALL_CHAT, footprint="cost",
                       prices={"wse3": 1, "trn2": 2, "h200": 2}, **arguments))
    assert not list(tmp_path.iterdir())


def test_a_pairings_numbers_are_checked_for_every_kind_before_any_pairing_runs(capsys, tmp_path,
                                                                              no_work):
    pairings = ["experiment", "pairings", "tiny", "--workload", SMALL_CHAT, "--ttft-slo", "1",
                "--workers", "1", "--footprint", "cost"]
    # The kinds as a user lists them, with spaces; a price for a kind not among them.
    line = refused(capsys, tmp_path, *pairings, "--kinds", "trn2, mesh16", "--price",
                   "trn2=1", "--price", "mesh16=1", "--price", "h200=2")
    assert "--price h200=2: no pool of this experiment is on h200; its pools are on trn2, " \
           "mesh16" in line, line
    # A kind without its price: every pairing with it would be skipped after the others ran.
    line = refused(capsys, tmp_path, *pairings, "--kinds", "trn2,mesh16", "--price", "trn2=1")
    assert "the price per hour of one mesh16: --price mesh16=PER_HOUR" in line, line


# --- experiment disagg --vary: every value before the first runs ---------------------------

@pytest.mark.parametrize("vary", ["tpot=0.01,inf", "tpot=0.01,nan", "prompt-scale=1,1e400",
                                  "systems=1,100", "systems=1,1.5"])
def test_a_vary_value_that_would_end_the_experiment_half_way_is_refused_at_the_start(
        capsys, tmp_path, no_work, vary):
    line = refused(capsys, tmp_path, "experiment", "disagg", *TINY, "--tpot-slo", "0.01",
                   "--vary", vary)
    assert f"--vary {vary.split('=')[0]}" in line and "--tpot-slo" not in line, line


# --- a cache folder that cannot be one -----------------------------------------------------

@pytest.mark.parametrize("command", [
    ["experiment", "disagg", *TINY, "--tpot-slo", "0.01"],
    ["experiment", "frontier", *TINY],
    ["serve", "tiny", "--fabric", "mesh16", "--region", "8x8", "--workload", SMALL_CHAT],
])
def test_a_cache_dir_that_cannot_be_a_folder_is_refused_before_any_table(capsys, tmp_path,
                                                                          no_work, command):
    file = tmp_path / "file"
    file.write_text("")
    for given, says in ((file, "is a file"), (file / "tables", "is under a file"),
                        ("", "is empty")):
        code = main(["--quiet", *map(str, command), "--cache-dir", str(given)])
        err = capsys.readouterr().err
        assert code == 2 and len(err.splitlines()) == 1, err
        assert "--cache-dir" in err and says in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_as_a_user_runs_it(tmp_path):
    """The command as a process: one line, exit 2, no traceback, nothing cached."""
    proc = run_cli("experiment", "frontier", *TINY, "--user-speeds", "inf", "--cache-dir",
                   tmp_path / "cache")
    assert_one_line_error(proc, "--user-speeds")
    assert "--tpot-slo" not in proc.stderr
    proc = run_cli("experiment", "disagg", *POOLS, "--footprint", "racks", "--per-rack",
                   "trn2=0", "--per-rack", "wse3=1", "--cache-dir", tmp_path / "cache")
    assert_one_line_error(proc, "--per-rack trn2=0")
    assert not (tmp_path / "cache").exists()


# --- a sweep: every point's values before the first point compiles ------------------------

SWEEP = """version: 1
name: s
point: {point}
base: {{model: tiny, fabric: mesh16, region: 8x8{base}}}
axes:
  {axis}
"""


@pytest.mark.parametrize("point, base, axis, says", [
    ("run", "", "batch: [1, '8']", "batch must be a whole number, got '8'"),
    ("run", "", "engine: [fast, exact]", "engine must be one of fast, cycle"),
    ("run", "", "region: [8x8, 8xq]", "region must look like WxH"),
    ("run", "", "prefill_share: [0.5]", "prefill_share and prefill_systems need plan"),
    ("run", "", "fabric.clock_hz: [1.0e+9, 0]", "clock_hz"),
    ("serve", ", workload: chat", "batch_limit: [8, 0]", "batch_limit"),
    ("serve", ", workload: chat", "cache_dir: ['']", "cache_dir is empty"),
])
def test_a_sweeps_values_are_refused_before_any_point_runs(capsys, tmp_path, no_work, point,
                                                           base, axis, says):
    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP.format(point=point, base=base, axis=axis))
    code = main(["--quiet", "sweep", str(path), "-o", str(tmp_path / "out"), "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert says in err and "sweep s, point {" in err, err
    assert not (tmp_path / "out").exists()  # nothing claimed, nothing compiled
