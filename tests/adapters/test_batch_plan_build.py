"""Building and caching the copier's compiled helpers (native/build.py): where, with what, and errors.

These check the paths and the messages around the build (needing no compiler), and that a
changed header rebuilds what includes it (with one).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

from ec_connector.adapters.torch_copy.native import batchplan, launcher
from ec_connector.adapters.torch_copy.native import build as native
from ec_connector.domain.errors import ECConnectorError

from ..native_marks import NEEDS_COMPILER


def test_the_cache_is_a_directory_of_this_users_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    own = tmp_path / "own"
    monkeypatch.setenv("EC_CONNECTOR_CACHE", str(own))
    assert native.cache_dir() == own
    assert own.stat().st_mode & 0o077 == 0, "made private to this user"
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("EC_CONNECTOR_CACHE", str(shared))
    with pytest.raises(ECConnectorError, match="shared: not this user's own, or writable by others"):
        native.cache_dir()


def test_a_home_that_cannot_be_written_falls_back_to_a_private_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "home"
    blocked.write_text("a file where the cache directory's parent should be")
    monkeypatch.delenv("EC_CONNECTOR_CACHE", raising=False)
    monkeypatch.setattr(Path, "home", staticmethod(lambda: blocked))
    monkeypatch.setattr(native.tempfile, "gettempdir", lambda: str(tmp_path))
    assert native.cache_dir() == tmp_path / f"ec_connector-{os.getuid()}"


def test_no_compiler_and_a_failing_one_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EC_CONNECTOR_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert native.compiler() is None
    for source, what in ((batchplan.SOURCE, "the batch planner"), (launcher.SOURCE, "the save launcher")):
        with pytest.raises(ECConnectorError, match=f"builds {what} \\({source.name}\\) with a C compiler"):
            native.build(source, what)
    monkeypatch.setenv("CC", "/bin/false")
    with pytest.raises(
        ECConnectorError, match="building the batch planner with /bin/false failed \\(exit 1\\)"
    ):
        native.build(batchplan.SOURCE, "the batch planner")
    assert not list((tmp_path / "cache").glob("*.so*")), "no partial library left behind"


@NEEDS_COMPILER
def test_a_changed_local_header_rebuilds_the_library_that_includes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EC_CONNECTOR_CACHE", str(tmp_path / "cache"))
    header, source = tmp_path / "value.h", tmp_path / "helper.c"
    header.write_text("#define VALUE 1\n")
    source.write_text('#include <stdint.h>\n#include "value.h"\nint64_t value(void) { return VALUE; }\n')
    assert native.local_headers(source) == [header]
    first = native.build(source, "a helper")
    assert native.build(source, "a helper") == first, "unchanged: taken from the cache"
    header.write_text("#define VALUE 2\n")
    second = native.build(source, "a helper")
    assert second != first
    assert ctypes.CDLL(str(second)).value() == 2
    assert [native.local_headers(s) for s in (batchplan.SOURCE, launcher.SOURCE)] == [
        [batchplan.SOURCE.with_name("queue.h")]
    ] * 2


@NEEDS_COMPILER
def test_a_library_built_against_pythons_headers_is_cached_apart_and_missing_headers_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EC_CONNECTOR_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "helper.c"
    source.write_text("#include <stdint.h>\nint64_t value(void) { return 1; }\n")
    if native.python_headers() is not None:
        assert native.build(source, "a helper", python=True) != native.build(source, "a helper")
    monkeypatch.setattr(native, "python_headers", lambda: None)
    with pytest.raises(ECConnectorError, match="builds a helper \\(helper.c\\) against Python's C headers"):
        native.build(source, "a helper", python=True)
