"""ec_connector_extra_config validation (`parse_settings`: the tier's keys, NIXL's and ZMQ's): every
rejected value fails with its exact message; the side-channel environment and the per-rank ports."""

from __future__ import annotations

import math
import re

import pytest

from ec_connector.adapters.nixl_data.settings import NixlSettings
from ec_connector.adapters.zmq_settings import (
    SideChannel,
    ZmqSettings,
    endpoint_for_rank,
    side_channel_from_env,
)
from ec_connector.container import KNOWN_KEYS, Settings, parse_settings
from ec_connector.domain.config import ConnectorConfig, FleetConfig, FleetPeer, Role
from ec_connector.domain.errors import ConfigError
from ec_connector.domain.layout import Layout

GIB = 1 << 30
BASE = {"ec_cpu_bytes": GIB}
SECONDS_KEYS = [
    "consumer_ack_timeout_s",
    "read_timeout_s",
    "quarantine_s",
    "producer_pin_lease_s",
    "announce_lease_s",
    "save_lease_s",
    "not_ready_backoff_s",
    "not_ready_backoff_max_s",
    "not_ready_give_up_s",
]
ALL_KEYS = (
    "announce_lease_s, consumer_ack_timeout_s, ec_cpu_bytes, ec_enable_nixl, ec_eviction, ec_max_entry_runs, "
    "ec_min_run_bytes, "
    "event_feed_address, "
    "fleet_encode_us_per_row, fleet_heartbeat_timeout_s, fleet_max_entries, fleet_max_entries_per_peer, "
    "fleet_max_pulls_in_flight, fleet_peers, fleet_pull_fixed_ms, fleet_read_gib_s, "
    "nixl_backend, nixl_consumer_progress_thread, nixl_read_lanes, not_ready_backoff_max_s, "
    "not_ready_backoff_s, not_ready_give_up_s, producer_pin_lease_s, quarantine_s, read_timeout_s, "
    "save_lease_s, "
    "side_channel_secret, tenant_scopes, ucx_error_mode"
)


def _parse(role: str = "ec_producer", **extra) -> ConnectorConfig:
    return parse_settings({**BASE, **extra}, role=role).tier


def _nixl(**extra) -> NixlSettings:
    return parse_settings({**BASE, **extra}, role="ec_consumer").nixl


def _zmq(**extra) -> ZmqSettings:
    return parse_settings({**BASE, **extra}, role="ec_producer").zmq


def _rejects(message: str):
    return pytest.raises(ConfigError, match=re.escape(message) + "$")


# --- defaults and roles ------------------------------------------------------------------------


def test_minimal_config_takes_every_documented_default():
    settings = parse_settings({"ec_cpu_bytes": GIB}, role="ec_consumer")
    assert settings == Settings(
        ConnectorConfig(role=Role.CONSUMER, cpu_bytes=GIB), NixlSettings(), ZmqSettings(), FleetConfig()
    )
    config = settings.tier
    assert config.enable_nixl is False
    assert config.consumer_ack_timeout_s == 2.0
    assert config.read_timeout_s == 20.0
    assert config.quarantine_s == 60.0
    assert config.producer_pin_lease_s == 30.0
    assert config.announce_lease_s == 60.0
    assert config.save_lease_s == 30.0
    assert config.not_ready_backoff_s == 0.05
    assert config.not_ready_backoff_max_s == 1.0
    assert config.not_ready_give_up_s == 10.0
    assert settings.nixl.backend == "UCX"
    assert settings.nixl.ucx_error_mode == "peer"
    assert settings.nixl.read_lanes == 4
    assert settings.nixl.consumer_progress_thread is True
    assert settings.zmq.side_channel_secret is None
    assert settings.zmq.event_feed_address is None
    assert config.min_run_bytes == 256 * 1024
    assert config.max_entry_runs == 4
    assert config.tenant_scopes is True
    fleet = settings.fleet
    assert fleet.peers == () and not fleet.enabled
    assert fleet.heartbeat_timeout_s == 3.0
    assert fleet.encode_us_per_row == 10.0
    assert fleet.read_gib_s == 3.5
    assert fleet.pull_fixed_ms == 1.5
    assert (fleet.max_entries, fleet.max_entries_per_peer, fleet.max_pulls_in_flight) == (262_144, 65_536, 64)


