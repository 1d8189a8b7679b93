"""Serving request workloads on pools: workloads, stage-time tables, serving knobs and batching
policies, the serving loop (compiled, with its plain twin in loops/), and metrics. It sees a pool
only through the protocol in pools.py: what kind of hardware runs it lives above, in
wse_emu.pools."""
