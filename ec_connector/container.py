"""The composition root: the one place that chooses adapters and wires the services.

Entry points (the vLLM facade, the CLI) parse `ec_connector_extra_config` once (`parse_settings`:
the tier's rules from the domain, each adapter's keys from its settings module), hand the result to
`build_container` with this process's settings, and ask for the services of their role: the
scheduler side (`scheduler_side`: the tier, its supply and its publisher, each chosen here for the
role and whether NIXL is on) and its `stats`, or the worker side (`tier_worker`). Nothing else
imports dependency_injector. Heavy adapters are imported inside their factory functions, so
local mode never imports nixl, zmq or msgspec, and the core never imports torch.

Settings (of this process; the extra config comes parsed, as `config`):
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
local mode; its events are authenticated with `side_channel_secret` when set), else LogEventSink.
With `fleet_peers` set (ec_both or ec_consumer, NIXL on), the supply is a FleetFetcher in front of
the consumer fetcher, fed by a PeerDirectory that a FleetUpdater keeps from every peer's event feed
(ZmqFleetFeed, a resource: its thread starts with the supply and stops at `shutdown_resources`).
A replica that serves (NIXL on, a role that saves) with a feed sends hello frames on it (engine id,
side channel, `boot`: random per process start) from the sink's own thread once its control
server answers.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from dependency_injector import containers, providers

from ec_connector.adapters.nixl_data.settings import KEYS as NIXL_KEYS
from ec_connector.adapters.nixl_data.settings import NixlSettings, parse_nixl_settings
from ec_connector.adapters.system import LogEventSink, SystemClock
from ec_connector.adapters.zmq_settings import (
    DEFAULT_SIDE_CHANNEL_HOST,
    DEFAULT_SIDE_CHANNEL_PORT,
    ZmqSettings,
    parse_zmq_settings,
)
from ec_connector.adapters.zmq_settings import KEYS as ZMQ_KEYS
from ec_connector.application import TierScheduler, TierWorker
from ec_connector.application.consumer import ConsumerFetcher
from ec_connector.application.fleet import RECENT_LOCAL_ROWS, FleetFetcher, FleetStats, FleetUpdater
from ec_connector.application.producer import ProducerDesk
from ec_connector.application.roles import (
    Allocations,
    LocalSupply,
    NoFleet,
    NoPublisher,
    Publisher,
    SchedulerSide,
    StatsService,
    Supply,
)
from ec_connector.application.scoping import RequestScopes
from ec_connector.application.stats import PeerStats
from ec_connector.domain.config import (
    FLEET_KEYS,
    ConnectorConfig,
    FleetConfig,
    Role,
    as_mapping,
    parse_config,
    parse_fleet_config,
)
from ec_connector.domain.config import KNOWN_KEYS as TIER_KEYS
from ec_connector.domain.directory import DirectoryLimits, Peer, PeerDirectory
from ec_connector.domain.layout import Layout
from ec_connector.domain.publish import PeerAddress
from ec_connector.ports.control import ControlClient, ControlServer
from ec_connector.ports.copier import Copier
from ec_connector.ports.peer import PeerTransport
from ec_connector.ports.region import Region
from ec_connector.ports.runtime import Clock, EventSink


@dataclass(frozen=True, slots=True)
class Settings:
    """`ec_connector_extra_config`, parsed: the tier's rules and each adapter's settings."""

    tier: ConnectorConfig
    nixl: NixlSettings
    zmq: ZmqSettings
    fleet: FleetConfig = FleetConfig()

    @property
    def p2p_loads(self) -> bool:
        """This role pulls items from peers (NIXL on, a role that loads)."""
        return self.tier.enable_nixl and self.tier.role.loads

    @property
    def p2p_saves(self) -> bool:
        """This role serves its items to peers (NIXL on, a role that saves)."""
        return self.tier.enable_nixl and self.tier.role.saves


KNOWN_KEYS = TIER_KEYS | NIXL_KEYS | ZMQ_KEYS | FLEET_KEYS
"""Every key `ec_connector_extra_config` accepts."""


def parse_settings(extra: object, *, role: object) -> Settings:
    """`ec_connector_extra_config` for `role`, read once by the entry point: each part parses its
    own keys; a key no part knows is rejected, naming every accepted key (ConfigError)."""
    tier = parse_config(extra, role=role, other_keys=NIXL_KEYS | ZMQ_KEYS | FLEET_KEYS)
    mapping: Mapping[str, Any] = as_mapping(extra)
    return Settings(
        tier=tier,
        nixl=parse_nixl_settings(mapping),
        zmq=parse_zmq_settings(mapping),
        fleet=parse_fleet_config(mapping, tier),
    )


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


def _peer_transport(region: Region, config: Settings, agent_name: str) -> Iterator[PeerTransport]:
    from ec_connector.adapters.nixl_data import open_lanes

    role, nixl = config.tier.role, config.nixl
    transport = open_lanes(
        region,  # type: ignore[arg-type]  # the shm region exposes data_address()
        agent_name=agent_name,
        # a role that reads cuts each READ across `nixl_read_lanes` agents; a producer only serves
        lanes=nixl.read_lanes if role.loads else 1,
        backend=nixl.backend,
        ucx_error_mode=nixl.ucx_error_mode,
        # a producer's agent needs NIXL's progress thread (peers cannot connect otherwise); an
        # ec_consumer's may go without it and progress when it polls its READs (saves a spinning core)
        progress_thread=role is not Role.CONSUMER or nixl.consumer_progress_thread,
        progress_delay_us=nixl.progress_delay_us,
    )
    try:
        yield transport
    finally:
        transport.close()


def _control_server(config: ZmqSettings, host: str, port: int) -> Iterator[ControlServer]:
    from ec_connector.adapters.zmq_control import ZmqControlServer

    server = ZmqControlServer(host, port, secret=config.side_channel_secret)
    try:
        yield server
    finally:
        server.close()


def _control_client(config: ZmqSettings) -> Iterator[ControlClient]:
    from ec_connector.adapters.zmq_control import ZmqControlClient

    client = ZmqControlClient(secret=config.side_channel_secret)
    try:
        yield client
    finally:
        client.close()


def _event_sink(config: ZmqSettings, dp_rank: int) -> Iterator[EventSink]:
    """The event feed at `event_feed_address` (offset per data-parallel rank) when set (imports
    zmq), else debug log lines."""
    endpoint = config.feed_endpoint(dp_rank)
    if endpoint is None:
        yield LogEventSink()
        return
    from ec_connector.adapters.zmq_control.events import ZmqEventSink

    sink = ZmqEventSink(endpoint, secret=config.side_channel_secret)
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


def _serving(desk: ProducerDesk, server: ControlServer, hello: object) -> Publisher:
    """The desk, once its control server answers peers with it (and `hello` is asked for so that
    the feed introduces the server to the fleet)."""
    server.start(desk.answer, desk.done)
    return desk


def _boot() -> str:
    """This process's boot: random per start, so that peers tell a restart from a reconnect."""
    return secrets.token_hex(8)


