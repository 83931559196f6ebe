"""How the container wires the P2P producer (what its desk advertises is where its server listens),
the copier (the save launcher on CUDA), and the scheduler side's services for each role."""

from __future__ import annotations

import pytest
import torch
from dependency_injector import providers

from ec_connector.adapters.memory import MemoryPeerTransport, MemoryPeerWorld
from ec_connector.adapters.memory.control import MemoryControlClient, MemoryNetwork
from ec_connector.application.consumer import ConsumerFetcher
from ec_connector.application.producer import ProducerDesk
from ec_connector.application.roles import LocalSupply, NoPublisher
from ec_connector.container import build_container, parse_settings
from ec_connector.domain.protocol import PROTOCOL_VERSION, AckStatus, XferReq


def test_a_producer_asked_for_port_0_advertises_the_port_its_server_bound():
    container = build_container(
        role="ec_producer",
        tier="memory",
        device="memory",
        hidden_dim=4,
        dtype="bfloat16",
        side_host="127.0.0.1",
        side_port=0,
        extra={"ec_cpu_bytes": 4096, "ec_enable_nixl": True},
    )
    transport = MemoryPeerTransport(MemoryPeerWorld(), "prod", container.region())
    container.peer_transport.override(providers.Object(transport))
    try:
        desk, server, tier = container.producer_desk(), container.control_server(), container.tier_scheduler()
        assert server.address.port != 0, "port 0 asks the system for a free port"
        tier.reserve_fetch("img", 2, now=container.clock().now(), lease_s=60.0)  # as a peer READ lands it
        tier.finish_fetch("img")
        params = desk.publish({"img": {}})
        assert (params["img"]["peer_host"], params["img"]["peer_port"]) == ("127.0.0.1", server.address.port)
    finally:
        container.shutdown_resources()


@pytest.mark.parametrize(
    "device",
    [
        pytest.param("cpu", id="cpu"),
        pytest.param(
            "cuda",
            id="cuda",
            marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")],
        ),
    ],
)
@pytest.mark.parametrize("role", ["ec_producer", "ec_consumer", "ec_both"])
def test_every_role_on_cuda_launches_saves_from_the_launchers_thread(device: str, role: str) -> None:
    """Every role's copier hands copy-engine saves to the save launcher: from the model runner's own
    stream, the launches after the flush do not wait for its driver calls (docs/benchmarks.md).
    CPU copies never launch."""
    container = build_container(
        role=role,
        tier="memory",
        device=device,
        hidden_dim=4,
        dtype="bfloat16",
        side_host="127.0.0.1",
        side_port=0,
        extra={"ec_cpu_bytes": 4096},
    )
    try:
        copier = container.copier()
        assert copier.launches_saves == (device == "cuda")
    finally:
        container.shutdown_resources()


def test_each_start_names_its_nixl_agent_anew_and_the_desk_acks_with_the_transports_name():
    def build() -> object:
        return build_container(
            role="ec_producer",
            tier="memory",
            device="memory",
            instance="enc-7",
            dp_rank=1,
            hidden_dim=4,
            dtype="bfloat16",
            side_host="127.0.0.1",
            side_port=0,
            extra={"ec_cpu_bytes": 4096, "ec_enable_nixl": True},
        )

    first, second = build(), build()
    names = [c.agent_name() for c in (first, second)]  # type: ignore[attr-defined]
    assert all(n.startswith("enc-7_dp1@") for n in names) and names[0] != names[1]
    assert first.agent_name() == names[0], "one name per container"  # type: ignore[attr-defined]
    for c in (first, second):
        c.shutdown_resources()  # type: ignore[attr-defined]

    container = build()
    transport = MemoryPeerTransport(MemoryPeerWorld(), container.agent_name(), container.region())
    container.peer_transport.override(providers.Object(transport))
    try:
        tier, desk = container.tier_scheduler(), container.producer_desk()
        tier.reserve_fetch("img", 2, now=container.clock().now(), lease_s=60.0)  # as a peer READ lands it
        tier.finish_fetch("img")
        ack = desk.answer(XferReq(PROTOCOL_VERSION, "img", "", "cons"))
        assert ack.status is AckStatus.OK and ack.agent_name == transport.agent_name
    finally:
        container.shutdown_resources()


def _with_memory_peers(config, **kwargs):
    """A memory-tier container for `config` whose NIXL transport and control client are the
    in-memory adapters (the real ones need a NIXL agent and sockets)."""
    container = build_container(
        config, tier="memory", device="memory", hidden_dim=4, side_host="127.0.0.1", side_port=0, **kwargs
    )
    transport = MemoryPeerTransport(MemoryPeerWorld(), "agent", container.region())
    container.peer_transport.override(providers.Object(transport))
    container.control_client.override(providers.Object(MemoryControlClient(MemoryNetwork())))
    return container


@pytest.mark.parametrize(
    ("role", "nixl", "supply", "publisher"),
    [
        ("ec_both", False, LocalSupply, NoPublisher),
        ("ec_consumer", True, ConsumerFetcher, NoPublisher),
        ("ec_producer", True, LocalSupply, ProducerDesk),
        ("ec_both", True, ConsumerFetcher, ProducerDesk),
    ],
)
def test_the_scheduler_side_gets_one_service_per_part_chosen_for_its_role(role, nixl, supply, publisher):
    """The entry point calls the same three objects in every mode: what differs is chosen here."""
    config = parse_settings({"ec_cpu_bytes": 4096, "ec_enable_nixl": nixl}, role=role)
    container = _with_memory_peers(config)
    try:
        side = container.scheduler_side()
        assert (type(side.supply), type(side.publisher)) == (supply, publisher)
        assert side.tier is container.tier_scheduler()
        if publisher is ProducerDesk:  # the desk answers peers as soon as the entry point has it
            assert container.control_server().address.port != 0
        report = container.stats().report()
        assert ("peer_grants" in report) is nixl, "peer counters where NIXL is on"
        assert report["capacity_bytes"] == 4096 and report["hits"] == 0
    finally:
        container.shutdown_resources()


