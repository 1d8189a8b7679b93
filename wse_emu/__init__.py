"""wse-emu: a wafer-scale hardware emulator.

The core package holds the emulated hardware: the fabric description (FabricSpec), the model
shapes the hardware runs (ModelSpec), the WaferProgram format the compiler produces, and (later)
the engines that execute programs. It never imports the compiler or the visualizer; only the
command line in ``wse_emu.cli`` wires them together.
"""

__version__ = "0.1.0"
