"""Fabric and model presets load with their documented values; bad files fail clearly."""

import subprocess
import sys

import pytest

from wse_emu.errors import ConfigError
from wse_emu.hardware.fabric import (
    DEFAULT_QUEUE_WAVELETS,
    DEFAULT_VIRTUAL_CHANNELS,
    ClusterSpec,
    load_fabric,
    with_overrides,
)
from wse_emu.models.layer import ops_by_name
from wse_emu.models.load import load_model
from wse_emu.util.configfile import preset_dir, preset_names, read_yaml_mapping


def test_wafer_presets_match_hardware_md():
    wse2, wse3 = load_fabric("wse2"), load_fabric("wse3")
    assert (wse2.width, wse2.height) == (750, 994)
    assert (wse3.width, wse3.height) == (755, 1170)
    for f in (wse2, wse3):
        assert f.sram_bytes_per_pe == 48 * 1024
        assert f.link_bytes_per_cycle == 4
        assert (f.colors_total, f.colors_reserved) == (24, 6)
        assert f.colors_available == 18
        assert f.offwafer_bytes_per_s == pytest.approx(1.2e12 / 8)
    assert (wse2.fp16_flops_per_cycle, wse3.fp16_flops_per_cycle) == (8, 16)
    # HARDWARE.md consistency check: 48 KiB x 883,350 PEs is about 43 GB on the user rectangle.
    assert wse3.sram_bytes_total == pytest.approx(43.4e9, rel=0.01)


def test_small_meshes_exist_for_tests():
    names = preset_names("fabrics")
    for k in (8, 16, 32, 64, 128):
        assert f"mesh{k}" in names
        assert load_fabric(f"mesh{k}").pes == k * k


def test_uncertain_values_are_parameters():
    wse3 = load_fabric("wse3")
    slower = with_overrides(wse3, clock_hz=850e6, hop_latency_cycles=2)
    assert slower.clock_hz == 850e6 and slower.hop_latency_cycles == 2
    assert slower.width == wse3.width


def test_router_fields_are_set_in_every_preset_with_a_comment():
    """virtual_channels and queue_wavelets are stated in every preset (the engines' former
    constants, 4 and 8), each under a comment citing HARDWARE.md or calling it an
    assumption."""
    assert (DEFAULT_VIRTUAL_CHANNELS, DEFAULT_QUEUE_WAVELETS) == (4, 8)
    for name in preset_names("fabrics"):
        text = (preset_dir("fabrics") / f"{name}.yaml").read_text()
        data = read_yaml_mapping(preset_dir("fabrics") / f"{name}.yaml")
        assert (data["virtual_channels"], data["queue_wavelets"]) == (4, 8), name
        lines = text.splitlines()
        for field in ("virtual_channels", "queue_wavelets"):
            at = next(i for i, line in enumerate(lines) if line.startswith(f"{field}:"))
            first = at
            while first > 0 and lines[first - 1].startswith("#"):
                first -= 1
            comment = " ".join(lines[first:at])
            assert "HARDWARE.md 'Router buffers'" in comment and "assumption" in comment, name


def test_a_fabric_file_without_the_router_fields_takes_the_defaults(tmp_path):
    text = (preset_dir("fabrics") / "mesh8.yaml").read_text()
    kept = [line for line in text.splitlines()
            if not line.startswith(("virtual_channels:", "queue_wavelets:"))]
    path = tmp_path / "old.yaml"
    path.write_text("\n".join(kept) + "\n")
    old = load_fabric(path)
    assert (old.virtual_channels, old.queue_wavelets) == (4, 8)
    assert old == load_fabric("mesh8")


@pytest.mark.parametrize("field, value, allowed", [
    ("virtual_channels", 0, "must be between 1 and 32"),
    ("virtual_channels", 33, "must be between 1 and 32"),
    ("virtual_channels", -4, "must be between 1 and 32"),
    ("queue_wavelets", 0, "must be between 1 and 1024"),
    ("queue_wavelets", 1025, "must be between 1 and 1024"),
    ("queue_wavelets", "8", "must be an integer"),
    ("virtual_channels", 2.5, "must be an integer"),
])
def test_router_fields_out_of_range_are_refused_by_name(tmp_path, field, value, allowed):
    text = (preset_dir("fabrics") / "mesh8.yaml").read_text()
    path = tmp_path / "routers.yaml"
    shown_value = f"'{value}'" if isinstance(value, str) else value
    path.write_text("\n".join(f"{field}: {shown_value}" if line.startswith(f"{field}:")
                              else line for line in text.splitlines()) + "\n")
    with pytest.raises(ConfigError, match=f"routers.yaml: field '{field}' {allowed}"):
        load_fabric(path)
    if not isinstance(value, (str, float)):
        with pytest.raises(ConfigError, match=f"'{field}' {allowed}, got {value}"):
            with_overrides(load_fabric("mesh8"), **{field: value})


def test_router_fields_at_the_ends_of_their_ranges_load():
    mesh8 = load_fabric("mesh8")
    for vcs, depth in ((1, 1), (32, 1024)):
        spec = with_overrides(mesh8, virtual_channels=vcs, queue_wavelets=depth)
        assert (spec.virtual_channels, spec.queue_wavelets) == (vcs, depth)


