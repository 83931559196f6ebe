"""Subscribe to engines' event feeds, print each event, and keep a table of servable encodings.

    .venv/bin/python examples/event_subscriber.py tcp://127.0.0.1:5610 [tcp://host2:5610 ...]
        [--only evicted] [--count N]

Each engine started with `"event_feed_address": "tcp://0.0.0.0:5610"` in ec_connector_extra_config
publishes `stored`, `announced`, `expired` and `evicted` events (wire format:
ec_connector/adapters/zmq_control/events.py). An orchestrator that forwards a producer's
`ec_transfer_params` to consumers uses `evicted` to drop the params of an entry that is gone (a
consumer would be answered NACK_MISSING and encode the item itself), and `announced` to learn
which entries a producer will hold for its consumers. `StaleParams` below is that bookkeeping.
"""

from __future__ import annotations

import argparse
import signal
import sys
from dataclasses import dataclass, field

import zmq

from ec_connector.adapters.zmq_control.events import EventFrameError, FeedEvent, decode_event, topic
from ec_connector.domain.transfers import EventKind


@dataclass
class StaleParams:
    """Which (engine, mm_hash) entries may still be named in forwarded ec_transfer_params."""

    track_gaps: bool = True  # False when subscribed to some kinds only (the others leave gaps)
    servable: dict[tuple[str, str], int] = field(default_factory=dict)  # -> size in bytes
    last_seq: dict[str, int] = field(default_factory=dict)

    def apply(self, event: FeedEvent) -> str:
        """Update the table; return a note for the operator."""
        note = ""
        seen = self.last_seq.get(event.engine_id)
        if self.track_gaps and seen is not None and event.seq != seen + 1:
            note = f" (missed {event.seq - seen - 1} event(s): resync from the producers' params)"
        self.last_seq[event.engine_id] = event.seq
        key = (event.engine_id, event.mm_hash)
        if event.kind is EventKind.ANNOUNCED or event.kind is EventKind.STORED:
            self.servable[key] = event.size_bytes
        elif event.kind is EventKind.EVICTED:
            if self.servable.pop(key, None) is not None:
                note = " -> drop its ec_transfer_params" + note
        return note

    def is_servable(self, engine_id: str, mm_hash: str) -> bool:
        return (engine_id, mm_hash) in self.servable


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("addresses", nargs="+", help="event_feed_address of each engine")
    parser.add_argument("--only", choices=[k.value for k in EventKind], action="append", help="kinds to take")
    parser.add_argument("--count", type=int, default=0, help="stop after N events (0: run until Ctrl-C)")
    args = parser.parse_args()
    # Ctrl-C (SIGINT) stops it even when started as a shell's background job, which inherits
    # SIGINT ignored: a supervisor that runs it so still stops it with SIGINT
    signal.signal(signal.SIGINT, signal.default_int_handler)

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    for address in args.addresses:
        sub.connect(address)
    for kind in args.only or [None]:
        sub.setsockopt(zmq.SUBSCRIBE, topic(kind) if kind else b"ec.")
    table = StaleParams(track_gaps=not args.only)
    taken = 0
    try:
        while not args.count or taken < args.count:
            frames = sub.recv_multipart()
            try:
                event = decode_event(frames)
            except EventFrameError as err:
                print(f"ignored a message: {err}", file=sys.stderr)
                continue
            taken += 1
            note = table.apply(event)
            print(
                f"{event.ts:.3f} seq={event.seq} {event.engine_id} {event.kind.value:<9} "
                f"{event.mm_hash} {event.size_bytes} B{note}",
                flush=True,
            )
    except KeyboardInterrupt:
        pass
    finally:
        sub.close(linger=0)
        ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
