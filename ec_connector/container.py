"""The composition root: the one place that chooses adapters and wires the services.

Entry points (the vLLM facade, the CLI) fill `Container.settings` and ask for a service; nothing
else imports dependency_injector. Heavy adapters are imported inside their factory functions, so
local mode never imports nixl, zmq or msgspec, and the core never imports torch.

Settings:
    role, extra        ec_role and ec_connector_extra_config, validated by the domain
    instance, dp_rank  region identity (engine_id when given, else vLLM's instance id)
    hidden_dim, dtype  the model's encoder-output row
    ranks, rank        workers of this instance (TP × PCP) and this worker's rank
    writer             this worker writes saves (TP rank 0 and PCP rank 0)
    participants, slot local processes mapping the region, and this one's index among them
    tier               "shm" (real /dev/shm region) or "memory" (in-process fakes)
    device             torch device of the copier ("cpu", "cuda:0"); "memory" for the fake copier
    shm_dir            directory of the region files (default /dev/shm)
    fingerprint        compatibility fingerprint of this instance (P2P only)
    side_host, side_port  where a producer's control server listens and what it advertises (P2P)

The event sink is the ZMQ event feed when `event_feed_address` is set (zmq is then imported, even in
local mode), else LogEventSink.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

from dependency_injector import containers, providers

from ec_connector.adapters.system import LogEventSink, SystemClock
from ec_connector.application import TierScheduler, TierWorker
from ec_connector.application.consumer import ConsumerFetcher
from ec_connector.application.producer import ProducerDesk
from ec_connector.application.stats import PeerStats
from ec_connector.domain.config import ConnectorConfig, Role, endpoint_for_rank, parse_config
from ec_connector.domain.layout import Layout
from ec_connector.ports.control import ControlClient, ControlServer
from ec_connector.ports.copier import Copier
from ec_connector.ports.peer import PeerTransport
from ec_connector.ports.region import Region
from ec_connector.ports.runtime import EventSink


def _layout(config: ConnectorConfig, hidden_dim: int, dtype: str) -> Layout:
    return Layout.for_budget(config.cpu_bytes, hidden_dim=hidden_dim, dtype=dtype)


def _memory_region(layout: Layout, instance: str, dp_rank: int, ranks: int) -> Iterator[Region]:
    from ec_connector.adapters.memory import MemoryRegion

    region = MemoryRegion(layout, name=f"memory_{instance}_dp{dp_rank}", ranks=ranks)
    yield region
    region.close()


def _shm_region(
    layout: Layout,
    instance: str,
    dp_rank: int,
    participants: int,
    slot: int,
    ranks: int,
    shm_dir: str,
    populate: bool,
) -> Iterator[Region]:
    from ec_connector.adapters.shm import ShmRegion

    # With NIXL on, peers read this mapping directly: pre-fault its page tables now, or the first
    # READs of each page pay a fault (a 9 MiB READ measured 50-107 ms cold against 8-11 ms warm).
    region = ShmRegion.open(
        instance=instance,
        dp_rank=dp_rank,
        layout=layout,
        participants=participants,
        slot=slot,
        ranks=ranks,
        shm_dir=shm_dir,
        populate=populate,
    )
    try:
        yield region
    finally:
        region.close()


def _copier(region: Region, device: str) -> Iterator[Copier]:
    copier: Copier
    if device == "memory":
        from ec_connector.adapters.memory import MemoryCopier

        copier = MemoryCopier(region)
    else:
        from ec_connector.adapters.torch_copy import TorchCopier

        # The save launcher's thread takes the driver's part of each save's launch off the step
        # thread, for every role that saves (ec_producer, ec_both): from the model runner's own
        # stream, the kernel launches that follow the flush do not wait for it (docs/benchmarks.md,
        # "A step with the save launcher"; from the legacy default stream they did).
        copier = TorchCopier(region, device=device, save_launcher=True)
    try:
        yield copier
    finally:
        copier.close()


def _peer_transport(region: Region, config: ConnectorConfig, agent_name: str) -> Iterator[PeerTransport]:
    from ec_connector.adapters.nixl_data import open_lanes

    transport = open_lanes(
        region,  # type: ignore[arg-type]  # the shm region exposes data_address()
        agent_name=agent_name,
        # a role that reads cuts each READ across `nixl_read_lanes` agents; a producer only serves
        lanes=config.nixl_read_lanes if config.role.loads else 1,
        backend=config.nixl_backend,
        ucx_error_mode=config.ucx_error_mode,
        # a producer's agent needs NIXL's progress thread (peers cannot connect otherwise); an
        # ec_consumer's may go without it and progress when it polls its READs (saves a spinning core)
        progress_thread=config.role is not Role.CONSUMER or config.nixl_consumer_progress_thread,
    )
    try:
        yield transport
    finally:
        transport.close()


def _control_server(config: ConnectorConfig, host: str, port: int) -> Iterator[ControlServer]:
    from ec_connector.adapters.zmq_control import ZmqControlServer

    server = ZmqControlServer(host, port, secret=config.side_channel_secret)
    try:
        yield server
    finally:
        server.close()


def _control_client(config: ConnectorConfig) -> Iterator[ControlClient]:
    from ec_connector.adapters.zmq_control import ZmqControlClient

    client = ZmqControlClient(secret=config.side_channel_secret)
    try:
        yield client
    finally:
        client.close()


def _event_sink(config: ConnectorConfig, dp_rank: int) -> Iterator[EventSink]:
    """The event feed at `event_feed_address` (offset per data-parallel rank) when set (imports
    zmq), else debug log lines."""
    if config.event_feed_address is None:
        yield LogEventSink()
        return
    from ec_connector.adapters.zmq_control.events import ZmqEventSink

    sink = ZmqEventSink(endpoint_for_rank(config.event_feed_address, dp_rank))
    try:
        yield sink
    finally:
        sink.close()


def _agent_name(instance: str, dp_rank: int) -> str:
    """One NIXL agent per engine instance and data-parallel rank (as the region file), named anew at
    each start: a restarted producer's agent never takes its predecessor's name, which consumers
    may still hold (ConsumerFetcher._use_agent)."""
    return f"{instance}_dp{dp_rank}@{secrets.token_hex(4)}"


def _agent_metadata(transport: PeerTransport) -> bytes:
    return transport.agent_metadata()


class Container(containers.DeclarativeContainer):
    settings = providers.Configuration()

    connector_config = providers.Singleton(parse_config, settings.extra, role=settings.role)
    layout = providers.Singleton(
        _layout, connector_config, hidden_dim=settings.hidden_dim, dtype=settings.dtype
    )
    clock = providers.Singleton(SystemClock)
    events = providers.Resource(_event_sink, connector_config, settings.dp_rank)

    region = providers.Selector(
        settings.tier,
        memory=providers.Resource(
            _memory_region,
            layout,
            instance=settings.instance,
            dp_rank=settings.dp_rank,
            ranks=settings.ranks,
        ),
        shm=providers.Resource(
            _shm_region,
            layout,
            instance=settings.instance,
            dp_rank=settings.dp_rank,
            participants=settings.participants,
            slot=settings.slot,
            ranks=settings.ranks,
            shm_dir=settings.shm_dir,
            populate=connector_config.provided.enable_nixl,
        ),
    )
    copier = providers.Resource(_copier, region, device=settings.device)

    tier_scheduler = providers.Singleton(
        TierScheduler,
        config=connector_config,
        region=region,
        clock=clock,
        events=events,
        ranks=settings.ranks,
        engine_id=settings.instance,
    )
    peer_stats = providers.Singleton(PeerStats)
    agent_name = providers.Singleton(_agent_name, settings.instance, settings.dp_rank)
    peer_transport = providers.Resource(_peer_transport, region, connector_config, agent_name=agent_name)
    control_server = providers.Resource(
        _control_server, connector_config, host=settings.side_host, port=settings.side_port
    )
    control_client = providers.Resource(_control_client, connector_config)
    producer_desk = providers.Singleton(
        ProducerDesk,
        tier=tier_scheduler,
        config=connector_config,
        clock=clock,
        fingerprint=settings.fingerprint,
        address=control_server.provided.address,  # where it listens: its port, if 0 was asked
        agent_name=peer_transport.provided.agent_name,  # what the acks name: the transport's own
        agent_metadata=providers.Callable(_agent_metadata, peer_transport),
        stats=peer_stats,
    )
    consumer_fetcher = providers.Singleton(
        ConsumerFetcher,
        tier=tier_scheduler,
        config=connector_config,
        clock=clock,
        control=control_client,
        transport=peer_transport,
        fingerprint=settings.fingerprint,
        engine_id=settings.instance,
        stats=peer_stats,
    )
    tier_worker = providers.Singleton(
        TierWorker,
        role=connector_config.provided.role,
        rank=settings.rank,
        writer=settings.writer,
        region=region,
        copier=copier,
    )


DEFAULTS: dict[str, object] = {
    "instance": "default",
    "dp_rank": 0,
    "ranks": 1,
    "rank": 0,
    "writer": True,
    "participants": 2,
    "slot": 0,
    "tier": "shm",
    "device": "cpu",
    "shm_dir": "/dev/shm",
    "dtype": "bfloat16",
    "fingerprint": "",
    "side_host": "localhost",
    "side_port": 5601,
}


def build_container(**settings: object) -> Container:
    """A container with `settings` over DEFAULTS; call `shutdown_resources()` when done."""
    container = Container()
    container.settings.from_dict({**DEFAULTS, **settings})
    return container
