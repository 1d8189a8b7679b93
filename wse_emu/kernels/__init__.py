"""Kernel patterns expanded into task graphs, with numpy array operations (never a Python loop
over PEs): a stage of a compiled program becomes per-PE compute tasks and wavelet messages that
either engine executes."""
