"""The shipped request traces: named like the other presets or given by path, from the API, the
command line and a workload YAML; read row by row and no further than the rows wanted."""

import json
import re
from dataclasses import replace

import numpy as np
import pytest
from helpers import assert_one_line_error, run_cli

from wse_emu import api
from wse_emu.errors import ConfigError
from wse_emu.serving.workload import (
    WorkloadSpec,
    generate,
    load_trace,
    load_workload,
    trace_names,
    workload_spec,
)
from wse_emu.util.configfile import preset_dir

HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"
# Name -> (rows, median prompt, median output), as the traces' README states them.
SHIPPED = {"azure-conv": (19366, 1020, 129), "azure-code": (8819, 1469, 13),
           "mooncake-conv": (12031, 6909, 350)}
SUFFIX = {"mooncake-conv": ".jsonl"}  # the others are CSV files


def rows(n: int, start: float = 0.0) -> str:
    """``n`` valid trace rows, one a second from ``start``, short enough for a tiny model."""
    return "".join(f"{start + i:.1f},{20 + i},{3 + i % 4}\n" for i in range(n))


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_a_shipped_trace_loads_by_name_and_by_path(name):
    count, prompt, output = SHIPPED[name]
    by_name = load_trace(name)
    by_path = load_trace(preset_dir("traces") / f"{name}{SUFFIX.get(name, '.csv')}")
    assert len(by_name[0]) == count
    assert np.median(by_name[1]) == prompt and np.median(by_name[2]) == output
    assert all(np.array_equal(a, b) for a, b in zip(by_name, by_path))
    spec = workload_spec(trace=name)
    assert (spec.name, spec.requests) == (name, count)  # reports name it as the user did


def test_the_shipped_traces_are_listed_and_described():
    assert trace_names() == sorted(SHIPPED)
    readme = (preset_dir("traces") / "README.md").read_text()
    for name, (count, prompt, output) in SHIPPED.items():
        line = next(x for x in readme.splitlines() if x.startswith(f"| `{name}`"))
        assert f"| {count:,} | {prompt} /" in line and f"| {output} /" in line
    assert "CC-BY-4.0" in readme and "MIT" in readme and "vidur" in readme
    assert "Apache-2.0" in readme and "Mooncake" in readme


def test_an_unknown_trace_name_lists_the_shipped_ones():
    with pytest.raises(ConfigError, match="unknown trace 'azure-chat': choose one of "
                                          "azure-code, azure-conv, mooncake-conv or give a CSV "
                                          "or JSON-lines path"):
        workload_spec(trace="azure-chat")


def test_a_window_of_a_trace_is_the_same_as_cut_from_the_whole():
    whole = generate(workload_spec(trace="azure-conv")).arrival_s
    spec = workload_spec(trace="azure-conv", requests=500)
    for skip in (0, 500, 7000):
        window = generate(replace(spec, skip=skip)).arrival_s
        assert np.array_equal(window, whole[skip:skip + 500] - whole[skip])


def test_a_workload_yaml_names_a_trace_by_name_or_by_a_path_beside_it(tmp_path, monkeypatch):
    folder = tmp_path / "study"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "t.csv").write_text(HEADER + rows(7))
    (folder / "mine.yaml").write_text("name: mine\narrival: trace\ntrace: data/t.csv\n"
                                      "requests: 5\n")
    (folder / "named.yaml").write_text("name: named\narrival: trace\ntrace: azure-code\n"
                                       "requests: 5\n")
    monkeypatch.chdir(tmp_path)  # elsewhere than the YAML: its path still finds the trace
    mine = generate(load_workload("study/mine.yaml"))
    assert list(mine.prompt_tokens) == [20, 21, 22, 23, 24]
    named = load_workload("study/named.yaml")
    assert named.trace == "azure-code"  # a name stays a name (a run directory reruns it)
    assert np.array_equal(generate(named).prompt_tokens, load_trace("azure-code")[1][:5])


def test_a_trace_a_workload_cannot_replay_is_refused_before_any_work(tmp_path):
    workload = tmp_path / "w.yaml"
    workload.write_text("name: w\narrival: trace\ntrace: gone.csv\nrequests: 5\n")
    with pytest.raises(ConfigError, match=re.escape(f"cannot read {tmp_path / 'gone.csv'}")):
        api.check_serving(workload=str(workload))
    (tmp_path / "gone.csv").write_text(HEADER + rows(3))
    assert api.check_serving(workload=str(workload)).requests == 5
    workload.write_text("name: w\narrival: trace\ntrace: gone.csv\nrequests: 5\nskip: 3\n")
    with pytest.raises(ConfigError, match="3 requests, none left after skipping 3"):
        api.check_serving(workload=str(workload))