def _feed_hello(events: EventSink, server: ControlServer, engine_id: str, dp_rank: int, boot: str) -> bool:
    """Hello frames on the event feed (when there is one) naming this engine's side channel: from
    the sink's own thread, so never on the step thread. True when started."""
    from ec_connector.adapters.zmq_control.events import Hello, ZmqEventSink

    if not isinstance(events, ZmqEventSink):
        return False
    address = server.address
    events.start_hello(Hello(engine_id, boot, address.host, address.port, dp_rank=dp_rank))
    return True


def _p2p_mode(p2p: bool) -> str:
    return "p2p" if p2p else "local"


def _supply_mode(config: Settings) -> str:
    """ "fleet" (pulls of forwarded params and of the fleet's entries), "p2p" (forwarded params
    only) or "local"."""
    if config.p2p_loads and config.fleet.enabled:
        return "fleet"
    return _p2p_mode(config.p2p_loads)


def _request_scopes(config: Settings) -> RequestScopes:
    # Replicas that share entries key scopes with the fleet's secret, so a feed subscriber who
    # guesses a salt cannot recognise that tenant's entries.
    secret = config.zmq.side_channel_secret
    return RequestScopes(secret=secret.encode() if secret else None, scoped=config.tier.tenant_scopes)


def _peer_directory(config: Settings) -> PeerDirectory:
    fleet = config.fleet
    return PeerDirectory(
        DirectoryLimits(
            max_entries_per_peer=fleet.max_entries_per_peer,
            max_entries=fleet.max_entries,
            max_peers=max(len(fleet.peers), DirectoryLimits().max_peers),
        )
    )


