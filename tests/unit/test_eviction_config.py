"""`ec_eviction` in ec_connector_extra_config: the accepted policies, the default, the error."""

from __future__ import annotations

import pytest

from ec_connector.domain.config import parse_config
from ec_connector.domain.errors import ConfigError
from ec_connector.domain.eviction import DEFAULT_POLICY, POLICIES


def _parse(**extra: object):
    return parse_config({"ec_cpu_bytes": 1 << 20, **extra}, role="ec_both")


def test_the_default_policy_is_duel():
    assert DEFAULT_POLICY == "duel"
    assert _parse().eviction == "duel"


@pytest.mark.parametrize("value", POLICIES)
def test_every_policy_is_accepted(value):
    assert _parse(ec_eviction=value).eviction == value


@pytest.mark.parametrize(
    ("value", "shown"),
    [("lru", "'lru'"), ("FIFO", "'FIFO'"), (1, "1"), (None, "None"), (["fifo"], "['fifo']")],
)
def test_a_bad_policy_is_rejected_naming_key_value_and_the_accepted_ones(value, shown):
    with pytest.raises(ConfigError) as err:
        _parse(ec_eviction=value)
    assert str(err.value) == (
        f"ec_connector_extra_config['ec_eviction'] = {shown} is invalid: "
        "expected one of 'fifo', 's3fifo', 'lecar', 'duel'"
    )
