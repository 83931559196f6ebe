"""Two replicas that pull each other's encodings, replayed offline through our table: the driver of
bench/fleet_replay.py (which compares ways of treating a pulled copy) and of the serving bench's
expected fleet hit ratio (serving_expected.py).

`replay_pair` serves a trace step by step on one or two `OursSide`s, requests handed round-robin
(a request's items all go to its replica). Per step, per replica: saves and pulls started last step
become READY (or are discarded when the item's save fails), last step's loads unpin and peer grants
are released. Then each arriving item is looked up in its replica's table: READY there is a local
hit (pinned for a step); NOT_READY waits (not counted); absent, it is a fleet hit when sharing is on,
the other replica holds it READY and the `PullRule` finds the pull worth it (the copy is reserved
here and marked a copy, the holder grants the READ, which counts as a read of the holder's entry, and
the pulling request loads the copy once it is READY), else an encode (reserved here and saved). A
pull whose copy the region cannot take is an encode, as in the fetcher. The directory and the
pull's timing are idealised: a peer's READY entry is known at once and a pull takes one step, as a
save does.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ec_connector.benchmarks.cache_sides import ABSENT, READY, OursSide
from ec_connector.benchmarks.cache_traces import ROW_BYTES, Item, Trace
from ec_connector.domain.pull_rule import PullRule

STEP_S = 0.02  # the replay's clock: one engine step


@dataclass
class _Replica:
    """One replica's table and what its last step started: saves and pulls landing next step (the
    item, and whether it is a pull), loads to unpin, peer grants to release."""

    side: OursSide
    to_ready: list[tuple[Item, bool]] = field(default_factory=list)
    to_unpin: list[str] = field(default_factory=list)
    to_release: list[tuple[str, int]] = field(default_factory=list)

    def start_step(self, now: float) -> None:
        """Last step's loads unpin (a `to_drop` copy is freed), its grants are released, and its
        saves and pulls land (a pulled copy is then loaded)."""
        self.side.tick(now)
        table = self.side.table
        drops = getattr(table._policy, "to_drop", ())
        loads, self.to_unpin = self.to_unpin, []
        for key in loads:
            entry = table.unpin(key)
            if key in drops and not entry.is_pinned:
                table.drop(key)
        grants, self.to_release = self.to_release, []
        for key, gid in grants:
            table.release_grant(key, gid)
        saves, self.to_ready = self.to_ready, []
        for item, pulled in saves:
            if item.fails:
                self.side.discard(item.key)
                continue
            self.side.ready(item.key)
            if pulled:  # the pulling request loads the copy
                self.load(item.key)

    def load(self, key: str) -> None:
        """A request loads `key` from this replica's table: pinned until the next step."""
        self.side.pin(key)
        self.to_unpin.append(key)


def replay_pair(
    trace: Trace,
    sides: Sequence[OursSide],
    *,
    share: bool,
    rule: PullRule | None = None,
    count_from: int = 0,
    replica_of: Callable[[int], int] | None = None,
) -> dict[str, Any]:
    """Local hits, fleet hits (pulls) and encodes of `trace` on `sides` (one or two), counting the
    items of steps from `count_from` on. `share`: the two replicas pull from each other.
    `replica_of(n)`: the replica of the n-th request (default n % len(sides)). A policy with a
    `to_drop` set (a research copy rule) has those copies freed right after their load."""
    rule = rule or PullRule()
    n = len(sides)
    assert n in (1, 2) and not (share and n == 1), "share needs two replicas"
    route = replica_of or (lambda k: k % n)
    replicas = [_Replica(side) for side in sides]
    local = fleet = encodes = waits = 0
    encoded_rows = 0
    pull_s = 0.0
    grant_ids = itertools.count(1)
    ordinal = itertools.count()
    t0 = time.perf_counter()
    for step_no, step in enumerate(trace.steps):
        now = step_no * STEP_S
        for replica in replicas:
            replica.start_step(now)
        counted = step_no >= count_from
        for _, items in step.arrivals:
            r = route(next(ordinal))
            here, other = replicas[r], replicas[1 - r] if share else None
            side = here.side
            for item in items:
                state = side.lookup(item.key)
                if state == READY:
                    here.load(item.key)
                    local += counted
                    continue
                if state != ABSENT:
                    waits += counted
                    continue
                size = item.rows * ROW_BYTES
                if (
                    other is not None
                    and other.side.lookup(item.key) == READY
                    and rule.worth(size, item.rows)
                    and side.alloc(item.key, item.rows)
                ):
                    gid = next(grant_ids)
                    other.side.table.grant(item.key, gid, now=now, lease_s=30.0)
                    other.to_release.append((item.key, gid))
                    side.table.mark_copy(item.key)
                    here.to_ready.append((item, True))
                    if counted:
                        fleet += 1
                        pull_s += rule.read_s(size)
                    continue
                if counted:
                    encodes += 1
                    encoded_rows += item.rows
                if side.table.get(item.key) is None and side.alloc(item.key, item.rows):
                    here.to_ready.append((item, False))
    served = local + fleet + encodes
    return {
        "local_hits": local,
        "fleet_hits": fleet,
        "encodes": encodes,
        "waits": waits,
        "encode_ratio": encodes / max(1, served),
        "hit_ratio": (local + fleet) / max(1, served),
        "encoded_rows": encoded_rows,
        # the encoder's and the pulls' time under the PullRule's figures (pulls cost a step's wait
        # for their request on top, which this does not count)
        "work_s": encoded_rows * rule.encode_s_per_row + pull_s,
        "replay_s": time.perf_counter() - t0,
    }
