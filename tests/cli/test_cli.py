"""The command line: outputs, JSON keys, and one-line errors with exit code 2."""

import json
import subprocess
import sys

import pytest

from wse_emu.cli.main import main


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "wse_emu.cli.main", *args],
                          capture_output=True, text=True)


def test_compile_json_reports_the_required_keys(capsys):
    assert main(["compile", "tiny", "--fabric", "mesh8", "--region", "8x8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("regions", "stages", "pes_used", "weight_bytes_total", "sram_bytes_max_per_pe",
                "kv_capacity_tokens", "bounds", "placement"):
        assert key in out
    assert out["bounds"]["mixed0"]["decode"]["bottleneck_cycles"] > 0
    assert out["placement"]["8x8"]["optimized"]["bytes_hops_per_token"] <= \
        out["placement"]["8x8"]["baseline"]["bytes_hops_per_token"]


def test_compile_writes_a_run_directory(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["compile", "tiny", "--fabric", "mesh8", "-o", str(run)]) == 0
    assert {p.name for p in run.iterdir()} == {"program.json", "program.npz", "config.yaml",
                                               "summary.json"}
    assert "wrote" in capsys.readouterr().out


def test_inspect_text_and_json(capsys):
    assert main(["inspect", "llama-3.1-8b", "--phase", "prefill", "--tokens", "4096"]) == 0
    text = capsys.readouterr().out
    assert "L0.q_proj" in text and "compute" in text
    assert main(["inspect", "tiny", "--json", "--phase", "decode", "--batch", "4"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["workload"]["batch"] == 4 and len(data["layers"]) == 2


@pytest.mark.parametrize("args,needle", [
    (["compile", "llama-3.1-70b", "--fabric", "wse3"], "use --systems 4 or more"),
    (["compile", "no-such-model"], "unknown model"),
    (["compile", "tiny", "--fabric", "no-such-fabric"], "unknown fabric"),
    (["compile", "tiny", "--region", "banana"], "--region must look like WxH"),
    (["inspect", "tiny", "--tokens", "0", "--phase", "prefill"], "--tokens must be at least 1"),
    (["compile", "tiny", "--plan", "sideways"], "invalid choice"),
])
def test_errors_are_one_line_and_exit_2(args, needle):
    proc = run_cli(*args)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr


def test_failed_compile_writes_nothing(tmp_path):
    run = tmp_path / "run"
    proc = run_cli("compile", "llama-3.1-70b", "-o", str(run))
    assert proc.returncode == 2
    assert not run.exists()


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "llama-3.1-70b" in out and "wse3" in out


def test_uncertain_fabric_values_can_be_overridden(capsys):
    assert main(["inspect", "tiny", "--set", "sram_read_bytes_per_cycle=32", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ridge_flop_per_byte"] == 0.5
    assert main(["compile", "tiny", "--fabric", "mesh8", "--region", "8x8", "--json",
                 "--set", "clock_hz=850e6"]) == 0
    slow = json.loads(capsys.readouterr().out)["bounds"]["mixed0"]["decode"]
    assert main(["compile", "tiny", "--fabric", "mesh8", "--region", "8x8", "--json"]) == 0
    fast = json.loads(capsys.readouterr().out)["bounds"]["mixed0"]["decode"]
    assert slow["bottleneck_cycles"] == fast["bottleneck_cycles"]
    assert slow["pipeline_latency_s"] == pytest.approx(fast["pipeline_latency_s"] * 1.1e9 / 850e6)


def test_bad_override_is_a_one_line_error():
    proc = run_cli("compile", "tiny", "--fabric", "mesh8", "--set", "bogus=1")
    assert proc.returncode == 2 and "unknown field 'bogus'" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_help_imports_no_command_module():
    """``wse-emu --help`` lists every command without importing any command's module (nor
    numpy or matplotlib): the listing is fast."""
    import subprocess
    import sys

    code = ("import sys\nfrom wse_emu.cli.main import main\ntry:\n    main(['--help'])\n"
            "except SystemExit:\n    pass\n"
            "heavy = [m for m in sys.modules if m.startswith(('wse_emu.cli.', 'numpy', "
            "'matplotlib', 'compiler'))]\nprint(sorted(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert "experiment" in out and "viz" in out  # the listing
    assert out.strip().splitlines()[-1] == ("['wse_emu.cli.commands', 'wse_emu.cli.flag_names', "
                                            "'wse_emu.cli.main']")
