"""Fixtures shared by the contract suites."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """A private directory on the real /dev/shm tmpfs; it must hold nothing at the end."""
    path = Path("/dev/shm") / f"ec_test_{uuid.uuid4().hex[:12]}"
    path.mkdir(mode=0o700)
    try:
        yield path
        assert sorted(p.name for p in path.iterdir()) == [], "a test left files behind"
    finally:
        shutil.rmtree(path, ignore_errors=True)
