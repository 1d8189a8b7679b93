"""Serving request workloads on regions of compiled programs: workloads, stage-time tables, the
event-driven serving loop and its policies, metrics, and the disaggregation experiment."""
