"""Engines that execute traffic and programs on the emulated fabric.

- ``cycle``: wavelet-level, cycle by cycle (per-port, per-color queues with credit
  backpressure); for meshes up to a few hundred PEs a side.
- ``fast``: message-level and event-driven, with per-link occupancy; for whole wafers.
Each jitted engine has a slow, plain-Python twin in ``reference`` that tests compare it with.
Both share ``cores`` (the PE cores) and their events' ``calendar`` (built on a ``heap``), and
take their arrays as ``records``.
"""