def _fleet_updater(
    config: Settings, directory: PeerDirectory, clock: Clock, engine_id: str, stats: FleetStats, boot: str
) -> FleetUpdater:
    return FleetUpdater(
        directory=directory,
        clock=clock,
        engine_id=engine_id,
        heartbeat_timeout_s=config.fleet.heartbeat_timeout_s,
        stats=stats,
        boot=boot,
    )


def _fleet_feed(config: Settings, updater: FleetUpdater) -> Iterator[object]:
    """The subscriber of every fleet peer's event feed, on its own thread, feeding `updater`;
    stopped at shutdown."""
    from ec_connector.adapters.zmq_control.fleet_feed import FeedPeer, ZmqFleetFeed
    from ec_connector.adapters.zmq_control.sockets import Heartbeat

    timeout = config.fleet.heartbeat_timeout_s
    peers = [
        FeedPeer(
            Peer(p.engine_id, PeerAddress(p.peer_host, p.peer_port))
            if p.engine_id is not None and p.peer_host is not None and p.peer_port is not None
            else None,  # told by its hello frames
            p.event_feed,
        )
        for p in config.fleet.peers
    ]
    feed = ZmqFleetFeed(
        peers,
        on_seen=updater.peer_seen,
        on_event=lambda event, seq: updater.apply(event, seq=seq),
        on_gone=updater.peer_gone,
        on_tick=updater.tick,
        on_rejected=updater.frame_rejected,
        tick_s=min(1.0, timeout / 3),
        # a peer that stops answering PINGs is gone after the configured heartbeat timeout
        heartbeat=Heartbeat(ivl_s=min(1.0, timeout / 3), timeout_s=timeout, ttl_s=min(6553.0, 2 * timeout)),
        secret=config.zmq.side_channel_secret,
    )
    feed.start()
    try:
        yield feed
    finally:
        feed.close()


def _fleet_fetcher(
    config: Settings,
    tier: TierScheduler,
    fetcher: ConsumerFetcher,
    directory: PeerDirectory,
    updater: FleetUpdater,
    engine_id: str,
    stats: FleetStats,
    feed: object,
    encoder_cache_rows: int,
) -> FleetFetcher:
    """The fleet's supply; `feed` is asked for so that the subscriber runs once the fetcher does;
    `encoder_cache_rows`: the size of vLLM's encoder cache, in rows."""
    fleet = config.fleet
    rule = fleet.pull_rule()
    return FleetFetcher(
        tier=tier,
        fetcher=fetcher,
        directory=directory,
        updater=updater,
        rule=rule,
        engine_id=engine_id,
        stats=stats,
        max_pulls_in_flight=fleet.max_pulls_in_flight,
        recent_local_rows=encoder_cache_rows,
    )


