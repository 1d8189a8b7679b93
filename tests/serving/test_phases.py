"""A workload of phases: workloads served one after another, each later phase matched to the
first in output tokens offered and in time, so that only the mix changes over the run."""

import numpy as np
import pytest

from wse_emu.errors import ConfigError
from wse_emu.serving.phases import session_outputs, span_s
from wse_emu.serving.workload import (
    generate,
    load_workload,
    phase_specs,
    replicate,
    workload_from_dict,
    workload_spec,
)


def phases_of(requests, first_sessions: int):
    """The first phase's requests and the rest, by session."""
    return (requests.subset(requests.session < first_sessions),
            requests.subset(requests.session >= first_sessions))


def test_each_later_phase_offers_the_first_ones_output_tokens_over_its_time():
    spec = workload_spec("chat-to-agents", requests=300)
    chat, agents = phases_of(generate(spec), 300)
    assert len(chat) == 300 and (chat.call == 0).all()
    assert (agents.call.max() == 19) and agents.sessions() >= 2
    # The agents' sessions stop at the first whose output reaches the chat phase's.
    wanted = chat.output_tokens.sum()
    per_session = session_outputs(agents)[300:]
    assert per_session.sum() >= wanted > per_session[:-1].sum()
    # The same time, the second phase after the first (one mean gap later).
    assert span_s(agents) == pytest.approx(span_s(chat))
    gap = span_s(chat) / 299
    assert np.nanmin(agents.arrival_s) == pytest.approx(np.nanmax(chat.arrival_s) + gap)
    # A session's later calls follow its earlier ones, as in the workload alone.
    assert np.isnan(agents.arrival_s[agents.call > 0]).all()


def test_a_phase_is_drawn_as_it_would_be_alone_and_draw_i_takes_each_phases_draw_i():
    spec = workload_spec("chat-to-agents", requests=200)
    for draw in (0, 1):
        chat, _ = phases_of(generate(replicate(spec, draw, 200)), 200)
        alone = generate(replicate(workload_spec("chat", rate=spec.rate, requests=200),
                                   draw, 200))
        assert np.array_equal(chat.prompt_tokens, alone.prompt_tokens)
        assert np.allclose(chat.arrival_s, alone.arrival_s)
    assert generate(spec).digest() == generate(spec).digest()
    assert generate(spec).digest() != generate(replicate(spec, 1, 200)).digest()


def test_the_first_phase_takes_the_mixtures_rate_and_size():
    first, later = phase_specs(workload_spec("chat-to-agents", rate=2.0, requests=50))
    assert (first.name, first.rate, first.requests) == ("chat", 2.0, 50)
    assert later.name == "agentic-long" and later.rate == load_workload("agentic-long").rate


@pytest.mark.parametrize("fields, message", [
    ({"phases": ["chat", "agentic"]}, "goes with arrival 'phases'"),
    ({"arrival": "phases"}, "goes with arrival 'phases'"),
    ({"arrival": "phases", "phases": ["chat"]}, "two or more"),
    ({"arrival": "phases", "phases": ["chat", 3]}, "two or more"),
    ({"arrival": "phases", "phases": ["chat", "chat"], "calls": 4}, "'calls' must be 1"),
])
def test_a_workload_of_phases_is_checked_by_name(fields, message):
    with pytest.raises(ConfigError, match=message):
        workload_from_dict({"version": 1, "name": "w", **fields}, "w.yaml")


def test_a_phase_that_is_a_trace_or_phases_itself_or_unknown_is_refused(tmp_path):
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text("version: 1\nname: mixed\narrival: phases\nphases: [chat, azure.yaml]\n")
    azure = tmp_path / "azure.yaml"
    azure.write_text("version: 1\nname: azure\narrival: trace\ntrace: azure-conv\n")
    with pytest.raises(ConfigError, match="phase '.*azure.yaml' has arrival 'trace'"):
        workload_spec(str(mixed))
    mixed.write_text("version: 1\nname: mixed\narrival: phases\nphases: [chat, chat-to-agents]\n")
    with pytest.raises(ConfigError, match="arrival 'phases': a phase must be a synthetic"):
        workload_spec(str(mixed))
    mixed.write_text("version: 1\nname: mixed\narrival: phases\nphases: [chat, no-such]\n")
    with pytest.raises(ConfigError, match="no-such"):
        workload_spec(str(mixed))


def test_each_phase_is_judged_on_its_own_steady_window():
    """Counted over all the run's first calls, the last phase (a few agent sessions after a
    thousand chat requests) would fall in the drain and never be judged."""
    from wse_emu.serving.metrics import session_window, steady_window

    r = generate(workload_spec("chat-to-agents", requests=300))
    first = r.call == 0
    arrival = np.where(np.isnan(r.arrival_s), np.inf, r.arrival_s)
    whole = session_window(arrival, r.session, first)
    assert not whole[r.phase == 1].any()
    judged = session_window(arrival, r.session, first, phase=r.phase)
    for k in (0, 1):
        opening = np.flatnonzero(first & (r.phase == k))
        chosen = set(r.session[opening[steady_window(arrival[opening])]])
        assert set(r.session[judged & (r.phase == k)]) == chosen and chosen
    # A subset and a faster copy keep each call's phase.
    assert np.array_equal(r.faster(2.0).phase, r.phase)
    assert np.array_equal(r.subset(r.session < 310).phase, r.phase[r.session < 310])
