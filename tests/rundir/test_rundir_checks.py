"""Run directories with numbers no run writes (a negative count, a NaN or infinite rate,
latency or throughput, a share over 100%) are refused by file and field when read back, in
one line, never drawn as results; what wse-emu writes, infinities meaning "never" included,
reads back."""

import csv
import json
import math
import shutil

import pytest
from helpers import QUICK_KNOBS, SMALL_CHAT, assert_one_line_error, run_cli

from wse_emu.cli.main import main
from wse_emu.errors import UserError
from wse_emu.rundir.read import check_numbers, load_run

NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def served(tmp_path_factory, cache):
    out = tmp_path_factory.mktemp("served") / "run"
    assert main(["-q", "serve", "tiny", "--fabric", "mesh16", "--workload", str(SMALL_CHAT),
                 "--ttft-slo", "0.05", "--tpot-slo", "0.001", "--cache-dir", cache,
                 "-o", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def stepped(tmp_path_factory):
    out = tmp_path_factory.mktemp("stepped") / "run"
    assert main(["-q", "run", "tiny", "--fabric", "mesh16", "--phase", "decode", "--batch", "2",
                 "--context", "128", "-o", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    root = tmp_path_factory.mktemp("swept")
    sweep = root / "clock.yaml"
    sweep.write_text("version: 1\nname: clock\npoint: run\nbase: {model: tiny, fabric: mesh16, "
                     "phase: decode, batch: 1, context: 64}\naxes:\n  fabric.clock_hz: "
                     "[1.0e+9, 2.0e+9]\n")
    assert main(["-q", "sweep", str(sweep), "-o", str(root / "sweep"), "--workers", "1"]) == 0
    return root / "sweep"


@pytest.fixture(scope="module")
def experimented(tmp_path_factory, cache):
    out = tmp_path_factory.mktemp("experimented") / "run"
    assert main(["-q", "experiment", "disagg", "tiny", "--fabric", "mesh16", "--workload",
                 str(SMALL_CHAT), "--ttft-slo", "0.05", "--tpot-slo", "0.001", *QUICK_KNOBS,
                 "--cache-dir", cache, "--workers", "1", "-o", str(out)]) == 0
    return out


def edited(source, tmp_path, name: str, change):
    """A copy of the run directory ``source`` with its JSON file ``name`` changed."""
    run = tmp_path / "run"
    shutil.copytree(source, run)
    data = json.loads((run / name).read_text())
    change(data)
    (run / name).write_text(json.dumps(data))  # NaN and Infinity as Python writes them
    return run


def setting(path, value):
    def change(data):
        *head, last = path
        for key in head:
            data = data[key] if not callable(key) else key(data)
        data[last] = value
    return change


def first_region(data):
    return data["regions"][next(iter(data["regions"]))]


def refused(capsys, run, *needles) -> str:
    assert main(["viz", str(run)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert not (run / "report.html").exists() and not (run / "figures").exists()
    return lines[0]


def test_what_wse_emu_writes_reads_back(served, stepped, swept):
    for run in (served, stepped, swept):
        assert load_run(run).kind in ("serve", "run", "sweep")


@pytest.mark.parametrize("path, value, field, problem", [
    (["requests"], -3, "requests", "negative (-3)"),
    (["refused"], -1, "refused", "negative"),
    (["output_tokens_per_s"], NAN, "output_tokens_per_s", "NaN"),
    (["requests_per_s"], INF, "requests_per_s", "infinite"),
    (["goodput_requests_per_s"], -INF, "goodput_requests_per_s", "infinite"),
    (["slo_attainment"], 1.5, "slo_attainment", "150%, over 100%"),
    (["ttft_s", "p90"], -0.01, "ttft_s.p90", "negative"),
    (["tpot_s", "p50"], NAN, "tpot_s.p50", "NaN"),
    (["duration_s"], INF, "duration_s", "infinite"),
    (["user_tokens_per_s", "mean"], INF, "user_tokens_per_s.mean", "infinite"),
    ([first_region, "kv_capacity_tokens"], -5, "kv_capacity_tokens", "negative"),
    ([first_region, "stage_utilization"], 2.0, "stage_utilization", "200%, over 100%"),
])
def test_a_serving_runs_impossible_metric_is_refused_by_file_and_field(served, tmp_path, capsys,
                                                                       path, value, field,
                                                                       problem):
    run = edited(served, tmp_path, "metrics.json", setting(path, value))
    line = refused(capsys, run, f"{run / 'metrics.json'}: ", field, f"is {problem}")
    assert "edited or damaged" in line


def test_a_latency_that_is_never_reached_reads_back(served, tmp_path):
    """A refused request's TTFT is infinite, and so is a percentile that falls on it."""
    run = edited(served, tmp_path, "metrics.json", lambda data: (
        data["ttft_s"].update(p99=INF), data["tpot_s"].update(p99=INF),
        data["e2e_s"].update(p99=INF)))
    assert load_run(run).metrics.metrics.ttft_s.p99 == INF


def test_the_command_line_refuses_it_in_one_line(served, tmp_path):
    """As a user runs it: exit code 2, one line on stderr naming the file and the field."""
    run = edited(served, tmp_path, "metrics.json", setting(["requests"], -40))
    proc = run_cli("viz", run)
    assert_one_line_error(proc, str(run / "metrics.json"), "requests is negative (-40)")


@pytest.mark.parametrize("path, value, field, problem", [
    (["step_seconds"], NAN, "step_seconds", "NaN"),
    (["step_cycles"], -1, "step_cycles", "negative"),
    (["stages", 0, "cycles"], -7, "stages[0].cycles", "negative (-7)"),
    (["compute_utilization"], 1.2, "compute_utilization", "120%, over 100%"),
    (["tokens_per_s_pipelined"], INF, "tokens_per_s_pipelined", "infinite"),
])
def test_a_steps_impossible_result_is_refused_by_file_and_field(stepped, tmp_path, capsys, path,
                                                                value, field, problem):
    run = edited(stepped, tmp_path, "results.json", setting(path, value))
    refused(capsys, run, f"{run / 'results.json'}: ", f"{field} is {problem}")


@pytest.mark.parametrize("name, column, value", [
    ("requests.csv", "ttft_s", "nan"), ("requests.csv", "arrival_s", "-1.5"),
    ("requests.csv", "prompt_tokens", "inf"), ("kv_occupancy.csv", "kv_tokens", "-3")])
def test_an_impossible_number_in_a_serving_runs_table_is_refused_by_column_and_row(
        served, tmp_path, capsys, name, column, value):
    run = tmp_path / "run"
    shutil.copytree(served, run)
    with open(run / name, newline="") as fh:
        rows = list(csv.DictReader(fh))
    rows[2][column] = value
    with open(run / name, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert main(["viz", str(run), "--what", "serving"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert f"{run / name}: {column} of row 3 is {float(value)!r}" in err


def test_a_refused_requests_infinite_times_read_back(served, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(served, run)
    with open(run / "requests.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    rows[2].update(ttft_s="inf", tpot_s="inf", e2e_s="inf")
    with open(run / "requests.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert main(["-q", "viz", str(run), "--what", "serving"]) == 0, capsys.readouterr().err


def test_an_impossible_sweep_row_is_refused_by_its_point(swept, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(swept, run)
    lines = (run / "results.jsonl").read_text().splitlines()
    row = json.loads(lines[1])
    row["result"]["step_seconds"] = NAN
    lines[1] = json.dumps(row)
    (run / "results.jsonl").write_text("\n".join(lines) + "\n")
    refused(capsys, run, f"{run / 'results.jsonl'}: the row of point {row['key']}: ",
            "result.step_seconds is NaN")


@pytest.mark.e2e
def test_what_an_experiment_writes_reads_back(experimented):
    assert load_run(experimented).kind == "experiment"


@pytest.mark.e2e
@pytest.mark.parametrize("change, field, problem", [
    (lambda d: d["configurations"][0].update(max_rate_per_s=-1.0),
     "configurations[0].max_rate_per_s", "negative"),
    (lambda d: next(iter(d["points"].values()))[0].update(slo_attainment=NAN),
     ".slo_attainment", "NaN"),
    (lambda d: next(iter(d["points"].values()))[0].update(rate_per_s=INF), ".rate_per_s",
     "infinite"),
    (lambda d: d["targets"].update(attainment=1.1), "targets.attainment", "110%, over 100%"),
    (lambda d: d.update(requests_per_run=-40), "requests_per_run", "negative"),
])
def test_an_impossible_experiment_number_is_refused_by_file_and_field(experimented, tmp_path,
                                                                      capsys, change, field,
                                                                      problem):
    run = edited(experimented, tmp_path, "experiment.json", change)
    refused(capsys, run, f"{run / 'experiment.json'}: ", f"{field} is {problem}")


# --- the check itself ----------------------------------------------------------------------

@pytest.mark.parametrize("data", [
    {"ttft_slope": -0.2, "ttft_growth_s": -0.04},  # TTFT may fall over a run
    {"goodput_ratio_interval": {"mean": 0.3, "half_width": 0.5, "low": -0.2, "high": 0.8}},
    {"decode_stall_s": -4.7e-17},  # a sum that rounds below zero
    {"ttft_p99_s": INF, "tpot_s": {"p99": INF}, "pace": INF, "ttft_slope": INF},
    {"model_spec": {"norm_weight_offset": -1.0}},  # a model's own fields: its loader checks
    {"kv_peak_share": 1.0 + 1e-12, "slo_attainment": 1.0, "share_of_ceiling": 1.24},
    {"met": True, "name": "x", "value": None},
])
def test_numbers_a_run_writes_pass(data):
    check_numbers(data, "f.json")


@pytest.mark.parametrize("data, message", [
    ({"a": [{"requests": 1}, {"requests": -2}]}, "f.json: a[1].requests is negative (-2)"),
    ({"model_spec": {"rms_norm_eps": NAN}}, "f.json: model_spec.rms_norm_eps is NaN"),
    ({"e2e_s": {"p50": -INF}}, "f.json: e2e_s.p50 is infinite"),
    ({"output_tokens_per_s": INF}, "f.json: output_tokens_per_s is infinite"),
    ({"prefill_share": 1.5}, "f.json: prefill_share is 150%, over 100%"),
    ({"x": {"p90": math.nan}}, "f.json: x.p90 is NaN"),
])
def test_numbers_no_run_writes_are_named(data, message):
    with pytest.raises(UserError) as info:
        check_numbers(data, "f.json")
    assert str(info.value).startswith(message) and "\n" not in str(info.value)
