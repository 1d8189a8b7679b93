"""Bad input gives one clear line on stderr and exit code 2, never a traceback.

Library-level tests check the error class and what the message names; command-line tests run
``wse-emu`` in a subprocess and check the one-line contract.
"""

from __future__ import annotations

import dataclasses
import json
import math
import stat
import typing
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import assert_one_line_error, run_cli

from wse_emu.compiler.mapper import compile_model
from wse_emu.compiler.options import CompileOptions
from wse_emu.compiler.partition import (
    DEFAULT_PREFILL_SHARE,
    _min_part_width,
    _share_fits,
    _share_range,
    partition,
    wafer_weight_capacity,
    wafers_needed,
)
from wse_emu.errors import CompileError, ConfigError, UserError, WorkerLost
from wse_emu.hardware.fabric import MAX_SIDE, MAX_SYSTEMS, ClusterSpec, load_fabric, with_overrides
from wse_emu.models.load import load_model
from wse_emu.rundir.directory import write_run_dir
from wse_emu.serving.workload import load_workload
from wse_emu.util.configfile import _coerce, preset_dir, preset_names

HF_LLAMA = Path(__file__).parents[1] / "fixtures" / "hf_configs" / "llama-3.2-1b" / "config.json"
TINY_YAML = preset_dir("models") / "tiny.yaml"
MESH8_YAML = preset_dir("fabrics") / "mesh8.yaml"






def hf_config(tmp_path: Path, **changes) -> Path:
    """A copy of the Llama-3.2-1B config.json with some fields changed."""
    config = json.loads(HF_LLAMA.read_text())
    config.update(changes)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def model_yaml(tmp_path: Path, extra: str) -> Path:
    """The tiny preset with raw YAML lines appended (so YAML's own parsing applies)."""
    data = yaml.safe_load(TINY_YAML.read_text())
    keys = {line.split(":", 1)[0].strip() for line in extra.splitlines() if ":" in line}
    for key in keys:
        data.pop(key, None)
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False) + extra + "\n")
    return path


# --- 1. Hugging Face config.json: wrong types name the file and the field ------------------

@pytest.mark.parametrize("field,value", [
    ("num_attention_heads", "4"),
    ("hidden_size", True),
    ("num_hidden_layers", 16.0),
    ("vocab_size", None),
    ("intermediate_size", [8192]),
    ("num_key_value_heads", "8"),
    ("head_dim", 64.5),
    ("max_position_embeddings", None),
    ("rope_theta", None),
    ("rope_theta", "500000"),
    ("rope_theta", 10 ** 400),
    ("rms_norm_eps", "x"),
    ("rms_norm_eps", True),
    ("rms_norm_eps", float("nan")),
    ("rms_norm_eps", float("inf")),
    ("tie_word_embeddings", "false"),
    ("attention_bias", 1),
    ("torch_dtype", 16),
    ("_name_or_path", 5),
])
def test_hf_wrong_type_is_a_config_error_naming_file_and_field(tmp_path, field, value):
    path = hf_config(tmp_path, **{field: value})
    with pytest.raises(ConfigError) as info:
        load_model(path)
    message = str(info.value)
    assert str(path) in message
    assert f"'{field}'" in message
    assert "\n" not in message and len(message) < 300


@pytest.mark.parametrize("value", [[{}], ["LlamaForCausalLM", 3], 5, {"a": 1}])
def test_hf_architectures_must_be_names(tmp_path, value):
    path = hf_config(tmp_path, architectures=value)
    with pytest.raises(ConfigError) as info:
        load_model(path)
    assert "'architectures'" in str(info.value) and str(path) in str(info.value)


def test_hf_architectures_as_a_single_string_is_a_one_element_list(tmp_path):
    as_string = load_model(hf_config(tmp_path, architectures="LlamaForCausalLM"))
    assert as_string.family == "llama"
    assert as_string.replaced(source="") == \
        load_model(HF_LLAMA).replaced(source="", name=as_string.name)


