"""Input paths that are not regular files (a FIFO nobody writes to, a device, a directory) are
refused by name before anything opens them, by every reader of a user's file; files saved with
a UTF-8 byte-order mark read as they would without it.

A FIFO with no writer blocks whoever opens it for reading, for ever (native readers such as
safetensors' even through a signal): each command and each library call given a FIFO runs in a
subprocess with a timeout, so that a reader that opens one fails the test instead of hanging it.
"""

import json
import os
import subprocess
import sys

import pytest
from helpers import HF_CONFIGS, assert_one_line_error

from wse_emu import api
from wse_emu.errors import ConfigError
from wse_emu.models.load import load_model
from wse_emu.program.format import WaferProgram
from wse_emu.serving.workload import load_workload
from wse_emu.util.configfile import preset_dir, read_text, read_yaml_mapping, regular_file

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")

LIMIT_S = 60  # a refusal takes the time to start Python; a blocked open never returns


def fifo(path):
    os.mkfifo(path)
    return path


def library(call: str, *paths) -> str:
    """What the library call ``call`` (its arguments ``paths`` as p0, p1, ...) raised, as
    'ConfigError: message', run in a fresh Python given at most LIMIT_S."""
    code = "\n".join([
        "import sys", "from pathlib import Path", "from wse_emu import api",
        "from wse_emu.errors import UserError", "from wse_emu.models.load import load_model",
        "from wse_emu.program.format import WaferProgram",
        "from wse_emu.models.weights import load_checkpoint, tokenizer_for",
        *(f"p{i} = Path(sys.argv[{i + 1}])" for i in range(len(paths))),
        "try:", f"    {call}", "except UserError as exc:",
        "    print(type(exc).__name__ + ': ' + str(exc))"])
    proc = subprocess.run([sys.executable, "-c", code, *map(str, paths)], capture_output=True,
                          text=True, timeout=LIMIT_S)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def cli(*args, stdin=subprocess.DEVNULL):
    """``wse-emu ARGS``, given at most LIMIT_S (TimeoutExpired, not a hang, if it blocks)."""
    return subprocess.run([sys.executable, "-m", "wse_emu.cli.main", *map(str, args)],
                          capture_output=True, text=True, timeout=LIMIT_S, stdin=stdin)


def test_the_shared_check_names_what_the_path_is(tmp_path):
    assert regular_file(tmp_path / "missing.yaml") == tmp_path / "missing.yaml"  # reader says
    (tmp_path / "plain.yaml").write_text("a: 1\n")
    assert regular_file(tmp_path / "plain.yaml") == tmp_path / "plain.yaml"
    for path, kind in [(fifo(tmp_path / "pipe.yaml"), "a FIFO"),
                       ("/dev/zero", "a character device"), (tmp_path, "a directory")]:
        with pytest.raises(ConfigError, match=rf"^{path}: not a regular file \({kind}\)$"):
            regular_file(path)
    with pytest.raises(ConfigError, match="not a file name"):
        regular_file("a\x00b.yaml")


@pytest.mark.parametrize("make,needle", [
    (lambda d: fifo(d / "t.csv"), "not a regular file (a FIFO)"),
    (lambda d: "/dev/zero", "/dev/zero: not a regular file (a character device)"),
    (lambda d: (d / "folder").mkdir() or d / "folder", "not a regular file (a directory)"),
])
def test_a_trace_that_is_not_a_file_is_refused_at_once(tmp_path, make, needle):
    path = make(tmp_path)
    proc = cli("serve", "tiny", "--fabric", "mesh8", "--trace", path, "--requests", "5",
               "--cache-dir", tmp_path / "cache")
    assert_one_line_error(proc, needle)
    for requests in (None, 5):  # the whole trace counted, or its first rows
        said = library(f"api.check_serving(trace=p0, requests={requests})", path)
        assert said.startswith("ConfigError: ") and said.endswith(needle)


