"""The tier's keys in ec_connector_extra_config (the domain's `ConnectorConfig`): the role, the budget,
the run floor and cap, ec_enable_nixl, the leases and timeouts, tenant scopes; every rejected value
fails with its exact message."""

from __future__ import annotations

import math
import re

import pytest

from ec_connector.container import parse_settings
from ec_connector.domain.config import Role
from ec_connector.domain.errors import ConfigError
from ec_connector.domain.layout import Layout
from tests.extra_config import BASE, parse_tier, rejects

SECONDS_KEYS = [
    "consumer_ack_timeout_s",
    "read_timeout_s",
    "quarantine_s",
    "producer_pin_lease_s",
    "save_lease_s",
    "not_ready_backoff_s",
    "not_ready_backoff_max_s",
    "not_ready_give_up_s",
]


# --- roles ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "role", "saves", "loads"),
    [
        ("ec_producer", Role.PRODUCER, True, False),
        ("ec_consumer", Role.CONSUMER, False, True),
        ("ec_both", Role.BOTH, True, True),
    ],
)
def test_each_role_says_whether_it_saves_and_loads(raw, role, saves, loads):
    config = parse_tier(role=raw)
    assert config.role is role
    assert (role.saves, role.loads) == (saves, loads)


@pytest.mark.parametrize("role", ["producer", "", None, "EC_PRODUCER", 1])
def test_bad_role_is_rejected(role):
    with rejects(
        f"ec_role = {role!r} is invalid: expected one of 'ec_producer', 'ec_consumer', 'ec_both' "
        "(ec_role is required whenever ec_connector is set)"
    ):
        parse_settings(dict(BASE), role=role)


def test_config_is_frozen():
    config = parse_tier()
    with pytest.raises(AttributeError):
        config.cpu_bytes = 1  # type: ignore[misc]


# --- ec_cpu_bytes ------------------------------------------------------------------------------


def test_missing_ec_cpu_bytes_is_rejected_naming_the_key():
    with rejects(
        "ec_connector_extra_config is missing required key 'ec_cpu_bytes': expected a positive "
        'integer number of bytes, e.g. {"ec_cpu_bytes": 1073741824}'
    ):
        parse_settings({"ec_enable_nixl": False}, role="ec_producer")


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (0, "0"),
        (-1, "-1"),
        (1.5, "1.5"),
        (1073741824.0, "1073741824.0"),
        (True, "True"),
        (False, "False"),
        ("1073741824", "'1073741824'"),
        (None, "None"),
    ],
    ids=["zero", "negative", "float", "integral-float", "true", "false", "string", "null"],
)
def test_bad_ec_cpu_bytes_is_rejected(value, shown):
    with rejects(
        f"ec_connector_extra_config['ec_cpu_bytes'] = {shown} is invalid: expected a positive "
        "integer number of bytes, e.g. 1073741824"
    ):
        parse_settings({"ec_cpu_bytes": value}, role="ec_producer")


@pytest.mark.parametrize("key", ["ec_cpu_bytes", "consumer_ack_timeout_s"])
def test_a_huge_integer_is_rejected_without_printing_it(key):
    # Python refuses to repr an int of more than 4300 digits; the message must still be a ConfigError
    with pytest.raises(ConfigError, match=re.escape(f"[{key!r}] = <an integer of 16610 bits> is invalid")):
        parse_settings({"ec_cpu_bytes": 1 << 30, key: 10**5000}, role="ec_producer")


def test_ec_cpu_bytes_is_kept_exactly():
    assert parse_tier(ec_cpu_bytes=12345).cpu_bytes == 12345


def test_ec_cpu_bytes_smaller_than_one_block_is_rejected():
    config = parse_tier(ec_cpu_bytes=7167)
    with rejects(
        "ec_connector_extra_config['ec_cpu_bytes'] = 7167 is smaller than one block "
        "(7168 bytes = hidden_dim 3584 × bfloat16); expected an integer >= 7168"
    ):
        Layout.for_budget(config.cpu_bytes, hidden_dim=3584, dtype="bfloat16")


# --- ec_min_run_bytes ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 1, 4096, 1 << 20, (1 << 63) - 1])
def test_min_run_bytes_takes_any_byte_count_from_0(value):
    assert parse_tier(ec_min_run_bytes=value).min_run_bytes == value


