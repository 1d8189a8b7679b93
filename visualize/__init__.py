"""Figures and reports drawn from run directories (never by re-running a simulation).

``rundir`` reads what a run wrote; ``wafer`` turns a program and its counters into per-PE maps,
one pixel per PE; ``roofline`` places a model's ops against the PE's and the wafer's limits;
``report`` gathers the figures into one self-contained HTML page.
"""