def test_hf_unsupported_single_string_architecture_is_named(tmp_path):
    with pytest.raises(ConfigError, match="unsupported architecture GPT2LMHeadModel"):
        load_model(hf_config(tmp_path, architectures="GPT2LMHeadModel"))


def test_hf_nullable_fields_still_default(tmp_path):
    m = load_model(hf_config(tmp_path, num_key_value_heads=None, head_dim=None,
                             torch_dtype=None, rope_theta=500000))
    assert m.attention.num_kv_heads == m.attention.num_heads
    assert m.attention.head_dim == m.hidden_size // m.attention.num_heads
    assert m.rope.theta == 500000.0 and isinstance(m.rope.theta, float)


def test_cli_hf_wrong_type(tmp_path):
    path = hf_config(tmp_path, num_attention_heads="4")
    proc = run_cli("inspect", path)
    assert_one_line_error(proc, str(path), "'num_attention_heads'")
    assert proc.stdout == ""


# --- 2. YAML configs: optional fields are type-checked, floats parsed, non-finite refused --

@pytest.mark.parametrize("extra,field", [
    ("sliding_window: 100.5", "sliding_window"),
    ("sliding_window: [1]", "sliding_window"),
    ("sliding_window: '100'", "sliding_window"),
    ("sliding_window: true", "sliding_window"),
    ("rms_norm_eps: x", "rms_norm_eps"),
    ("rms_norm_eps: .inf", "rms_norm_eps"),
    ("rms_norm_eps: .nan", "rms_norm_eps"),
    ("rope_theta: inf", "rope_theta"),
    ("rope_theta: nan", "rope_theta"),
    ("rope_theta: -.inf", "rope_theta"),
])
def test_yaml_model_field_types(tmp_path, extra, field):
    path = model_yaml(tmp_path, extra)
    with pytest.raises(ConfigError) as info:
        load_model(path)
    assert f"field '{field}'" in str(info.value) and str(path) in str(info.value)


def test_yaml_float_given_as_string_is_parsed(tmp_path):
    # PyYAML (YAML 1.1) reads 1e-5 as the string '1e-5'.
    assert yaml.safe_load("x: 1e-5")["x"] == "1e-5"
    m = load_model(model_yaml(tmp_path, "rms_norm_eps: 1e-5\nrope_theta: 5e5"))
    assert m.norm.eps == 1e-5 and m.rope.theta == 500000.0


def test_yaml_optional_int_accepts_int_and_null(tmp_path):
    assert load_model(model_yaml(tmp_path, "sliding_window: 64")).attention.sliding_window == 64
    assert load_model(model_yaml(tmp_path, "sliding_window: null")).attention.sliding_window is None


@pytest.mark.parametrize("hint", [int | None, typing.Optional[int], typing.Union[int, None]])
def test_coerce_checks_both_union_spellings(hint):
    assert _coerce(3, hint, "f") == 3
    assert _coerce(None, hint, "f") is None
    for bad in (100.5, [1], "3", True):
        with pytest.raises(ConfigError, match="must be an integer"):
            _coerce(bad, hint, "f")


def test_coerce_float_union():
    assert _coerce("2.5", float | None, "f") == 2.5
    assert _coerce(None, float | None, "f") is None
    with pytest.raises(ConfigError, match="finite"):
        _coerce(float("inf"), float | None, "f")


def test_yaml_non_string_keys_are_unknown_fields(tmp_path):
    path = model_yaml(tmp_path, "1: 2")
    with pytest.raises(ConfigError, match="unknown field '1'"):
        load_model(path)


@pytest.mark.parametrize("extra", ["sliding_window: [1]", "rms_norm_eps: .inf"])
def test_cli_yaml_model_field_types(tmp_path, extra):
    path = model_yaml(tmp_path, extra)
    assert_one_line_error(run_cli("inspect", path), str(path))


# --- 3. Config files that are not UTF-8 ----------------------------------------------------

