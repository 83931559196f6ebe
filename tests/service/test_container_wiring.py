"""How the container wires the P2P producer: what its desk advertises is where its server listens."""

from __future__ import annotations

from dependency_injector import providers

from ec_connector.adapters.memory import MemoryPeerTransport, MemoryPeerWorld
from ec_connector.container import build_container


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
        with tier.lock:
            tier.table.reserve("img", 2, now=container.clock().now(), lease_s=60.0)
            tier.table.mark_ready("img")
        params = desk.publish({"img": {}})
        assert (params["img"]["peer_host"], params["img"]["peer_port"]) == ("127.0.0.1", server.address.port)
    finally:
        container.shutdown_resources()
