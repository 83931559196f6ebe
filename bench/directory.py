"""The peer directory's memory and its cost on the step thread (fleet sharing, docs/fleet.md).

- `memory`: bytes per (peer, entry) record, key string included, by tracemalloc, with `--records`
  records over `--peers` peers, for vLLM's 64-character identifiers and scoped keys (98 characters);
- `locate`: `PeerDirectory.locate` of a held key and of an unknown one, beside a bare `dict.get`
  of the same keys (the floor), alternating pass by pass;
- `ensure`: `FleetFetcher.ensure_available` for a request of `--items` items that are neither in
  the tier nor in the directory (the step thread's added cost on every miss), beside
  `ConsumerFetcher.ensure_available` alone, over the in-memory adapters, alternating;
- `updater`: `stored` per event and `leave` of a peer holding `--records / --peers` records (the
  subscriber's thread).

    .venv/bin/python bench/directory.py                      # 200,000 records over 4 peers
    .venv/bin/python bench/directory.py --records 1000000 --peers 8
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ec_connector.adapters.memory import (  # noqa: E402
    ManualClock,
    MemoryControlClient,
    MemoryNetwork,
    MemoryPeerTransport,
    MemoryPeerWorld,
    MemoryRegion,
    RecordingEventSink,
)
from ec_connector.application.consumer import ConsumerFetcher, WantedItem  # noqa: E402
from ec_connector.application.fleet import FleetFetcher, FleetStats, FleetUpdater  # noqa: E402
from ec_connector.application.scheduler import TierScheduler  # noqa: E402
from ec_connector.application.stats import PeerStats  # noqa: E402
from ec_connector.domain.config import ConnectorConfig, Role  # noqa: E402
from ec_connector.domain.directory import DirectoryLimits, Peer, PeerDirectory  # noqa: E402
from ec_connector.domain.layout import Layout  # noqa: E402
from ec_connector.domain.publish import PeerAddress  # noqa: E402
from ec_connector.domain.pull_rule import PullRule  # noqa: E402
from ec_connector.domain.scope import entry_key, scope_of  # noqa: E402


def peers(count: int) -> list[Peer]:
    return [Peer(f"replica-{n}", PeerAddress("10.0.0.1", 5600 + n), boot="1") for n in range(count)]


def filled(keys: list[str], count: int) -> PeerDirectory:
    directory = PeerDirectory(DirectoryLimits(max_entries_per_peer=len(keys), max_entries=len(keys)))
    members = peers(count)
    for peer in members:
        directory.join(peer, now=0.0)
    for n, key in enumerate(keys):
        directory.stored(members[n % count].peer_id, key, 768 * 7168)
    return directory


def memory(keys: list[str], count: int) -> float:
    """Bytes per record, the key strings included (the directory owns the keys a feed decodes)."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    directory = filled([(key + ".")[:-1] for key in keys], count)  # fresh copies of the keys
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(directory) == len(keys)
    return used / len(keys)


def per_call_ns(fn, args: list, passes: int) -> list[float]:  # noqa: ANN001
    out = []
    for _ in range(passes):
        start = time.perf_counter_ns()
        for arg in args:
            fn(arg)
        out.append((time.perf_counter_ns() - start) / len(args))
    return out


def locate(keys: list[str], count: int, passes: int) -> dict[str, float]:
    directory = filled(keys, count)
    plain = {key: object() for key in keys}
    sample = keys[:: max(1, len(keys) // 20_000)]
    unknown = [key + "x" for key in sample]
    runs: dict[str, list[float]] = {
        "locate hit": [],
        "locate miss": [],
        "dict.get hit": [],
        "dict.get miss": [],
    }
    for _ in range(passes):
        runs["locate hit"] += per_call_ns(directory.locate, sample, 1)
        runs["dict.get hit"] += per_call_ns(plain.get, sample, 1)
        runs["locate miss"] += per_call_ns(directory.locate, unknown, 1)
        runs["dict.get miss"] += per_call_ns(plain.get, unknown, 1)
    return {name: statistics.median(values) for name, values in runs.items()}


def ensure(items: int, passes: int) -> dict[str, float]:
    layout = Layout(hidden_dim=3584, dtype="bfloat16", num_blocks=4096)
    config = ConnectorConfig(role=Role.BOTH, cpu_bytes=layout.data_bytes)
    clock = ManualClock()
    region = MemoryRegion(layout, ranks=1)
    tier = TierScheduler(
        config=config, region=region, clock=clock, events=RecordingEventSink(), ranks=1, engine_id="me"
    )
    fetcher = ConsumerFetcher(
        tier=tier,
        config=config,
        clock=clock,
        control=MemoryControlClient(MemoryNetwork()),
        transport=MemoryPeerTransport(MemoryPeerWorld(), "me", region),
        fingerprint="fp",
        engine_id="me",
        stats=PeerStats(),
    )
    directory = filled([f"{n:064x}" for n in range(10_000)], 4)
    stats = FleetStats()
    updater = FleetUpdater(
        directory=directory, clock=clock, engine_id="me", heartbeat_timeout_s=3.0, stats=stats
    )
    fleet = FleetFetcher(
        tier=tier,
        fetcher=fetcher,
        directory=directory,
        updater=updater,
        rule=PullRule(),
        engine_id="me",
        stats=stats,
    )
    wanted = [WantedItem(f"miss-{n}", 768) for n in range(items)]
    runs: dict[str, list[float]] = {"ConsumerFetcher": [], "FleetFetcher": []}
    reps = 2000
    for _ in range(passes):
        for name, call in (
            ("ConsumerFetcher", fetcher.ensure_available),
            ("FleetFetcher", fleet.ensure_available),
        ):
            start = time.perf_counter_ns()
            for _ in range(reps):
                call("r", None, wanted)
            runs[name].append((time.perf_counter_ns() - start) / reps)
    return {name: statistics.median(values) for name, values in runs.items()}


def updater_costs(keys: list[str], count: int) -> dict[str, float]:
    directory = filled(keys, count)
    start = time.perf_counter_ns()
    for n, key in enumerate(keys):
        directory.stored(f"replica-{n % count}", key, 768 * 7168)  # re-stored: moved to the back
    stored_ns = (time.perf_counter_ns() - start) / len(keys)
    start = time.perf_counter_ns()
    dropped = directory.leave("replica-0")
    leave_ms = (time.perf_counter_ns() - start) / 1e6
    return {"stored ns/event": stored_ns, f"leave ms ({dropped} records)": leave_ms}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--items", type=int, default=4, help="items per request in the ensure bench")
    parser.add_argument("--passes", type=int, default=7)
    args = parser.parse_args()
    plain = [f"{n:064x}" for n in range(args.records)]
    scope = scope_of("tenant-1")
    scoped = [entry_key(key, scope) for key in plain]
    print(f"records {args.records} over {args.peers} peers, {args.passes} passes (medians)")
    print(f"memory    64-char keys   {memory(plain, args.peers):7.0f} B/record")
    print(f"memory    scoped keys    {memory(scoped, args.peers):7.0f} B/record")
    for name, ns in locate(plain, args.peers, args.passes).items():
        print(f"step      {name:<14} {ns:7.0f} ns")
    for name, ns in ensure(args.items, args.passes).items():
        print(f"step      {name:<16} {ns / 1000:6.2f} us per ensure_available of {args.items} missing items")
    for name, value in updater_costs(plain, args.peers).items():
        print(f"updater   {name:<24} {value:9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
