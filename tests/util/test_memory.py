"""Freed memory kept for the next stage-table job (``util.memory``)."""

import platform
import sys

import pytest

from wse_emu.util import memory


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="only glibc's allocator is asked (elsewhere nothing is done)")
def test_glibc_keeps_freed_memory_once_asked():
    assert memory.keep_freed_memory()
    assert memory.keep_freed_memory()  # asked again: still kept, nothing more done


def test_nothing_is_asked_outside_linux(monkeypatch):
    monkeypatch.setattr(memory, "_kept", False)
    monkeypatch.setattr(memory.sys, "platform", "darwin")
    assert not memory.keep_freed_memory()
