"""Skip marks for tests that build the copier's native libraries on this machine, as the CUDA engine
does on first use: the save launcher needs a C compiler, the batch planner (which reads Python
objects) Python's C headers too."""

from __future__ import annotations

import pytest

from ec_connector.adapters.torch_copy.native import build as native

NEEDS_COMPILER = pytest.mark.skipif(native.compiler() is None, reason="needs a C compiler (cc, gcc or clang)")
NEEDS_PLANNER_BUILD = pytest.mark.skipif(
    native.compiler() is None or native.python_headers() is None,
    reason="needs a C compiler (cc, gcc or clang) and Python's headers, as Triton does",
)
