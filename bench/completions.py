"""Step-thread cost of completion reports: a batch of ended copies posted and drained.

Each step the worker reports the copies that ended (`TierWorker` after `copier.poll()`), and the
scheduler side drains them (`ShmRegion.drain_completions`). Both run on engine threads: with vLLM's
single-process executor, on the step thread itself. Here, over a real /dev/shm region:

- `report`: `TierWorker._report_ended` for `--batch` ended tickets, as the product does it (one
  `post_completions` call for the batch), beside the same tickets posted one call each (the shape of
  a per-completion post), alternating call by call;
- `drain`: `drain_completions` of `--batch` posted tickets;
- `apply`: `TierScheduler.poll` applying `--batch` finished saves (each entry turns READY, its
  latency is kept and a STORED event goes to the sink), the scheduler side's work per completion;
- `events`: the `--batch` STORED events those saves publish on the event feed (`ZmqEventSink`, a
  subscriber connected over TCP), beside the same with the XPUB socket's subscription messages
  looked for at every publish (`SUBSCRIPTIONS_EVERY = 1`), in turn.

    python bench/completions.py            # 32 tickets, 2000 rounds
    python bench/completions.py --batch 256
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zmq  # noqa: E402

from bench.common import scratch_shm_dir  # noqa: E402
from ec_connector.adapters.memory import MemoryRegion  # noqa: E402
from ec_connector.adapters.shm import ShmRegion  # noqa: E402
from ec_connector.adapters.system import LogEventSink, SystemClock  # noqa: E402
from ec_connector.adapters.zmq_control import events as feed_module  # noqa: E402
from ec_connector.application.scheduler import TierScheduler  # noqa: E402
from ec_connector.application.worker import TierWorker  # noqa: E402
from ec_connector.domain.config import Role, parse_config  # noqa: E402
from ec_connector.domain.layout import Layout  # noqa: E402
from ec_connector.domain.transfers import CacheEvent, EventKind  # noqa: E402


class EndedCopies:
    """A copier whose `poll` returns the tickets the bench hands it (the Copier port's read side)."""

    def __init__(self) -> None:
        self.ended: list[int] = []

    def poll(self) -> list[int]:
        out, self.ended = self.ended, []
        return out

    def in_flight(self) -> int:
        return 0

    def close(self) -> None:
        pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=32, help="tickets per step (default 32)")
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args(argv)
    logging.disable(logging.INFO)
    layout = Layout(hidden_dim=16, dtype="bfloat16", num_blocks=64)
    with scratch_shm_dir() as shm_dir:
        region = ShmRegion.open(
            instance="completions",
            dp_rank=0,
            layout=layout,
            shm_dir=shm_dir,
            ring_slots=max(64, 2 * args.batch),
        )
        copier = EndedCopies()
        worker = TierWorker(role=Role.BOTH, rank=0, writer=True, region=region, copier=copier)  # type: ignore[arg-type]
        times: dict[str, list[float]] = {"report": [], "one call per ticket": [], "drain": []}
        ticket = 1
        for i in range(args.rounds + 50):
            batch = list(range(ticket, ticket + args.batch))
            ticket += args.batch
            copier.ended = batch
            t0 = time.perf_counter()
            worker._report_ended()
            report = time.perf_counter() - t0
            t0 = time.perf_counter()
            drained = region.drain_completions()
            drain = time.perf_counter() - t0
            assert [c.ticket for c in drained] == batch
            single = list(range(ticket, ticket + args.batch))
            ticket += args.batch
            t0 = time.perf_counter()
            for t in single:
                region.post_completions(0, [t], ok=True)
            one_by_one = time.perf_counter() - t0
            assert len(region.drain_completions()) == args.batch
            if i >= 50:
                times["report"].append(report)
                times["one call per ticket"].append(one_by_one)
                times["drain"].append(drain)
        worker.close()
        region.close()
    times.update(events(args.batch, args.rounds))
    times.update(apply(args.batch, args.rounds))
    med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    print(f"# {args.batch} tickets per step, {args.rounds} rounds; median us")
    print(f"report (one post per batch)   {med['report']:8.1f}")
    print(f"one post call per ticket      {med['one call per ticket']:8.1f}")
    print(f"ratio                         {med['report'] / med['one call per ticket']:8.2f}")
    print(f"drain                         {med['drain']:8.1f}")
    print(f"apply (TierScheduler.poll)    {med['apply']:8.1f}")
    print(f"events                        {med['events']:8.1f}")
    print(f"events, subscriptions each    {med['events, subscriptions each']:8.1f}")
    print(f"ratio                         {med['events'] / med['events, subscriptions each']:8.2f}")


def apply(batch: int, rounds: int) -> dict[str, list[float]]:
    """Host time of `TierScheduler.poll` applying `batch` finished saves, planned as vLLM's
    allocations plan them (a large tier: FIFO evictions make room as rounds go on)."""
    layout = Layout(hidden_dim=3584, dtype="bfloat16", num_blocks=200_000)
    region = MemoryRegion(layout)
    scheduler = TierScheduler(
        config=parse_config({"ec_cpu_bytes": layout.data_bytes}, role="ec_both"),
        region=region,
        clock=SystemClock(),
        events=LogEventSink(),
        ranks=1,
        engine_id="bench",
    )
    out: list[float] = []
    for i in range(rounds + 50):
        for j in range(batch):
            scheduler.on_allocated(f"item-{i}-{j}", 146)
        plan = scheduler.take_plan()
        region.post_completions(0, [c.ticket for c in plan.saves], ok=True)
        t0 = time.perf_counter()
        scheduler.poll()
        spent = time.perf_counter() - t0
        if i >= 50:
            out.append(spent)
    assert scheduler.stats.saves_done == batch * (rounds + 50)
    region.close()
    return {"apply": out}


def events(batch: int, rounds: int) -> dict[str, list[float]]:
    """Host time of publishing `batch` events, the shipped sink against one that reads its
    subscription messages at every publish; a SUB socket connected and drained between rounds."""
    out: dict[str, list[float]] = {"events": [], "events, subscriptions each": []}
    every = feed_module.SUBSCRIPTIONS_EVERY
    sink = feed_module.ZmqEventSink("tcp://127.0.0.1:*")
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.connect(sink.address)
    sub.setsockopt(zmq.SUBSCRIBE, b"ec.")
    event = CacheEvent(EventKind.STORED, "m" * 64, "engine-0", 1 << 20)
    while not sub.poll(20):  # until the subscription has reached the publisher
        sink.publish(event)
    try:
        for i in range(rounds + 50):
            for label, period in (("events", every), ("events, subscriptions each", 1)):
                feed_module.SUBSCRIPTIONS_EVERY = period
                t0 = time.perf_counter()
                for _ in range(batch):
                    sink.publish(event)
                spent = time.perf_counter() - t0
                while sub.poll(0):
                    sub.recv_multipart()
                if i >= 50:
                    out[label].append(spent)
    finally:
        feed_module.SUBSCRIPTIONS_EVERY = every
        sub.close(linger=0)
        context.term()
        sink.close()
    return out


if __name__ == "__main__":
    main()
