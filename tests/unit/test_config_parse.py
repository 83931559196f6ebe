"""`parse_settings` as a whole (the container's parse of ec_connector_extra_config): every default,
the accepted keys, the extra itself, a full config into every field, and the error type."""

from __future__ import annotations

import pytest

from ec_connector.adapters.nixl_data.settings import NixlSettings
from ec_connector.adapters.zmq_settings import ZmqSettings, side_channel_from_env
from ec_connector.container import KNOWN_KEYS, Settings, parse_settings
from ec_connector.domain.config import ConnectorConfig, FleetConfig, Role
from ec_connector.domain.errors import ConfigError
from ec_connector.domain.layout import Layout
from tests.extra_config import GIB, parse_tier, rejects

ALL_KEYS = (
    "announce_lease_s, consumer_ack_timeout_s, ec_cpu_bytes, ec_enable_nixl, ec_eviction, ec_max_entry_runs, "
    "ec_min_run_bytes, "
    "event_feed_address, "
    "fleet_encode_us_per_row, fleet_heartbeat_timeout_s, fleet_max_entries, fleet_max_entries_per_peer, "
    "fleet_max_pulls_in_flight, fleet_peers, fleet_pull_fixed_ms, fleet_read_gib_s, "
    "nixl_backend, nixl_consumer_progress_thread, nixl_progress_delay_us, nixl_read_lanes, "
    "not_ready_backoff_max_s, "
    "not_ready_backoff_s, not_ready_give_up_s, producer_pin_lease_s, quarantine_s, read_timeout_s, "
    "save_lease_s, "
    "side_channel_secret, step_ack_wait_s, step_pull_wait_s, tenant_scopes, ucx_error_mode"
)


# --- defaults and keys ------------------------------------------------------------------------


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
    assert config.announce_lease_s is None and config.announce_hold_s == 0.0  # a consumer publishes nothing
    assert config.save_lease_s == 30.0
    assert config.not_ready_backoff_s == 0.005
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
    assert (config.step_ack_wait_s, config.step_pull_wait_s) == (0.002, 0.005)
    fleet = settings.fleet
    assert fleet.peers == () and not fleet.enabled
    assert fleet.heartbeat_timeout_s == 3.0
    assert fleet.encode_us_per_row == 10.0
    assert fleet.read_gib_s == 3.5
    assert fleet.pull_fixed_ms == 1.5
    assert (fleet.max_entries, fleet.max_entries_per_peer, fleet.max_pulls_in_flight) == (262_144, 65_536, 64)


def test_known_keys_are_ec_cpu_bytes_nixl_and_every_design_key():
    assert sorted(KNOWN_KEYS) == ALL_KEYS.split(", ")


# --- extra itself ------------------------------------------------------------------------------


@pytest.mark.parametrize("extra", [[1], "ec_cpu_bytes=1", 5])
def test_extra_that_is_not_a_dict_is_rejected(extra):
    with rejects(f"ec_connector_extra_config = {extra!r} is invalid: expected a JSON object (dict)"):
        parse_settings(extra, role="ec_producer")


def test_absent_extra_is_rejected_for_its_missing_ec_cpu_bytes():
    with rejects(
        "ec_connector_extra_config is missing required key 'ec_cpu_bytes': expected a positive "
        'integer number of bytes, e.g. {"ec_cpu_bytes": 1073741824}'
    ):
        parse_settings(None, role="ec_producer")


def test_unknown_key_is_rejected_naming_it():
    with rejects(f"ec_connector_extra_config has unknown key(s) 'ec_cpu_byte': accepted keys are {ALL_KEYS}"):
        parse_settings({"ec_cpu_byte": GIB}, role="ec_producer")


def test_every_unknown_key_is_named_sorted():
    with rejects(
        f"ec_connector_extra_config has unknown key(s) 'alpha', 'zeta': accepted keys are {ALL_KEYS}"
    ):
        parse_tier(zeta=1, alpha=2)


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
