"""The NIXL and ZMQ adapters' settings in ec_connector_extra_config (`NixlSettings`, `ZmqSettings`),
the side-channel environment and the per-rank ports; every rejected value fails with its exact
message."""

from __future__ import annotations

import pytest

from ec_connector.adapters.nixl_data.settings import NixlSettings
from ec_connector.adapters.zmq_settings import (
    SideChannel,
    ZmqSettings,
    endpoint_for_rank,
    side_channel_from_env,
)
from ec_connector.container import parse_settings
from tests.extra_config import BASE, parse_tier, rejects


def _nixl(**extra) -> NixlSettings:
    return parse_settings({**BASE, **extra}, role="ec_consumer").nixl


def _zmq(**extra) -> ZmqSettings:
    return parse_settings({**BASE, **extra}, role="ec_producer").zmq


# --- nixl_consumer_progress_thread ------------------------------------------------------------


def test_consumer_progress_thread_is_on_unless_turned_off():
    assert _nixl().consumer_progress_thread is True
    assert _nixl(nixl_consumer_progress_thread=False).consumer_progress_thread is False
    assert _nixl(nixl_consumer_progress_thread="false").consumer_progress_thread is False
    with rejects(
        "ec_connector_extra_config['nixl_consumer_progress_thread'] = 0 is invalid: expected a bool or a "
        'string ("true", "1", "yes" enable; anything else disables)'
    ):
        parse_tier(nixl_consumer_progress_thread=0)


# --- nixl_progress_delay_us -------------------------------------------------------------------


def test_progress_delay_defaults_to_1000_us_and_takes_0_to_100000():
    assert _nixl().progress_delay_us == 1000
    assert _nixl(nixl_progress_delay_us=0).progress_delay_us == 0
    assert _nixl(nixl_progress_delay_us=100_000).progress_delay_us == 100_000


@pytest.mark.parametrize("value", [-1, 100_001, 1000.0, "1000", True, None])
def test_progress_delay_outside_0_to_100000_or_not_an_int_is_refused(value):
    with rejects(
        f"ec_connector_extra_config['nixl_progress_delay_us'] = {value!r} is invalid: expected an integer "
        "number of microseconds from 0 (spin) to 100000, e.g. 1000"
    ):
        parse_tier(nixl_progress_delay_us=value)


# --- nixl_read_lanes --------------------------------------------------------------------------


def test_read_lanes_default_to_4_and_take_1_to_32():
    assert _nixl().read_lanes == 4
    assert _nixl(nixl_read_lanes=1).read_lanes == 1
    assert _nixl(nixl_read_lanes=32).read_lanes == 32


@pytest.mark.parametrize("value", [0, 33, -1, 4.0, "4", True, None])
def test_read_lanes_outside_1_to_32_or_not_an_int_are_refused(value):
    with rejects(
        f"ec_connector_extra_config['nixl_read_lanes'] = {value!r} is invalid: expected an integer "
        "number of NIXL agents from 1 to 32, e.g. 4"
    ):
        parse_tier(nixl_read_lanes=value)


# --- NIXL backend and UCX mode ------------------------------------------------------------------


@pytest.mark.parametrize("value", ["UCX", "LIBFABRIC", "GDS", "POSIX", "OBJ", "MOONCAKE"])
def test_nixl_backend_choices_are_accepted(value):
    assert _nixl(nixl_backend=value).backend == value


@pytest.mark.parametrize(("value", "shown"), [("ucx", "'ucx'"), ("", "''"), (None, "None"), (1, "1")])
def test_bad_nixl_backend_is_rejected(value, shown):
    with rejects(
        f"ec_connector_extra_config['nixl_backend'] = {shown} is invalid: expected one of "
        "'UCX', 'LIBFABRIC', 'GDS', 'POSIX', 'OBJ', 'MOONCAKE'"
    ):
        parse_tier(nixl_backend=value)


@pytest.mark.parametrize("value", ["none", "peer"])
def test_ucx_error_mode_choices_are_accepted(value):
    assert _nixl(ucx_error_mode=value).ucx_error_mode == value


@pytest.mark.parametrize(
    ("value", "shown"), [("PEER", "'PEER'"), ("", "''"), (None, "None"), (False, "False")]
)
def test_bad_ucx_error_mode_is_rejected(value, shown):
    with rejects(
        f"ec_connector_extra_config['ucx_error_mode'] = {shown} is invalid: expected one of 'none', 'peer'"
    ):
        parse_tier(ucx_error_mode=value)


# --- ZMQ secret and event feed ------------------------------------------------------------------


def test_side_channel_secret_accepts_text_or_null():
    assert _zmq(side_channel_secret="s3cret").side_channel_secret == "s3cret"
    assert _zmq(side_channel_secret=None).side_channel_secret is None


@pytest.mark.parametrize(("value", "shown"), [("", "''"), (42, "42"), (b"k", "b'k'")])
def test_bad_side_channel_secret_is_rejected(value, shown):
    with rejects(
        f"ec_connector_extra_config['side_channel_secret'] = {shown} is invalid: expected a "
        "non-empty string or null"
    ):
        parse_tier(side_channel_secret=value)


def test_event_feed_address_accepts_an_endpoint_or_null():
    assert _zmq(event_feed_address="tcp://127.0.0.1:5610").event_feed_address == "tcp://127.0.0.1:5610"
    assert _zmq(event_feed_address=None).event_feed_address is None


@pytest.mark.parametrize(("value", "shown"), [("", "''"), (5610, "5610"), (["tcp://x:1"], "['tcp://x:1']")])
def test_bad_event_feed_address_is_rejected(value, shown):
    with rejects(
        f"ec_connector_extra_config['event_feed_address'] = {shown} is invalid: expected a ZMQ "
        'endpoint string such as "tcp://127.0.0.1:5610", or null'
    ):
        parse_tier(event_feed_address=value)


# --- side channel environment ------------------------------------------------------------------


@pytest.mark.parametrize("port", ["0", "1", "65535"])
def test_side_channel_accepts_the_port_range_ends(port):
    assert side_channel_from_env({"VLLM_EC_SIDE_CHANNEL_PORT": port}).port == int(port)


def test_side_channel_defaults_to_localhost_5601():
    assert side_channel_from_env({}) == SideChannel("localhost", 5601)


def test_side_channel_reads_host_and_port():
    env = {"VLLM_EC_SIDE_CHANNEL_HOST": "10.1.2.3", "VLLM_EC_SIDE_CHANNEL_PORT": "6000"}
    assert side_channel_from_env(env) == SideChannel("10.1.2.3", 6000)


@pytest.mark.parametrize("port", ["abc", "70000", "65536", "-1", "", "56.01", " 6000 ", "5_601", "６０００"])
def test_bad_side_channel_port_is_rejected(port):
    with rejects(
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
    with rejects(
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
    with rejects(
        "VLLM_EC_SIDE_CHANNEL_PORT = 65534 puts data-parallel rank 2 at port 65536, past 65535: each "
        "rank uses port + rank; lower the port, or set 0 for any free port"
    ):
        SideChannel("h", 65534).for_rank(2)


@pytest.mark.parametrize("host", ["", "   "])
def test_empty_side_channel_host_is_rejected(host):
    with rejects("VLLM_EC_SIDE_CHANNEL_HOST is empty: expected a host name or address"):
        side_channel_from_env({"VLLM_EC_SIDE_CHANNEL_HOST": host})
