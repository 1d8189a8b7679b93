"""Request workloads: synthetic, trace replay, agentic sessions, and bad inputs."""

import numpy as np
import pytest

from wse_emu.errors import ConfigError
from wse_emu.serving.workload import (
    WorkloadSpec,
    generate,
    load_trace,
    load_workload,
    workload_from_dict,
)
from wse_emu.util.configfile import preset_dir

CONVERSATIONS = preset_dir("traces") / "azure-conv.csv"  # shipped with wse-emu


def test_presets_load_and_are_deterministic():
    for name in ("long-prompt", "chat", "agentic", "agentic-long", "decode-heavy"):
        spec = load_workload(name)
        a, b = generate(spec), generate(spec)
        assert np.array_equal(a.prompt_tokens, b.prompt_tokens)
        assert np.array_equal(np.nan_to_num(a.arrival_s), np.nan_to_num(b.arrival_s))
    other = generate(WorkloadSpec(**{**load_workload("chat").__dict__, "seed": 1}))
    assert not np.array_equal(other.prompt_tokens, generate(load_workload("chat")).prompt_tokens)


def test_long_agent_sessions_grow_within_llama_31s_positions():
    """agentic-long: twenty calls a session, each context the one before plus its output and
    the new tool output, the longest within Llama-3.1's 131,072 positions."""
    requests = generate(load_workload("agentic-long"))
    assert requests.sessions() == 200 and len(requests) == 200 * 20
    ctx = requests.prompt_tokens + requests.output_tokens
    assert ctx.max() < 131072 and np.mean(ctx[requests.call == 19]) > 50_000
    later = requests.call > 0
    grew = requests.prompt_tokens[later] - (requests.prompt_tokens + requests.output_tokens)[
        np.flatnonzero(later) - 1]
    assert (grew >= 64).all() and (grew <= 8192).all()  # the tool output's bounds


def test_poisson_rate_and_lengths():
    spec = workload_from_dict({"name": "p", "rate": 4.0, "requests": 20000,
                               "prompt": {"kind": "uniform", "low": 10, "high": 20},
                               "output": {"kind": "fixed", "value": 7}}, "test")
    r = generate(spec)
    gaps = np.diff(r.arrival_s)
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)
    assert r.prompt_tokens.min() == 10 and r.prompt_tokens.max() == 20
    assert (r.output_tokens == 7).all()


def test_gamma_burstiness():
    spec = workload_from_dict({"name": "g", "arrival": "gamma", "rate": 2.0, "cv": 3.0,
                               "requests": 20000}, "test")
    gaps = np.diff(generate(spec).arrival_s)
    assert gaps.mean() == pytest.approx(0.5, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.1)


def test_agentic_sessions_grow_their_context():
    r = generate(load_workload("agentic"))
    assert len(r) == 200 * 5
    first = r.call == 0
    assert not np.isnan(r.arrival_s[first]).any() and np.isnan(r.arrival_s[~first]).all()
    s0 = r.session == 0
    prompts, outputs = r.prompt_tokens[s0], r.output_tokens[s0]
    assert list(prompts) == [2048 + i * (128 + 512) for i in range(5)]
    assert list(r.think_s[s0]) == [0, 2, 2, 2, 2]
    assert (outputs == 128).all()


def test_real_trace_replay_with_rate_scaling():
    t, p, o = load_trace(CONVERSATIONS)
    assert len(t) == 19366 and t[0] == 0 and (np.diff(t) >= 0).all()
    assert np.median(p) == 1020 and np.median(o) == 129
    t2, _, _ = load_trace(CONVERSATIONS, rate_scale=2.0)
    assert t2[-1] == pytest.approx(t[-1] / 2)


@pytest.mark.parametrize("text,needle", [
    ("time,prompt,output\n0,1,1\n", "first line must be the columns"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,5\n", "has 2 columns"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,-5,3\n", "token counts >= 1"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n2,5,3\n1,5,3\n", "must be sorted"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\nx,5,3\n", "not numbers"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n", "no requests"),
])
def test_bad_traces_fail_clearly(tmp_path, text, needle):
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_trace(path)


@pytest.mark.parametrize("data,needle", [
    ({"name": "w", "arrival": "weibull"}, "'arrival' must be one of"),
    ({"name": "w", "rate": 0}, "must be positive"),
    ({"name": "w", "prompt": {"kind": "uniform", "low": 9, "high": 3}}, "low <= high"),
    ({"name": "w", "arrival": "trace"}, "need a 'trace'"),
    ({"name": "w", "prompt": {"kind": "zipf"}}, "'kind' must be one of"),
])
def test_bad_workloads_fail_clearly(data, needle):
    with pytest.raises(ConfigError, match=needle):
        workload_from_dict(data, "test.yaml")
