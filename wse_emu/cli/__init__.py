"""The ``wse-emu`` command line: the one place that wires the compiler, the emulator and the
visualizer together."""