def test_stdin_as_a_pipe_is_refused_not_waited_on(tmp_path):
    """/dev/stdin of a command whose input is a pipe nobody writes to."""
    with subprocess.Popen(["sleep", str(LIMIT_S)], stdout=subprocess.PIPE) as writer:
        try:
            proc = cli("serve", "tiny", "--fabric", "mesh8", "--trace", "/dev/stdin",
                       "--cache-dir", tmp_path, stdin=writer.stdout)
        finally:
            writer.kill()
    assert_one_line_error(proc, "/dev/stdin: not a regular file (a FIFO)")


@pytest.mark.parametrize("command", [
    lambda p, d: ["inspect", p],  # a model YAML
    lambda p, d: ["inspect", "tiny", "--fabric", p],  # a fabric YAML
    lambda p, d: ["serve", "tiny", "--fabric", "mesh8", "--workload", p, "--cache-dir", d],
    lambda p, d: ["sweep", p, "-o", d / "out"],  # a sweep spec
])
def test_every_yaml_reader_refuses_a_fifo(tmp_path, command):
    pipe = fifo(tmp_path / "config.yaml")
    proc = cli(*command(pipe, tmp_path))
    assert_one_line_error(proc, f"{pipe}: not a regular file (a FIFO)")
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_a_hugging_face_config_that_is_a_fifo_is_refused(tmp_path):
    fifo(tmp_path / "config.json")
    assert_one_line_error(cli("inspect", tmp_path), "config.json: not a regular file (a FIFO)")
    assert library("load_model(p0)", tmp_path) == \
        f"ConfigError: {tmp_path / 'config.json'}: not a regular file (a FIFO)"


def test_a_checkpoints_files_that_are_fifos_are_refused(tmp_path):
    config = json.loads((HF_CONFIGS / "llama-3.2-1b" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    fifo(tmp_path / "model.safetensors")
    assert library("load_checkpoint(p0)", tmp_path) == \
        f"ConfigError: {tmp_path / 'model.safetensors'}: not a regular file (a FIFO)"
    fifo(tmp_path / "tokenizer.json")
    assert library("tokenizer_for(p0)", tmp_path) == \
        f"ConfigError: {tmp_path / 'tokenizer.json'}: not a regular file (a FIFO)"


@pytest.mark.parametrize("name", ["metrics.json", "program.json", "counters.npz"])
def test_a_run_directory_holding_a_fifo_is_refused_by_viz(tmp_path, name):
    run = tmp_path / "run"
    run.mkdir()
    if name == "counters.npz":  # read beside a program or metrics: give it metrics to read
        (run / "metrics.json").write_text("{}")
    fifo(run / name)
    assert_one_line_error(cli("viz", run), f"{name}: not a regular file (a FIFO)")


def test_a_program_whose_arrays_are_a_fifo_is_refused(tmp_path):
    api.compile("tiny", "mesh8").save(tmp_path)
    assert WaferProgram.load(tmp_path).model.name == "tiny"
    (tmp_path / "program.npz").unlink()
    fifo(tmp_path / "program.npz")
    assert library("WaferProgram.load(p0)", tmp_path) == \
        f"ConfigError: {tmp_path / 'program.npz'}: not a regular file (a FIFO)"


# --- a byte-order mark ------------------------------------------------------------------------

BOM = b"\xef\xbb\xbf"


def test_yaml_and_json_with_a_byte_order_mark_read(tmp_path):
    workload = tmp_path / "w.yaml"
    workload.write_bytes(BOM + b"version: 1\nname: bom\nrequests: 3\n")
    assert load_workload(workload).name == "bom"
    fabric = tmp_path / "f.yaml"
    fabric.write_bytes(BOM + (preset_dir("fabrics") / "mesh8.yaml").read_bytes())
    assert read_yaml_mapping(fabric) == read_yaml_mapping(preset_dir("fabrics") / "mesh8.yaml")
    config = tmp_path / "config.json"
    config.write_bytes(BOM + (HF_CONFIGS / "llama-3.2-1b" / "config.json").read_bytes())
    assert load_model(config).num_layers == load_model(HF_CONFIGS / "llama-3.2-1b").num_layers
    assert not read_text(config).startswith("\ufeff")