@pytest.mark.parametrize("value", [-1, 1 << 63, 262144.0, "262144", True, None])
def test_min_run_bytes_negative_huge_or_not_an_int_is_refused(value):
    with rejects(
        f"ec_connector_extra_config['ec_min_run_bytes'] = {value!r} is invalid: expected an integer "
        "number of bytes >= 0 (0 turns the run floor off), e.g. 262144"
    ):
        parse_tier(ec_min_run_bytes=value)


# --- step_ack_wait_s, step_pull_wait_s ----------------------------------------------------------


def test_step_waits_default_to_two_and_five_milliseconds():
    config = parse_tier()
    assert (config.step_ack_wait_s, config.step_pull_wait_s) == (0.002, 0.005)


@pytest.mark.parametrize("key", ["step_ack_wait_s", "step_pull_wait_s"])
@pytest.mark.parametrize("value", [0, 0.0005, 0.002, 0.1])
def test_step_waits_take_seconds_from_0_to_a_tenth(key, value):
    assert getattr(parse_tier(**{key: value}), key) == value


@pytest.mark.parametrize(("key", "example"), [("step_ack_wait_s", "0.002"), ("step_pull_wait_s", "0.005")])
@pytest.mark.parametrize("value", [-0.001, 0.2, math.nan, math.inf, "0.002", True, None, 10**400])
def test_step_waits_negative_long_or_not_a_number_are_refused(key, example, value):
    shown = "<an integer of 1329 bits>" if value == 10**400 else repr(value)
    with rejects(
        f"ec_connector_extra_config['{key}'] = {shown} is invalid: expected a number of "
        f"seconds from 0 to 0.1 (0: no wait), e.g. {example}"
    ):
        parse_tier(**{key: value})


# --- ec_max_entry_runs --------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 1, 2, 4, 64])
def test_max_entry_runs_takes_any_count_from_0(value):
    assert parse_tier(ec_max_entry_runs=value).max_entry_runs == value


@pytest.mark.parametrize("value", [-1, (1 << 20) + 1, 4.0, "4", True, None])
def test_max_entry_runs_negative_huge_or_not_an_int_is_refused(value):
    with rejects(
        f"ec_connector_extra_config['ec_max_entry_runs'] = {value!r} is invalid: expected an integer "
        "number of runs from 0 to 1048576 (0 turns the run cap off), e.g. 4"
    ):
        parse_tier(ec_max_entry_runs=value)


# --- ec_enable_nixl ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [True, "true", "TRUE", "True", "1", "yes", "Yes", "YES"])
def test_ec_enable_nixl_values_that_enable(value):
    assert parse_tier(ec_enable_nixl=value).enable_nixl is True


@pytest.mark.parametrize("value", [False, "false", "0", "no", "on", "", "enabled", "y"])
def test_ec_enable_nixl_values_that_disable(value):
    assert parse_tier(ec_enable_nixl=value).enable_nixl is False


@pytest.mark.parametrize(("value", "shown"), [(1, "1"), (0, "0"), (None, "None"), (1.0, "1.0"), ([], "[]")])
def test_ec_enable_nixl_that_is_neither_bool_nor_string_is_rejected(value, shown):
    with rejects(
        f"ec_connector_extra_config['ec_enable_nixl'] = {shown} is invalid: expected a bool or a "
        'string ("true", "1", "yes" enable; anything else disables)'
    ):
        parse_tier(ec_enable_nixl=value)


# --- seconds -----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0.5, 3])
def test_consumer_ack_timeout_accepts_positive_numbers(value):
    config = parse_tier(consumer_ack_timeout_s=value)
    assert config.consumer_ack_timeout_s == float(value)
    assert type(config.consumer_ack_timeout_s) is float


def test_consumer_ack_timeout_defaults_to_two_seconds():
    assert parse_tier().consumer_ack_timeout_s == 2.0