def test_the_stats_service_reports_increments_since_its_last_report():
    container = build_container(
        role="ec_both", extra={"ec_cpu_bytes": 4096}, tier="memory", device="memory", hidden_dim=4
    )
    try:
        tier, stats = container.tier_scheduler(), container.stats()
        assert not tier.has_item("a") and not tier.has_item("b")  # two misses
        assert stats.report()["misses"] == 2
        assert tier.has_item("c") is False
        assert stats.report()["misses"] == 1, "an increment, not the running total"
    finally:
        container.shutdown_resources()


def test_the_container_takes_the_parsed_config_or_the_raw_document_not_both():
    config = parse_settings({"ec_cpu_bytes": 4096}, role="ec_both")
    with pytest.raises(TypeError, match="not both"):
        build_container(config, role="ec_both", extra={"ec_cpu_bytes": 4096})
    assert build_container(config, tier="memory").connector_config() is config.tier


FLEET_PEER = {"engine_id": "replica-b", "peer_host": "127.0.0.1", "peer_port": 5999}


def _fleet_container(role: str, **extra: object):
    import socket

    with socket.socket() as s:  # a feed address nobody binds: the subscriber keeps reconnecting
        s.bind(("127.0.0.1", 0))
        feed = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    config = parse_settings(
        {
            "ec_cpu_bytes": 4096,
            "ec_enable_nixl": True,
            "fleet_peers": [{**FLEET_PEER, "event_feed": feed}],
            **extra,
        },
        role=role,
    )
    return _with_memory_peers(config, instance="a")


@pytest.mark.parametrize("role", ["ec_both", "ec_consumer"])
def test_a_replica_with_fleet_peers_gets_the_fleet_fetcher_and_its_feed_until_shutdown(role):
    import threading

    from ec_connector.application.fleet import FleetFetcher

    container = _fleet_container(role)
    try:
        side = container.scheduler_side()
        assert type(side.supply) is FleetFetcher and side.fleet is side.supply
        feeds = [t for t in threading.enumerate() if t.name == "ec-fleet-feed"]
        assert len(feeds) == 1, "the feed subscriber runs once the fleet's supply exists"
        report = container.stats().report()
        assert report["fleet_lookups"] == 0 and "fleet_pulls_started" in report and "peer_grants" in report
        directory = container.peer_directory()
        assert directory.limits.max_entries == 262_144 and directory.limits.max_entries_per_peer == 65_536
    finally:
        container.shutdown_resources()
    assert not feeds[0].is_alive(), "shutdown stops the subscriber"


@pytest.mark.parametrize("role", ["ec_both", "ec_consumer"])
def test_a_replica_that_serves_says_hello_on_its_feed_with_its_side_channel_and_boot(role, tmp_path):
    import threading

    import zmq

    from ec_connector.adapters.zmq_control.events import Hello, decode_hello

    feed = f"ipc://{tmp_path}/feed"
    container = _fleet_container(
        role, event_feed_address=feed, fleet_peers=[{"event_feed": "tcp://127.0.0.1:1"}]
    )
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        container.scheduler_side()
        sub.connect(feed)
        if role == "ec_consumer":  # no side channel to name: no hello
            assert not [t for t in threading.enumerate() if t.name == "ec-feed-hello"]
            assert not sub.poll(1500)
            return
        assert sub.poll(5000), "a hello every second"
        port = container.control_server().address.port
        assert decode_hello(sub.recv_multipart()) == Hello("a", container.boot(), "127.0.0.1", port)
        assert len(container.boot()) == 16 and container.fleet_updater()._boot == container.boot()
    finally:
        sub.close(linger=0)
        ctx.term()
        container.shutdown_resources()
    assert not [t for t in threading.enumerate() if t.name == "ec-feed-hello"], "closing the feed stops it"


def test_without_fleet_peers_nothing_subscribes_and_no_fleet_counters_are_reported():
    import threading

    from ec_connector.application.roles import NoFleet

    config = parse_settings({"ec_cpu_bytes": 4096, "ec_enable_nixl": True}, role="ec_both")
    container = _with_memory_peers(config)
    try:
        side = container.scheduler_side()
        assert type(side.supply) is ConsumerFetcher and type(side.fleet) is NoFleet
        assert not [t for t in threading.enumerate() if t.name == "ec-fleet-feed"]
        assert not [k for k in container.stats().report() if k.startswith("fleet_")]
    finally:
        container.shutdown_resources()


@pytest.mark.parametrize(
    ("extra", "salted_key_is_scoped"),
    [({}, True), ({"tenant_scopes": False}, False)],
)
def test_the_requests_scopes_follow_tenant_scopes_and_the_fleets_secret(extra, salted_key_is_scoped):
    from ec_connector.application.scoping import RequestScopes

    config = parse_settings({"ec_cpu_bytes": 4096, "side_channel_secret": "s", **extra}, role="ec_both")
    container = build_container(config, tier="memory", device="memory", hidden_dim=4)
    try:
        scopes = container.scheduler_side().scopes
        assert scopes.key(None, "img") == "img"
        if salted_key_is_scoped:
            assert scopes.key("t", "img") == RequestScopes(secret=b"s").key("t", "img") != "img"
        else:
            assert scopes.key("t", "img") == "img"
    finally:
        container.shutdown_resources()
