"""Serving request workloads on regions of compiled programs (workloads so far; the
event-driven runtime and its policies build on them)."""