@pytest.mark.parametrize(
    ("value", "shown", "form"),
    [
        (0, "0", "a finite number of seconds > 0, e.g. 2.0"),
        (0.0, "0.0", "a finite number of seconds > 0, e.g. 2.0"),
        (-1, "-1", "a finite number of seconds > 0, e.g. 2.0"),
        (-0.5, "-0.5", "a finite number of seconds > 0, e.g. 2.0"),
        (math.nan, "nan", "a finite number of seconds > 0, e.g. 2.0"),
        (math.inf, "inf", "a finite number of seconds > 0, e.g. 2.0"),
        (-math.inf, "-inf", "a finite number of seconds > 0, e.g. 2.0"),
        ("2", "'2'", "a number of seconds > 0, e.g. 2.0"),
        (True, "True", "a number of seconds > 0, e.g. 2.0"),
        (None, "None", "a number of seconds > 0, e.g. 2.0"),
    ],
    ids=["zero", "zero-float", "negative", "negative-float", "nan", "inf", "-inf", "string", "bool", "null"],
)
@pytest.mark.parametrize("key", SECONDS_KEYS)
def test_bad_seconds_value_is_rejected(key, value, shown, form):
    with rejects(f"ec_connector_extra_config[{key!r}] = {shown} is invalid: expected {form}"):
        parse_tier(**{key: value})


@pytest.mark.parametrize("value", [0.5, 3])
@pytest.mark.parametrize("key", SECONDS_KEYS)
def test_positive_seconds_value_is_accepted(key, value):
    extra = {key: value}
    if key == "not_ready_backoff_s":
        extra["not_ready_backoff_max_s"] = 5
    config = parse_tier(**extra)
    assert getattr(config, key) == float(value)
    assert type(getattr(config, key)) is float


@pytest.mark.parametrize(("role", "hold"), [("ec_producer", 60.0), ("ec_both", 0.0), ("ec_consumer", 0.0)])
def test_a_published_entry_is_held_a_minute_on_a_producer_and_not_held_on_ec_both(role, hold):
    config = parse_tier(role=role)
    assert config.announce_lease_s is None and config.announce_hold_s == hold


@pytest.mark.parametrize("value", [0, 0.0, 2, 7.5])
@pytest.mark.parametrize("role", ["ec_producer", "ec_both"])
def test_announce_lease_s_set_is_the_hold_on_every_role_and_zero_turns_it_off(role, value):
    config = parse_tier(role=role, announce_lease_s=value)
    assert config.announce_hold_s == float(value) and type(config.announce_lease_s) is float


@pytest.mark.parametrize(
    ("value", "shown", "form"),
    [
        (-1, "-1", "a finite number of seconds >= 0, e.g. 2.0"),
        (math.nan, "nan", "a finite number of seconds >= 0, e.g. 2.0"),
        (math.inf, "inf", "a finite number of seconds >= 0, e.g. 2.0"),
        ("60", "'60'", "a number of seconds >= 0, e.g. 2.0"),
        (None, "None", "a number of seconds >= 0, e.g. 2.0"),
    ],
)
def test_bad_announce_lease_s_is_rejected(value, shown, form):
    with rejects(f"ec_connector_extra_config['announce_lease_s'] = {shown} is invalid: expected {form}"):
        parse_tier(announce_lease_s=value)


def test_backoff_max_below_backoff_is_rejected():
    with rejects(
        "ec_connector_extra_config['not_ready_backoff_max_s'] = 0.001 is invalid: expected a "
        "number >= not_ready_backoff_s (0.005)"
    ):
        parse_tier(not_ready_backoff_max_s=0.001)


def test_backoff_above_the_default_max_is_rejected():
    with rejects(
        "ec_connector_extra_config['not_ready_backoff_max_s'] = 1.0 is invalid: expected a "
        "number >= not_ready_backoff_s (2.0)"
    ):
        parse_tier(not_ready_backoff_s=2)


def test_backoff_max_equal_to_backoff_is_accepted():
    config = parse_tier(not_ready_backoff_s=0.5, not_ready_backoff_max_s=0.5)
    assert (config.not_ready_backoff_s, config.not_ready_backoff_max_s) == (0.5, 0.5)


# --- tenant scopes -------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "expected"), [(False, False), ("false", False), ("yes", True), (True, True)])
def test_tenant_scopes_is_a_flag(raw, expected):
    assert parse_tier(tenant_scopes=raw).tenant_scopes is expected


def test_tenant_scopes_rejects_a_number():
    with rejects(
        "ec_connector_extra_config['tenant_scopes'] = 1 is invalid: expected a bool or a string "
        '("true", "1", "yes" enable; anything else disables)'
    ):
        parse_tier(tenant_scopes=1)