@pytest.mark.e2e
def test_the_command_line_takes_a_trace_by_name_and_by_path(tmp_path):
    by_name = run_cli("serve", "tiny", "--fabric", "mesh8", "--trace", "azure-conv",
                      "--requests", "10", "--cache-dir", tmp_path, "--json")
    assert by_name.returncode == 0, by_name.stderr
    report = json.loads(by_name.stdout)
    assert report["workload"] == "azure-conv" and report["requests"] == 10
    by_path = run_cli("serve", "tiny", "--fabric", "mesh8", "--trace",
                      preset_dir("traces") / "azure-conv.csv", "--requests", "10",
                      "--cache-dir", tmp_path, "--json")
    assert by_path.returncode == 0, by_path.stderr
    again = json.loads(by_path.stdout)
    assert again["workload"] == "azure-conv" and again["duration_s"] == report["duration_s"]


def test_list_shows_the_traces():
    proc = run_cli("list", "--json")
    assert proc.returncode == 0, proc.stderr
    traces = {t["name"]: t for t in json.loads(proc.stdout)["traces"]}
    assert {n: t["requests"] for n, t in traces.items()} == {n: s[0] for n, s in SHIPPED.items()}
    text = run_cli("list").stdout
    assert re.search(r"^azure-conv\s+19,366\s", text, re.M)


@pytest.mark.e2e
def test_the_api_serves_a_trace_by_name(tmp_path):
    program = api.compile("tiny", "mesh8")
    served = api.serve(program, trace="azure-conv", requests=8, cache_dir=tmp_path)
    result, metrics = served.result, served.metrics
    assert result.workload == "azure-conv" and metrics.requests == 8


# --- read row by row, and no further than wanted -------------------------------------------

@pytest.mark.e2e
def test_rows_after_the_ones_wanted_are_never_read(tmp_path):
    """The row after the ten served is not a row at all: read, it would refuse the trace."""
    trace = tmp_path / "t.csv"
    trace.write_text(HEADER + rows(10) + "not,a,row\n" + rows(5, start=20))
    served = run_cli("serve", "tiny", "--fabric", "mesh8", "--trace", trace, "--requests", "10",
                     "--cache-dir", tmp_path / "cache", "--json")
    assert served.returncode == 0, served.stderr
    assert json.loads(served.stdout)["requests"] == 10
    assert len(generate(workload_spec(trace=trace, requests=10))) == 10
    # Asked for one row more, the bad line is read and refused with its line number.
    assert_one_line_error(run_cli("serve", "tiny", "--fabric", "mesh8", "--trace", trace,
                                  "--requests", "11", "--cache-dir", tmp_path / "cache"),
                          "line 12: not numbers: not,a,row")
    with pytest.raises(ConfigError, match="line 12: not numbers"):
        workload_spec(trace=trace)  # the whole trace: every row read


def test_a_window_reads_through_its_skip_and_stops_after_it(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(HEADER + rows(6) + "9,x,1\n")
    spec = WorkloadSpec(name="t", arrival="trace", trace=str(trace), requests=3, skip=3)
    window = generate(spec)
    assert list(window.prompt_tokens) == [23, 24, 25] and window.arrival_s[0] == 0
    with pytest.raises(ConfigError, match="line 8: not numbers"):
        generate(replace(spec, requests=4))
    # Rows skipped are still checked: a trace out of order is refused wherever it is.
    trace.write_text(HEADER + "5,1,1\n4,1,1\n" + rows(3, start=6))
    with pytest.raises(ConfigError, match="line 3: arrival 4.0 is before the previous one"):
        generate(replace(spec, skip=2, requests=1))


def test_a_line_without_end_is_refused_before_it_is_held(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(HEADER + rows(2) + "1" * 10_000_000)
    with pytest.raises(ConfigError, match="line 4 is longer than 65,536 characters"):
        load_trace(trace)


@pytest.mark.parametrize("text,needle", [
    (HEADER + "0,99999999999999999999999,1\n", "line 2: a token count beyond any model's"),
    (HEADER + "0,1,1\n1,\x00,1\n", "line 3"),
    (HEADER + "0,1,1\n1,2,\xff\n", None),
])
def test_odd_bytes_in_a_trace_are_one_clear_error(tmp_path, text, needle):
    trace = tmp_path / "t.csv"
    if needle is None:  # a byte that is not UTF-8
        trace.write_bytes(text.encode("latin-1"))
        needle = "not UTF-8 text"
    else:
        trace.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_trace(trace)


def test_a_trace_saved_with_a_byte_order_mark_reads(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_bytes(b"\xef\xbb\xbf" + (HEADER + rows(4)).encode())
    arrivals, prompts, _ = load_trace(trace)
    assert list(prompts) == [20, 21, 22, 23] and list(arrivals) == [0, 1, 2, 3]
