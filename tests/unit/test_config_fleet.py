"""The fleet keys in ec_connector_extra_config (the domain's `FleetConfig`): the peers of a replica
that pulls, the cost figures and the directory's bounds; every rejected value fails with its exact
message naming the peer and field."""

from __future__ import annotations

import math

import pytest

from ec_connector.container import parse_settings
from ec_connector.domain.config import FleetConfig, FleetPeer
from tests.extra_config import BASE, rejects

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
    with rejects(
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
    with rejects("ec_connector_extra_config" + message):
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
    with rejects(f"ec_connector_extra_config[{key!r}] = {value!r} is invalid: expected {form}"):
        _fleet(**{key: value})


def test_per_peer_bound_above_the_directory_bound_is_rejected():
    with rejects(
        "ec_connector_extra_config['fleet_max_entries_per_peer'] = 11 is invalid: expected an integer "
        "<= fleet_max_entries (10)"
    ):
        _fleet(fleet_max_entries=10, fleet_max_entries_per_peer=11)
