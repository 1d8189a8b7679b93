"""Functional inference: a compiled program computing real numbers through its per-PE tiles.

``trees`` (the program's reduction trees), ``numerics`` (what is rounded where), ``tiles`` (weight
blocks per PE), ``kvstore`` (a stage's KV cache in its PEs' slots, and attention over it),
``region`` (a region's stages, layer by layer), ``generate`` (greedy generation, colocated or
disaggregated) and ``timing`` (the emulated time of a generation, from the simulator).
"""
