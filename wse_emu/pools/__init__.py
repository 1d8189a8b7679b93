"""Pools by kind of hardware: wafers compiled and simulated, accelerators timed by their roofline,
GPUs timed from measured data (``kinds``: one module each), pool names as the command line
writes them (``names``, ``named``), and serving a workload on them whole (``serve``)."""
