"""The ec-connector command line, run as a user would run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ec_connector.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_demo_reloads_verified_embeddings_and_removes_its_region(tmp_path):
    result = _cli("demo", "--requests", "12", "--images", "4", "--shm-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    reloaded = next(line for line in out.splitlines() if "reloaded from tier" in line)
    count = int(reloaded.split()[3])
    assert count > 0
    assert f"{count}/{count} byte-identical" in reloaded
    assert "region file removed yes" in out
    assert list(tmp_path.iterdir()) == []


def test_user_mistakes_exit_2_without_a_traceback():
    result = _cli("demo", "--requests", "0")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "not > 0" in result.stderr


def test_demo_with_an_unusable_region_directory_is_a_clear_error(tmp_path):
    missing = tmp_path / "nope"
    result = _cli("demo", "--requests", "2", "--shm-dir", str(missing))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert str(missing) in result.stderr