class Container(containers.DeclarativeContainer):
    settings = providers.Configuration()
    config = providers.Dependency(instance_of=Settings)
    """The parsed extra config (`parse_settings`), given by the entry point."""

    connector_config = providers.Callable(lambda c: c.tier, config)
    nixl_settings = providers.Callable(lambda c: c.nixl, config)
    zmq_settings = providers.Callable(lambda c: c.zmq, config)
    layout = providers.Singleton(
        _layout, connector_config, hidden_dim=settings.hidden_dim, dtype=settings.dtype
    )
    clock = providers.Singleton(SystemClock)
    events = providers.Resource(_event_sink, zmq_settings, settings.dp_rank)

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
    peer_transport = providers.Resource(_peer_transport, region, config, agent_name=agent_name)
    control_server = providers.Resource(
        _control_server, zmq_settings, host=settings.side_host, port=settings.side_port
    )
    control_client = providers.Resource(_control_client, zmq_settings)
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
    request_scopes = providers.Singleton(_request_scopes, config)
    boot = providers.Singleton(_boot)
    fleet_stats = providers.Singleton(FleetStats)
    peer_directory = providers.Singleton(_peer_directory, config)
    fleet_updater = providers.Singleton(
        _fleet_updater, config, peer_directory, clock, settings.instance, fleet_stats, boot
    )
    fleet_feed = providers.Resource(_fleet_feed, config, fleet_updater)
    fleet_fetcher = providers.Singleton(
        _fleet_fetcher,
        config,
        tier_scheduler,
        consumer_fetcher,
        peer_directory,
        fleet_updater,
        settings.instance,
        fleet_stats,
        fleet_feed,
        settings.encoder_cache_rows,
    )
    supply: providers.Provider[Supply] = providers.Selector(
        providers.Callable(_supply_mode, config),
        fleet=fleet_fetcher,
        p2p=consumer_fetcher,
        local=providers.Singleton(LocalSupply),
    )
    allocations: providers.Provider[Allocations] = providers.Selector(
        providers.Callable(_supply_mode, config),
        fleet=fleet_fetcher,
        p2p=providers.Singleton(NoFleet),
        local=providers.Singleton(NoFleet),
    )
    publisher: providers.Provider[Publisher] = providers.Selector(
        providers.Callable(lambda c: _p2p_mode(c.p2p_saves), config),
        p2p=providers.Singleton(
            _serving,
            producer_desk,
            control_server,
            providers.Singleton(
                _feed_hello, events, control_server, settings.instance, settings.dp_rank, boot
            ),
        ),
        local=providers.Singleton(NoPublisher),
    )
    scheduler_side = providers.Singleton(
        SchedulerSide,
        tier=tier_scheduler,
        supply=supply,
        publisher=publisher,
        scopes=request_scopes,
        fleet=allocations,
    )
    """The scheduler role's services (the tier, its supply, its publisher, the requests' scopes,
    the fleet's allocations listener)."""
    stats = providers.Singleton(
        StatsService,
        tier=tier_scheduler,
        events=events,
        peer=providers.Selector(
            providers.Callable(lambda c: _p2p_mode(c.tier.enable_nixl), config),
            p2p=peer_stats,
            local=providers.Object(None),
        ),
        fleet=providers.Selector(
            providers.Callable(_supply_mode, config),
            fleet=fleet_stats,
            p2p=providers.Object(None),
            local=providers.Object(None),
        ),
    )
    """The scheduler side's counters for vLLM's stats path (peer counters where NIXL is on)."""
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
    "side_host": DEFAULT_SIDE_CHANNEL_HOST,
    "side_port": DEFAULT_SIDE_CHANNEL_PORT,
    "encoder_cache_rows": RECENT_LOCAL_ROWS,
}


def build_container(config: Settings | None = None, **settings: object) -> Container:
    """A container for `config` (the extra config as the entry point parsed it) with this process's
    `settings` over DEFAULTS; call `shutdown_resources()` when done.

    Callers that hold the raw document (tests, benches) may pass `role=` and `extra=` in place of
    `config`: they are parsed here, by the same `parse_settings`."""
    if config is None:
        config = parse_settings(settings.pop("extra", None), role=settings.pop("role", None))
    elif "extra" in settings or "role" in settings:
        raise TypeError("build_container takes the parsed config or role= and extra=, not both")
    container = Container(config=config)
    container.settings.from_dict({**DEFAULTS, **settings})
    return container
