"""What the ec_connector_extra_config tests share: a minimal config, the tier's parse of it and the
exact-message refusal every rejected value is checked with."""

from __future__ import annotations

import re

import pytest

from ec_connector.container import parse_settings
from ec_connector.domain.config import ConnectorConfig
from ec_connector.domain.errors import ConfigError

GIB = 1 << 30
BASE = {"ec_cpu_bytes": GIB}


def parse_tier(role: str = "ec_producer", **extra: object) -> ConnectorConfig:
    """The tier's config parsed from `BASE` updated with `extra`, for `role`."""
    return parse_settings({**BASE, **extra}, role=role).tier


def rejects(message: str):
    """Expects a ConfigError whose message is exactly `message`."""
    return pytest.raises(ConfigError, match=re.escape(message) + "$")
