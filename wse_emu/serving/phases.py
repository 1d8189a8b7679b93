"""A workload that changes over the run: synthetic workloads served one after another (a
workload of arrival ``phases``). Traffic drifts (chat by day, agents by night), and a split
tuned for one mix is then served on another; this is how a run shows it.

The phases are made alike in what they offer, so that only the mix changes: each later phase
holds the sessions whose output tokens add up to the first phase's (sessions in order of
arrival, the last one reaching it), and its arrivals are stretched or squeezed to span the
first phase's time, so every phase offers the same output tokens per second for the same
time. The rate search then scales the whole run at once."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

# (The requests are ``workload.Requests``, which generates a workload of phases from here: they
# are made with ``replace``, so this module needs no import of it.)


def session_outputs(requests) -> np.ndarray:
    """Each session's output tokens, its calls' summed, sessions in order."""
    return np.bincount(requests.session, weights=requests.output_tokens).astype(np.int64)


def span_s(requests) -> float:
    """From the first session's arrival to the last's."""
    first = requests.arrival_s[~np.isnan(requests.arrival_s)]
    return float(first.max() - first.min())


def matched(first, later):
    """``later``'s first sessions whose output tokens reach ``first``'s, their arrivals scaled
    to span ``first``'s time; None if all of ``later`` falls short (draw more of it)."""
    wanted = float(first.output_tokens.sum())
    reached = np.cumsum(session_outputs(later))
    if reached[-1] < wanted:
        return None
    # At least two sessions, so that the phase has a span to scale.
    sessions = max(int(np.searchsorted(reached, wanted)) + 1, 2)
    if sessions > len(reached):
        return None
    part = later.subset(later.session < sessions)
    span = span_s(part)
    scale = span_s(first) / span if span > 0 else 1.0
    return replace(part, arrival_s=part.arrival_s * scale)


def join(parts: list):
    """The phases one after another: each starts one mean gap of the first phase's arrivals
    after the one before it ended (``span_s``), its sessions numbered after the earlier
    ones', each call marked with its phase (each phase is judged on a steady window of its
    own: counted over all the run's first calls, the last phase's would fall in the drain)."""
    first = parts[0]
    gap = span_s(first) / max(first.sessions() - 1, 1)
    columns = {k: [] for k in ("arrival_s", "prompt_tokens", "output_tokens", "session", "call",
                               "think_s")}
    columns["phase"] = []
    start, sessions = 0.0, 0
    for k, part in enumerate(parts):
        columns["phase"].append(np.full(len(part), k, dtype=np.int64))
        arrivals = part.arrival_s - np.nanmin(part.arrival_s)
        columns["arrival_s"].append(arrivals + start)
        columns["session"].append(part.session + sessions)
        for name in ("prompt_tokens", "output_tokens", "call", "think_s"):
            columns[name].append(getattr(part, name))
        start += span_s(part) + gap
        sessions += int(part.session.max()) + 1
    return replace(first, blocks=None, **{k: np.concatenate(v) for k, v in columns.items()})
