"""Fuzz budget and accounting.

The default (CI) run gives each target a short budget (`DEFAULT_EXAMPLES` inputs); set
`EC_FUZZ_EXAMPLES=100000` for the dedicated long run. Hypothesis spends far more time per example
than our decoders spend per input, so each example carries a batch of `EC_FUZZ_BATCH` inputs
(default 1; the long run uses 50): a target runs ceil(EXAMPLES / BATCH) examples. Each target counts
the inputs it was given (`count(target)`), and the run ends with one line per target: inputs and
seconds.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

DEFAULT_EXAMPLES = 200
EXAMPLES = int(os.environ.get("EC_FUZZ_EXAMPLES") or DEFAULT_EXAMPLES)
BATCH = int(os.environ.get("EC_FUZZ_BATCH") or 1)

FUZZ = settings(
    max_examples=-(-EXAMPLES // BATCH),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    database=None,  # every run explores afresh; a failure is printed with its input
)


def batch(inputs: st.SearchStrategy) -> st.SearchStrategy[list]:
    """`BATCH` inputs per example."""
    return st.lists(inputs, min_size=BATCH, max_size=BATCH)


_inputs: dict[str, int] = defaultdict(int)
_first: dict[str, float] = {}
_last: dict[str, float] = {}


_PROGRESS = os.environ.get("EC_FUZZ_PROGRESS")  # a file: one line per 10,000 inputs of a target


def count(target: str) -> None:
    """Record one input given to `target`."""
    now = time.perf_counter()
    _first.setdefault(target, now)
    _last[target] = now
    _inputs[target] += 1
    if _PROGRESS and _inputs[target] % 10_000 == 0:
        with open(_PROGRESS, "a") as f:
            f.write(f"{target}\t{_inputs[target]}\t{now - _first[target]:.1f} s\n")


def pytest_collection_modifyitems(config, items) -> None:  # noqa: ANN001 (pytest hook)
    """A long run (EC_FUZZ_EXAMPLES set) must not be cut by the suite's 300 s per-test timeout."""
    if "EC_FUZZ_EXAMPLES" in os.environ:
        for item in items:
            if item.path.parent == Path(__file__).parent:
                item.add_marker(pytest.mark.timeout(0))


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 (pytest hook)
    if not _inputs:
        return
    terminalreporter.section(f"fuzz inputs per target (EC_FUZZ_EXAMPLES={EXAMPLES})")
    for target in sorted(_inputs):
        seconds = _last[target] - _first[target]
        terminalreporter.write_line(f"{target:40s} {_inputs[target]:>9d} inputs {seconds:9.1f} s")
