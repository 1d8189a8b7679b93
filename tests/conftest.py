"""Shared fixtures. Numba's cache goes to a git-ignored folder of the project."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Absolute, so that commands the tests run in other directories share it.
os.environ["NUMBA_CACHE_DIR"] = str(Path(os.environ.get("NUMBA_CACHE_DIR",
                                                        ROOT / ".numba_cache")).resolve())
os.environ.setdefault("MPLBACKEND", "Agg")

from wse_emu.compiler.mapper import compile_model  # noqa: E402
from wse_emu.compiler.options import CompileOptions  # noqa: E402
from wse_emu.hardware.fabric import ClusterSpec, load_fabric  # noqa: E402
from wse_emu.models.load import load_model  # noqa: E402


@pytest.fixture(scope="session")
def llama8b_colocated():
    return compile_model(load_model("llama-3.1-8b"), ClusterSpec(load_fabric("wse3"), 1),
                         CompileOptions())


@pytest.fixture(scope="session")
def llama8b_disaggregated():
    return compile_model(load_model("llama-3.1-8b"), ClusterSpec(load_fabric("wse3"), 1),
                         CompileOptions(plan="disaggregated"))


@pytest.fixture(scope="session")
def llama70b_four():
    return compile_model(load_model("llama-3.1-70b"), ClusterSpec(load_fabric("wse3"), 4),
                         CompileOptions())


@pytest.fixture(scope="session")
def tiny_8x8():
    return compile_model(load_model("tiny"), ClusterSpec(load_fabric("mesh8"), 1),
                         CompileOptions(region=(8, 8)))
