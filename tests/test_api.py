"""The Python API: the README's example runs, and each function returns what its command
prints."""

import re
from pathlib import Path

import pytest

import wse_emu
from wse_emu import api
from wse_emu.errors import UserError
from wse_emu.runtime.comparison import Space

README = Path(__file__).resolve().parent.parent / "README.md"
SMALL_CHAT = Path(__file__).parent / "data" / "small_chat.yaml"


def test_the_readme_example_runs(capsys):
    block = re.search(r"### Python\n.*?```python\n(.*?)```", README.read_text(), re.S).group(1)
    exec(compile(block, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert re.fullmatch(r"\d+ us per token on region mixed0\n", out)


def test_the_functions_are_reachable_from_the_package():
    assert wse_emu.compile is api.compile and wse_emu.serve is api.serve
    with pytest.raises(AttributeError):
        wse_emu.no_such_function  # noqa: B018


def test_serve_and_experiment_return_what_the_commands_print(tmp_path):
    program = api.compile("tiny", "mesh16", region=(8, 8))
    result, metrics = api.serve(program, str(SMALL_CHAT), cache_dir=tmp_path, ttft_s=1.0,
                                tpot_s=1.0)
    assert metrics["requests"] == len(result.tokens) == 40
    assert metrics["slo_attainment"] == 1.0
    space = Space(copies=(1,), prefill_tile=(64,), token_budget=(64,), interleave=(1,),
                  max_running=(0,), batch_limit=(64,), window_s=0.0, layers_per_stage="own")
    data = api.experiment("tiny", str(SMALL_CHAT), ttft_s=0.05, tpot_s=0.001, fabric="mesh16",
                          space=space, cache_dir=tmp_path, workers=1)
    assert {c["plan"] for c in data["final"]} == {"colocated", "disaggregated"}
    assert data["comparison"]["goodput_ratio"] > 0
    with pytest.raises(UserError, match="systems"):
        api.experiment("llama-3.1-70b", str(SMALL_CHAT), ttft_s=1, tpot_s=0.01, space=space,
                       workers=1,
                       cache_dir=tmp_path)


def test_generate_computes_through_the_tiles():
    program = api.compile("tiny", "mesh16", region=(8, 8))
    out = api.generate(program, [1, 2, 3], 4)
    assert len(out.generated_ids) == 4