@pytest.mark.parametrize("name,params", [
    ("llama-3.2-1b", 1_235_814_400),
    ("llama-3.1-8b", 8_030_261_248),
    ("llama-3.1-70b", 70_553_706_496),
    ("qwen2.5-7b", 7_615_616_512),
    ("qwen2.5-0.5b", 494_032_768),
    ("mistral-7b-v0.3", 7_248_023_552),
])
def test_model_presets_have_published_parameter_counts(name, params):
    assert load_model(name).params() == params


def test_grouped_query_attention_shapes():
    m = load_model("llama-3.1-70b")
    assert m.attention.group_size == 8
    assert ops_by_name(m)["k_proj"].matrix == (8192, 1024)
    assert m.kv_bytes_per_token() == 80 * 2 * 1024 * 2


def test_bad_yaml_names_file_and_field(tmp_path):
    bad = tmp_path / "f.yaml"
    bad.write_text("version: 1\nname: x\nwidth: [1\n")
    with pytest.raises(ConfigError, match="malformed YAML"):
        load_fabric(bad)
    wrong = tmp_path / "g.yaml"
    wrong.write_text("version: 1\nname: g\nwidth: eight\n")
    with pytest.raises(ConfigError, match="g.yaml: field 'width' must be an integer"):
        load_fabric(wrong)


def test_unknown_field_and_version(tmp_path):
    text = load_model("tiny").to_dict()
    path = tmp_path / "m.yaml"
    path.write_text("version: 1\n" + "\n".join(f"{k}: {v}" for k, v in text.items()
                                                if v is not None and k != "source")
                    + "\nhiden_size: 3\n")
    with pytest.raises(ConfigError, match="unknown field 'hiden_size'"):
        load_model(path)
    path.write_text("version: 9\nname: m\n")
    with pytest.raises(ConfigError, match="'version' must be 1"):
        load_model(path)


def test_unknown_names_list_the_choices():
    with pytest.raises(ConfigError, match="llama-3.1-8b"):
        load_model("gpt-5")
    with pytest.raises(ConfigError, match="wse3"):
        load_fabric("wse9")


def test_cluster_needs_a_system():
    with pytest.raises(ConfigError):
        ClusterSpec(load_fabric("wse3"), 0)


BOMB = "".join(f"{name}: &{name} [{', '.join([prev] * 10)}]\n" for name, prev in zip(
    "abcdefgh", ['"x"', "*a", "*b", "*c", "*d", "*e", "*f", "*g"]))


@pytest.mark.parametrize("text, needle", [
    (BOMB + "name: *h\n", "aliases expand to more than 100,000 values"),  # 10**8 values
    ("name: " + "[" * 70 + "1" + "]" * 70 + "\n", "nested more than 64 deep"),
    ("name: " + "[" * 5000 + "1" + "]" * 5000 + "\n", "malformed YAML"),
])
def test_yaml_bombs_are_refused_before_any_value_is_built(tmp_path, text, needle):
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        read_yaml_mapping(path)


def test_yaml_aliases_within_bounds_read_as_before(tmp_path):
    path = tmp_path / "aliased.yaml"
    path.write_text("base: &base {a: 1, b: [1, 2]}\nother: *base\n")
    assert read_yaml_mapping(path) == {"base": {"a": 1, "b": [1, 2]},
                                       "other": {"a": 1, "b": [1, 2]}}


def test_cli_yaml_bomb_is_one_line(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB + "name: *h\n")
    proc = subprocess.run([sys.executable, "-m", "wse_emu.cli.main", "inspect", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "aliases expand" in proc.stderr


@pytest.mark.parametrize("kind, text", [
    ("model", "version: 1\nname: m\n" + "k" * 5000 + ": 1\n"),
    ("model", (preset_dir("models") / "tiny.yaml").read_text().replace(
        "hidden_size: 64", "hidden_size: '" + "6" * 5000 + "'")),
    ("model", (preset_dir("models") / "tiny.yaml").read_text().replace(
        "family: llama", "family: " + "x" * 5000)),
    ("fabric", (preset_dir("fabrics") / "mesh8.yaml").read_text() + "z" * 5000 + ": 1\n"),
    ("sweep", "version: 1\nname: s\npoint: run\n" + "q" * 5000 + ": 1\naxes: {a: [1]}\n"),
    ("sweep", "version: 1\nname: s\npoint: run\nbase: {model: tiny}\naxes: {"
     + "b" * 5000 + ": [1]}\n"),
    ("sweep", "version: 1\nname: s\npoint: run\nbase: {model: tiny}\naxes: {fabric."
     + "c" * 5000 + ": [1]}\n"),
])
def test_error_messages_quote_long_values_cut_short(tmp_path, kind, text):
    """A message quotes what it was given, but a 5,000-character key or value is cut, so the
    one line stays a line (an unknown key was once printed whole)."""
    path = tmp_path / f"{kind}.yaml"
    path.write_text(text)
    command = {"model": ["inspect", str(path)],
               "fabric": ["inspect", "tiny", "--fabric", str(path)],
               "sweep": ["sweep", str(path), "-o", str(tmp_path / "out"), "--workers", "1"]}
    proc = subprocess.run([sys.executable, "-m", "wse_emu.cli.main", *command[kind]],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[:300]
    assert len(proc.stderr) < 400 + len(str(path)), proc.stderr[:400]
