"""Fixtures of the fault-injection suite (the harness itself is in harness.py).

Every test ends with `ConsumerSide.assert_clean()` and the `world` fixture's leak check: no pinned
entry, no blocks held by anything but READY entries, no transfer in flight, and after closing: the
private /dev/shm directory empty, and this process's file descriptors and threads back at the count
they had before the test.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .harness import HAVE_NIXL, ROW_BYTES, ConsumerSide, ProducerProcess, open_fds, resources

LONG = os.environ.get("EC_FAULT_LONG") == "1"


def pytest_collection_modifyitems(config, items) -> None:  # noqa: ANN001 (pytest hook)
    """`fault_long` tests run only with EC_FAULT_LONG=1 (they keep the default run short)."""
    if LONG:
        return
    skip = pytest.mark.skip(reason="long fault run: set EC_FAULT_LONG=1 (docs/reliability.md)")
    for item in items:
        if "fault_long" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def warm_nixl() -> None:
    """Load NIXL/UCX once so the per-test resource baseline excludes one-time library state."""
    if not HAVE_NIXL:
        return
    path = Path("/dev/shm") / f"ec_warm_{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o700)
    try:
        ConsumerSide(path, blocks=16).close()
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def shm_dir(warm_nixl: None) -> Iterator[Path]:
    """A private directory on the real /dev/shm; it must hold nothing at the end."""
    path = Path("/dev/shm") / f"ec_fault_{uuid.uuid4().hex[:12]}"
    path.mkdir(mode=0o700)
    try:
        yield path
        left = sorted(p.name for p in path.iterdir())
        assert left == [], f"files left in /dev/shm: {left}"
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def world(shm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Start producers and consumers; everything is closed at the end and leaks are checked.

    Consumers cut their READs across their lanes from two blocks up (the engine's 256 KiB minimum
    would leave this suite's small items whole on one lane).
    """
    if HAVE_NIXL:
        from ec_connector.adapters.nixl_data import lanes

        monkeypatch.setattr(lanes, "MIN_PART_BYTES", ROW_BYTES)
    fds, threads = resources()
    py_threads = threading.active_count()
    producers: list[ProducerProcess] = []
    consumers: list[ConsumerSide] = []

    def producer(name: str | None = None, **kw: Any) -> ProducerProcess:
        producers.append(ProducerProcess(name or f"prod-{uuid.uuid4().hex[:6]}", shm_dir, **kw))
        return producers[-1]

    def consumer(**kw: Any) -> ConsumerSide:
        consumers.append(ConsumerSide(shm_dir, **kw))
        return consumers[-1]

    yield {"producer": producer, "consumer": consumer, "shm_dir": shm_dir}
    for made in producers:
        if made.proc.poll() is None:
            made.signal(signal.SIGCONT)
        made.stop()
    for side in consumers:
        side.close()
    deadline = time.monotonic() + 5
    while resources() != (fds, threads) and time.monotonic() < deadline:
        time.sleep(0.05)  # ZMQ's and UCX's threads end asynchronously
    assert resources() == (fds, threads), (
        f"(fds, threads) before {(fds, threads)}, after {resources()}; open now: {open_fds()}"
    )
    assert threading.active_count() == py_threads
