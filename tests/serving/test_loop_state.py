"""The compiled loop's state made from the requests: each request's session's next call, found
by searching the requests sorted, is the one its definition names."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from wse_emu.serving.loops.state import next_calls


def defined(session: np.ndarray, call: np.ndarray) -> np.ndarray:
    """The request holding (session, call + 1) for each request, the later of two holding it,
    or -1: by its definition, a dictionary of every request's pair."""
    index = {(s, c): i for i, (s, c) in enumerate(zip(session.tolist(), call.tolist()))}
    return np.array([index.get((s, c + 1), -1) for s, c in zip(session.tolist(), call.tolist())],
                    dtype=np.int64)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(-3, 6)), min_size=1, max_size=60))
def test_next_call_is_the_sessions_next_as_defined(pairs):
    # Repeated pairs, calls missing from a session and calls below zero included.
    session, call = (np.array(column, dtype=np.int64) for column in zip(*pairs))
    assert np.array_equal(next_calls(session, call), defined(session, call))


def test_next_call_of_agent_sessions_and_of_plain_requests():
    session = np.array([0, 0, 0, 1, 2, 2])
    call = np.array([0, 1, 2, 0, 0, 1])
    assert next_calls(session, call).tolist() == [1, 2, -1, -1, 5, -1]
    assert next_calls(np.arange(4), np.zeros(4, dtype=np.int64)).tolist() == [-1] * 4
    assert next_calls(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)).tolist() == []