def test_known_keys_are_ec_cpu_bytes_nixl_and_every_design_key():
    assert sorted(KNOWN_KEYS) == ALL_KEYS.split(", ")


@pytest.mark.parametrize(
    ("raw", "role", "saves", "loads"),
    [
        ("ec_producer", Role.PRODUCER, True, False),
        ("ec_consumer", Role.CONSUMER, False, True),
        ("ec_both", Role.BOTH, True, True),
    ],
)
def test_each_role_says_whether_it_saves_and_loads(raw, role, saves, loads):
    config = _parse(role=raw)
    assert config.role is role
    assert (role.saves, role.loads) == (saves, loads)


@pytest.mark.parametrize("role", ["producer", "", None, "EC_PRODUCER", 1])
def test_bad_role_is_rejected(role):
    with _rejects(
        f"ec_role = {role!r} is invalid: expected one of 'ec_producer', 'ec_consumer', 'ec_both' "
        "(ec_role is required whenever ec_connector is set)"
    ):
        parse_settings(dict(BASE), role=role)


def test_config_is_frozen():
    config = _parse()
    with pytest.raises(AttributeError):
        config.cpu_bytes = 1  # type: ignore[misc]


# --- extra itself ------------------------------------------------------------------------------


@pytest.mark.parametrize("extra", [[1], "ec_cpu_bytes=1", 5])
def test_extra_that_is_not_a_dict_is_rejected(extra):
    with _rejects(f"ec_connector_extra_config = {extra!r} is invalid: expected a JSON object (dict)"):
        parse_settings(extra, role="ec_producer")


def test_absent_extra_is_rejected_for_its_missing_ec_cpu_bytes():
    with _rejects(
        "ec_connector_extra_config is missing required key 'ec_cpu_bytes': expected a positive "
        'integer number of bytes, e.g. {"ec_cpu_bytes": 1073741824}'
    ):
        parse_settings(None, role="ec_producer")


def test_unknown_key_is_rejected_naming_it():
    with _rejects(
        f"ec_connector_extra_config has unknown key(s) 'ec_cpu_byte': accepted keys are {ALL_KEYS}"
    ):
        parse_settings({"ec_cpu_byte": GIB}, role="ec_producer")


def test_every_unknown_key_is_named_sorted():
    with _rejects(
        f"ec_connector_extra_config has unknown key(s) 'alpha', 'zeta': accepted keys are {ALL_KEYS}"
    ):
        _parse(zeta=1, alpha=2)


# --- ec_cpu_bytes ------------------------------------------------------------------------------


