"""Figures and reports drawn from run directories (never by re-running a simulation).

``rundir`` reads what a run wrote. ``wafer`` turns a program and its counters into per-PE
arrays and ``draw`` draws them, one pixel per PE; ``roofline`` places a model's ops against the
PE's and the wafer's limits; ``serving`` and ``curves`` draw serving runs and the
disaggregation experiment; ``style`` makes every figure read alike (legible text, numbers as
the command line writes them, log ticks that do not collide, neighbours in distinct colours);
``figures`` chooses what a run gets; ``report`` gathers it into one
self-contained HTML page, and ``check_report`` opens that page in a headless browser.
"""