@pytest.mark.parametrize("name,loader", [
    ("model.yaml", load_model),
    ("config.json", load_model),
    ("fabric.yaml", load_fabric),
])
def test_non_utf8_config_is_a_config_error(tmp_path, name, loader):
    path = tmp_path / name
    path.write_bytes(b'{"name": "caf\xe9"}\n' if name.endswith(".json") else b"name: caf\xe9\n")
    with pytest.raises(ConfigError) as info:
        loader(path)
    assert "not UTF-8 text" in str(info.value) and str(path) in str(info.value)


@pytest.mark.slow
def test_cli_non_utf8_config(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_bytes(b"\xff\xfe{}")
    assert_one_line_error(run_cli("inspect", bad), "not UTF-8 text")
    assert_one_line_error(run_cli("inspect", tmp_path), "not UTF-8 text")
    fabric = tmp_path / "fabric.yaml"
    fabric.write_bytes(MESH8_YAML.read_bytes() + b"# \xff\n")
    assert_one_line_error(run_cli("compile", "tiny", "--fabric", fabric), "not UTF-8 text")


# --- 4. Fabric and cluster limits ----------------------------------------------------------

@pytest.mark.parametrize("field", ["clock_hz", "offwafer_bytes_per_s",
                                   "host_transfer_overhead_s"])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_fabric_float_fields_must_be_finite(field, value):
    mesh8 = load_fabric("mesh8")
    with pytest.raises(ConfigError, match=f"'{field}'"):
        with_overrides(mesh8, **{field: value})
    # validate() itself refuses them too, whatever built the spec.
    with pytest.raises(ConfigError, match=f"'{field}'.*finite"):
        dataclasses.replace(mesh8, **{field: value}).validate("test")


@pytest.mark.parametrize("field", ["width", "height"])
def test_fabric_sides_have_an_upper_limit(field):
    mesh8 = load_fabric("mesh8")
    assert with_overrides(mesh8, **{field: MAX_SIDE}).pes == MAX_SIDE * 8
    with pytest.raises(ConfigError, match=f"'{field}' must be <= {MAX_SIDE}"):
        with_overrides(mesh8, **{field: MAX_SIDE + 1})


def test_fabric_yaml_with_inf(tmp_path):
    path = tmp_path / "fabric.yaml"
    path.write_text(MESH8_YAML.read_text().replace("clock_hz: 1.1e+9", "clock_hz: .inf"))
    with pytest.raises(ConfigError, match="'clock_hz' must be a finite number"):
        load_fabric(path)


def test_shipped_presets_are_within_the_limits():
    for name in preset_names("fabrics"):
        fabric = load_fabric(name)
        assert fabric.width <= MAX_SIDE and fabric.height <= MAX_SIDE


def test_cluster_systems_limit():
    mesh8 = load_fabric("mesh8")
    assert ClusterSpec(mesh8, MAX_SYSTEMS).systems == MAX_SYSTEMS
    # The library names its parameter; the command line names the flag (below).
    with pytest.raises(ConfigError, match="`systems` must be at most"):
        ClusterSpec(mesh8, MAX_SYSTEMS + 1)
    with pytest.raises(ConfigError, match="`systems`"):
        ClusterSpec(mesh8, 0)


@pytest.mark.parametrize("args,needle", [
    (["--systems", "100000"], "--systems must be at most 64"),
    (["--set", "clock_hz=inf"], "'clock_hz'"),
    (["--set", "clock_hz=nan"], "'clock_hz'"),
    (["--set", "width=100000"], "'width' must be <= 4096"),
    (["--set", "height=5000"], "'height' must be <= 4096"),
])
def test_cli_fabric_and_cluster_limits(tmp_path, args, needle):
    run = tmp_path / "run"
    proc = run_cli("compile", "tiny", "--fabric", "mesh8", *args, "-o", run)
    assert_one_line_error(proc, needle)
    assert not run.exists()


# --- 5. Compile options --------------------------------------------------------------------

def test_seed_and_anneal_steps_must_not_be_negative():
    assert CompileOptions(seed=0, anneal_steps=0).seed == 0
    with pytest.raises(UserError, match="`seed`"):
        CompileOptions(seed=-1)
    with pytest.raises(UserError, match="anneal_steps"):
        CompileOptions(anneal_steps=-1)


def test_cli_negative_seed():
    assert_one_line_error(run_cli("compile", "tiny", "--fabric", "mesh8", "--seed", "-1"),
                          "--seed must be 0 or more")


# --- 6. Run directories --------------------------------------------------------------------

def _write_one(tmp: Path) -> None:
    (tmp / "a.txt").write_text("a")


def test_run_dir_under_a_file_is_a_user_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for target in (blocker / "run", blocker / "deeper" / "run"):
        with pytest.raises(UserError) as info:
            write_run_dir(target, _write_one)
        message = str(info.value)
        assert message.startswith(f"cannot create run directory {target}:")
        assert "not a directory" in message and "\n" not in message
    assert blocker.read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_run_dir_that_is_a_file_is_a_user_error(tmp_path):
    target = tmp_path / "run"
    target.write_text("x")
    with pytest.raises(UserError, match="not a directory"):
        write_run_dir(target, _write_one)
    assert target.read_text() == "x"


def test_run_dir_parent_that_cannot_be_created(tmp_path, monkeypatch):
    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    target = tmp_path / "a" / "b" / "run"
    with pytest.raises(UserError, match=r"cannot create run directory .*: Permission denied"):
        write_run_dir(target, _write_one)


def test_run_dir_failed_write_leaves_nothing(tmp_path):
    def fail(tmp: Path) -> None:
        (tmp / "half.txt").write_text("half")
        raise OSError(28, "No space left on device")

    target = tmp_path / "run"
    with pytest.raises(UserError, match="No space left on device"):
        write_run_dir(target, fail)
    assert list(tmp_path.iterdir()) == []


def test_run_dir_mode_is_0755(tmp_path):
    target = write_run_dir(tmp_path / "run", _write_one)
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert (target / "a.txt").read_text() == "a"
    # An existing empty directory is replaced the same way.
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    write_run_dir(empty, _write_one)
    assert stat.S_IMODE(empty.stat().st_mode) == 0o755


def test_cli_output_under_a_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = run_cli("compile", "tiny", "--fabric", "mesh8", "--region", "8x8",
                   "-o", blocker / "run")
    assert_one_line_error(proc, "cannot create run directory", "not a directory")
    assert proc.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


# --- 7. Partition messages -----------------------------------------------------------------

def test_too_big_message_says_how_much_sram_holds_weights():
    wse2 = load_fabric("wse2")
    with pytest.raises(CompileError) as info:
        compile_model(load_model("llama-3.1-70b"), ClusterSpec(wse2, 4))
    message = str(info.value)
    capacity = round(4 * wafer_weight_capacity(wse2) / 1e9)
    assert message.startswith("llama-3.1-70b needs 141 GB of weights; 4 x wse2 holds 147 GB "
                              "of SRAM")
    assert f"of which {capacity} GB can hold weights" in message
    assert capacity < 141
    assert message.endswith("use `systems=5` or more, or store them narrower: with matrices "
                            "in fp8 (`weight_format=fp8`) they need 3")


def test_cli_too_big_message():
    line = assert_one_line_error(run_cli("compile", "llama-3.1-70b", "--fabric", "wse2",
                                         "--systems", "4"),
                                 "can hold weights", "use --systems 5 or more")
    assert line.endswith("use --systems 5 or more, or store them narrower: with matrices in "
                         "fp8 (--weight-format fp8) they need 3")


def test_disaggregated_with_no_fitting_share_says_to_split_systems():
    wse2 = load_fabric("wse2")
    model = load_model("llama-3.1-8b")
    # Verify the premise: no share of a wse2 wafer holds the model in both parts.
    min_width = _min_part_width(model, wse2)
    assert 2 * min_width > wse2.width
    assert _share_range(wse2.width, min_width) is None
    with pytest.raises(CompileError) as info:
        partition(model, ClusterSpec(wse2, 1), CompileOptions(plan="disaggregated"))
    message = str(info.value)
    assert "larger share" not in message
    assert "no `prefill_share` fits both parts" in message
    assert message.endswith("use `prefill_systems=1` and `systems=2` (or more systems)")
    # The advice holds (by capacity): one whole wafer per role.
    plans = partition(model, ClusterSpec(wse2, 2),
                      CompileOptions(plan="disaggregated", prefill_systems=1))
    assert sorted(p.role for p in plans) == ["decode", "prefill"]


def test_disaggregated_no_fitting_share_with_more_systems():
    wse2 = load_fabric("wse2")
    with pytest.raises(CompileError, match="use `prefill_systems` between 1 and 2$"):
        partition(load_model("llama-3.1-8b"), ClusterSpec(wse2, 3),
                  CompileOptions(plan="disaggregated"))


def test_disaggregated_names_the_shares_that_fit():
    wse2 = load_fabric("wse2")
    model = load_model("qwen2.5-7b")
    cluster = ClusterSpec(wse2, 1)
    for share in (0.3, 0.7):
        with pytest.raises(CompileError) as info:
            partition(model, cluster, CompileOptions(plan="disaggregated",
                                                     prefill_share=share))
        assert "use `prefill_share` between 0.48 and 0.52" in str(info.value)
    # Every share in the named range passes the capacity check, the ones just outside fail.
    min_width = _min_part_width(model, wse2)
    lo, hi = _share_range(wse2.width, min_width)
    for share in (lo, (lo + hi) / 2, hi):
        assert _share_fits(share, wse2.width, min_width)
        partition(model, cluster, CompileOptions(plan="disaggregated", prefill_share=share))
    for share in (lo - 0.01, hi + 0.01):
        assert not _share_fits(share, wse2.width, min_width)
        with pytest.raises(CompileError):
            partition(model, cluster, CompileOptions(plan="disaggregated",
                                                     prefill_share=share))


def test_min_part_width_is_the_fewest_columns():
    for fabric_name in ("wse2", "wse3"):
        fabric = load_fabric(fabric_name)
        for model_name in ("llama-3.1-8b", "qwen2.5-7b", "llama-3.2-1b", "tiny"):
            model = load_model(model_name)
            w = _min_part_width(model, fabric)
            per_column = fabric.height * fabric.usable_bytes_per_pe * 0.95
            assert model.weight_bytes() <= w * per_column * (1 + 1e-12)
            assert w == 1 or model.weight_bytes() > (w - 1) * per_column * (1 - 1e-12)


def test_region_with_a_multi_wafer_model_is_refused():
    wse3 = load_fabric("wse3")
    with pytest.raises(CompileError, match="`region=100x100` applies only to models that fit "
                                           "one wafer"):
        partition(load_model("llama-3.1-70b"), ClusterSpec(wse3, 4),
                  CompileOptions(region=(100, 100)))


def test_cli_region_with_a_multi_wafer_model(tmp_path):
    run = tmp_path / "run"
    proc = run_cli("compile", "llama-3.1-70b", "--systems", "4", "--region", "100x100",
                   "-o", run)
    assert_one_line_error(proc, "--region", "fit one wafer")
    assert not run.exists()


def test_whole_wafer_part_fits_whenever_one_wafer_suffices():
    """The single-wafer capacity check cannot fail for a whole wafer: a model that needs one
    wafer (wafers_needed == 1) fits the full-width part, so colocated plans and whole-system
    roles never hit it."""
    for fabric_name in preset_names("fabrics"):
        fabric = load_fabric(fabric_name)
        for model_name in preset_names("models"):
            model = load_model(model_name)
            if wafers_needed(model, fabric) != 1 or model.is_moe:
                continue  # (experts are refused by name before partitioning: test_moe)
            cluster = ClusterSpec(fabric, 2)
            assert partition(model, cluster, CompileOptions())
            assert partition(model, cluster, CompileOptions(plan="disaggregated",
                                                            prefill_systems=1))


def test_default_share_is_used_in_the_range_check():
    assert 0 < DEFAULT_PREFILL_SHARE < 1
    wse3 = load_fabric("wse3")
    model = load_model("llama-3.1-8b")
    lo, hi = _share_range(wse3.width, _min_part_width(model, wse3))
    assert lo <= DEFAULT_PREFILL_SHARE <= hi


def test_library_errors_name_parameters_and_the_cli_names_flags():
    """One message, two readers: the Python API's parameter names, the command's flags."""
    from wse_emu.cli.main import in_flags
    flags = {"systems": "--systems", "prefill_share": "--prefill-share"}
    assert in_flags("use `systems=5` or more", flags) == "use --systems 5 or more"
    assert in_flags("no `prefill_share` fits", flags) == "no --prefill-share fits"
    # A parameter the command has no flag for keeps its name, without the quotes.
    assert in_flags("use `prefill_systems=1`", flags) == "use prefill_systems=1"
    proc = run_cli("compile", "tiny", "--fabric", "mesh8", "--plan", "colocated",
                   "--prefill-share", "0.5")
    assert_one_line_error(proc, "--prefill-share and --prefill-systems need --plan "
                                "disaggregated")


@pytest.mark.parametrize("command", [
    ["compile", "tiny", "--fabric", "mesh8", "--region", "8x8"],
    ["run", "tiny", "--fabric", "mesh8", "--region", "8x8", "--phase", "decode", "--batch", "1",
     "--context", "64"],
    ["inspect", "tiny"],
    ["serve", "tiny", "--fabric", "mesh8", "--region", "8x8", "--workload", "chat",
     "--requests", "5"],
    ["experiment", "disagg", "tiny", "--fabric", "mesh8", "--workload", "chat",
     "--ttft-slo", "1", "--tpot-slo", "0.005"],
])
def test_every_command_refuses_an_unusable_run_dir_before_any_work(tmp_path, monkeypatch,
                                                                      command):
    """A folder that is not empty is refused up front: nothing is compiled or simulated (a
    compile of Llama-3.1-8B took 16 s before the folder was refused)."""
    import importlib

    import wse_emu.models.hf_config
    import wse_emu.models.spec
    import wse_emu.program.format
    from wse_emu.cli.commands import COMMANDS
    from wse_emu.cli.main import main

    def no_work(*args, **kwargs):
        raise AssertionError("work began before the run directory was checked")
    # Every command's work begins by reading its model. The command's modules are imported
    # first, so that none binds the stand-in by name and keeps it after this test.
    importlib.import_module(COMMANDS[command[0]][0])
    monkeypatch.setattr(wse_emu.models.spec, "model_from_dict", no_work)
    full = tmp_path / "full"
    full.mkdir()
    (full / "kept.txt").write_text("x")
    assert main(["--quiet", *command, "-o", str(full)]) == 2
    assert [p.name for p in full.iterdir()] == ["kept.txt"]


# --- Positions: a context or a request past the model's max_position_embeddings -----------

def short_model(tmp_path: Path, positions: int = 512) -> Path:
    """The tiny preset with only ``positions`` positions."""
    data = yaml.safe_load((preset_dir("models") / "tiny.yaml").read_text())
    data.update(name="short", max_position_embeddings=positions)
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("command,needle", [
    (["run", "MODEL", "--fabric", "mesh16", "--context", "4000"],
     "a decode step at --context 4000 needs 4,000 positions; short has 512"),
    (["run", "MODEL", "--fabric", "mesh16", "--phase", "prefill", "--tokens", "513"],
     "a prompt of --tokens 513 needs 513 positions"),
    (["run", "MODEL", "--fabric", "mesh16", "--plan", "disaggregated", "--phase", "handoff",
      "--tokens", "600"], "a prompt of --tokens 600 needs 600 positions"),
    (["inspect", "MODEL", "--context", "4000"], "needs 4,000 positions"),
    (["serve", "MODEL", "--fabric", "mesh16", "--workload", "chat", "--requests", "100"],
     "of 100 requests run past short's 512 positions (max_position_embeddings)"),
    (["experiment", "disagg", "MODEL", "--fabric", "mesh16", "--workload", "chat",
      "--requests", "20", "--ttft-slo", "1", "--tpot-slo", "0.01"],
     "requests run past short's 512 positions"),
    (["generate", "MODEL", "--fabric", "mesh16", "--prompt-ids", "1,2",
      "--max-new-tokens", "600"], "601 positions; short has 512"),
], ids=["run-decode", "run-prefill", "run-handoff", "inspect", "serve", "experiment",
        "generate"])
@pytest.mark.slow
def test_every_command_refuses_positions_past_the_model(tmp_path, command, needle):
    """A context the model's rotary embedding was never defined for is refused by name, in
    seconds, before any step is timed (``serve tiny`` once served 81 of 100 prompts longer
    than its 512 positions without a word)."""
    model = short_model(tmp_path)
    proc = run_cli(*[str(model) if a == "MODEL" else a for a in command], cwd=tmp_path)
    assert_one_line_error(proc, needle, "max_position_embeddings")


def test_the_last_position_is_allowed(tmp_path):
    """The bound is inclusive: a decode attending over all 512 positions, a 512-token prompt,
    and requests whose last decode step feeds position 511, all run."""
    from wse_emu import api
    from wse_emu.serving.serve import position_shortfall
    from wse_emu.serving.workload import Requests

    model = load_model(str(short_model(tmp_path)))
    program = compile_model(model, ClusterSpec(load_fabric("mesh16")), CompileOptions())
    assert api.run(program, "decode", context=512).step_seconds > 0
    assert api.run(program, "prefill", tokens=512).step_seconds > 0
    with pytest.raises(UserError, match="`context=513`"):
        api.run(program, "decode", context=513)

    def requests(prompt, output):
        n = len(prompt)
        return Requests(np.zeros(n), np.asarray(prompt), np.asarray(output), np.arange(n),
                        np.zeros(n, int), np.zeros(n))
    assert position_shortfall(requests([500, 1], [13, 512]), model) is None
    message = position_shortfall(requests([500, 1, 600], [14, 1, 1]), model)
    assert message.startswith("2 of 3 requests run past short's 512 positions")
    assert "the longest, 600 prompt and 1 output tokens, needs 600" in message


def test_a_preset_name_is_the_preset_whatever_the_working_folder_holds(tmp_path, monkeypatch):
    """A run directory or a file named like a preset (``-o wse3``) does not shadow it; the
    file is still read when named as a path."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "wse3").write_text("not: [a fabric")
    (tmp_path / "chat").mkdir()
    assert load_fabric("wse3") == load_fabric(preset_dir("fabrics") / "wse3.yaml")
    assert load_workload("chat").name == "chat"
    with pytest.raises(ConfigError, match="wse3"):
        load_fabric("./wse3")


@pytest.mark.parametrize("error, words", [
    (WorkerLost("a worker process ended while running a job (exit code -9; out of memory?)"),
     "out of memory?"),
    (MemoryError(), "out of memory"),
])
def test_a_lost_worker_or_memory_is_one_line_and_exit_1(monkeypatch, capsys, error, words):
    """What the machine could not finish is not the input's fault (exit 1, not 2), and one
    line says what ran out, with no traceback."""
    from wse_emu.cli import inspect_cmd
    from wse_emu.cli.main import main

    def run(args):
        raise error

    monkeypatch.setattr(inspect_cmd, "run", run)  # read when the parser is built
    assert main(["inspect", "tiny"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("wse-emu: failed: ") and words in err[0]

