"""Experiments that answer a question end to end: the goodput of each plan by rate search, the
layouts each plan may use, tuning with equal effort, the comparison, the frontier, pairings of
kinds, sensitivity, ceilings and the check against a peer planner."""