def test_missing_ec_cpu_bytes_is_rejected_naming_the_key():
    with _rejects(
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
    with _rejects(
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
    assert _parse(ec_cpu_bytes=12345).cpu_bytes == 12345


def test_ec_cpu_bytes_smaller_than_one_block_is_rejected():
    config = _parse(ec_cpu_bytes=7167)
    with _rejects(
        "ec_connector_extra_config['ec_cpu_bytes'] = 7167 is smaller than one block "
        "(7168 bytes = hidden_dim 3584 × bfloat16); expected an integer >= 7168"
    ):
        Layout.for_budget(config.cpu_bytes, hidden_dim=3584, dtype="bfloat16")


# --- nixl_consumer_progress_thread ------------------------------------------------------------


def test_consumer_progress_thread_is_on_unless_turned_off():
    assert _nixl().consumer_progress_thread is True
    assert _nixl(nixl_consumer_progress_thread=False).consumer_progress_thread is False
    assert _nixl(nixl_consumer_progress_thread="false").consumer_progress_thread is False
    with _rejects(
        "ec_connector_extra_config['nixl_consumer_progress_thread'] = 0 is invalid: expected a bool or a "
        'string ("true", "1", "yes" enable; anything else disables)'
    ):
        _parse(nixl_consumer_progress_thread=0)


# --- nixl_read_lanes --------------------------------------------------------------------------


def test_read_lanes_default_to_4_and_take_1_to_32():
    assert _nixl().read_lanes == 4
    assert _nixl(nixl_read_lanes=1).read_lanes == 1
    assert _nixl(nixl_read_lanes=32).read_lanes == 32


@pytest.mark.parametrize("value", [0, 33, -1, 4.0, "4", True, None])
def test_read_lanes_outside_1_to_32_or_not_an_int_are_refused(value):
    with _rejects(
        f"ec_connector_extra_config['nixl_read_lanes'] = {value!r} is invalid: expected an integer "
        "number of NIXL agents from 1 to 32, e.g. 4"
    ):
        _parse(nixl_read_lanes=value)


# --- ec_min_run_bytes ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 1, 4096, 1 << 20, (1 << 63) - 1])
def test_min_run_bytes_takes_any_byte_count_from_0(value):
    assert _parse(ec_min_run_bytes=value).min_run_bytes == value


@pytest.mark.parametrize("value", [-1, 1 << 63, 262144.0, "262144", True, None])
def test_min_run_bytes_negative_huge_or_not_an_int_is_refused(value):
    with _rejects(
        f"ec_connector_extra_config['ec_min_run_bytes'] = {value!r} is invalid: expected an integer "
        "number of bytes >= 0 (0 turns the run floor off), e.g. 262144"
    ):
        _parse(ec_min_run_bytes=value)


# --- ec_max_entry_runs --------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 1, 2, 4, 64])
def test_max_entry_runs_takes_any_count_from_0(value):
    assert _parse(ec_max_entry_runs=value).max_entry_runs == value


@pytest.mark.parametrize("value", [-1, (1 << 20) + 1, 4.0, "4", True, None])
def test_max_entry_runs_negative_huge_or_not_an_int_is_refused(value):
    with _rejects(
        f"ec_connector_extra_config['ec_max_entry_runs'] = {value!r} is invalid: expected an integer "
        "number of runs from 0 to 1048576 (0 turns the run cap off), e.g. 4"
    ):
        _parse(ec_max_entry_runs=value)


# --- ec_enable_nixl ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [True, "true", "TRUE", "True", "1", "yes", "Yes", "YES"])
def test_ec_enable_nixl_values_that_enable(value):
    assert _parse(ec_enable_nixl=value).enable_nixl is True


@pytest.mark.parametrize("value", [False, "false", "0", "no", "on", "", "enabled", "y"])
def test_ec_enable_nixl_values_that_disable(value):
    assert _parse(ec_enable_nixl=value).enable_nixl is False


@pytest.mark.parametrize(("value", "shown"), [(1, "1"), (0, "0"), (None, "None"), (1.0, "1.0"), ([], "[]")])
def test_ec_enable_nixl_that_is_neither_bool_nor_string_is_rejected(value, shown):
    with _rejects(
        f"ec_connector_extra_config['ec_enable_nixl'] = {shown} is invalid: expected a bool or a "
        'string ("true", "1", "yes" enable; anything else disables)'
    ):
        _parse(ec_enable_nixl=value)


# --- seconds -----------------------------------------------------------------------------------


def test_consumer_ack_timeout_defaults_to_two_seconds():
    assert _parse().consumer_ack_timeout_s == 2.0


@pytest.mark.parametrize("value", [0.5, 3])
def test_consumer_ack_timeout_accepts_positive_numbers(value):
    config = _parse(consumer_ack_timeout_s=value)
    assert config.consumer_ack_timeout_s == float(value)
    assert type(config.consumer_ack_timeout_s) is float


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
    with _rejects(f"ec_connector_extra_config[{key!r}] = {shown} is invalid: expected {form}"):
        _parse(**{key: value})


@pytest.mark.parametrize("value", [0.5, 3])
@pytest.mark.parametrize("key", SECONDS_KEYS)
def test_positive_seconds_value_is_accepted(key, value):
    extra = {key: value}
    if key == "not_ready_backoff_s":
        extra["not_ready_backoff_max_s"] = 5
    config = _parse(**extra)
    assert getattr(config, key) == float(value)
    assert type(getattr(config, key)) is float


def test_backoff_max_below_backoff_is_rejected():
    with _rejects(
        "ec_connector_extra_config['not_ready_backoff_max_s'] = 0.01 is invalid: expected a "
        "number >= not_ready_backoff_s (0.05)"
    ):
        _parse(not_ready_backoff_max_s=0.01)


def test_backoff_above_the_default_max_is_rejected():
    with _rejects(
        "ec_connector_extra_config['not_ready_backoff_max_s'] = 1.0 is invalid: expected a "
        "number >= not_ready_backoff_s (2.0)"
    ):
        _parse(not_ready_backoff_s=2)


def test_backoff_max_equal_to_backoff_is_accepted():
    config = _parse(not_ready_backoff_s=0.5, not_ready_backoff_max_s=0.5)
    assert (config.not_ready_backoff_s, config.not_ready_backoff_max_s) == (0.5, 0.5)


# --- choices and text --------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["UCX", "LIBFABRIC", "GDS", "POSIX", "OBJ", "MOONCAKE"])
def test_nixl_backend_choices_are_accepted(value):
    assert _nixl(nixl_backend=value).backend == value


@pytest.mark.parametrize(("value", "shown"), [("ucx", "'ucx'"), ("", "''"), (None, "None"), (1, "1")])
def test_bad_nixl_backend_is_rejected(value, shown):
    with _rejects(
        f"ec_connector_extra_config['nixl_backend'] = {shown} is invalid: expected one of "
        "'UCX', 'LIBFABRIC', 'GDS', 'POSIX', 'OBJ', 'MOONCAKE'"
    ):
        _parse(nixl_backend=value)


@pytest.mark.parametrize("value", ["none", "peer"])
def test_ucx_error_mode_choices_are_accepted(value):
    assert _nixl(ucx_error_mode=value).ucx_error_mode == value


@pytest.mark.parametrize(
    ("value", "shown"), [("PEER", "'PEER'"), ("", "''"), (None, "None"), (False, "False")]
)
def test_bad_ucx_error_mode_is_rejected(value, shown):
    with _rejects(
        f"ec_connector_extra_config['ucx_error_mode'] = {shown} is invalid: expected one of 'none', 'peer'"
    ):
        _parse(ucx_error_mode=value)


def test_side_channel_secret_accepts_text_or_null():
    assert _zmq(side_channel_secret="s3cret").side_channel_secret == "s3cret"
    assert _zmq(side_channel_secret=None).side_channel_secret is None


@pytest.mark.parametrize(("value", "shown"), [("", "''"), (42, "42"), (b"k", "b'k'")])
def test_bad_side_channel_secret_is_rejected(value, shown):
    with _rejects(
        f"ec_connector_extra_config['side_channel_secret'] = {shown} is invalid: expected a "
        "non-empty string or null"
    ):
        _parse(side_channel_secret=value)


def test_event_feed_address_accepts_an_endpoint_or_null():
    assert _zmq(event_feed_address="tcp://127.0.0.1:5610").event_feed_address == "tcp://127.0.0.1:5610"
    assert _zmq(event_feed_address=None).event_feed_address is None


@pytest.mark.parametrize(("value", "shown"), [("", "''"), (5610, "5610"), (["tcp://x:1"], "['tcp://x:1']")])
def test_bad_event_feed_address_is_rejected(value, shown):
    with _rejects(
        f"ec_connector_extra_config['event_feed_address'] = {shown} is invalid: expected a ZMQ "
        'endpoint string such as "tcp://127.0.0.1:5610", or null'
    ):
        _parse(event_feed_address=value)


def test_full_config_is_parsed_into_every_field():
    config = parse_settings(
        {
            "ec_cpu_bytes": 4 * GIB,
            "ec_enable_nixl": "yes",
            "consumer_ack_timeout_s": 1,
            "read_timeout_s": 5,
            "quarantine_s": 7,
            "producer_pin_lease_s": 9,
            "announce_lease_s": 11,
            "save_lease_s": 13,
            "not_ready_backoff_s": 0.1,
            "not_ready_backoff_max_s": 0.2,
            "not_ready_give_up_s": 3,
            "nixl_backend": "LIBFABRIC",
            "ucx_error_mode": "peer",
            "side_channel_secret": "k",
            "event_feed_address": "tcp://h:1",
        },
        role="ec_both",
    )
    assert config == Settings(
        tier=ConnectorConfig(
            role=Role.BOTH,
            cpu_bytes=4 * GIB,
            enable_nixl=True,
            consumer_ack_timeout_s=1.0,
            read_timeout_s=5.0,
            quarantine_s=7.0,
            producer_pin_lease_s=9.0,
            announce_lease_s=11.0,
            save_lease_s=13.0,
            not_ready_backoff_s=0.1,
            not_ready_backoff_max_s=0.2,
            not_ready_give_up_s=3.0,
        ),
        nixl=NixlSettings(backend="LIBFABRIC", ucx_error_mode="peer"),
        zmq=ZmqSettings(side_channel_secret="k", event_feed_address="tcp://h:1"),
    )


# --- side channel environment ------------------------------------------------------------------


def test_side_channel_defaults_to_localhost_5601():
    assert side_channel_from_env({}) == SideChannel("localhost", 5601)


def test_side_channel_reads_host_and_port():
    env = {"VLLM_EC_SIDE_CHANNEL_HOST": "10.1.2.3", "VLLM_EC_SIDE_CHANNEL_PORT": "6000"}
    assert side_channel_from_env(env) == SideChannel("10.1.2.3", 6000)


@pytest.mark.parametrize("port", ["0", "1", "65535"])
def test_side_channel_accepts_the_port_range_ends(port):
    assert side_channel_from_env({"VLLM_EC_SIDE_CHANNEL_PORT": port}).port == int(port)


@pytest.mark.parametrize("port", ["abc", "70000", "65536", "-1", "", "56.01", " 6000 ", "5_601", "６０００"])
def test_bad_side_channel_port_is_rejected(port):
    with _rejects(
        f"VLLM_EC_SIDE_CHANNEL_PORT = {port!r} is invalid: "
        "expected an integer port 0-65535 (0: any free port)"
    ):
        side_channel_from_env({"VLLM_EC_SIDE_CHANNEL_PORT": port})


@pytest.mark.parametrize(
    ("address", "rank", "expected"),
    [
        ("tcp://127.0.0.1:5610", 0, "tcp://127.0.0.1:5610"),
        ("tcp://127.0.0.1:5610", 3, "tcp://127.0.0.1:5613"),
        ("tcp://*:5610", 1, "tcp://*:5611"),
        ("tcp://[::1]:5610", 2, "tcp://[::1]:5612"),
        ("tcp://127.0.0.1:0", 2, "tcp://127.0.0.1:0"),
        ("tcp://127.0.0.1:*", 2, "tcp://127.0.0.1:*"),
        ("ipc:///tmp/ec_events", 0, "ipc:///tmp/ec_events"),
        ("ipc:///tmp/ec_events", 2, "ipc:///tmp/ec_events_dp2"),
        ("inproc://feed", 1, "inproc://feed_dp1"),
    ],
)
def test_each_data_parallel_rank_publishes_its_own_event_feed(address, rank, expected):
    assert endpoint_for_rank(address, rank) == expected


def test_an_event_feed_rank_past_the_last_port_is_rejected():
    with _rejects(
        "ec_connector_extra_config['event_feed_address'] = 'tcp://h:65535' puts data-parallel rank 1 "
        "at port 65536, past 65535: each rank uses port + rank; lower the port, or set 0 for any free port"
    ):
        endpoint_for_rank("tcp://h:65535", 1)


def test_each_data_parallel_rank_listens_at_port_plus_rank():
    channel = SideChannel("10.1.2.3", 6000)
    assert channel.for_rank(0) == channel
    assert channel.for_rank(3) == SideChannel("10.1.2.3", 6003)


def test_port_zero_stays_any_free_port_on_every_rank():
    assert SideChannel("h", 0).for_rank(5) == SideChannel("h", 0)


def test_a_rank_past_the_last_port_is_rejected():
    assert SideChannel("h", 65534).for_rank(1).port == 65535
    with _rejects(
        "VLLM_EC_SIDE_CHANNEL_PORT = 65534 puts data-parallel rank 2 at port 65536, past 65535: each "
        "rank uses port + rank; lower the port, or set 0 for any free port"
    ):
        SideChannel("h", 65534).for_rank(2)


@pytest.mark.parametrize("host", ["", "   "])
def test_empty_side_channel_host_is_rejected(host):
    with _rejects("VLLM_EC_SIDE_CHANNEL_HOST is empty: expected a host name or address"):
        side_channel_from_env({"VLLM_EC_SIDE_CHANNEL_HOST": host})


# --- error type --------------------------------------------------------------------------------


BAD_CONFIGS = [
    (None, "ec_producer"),
    ({}, "ec_producer"),
    ({"ec_cpu_bytes": 0}, "ec_producer"),
    ({"ec_cpu_bytes": GIB, "ec_enable_nixl": 1}, "ec_producer"),
    ({"ec_cpu_bytes": GIB, "read_timeout_s": -1}, "ec_producer"),
    ({"ec_cpu_bytes": GIB, "bogus": 1}, "ec_producer"),
    ({"ec_cpu_bytes": GIB}, "nope"),
    ([], "ec_producer"),
    ({"ec_cpu_bytes": GIB, "nixl_backend": "x"}, "ec_producer"),
    ({"ec_cpu_bytes": GIB, "not_ready_backoff_max_s": 0.001}, "ec_producer"),
]


@pytest.mark.parametrize(("extra", "role"), BAD_CONFIGS)
def test_every_config_error_is_a_value_error(extra, role):
    with pytest.raises(ValueError) as info:
        parse_settings(extra, role=role)
    assert isinstance(info.value, ConfigError)


def test_env_and_layout_config_errors_are_value_errors():
    with pytest.raises(ValueError):
        side_channel_from_env({"VLLM_EC_SIDE_CHANNEL_PORT": "x"})
    with pytest.raises(ValueError):
        Layout.for_budget(1, hidden_dim=8, dtype="float32")
    assert issubclass(ConfigError, ValueError)


# --- tenant scopes and the fleet ---------------------------------------------------------------

PEER = {
    "engine_id": "replica-b",
    "event_feed": "tcp://10.0.0.2:5610",
    "peer_host": "10.0.0.2",
    "peer_port": 5601,
}
PEER_FORM = (
    'a list of peers, each {"event_feed": "tcp://host:port"} (the peer says who it is in its feed\'s '
    'hello frames) or {"engine_id": str, "event_feed": "tcp://host:port", "peer_host": str, '
    '"peer_port": int 1-65535}, with distinct engine_ids and event_feeds'
)


def _fleet(role: str = "ec_both", **extra):
    return parse_settings({**BASE, "ec_enable_nixl": True, **extra}, role=role).fleet


@pytest.mark.parametrize(("raw", "expected"), [(False, False), ("false", False), ("yes", True), (True, True)])
def test_tenant_scopes_is_a_flag(raw, expected):
    assert _parse(tenant_scopes=raw).tenant_scopes is expected


def test_tenant_scopes_rejects_a_number():
    with _rejects(
        "ec_connector_extra_config['tenant_scopes'] = 1 is invalid: expected a bool or a string "
        '("true", "1", "yes" enable; anything else disables)'
    ):
        _parse(tenant_scopes=1)


@pytest.mark.parametrize("role", ["ec_both", "ec_consumer"])
def test_fleet_peers_are_parsed_for_a_replica_that_pulls(role):
    other = {**PEER, "engine_id": "replica-c", "event_feed": "tcp://10.0.0.2:5611", "peer_port": 5602}
    fleet = _fleet(role, fleet_peers=[PEER, other, {"event_feed": "tcp://10.0.0.3:5610"}])
    assert fleet.enabled
    assert fleet.peers == (
        FleetPeer("tcp://10.0.0.2:5610", "replica-b", "10.0.0.2", 5601),
        FleetPeer("tcp://10.0.0.2:5611", "replica-c", "10.0.0.2", 5602),
        FleetPeer("tcp://10.0.0.3:5610"),
    )


def test_fleet_figures_and_bounds_are_read():
    fleet = _fleet(
        fleet_heartbeat_timeout_s=1,
        fleet_encode_us_per_row=0,
        fleet_read_gib_s=0.6,
        fleet_pull_fixed_ms=0,
        fleet_max_entries=100,
        fleet_max_entries_per_peer=100,
        fleet_max_pulls_in_flight=1,
    )
    assert fleet == FleetConfig(
        heartbeat_timeout_s=1.0,
        encode_us_per_row=0.0,
        read_gib_s=0.6,
        pull_fixed_ms=0.0,
        max_entries=100,
        max_entries_per_peer=100,
        max_pulls_in_flight=1,
    )


@pytest.mark.parametrize(
    ("extra", "role", "reason"),
    [
        ({"ec_enable_nixl": False}, "ec_both", "ec_enable_nixl=False, ec_role='ec_both'"),
        ({}, "ec_producer", "ec_enable_nixl=True, ec_role='ec_producer'"),
    ],
)
def test_fleet_peers_are_refused_where_the_replica_cannot_pull(extra, role, reason):
    shown = str([PEER])[:77] + "..."  # values are shown cut to 80 characters
    with _rejects(
        f"ec_connector_extra_config['fleet_peers'] = {shown} is invalid: expected [] (no fleet) for this "
        "replica: fleet pulls need ec_enable_nixl on and ec_role 'ec_both' or 'ec_consumer' "
        f"(here {reason})"
    ):
        parse_settings({**BASE, "ec_enable_nixl": True, **extra, "fleet_peers": [PEER]}, role=role)


@pytest.mark.parametrize(
    ("peers", "message"),
    [
        ({"a": 1}, "['fleet_peers'] = {'a': 1} is invalid: expected " + PEER_FORM),
        (
            [PEER, PEER],
            "['fleet_peers'] = "
            + str([PEER, PEER])[:77]
            + "... is invalid: expected "
            + PEER_FORM
            + " (engine_id 'replica-b' is listed twice)",
        ),
        (
            [{"event_feed": "tcp://h:1"}, {"event_feed": "tcp://h:1"}],
            "['fleet_peers'] = [{'event_feed': 'tcp://h:1'}, {'event_feed': 'tcp://h:1'}] is invalid: "
            "expected " + PEER_FORM + " (event_feed 'tcp://h:1' is listed twice)",
        ),
        (
            [{"event_feed": "tcp://h:1", "engine_id": "b"}],
            "['fleet_peers'][0] = {'event_feed': 'tcp://h:1', 'engine_id': 'b'} is invalid (missing "
            "'peer_host', 'peer_port'): expected exactly the keys engine_id, event_feed, peer_host, "
            "peer_port, or event_feed alone (the peer's hello frames tell the others)",
        ),
        (
            [{"event_feed": "h:1"}],
            "['fleet_peers'][0]['event_feed'] = 'h:1' is invalid: expected a ZMQ endpoint such as "
            '"tcp://10.0.0.2:5610" (the peer\'s event_feed_address, reachable from here)',
        ),
        (["x"], "['fleet_peers'][0] = 'x' is invalid: expected " + PEER_FORM),
        (
            [{"engine_id": "b", "peer_host": "h", "peer_port": 1, "port": 2}],
            "['fleet_peers'][0] = {'engine_id': 'b', 'peer_host': 'h', 'peer_port': 1, 'port': 2} is invalid "
            "(missing 'event_feed'; unknown 'port'): expected exactly the keys engine_id, event_feed, "
            "peer_host, peer_port, or event_feed alone (the peer's hello frames tell the others)",
        ),
        (
            [{**PEER, "engine_id": " "}],
            "['fleet_peers'][0]['engine_id'] = ' ' is invalid: expected a non-empty string",
        ),
        (
            [{**PEER, "peer_host": 7}],
            "['fleet_peers'][0]['peer_host'] = 7 is invalid: expected a non-empty string",
        ),
        (
            [{**PEER, "event_feed": "10.0.0.2:5610"}],
            "['fleet_peers'][0]['event_feed'] = '10.0.0.2:5610' is invalid: expected a ZMQ endpoint such as "
            '"tcp://10.0.0.2:5610" (the peer\'s event_feed_address, reachable from here)',
        ),
        (
            [{**PEER, "peer_port": 0}],
            "['fleet_peers'][0]['peer_port'] = 0 is invalid: expected an integer port 1-65535 "
            "(the peer's VLLM_EC_SIDE_CHANNEL_PORT)",
        ),
        (
            [{**PEER, "peer_port": True}],
            "['fleet_peers'][0]['peer_port'] = True is invalid: expected an integer port 1-65535 "
            "(the peer's VLLM_EC_SIDE_CHANNEL_PORT)",
        ),
    ],
)
def test_bad_fleet_peers_are_rejected_naming_the_peer_and_field(peers, message):
    with _rejects("ec_connector_extra_config" + message):
        _fleet(fleet_peers=peers)


@pytest.mark.parametrize(
    ("key", "value", "form"),
    [
        ("fleet_heartbeat_timeout_s", 0, "a finite number of seconds > 0, e.g. 2.0"),
        ("fleet_read_gib_s", 0, "a finite number > 0, e.g. 3.5"),
        ("fleet_read_gib_s", "fast", "a finite number > 0, e.g. 3.5"),
        ("fleet_encode_us_per_row", -1, "a finite number >= 0, e.g. 10.0"),
        ("fleet_encode_us_per_row", math.inf, "a finite number >= 0, e.g. 10.0"),
        ("fleet_pull_fixed_ms", True, "a finite number >= 0, e.g. 1.5"),
        ("fleet_max_entries", 0, "an integer from 1 to 2147483647, e.g. 262144"),
        ("fleet_max_entries_per_peer", 1.5, "an integer from 1 to 2147483647, e.g. 65536"),
        ("fleet_max_pulls_in_flight", 1 << 31, "an integer from 1 to 2147483647, e.g. 64"),
    ],
)
def test_bad_fleet_figures_are_rejected(key, value, form):
    with _rejects(f"ec_connector_extra_config[{key!r}] = {value!r} is invalid: expected {form}"):
        _fleet(**{key: value})


def test_per_peer_bound_above_the_directory_bound_is_rejected():
    with _rejects(
        "ec_connector_extra_config['fleet_max_entries_per_peer'] = 11 is invalid: expected an integer "
        "<= fleet_max_entries (10)"
    ):
        _fleet(fleet_max_entries=10, fleet_max_entries_per_peer=11)
