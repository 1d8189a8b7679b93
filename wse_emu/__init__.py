"""wse-emu: a wafer-scale hardware emulator with a mapping compiler.

The core package holds the emulated hardware: the fabric description (FabricSpec), the model
shapes the hardware runs (ModelSpec), the WaferProgram format the compiler produces, the
engines that execute programs and the serving runtime. It imports neither the compiler nor the
figures; the command line (``wse_emu.cli``) and the Python API (``wse_emu.api``) wire them
together. The API's functions are also reachable from here (``wse_emu.compile`` ...), imported
on first use, so that importing ``wse_emu`` stays quick.
"""

__version__ = "0.1.0"

_API = ("load_model", "load_fabric", "compile", "run", "serve", "serve_pools", "experiment",
        "frontier", "pairings", "generate", "sweep", "draw")


def __getattr__(name: str):
    if name in _API:
        from wse_emu import api

        return getattr(api, name)
    raise AttributeError(f"module 'wse_emu' has no attribute {name!r}")
