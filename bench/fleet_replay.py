"""Two replicas sharing encodings, replayed offline: what a pulled copy should be worth.

Every pull of a fleet hit stores a second copy of the item in the puller's region, so two replicas
that share a working set can hold it twice, and their regions together hold fewer distinct items
than one engine with the same bytes. This replay measures, per way of treating a pulled copy
(`COPY_RULES`), how many requests each replica serves from its own tier, from its peer (a pull)
and by encoding, beside one table of the total bytes (`single`) and two tables that do not share
(`none`):

    .venv/bin/python bench/fleet_replay.py --json out/fleet_replay.json      # ~6 min, 2-core VM
    .venv/bin/python bench/fleet_replay.py --quick                           # ~1 min

Model: `ec_connector.benchmarks.replay_pair` (its docstring has the rules): two of our `EntryTable`s
(`R` blocks each, the shipped run floor and cap), fed round-robin by request, 1% of saves failing; a
pull needs the shipped `PullRule` to find it worth it; directory and pull timing idealised. `single`,
`none` and `first` run `--eviction` (the shipped default, `duel`, unless named); the other copy
rules are variants of `s3fifo`:

    .venv/bin/python bench/fleet_replay.py --arms single none first --eviction s3fifo

Copy rules (what the table does with a pulled copy):

- `keep`: a copy is an entry like any other; the pulling request's load counts as a read, so under
  S3-FIFO it moves to the main queue (what the tier did before copies were told apart);
- `demote`: the pulling request's load is not counted: the copy stays in the small queue and is
  among the first to go unless it is read again here;
- `demote-noghost`: `demote`, and a copy is never admitted to the main queue from the ghost list,
  nor remembered there when it goes;
- `tail`: `demote`, and the copy joins the small queue at its eviction end (the next to go);
- `first` (shipped: `EntryTable.mark_copy`, under `s3fifo` and `duel`): copies wait in a queue of
  their own, oldest first, that gives every victim it can before the policy's order is asked; the
  pulling load is not counted, and a copy read here again becomes an entry of this replica's own
  (under `s3fifo`: the small queue's, read once);
- `first-strict`: `first`, but a copy never leaves the copies' queue;
- `drop`: the copy is freed right after its load (one copy in the fleet, every remote repeat
  pulls again).

Traces: the serving bench's shapes at one image size (768 rows of 7 KiB, a region of 512 MiB =
97 images): `repeat` (a pool of 0.5-2x one region's images, a fill pass and four passes, each a
fresh shuffle) and `pressure` (Zipf 0.6 / 0.8 / 1.0 draws over a pool of 4x both regions' bytes);
and bench/cache_traces.py's sources with both regions together 10%, 25% and 50% of the trace's
footprint.
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
from collections import deque
from collections.abc import Callable, Container, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cache_sides import OursSide  # noqa: E402
from bench.cache_traces import SOURCES, Item, Step, Trace, make_trace  # noqa: E402
from ec_connector.benchmarks.output import write_json  # noqa: E402
from ec_connector.benchmarks.replay_pair import replay_pair  # noqa: E402
from ec_connector.domain.entries import Entry  # noqa: E402
from ec_connector.domain.eviction import _COPIES, _SMALL, DEFAULT_POLICY, POLICIES, S3FifoPolicy  # noqa: E402
from ec_connector.domain.pull_rule import PullRule  # noqa: E402

COPY_RULES = ("keep", "demote", "demote-noghost", "tail", "first", "first-strict", "drop")
ARMS = ("single", "none", *COPY_RULES)
IMAGE_ROWS = 768  # a 5.25 MiB encoder output: the serving bench's image size
REGION_IMAGES = 97  # 512 MiB of those per replica
REPEAT_POOLS = (0.5, 1.0, 1.5, 2.0)  # repeat pools, in one region's images
ZIPF_ALPHAS = (0.6, 0.8, 1.0)
TOTAL_FRACTIONS = (0.10, 0.25, 0.50)  # both regions together, share of a cache trace's footprint


class CopyRuleS3Fifo(S3FifoPolicy):
    """S3-FIFO with one of the measured rules for pulled copies in place of the shipped one
    (`copied` is called right after the copy's reservation, before it is READY).
    `skip_read`: the copy's next read (the pulling request's load) is not counted; `tail`: the copy
    joins the small queue at its eviction end; `noghost`: a copy is not admitted from, nor
    remembered in, the ghost list; `drop`: the driver frees the copy after its load (`to_drop`);
    `strict`: the shipped copies' queue, but a copy read here again stays in it."""

    def __init__(
        self,
        num_blocks: int,
        evictable: Mapping[str, Entry],
        *,
        skip_read: bool = False,
        tail: bool = False,
        noghost: bool = False,
        drop: bool = False,
        strict: bool = False,
    ) -> None:
        super().__init__(num_blocks, evictable, min_compact=64)
        self._skip_read, self._tail, self._noghost = skip_read, tail, noghost
        self._drop, self._strict = drop, strict
        self.to_drop: set[str] = set()  # copies the driver frees after their load (`drop`)
        self._unread: set[str] = set()  # copies whose next read is not counted
        self._copies: set[str] = set()  # live copies (`tail`, `noghost`)

    def copied(self, entry: Entry) -> None:
        if self._strict:
            super().copied(entry)
            return
        node = self._nodes[entry.key]
        if self._skip_read:
            self._unread.add(entry.key)
        if self._noghost:
            self._copies.add(entry.key)
            node.queue = _SMALL  # not listed yet: no queue counters to move
        if self._tail:
            self._copies.add(entry.key)
        if self._drop:
            self.to_drop.add(entry.key)

    def listed(self, entry: Entry) -> None:
        node = self._nodes[entry.key]
        if self._tail and not node.stamp and entry.key in self._copies and node.queue == _SMALL:
            self._rows[_SMALL] += entry.rows
            self._live[_SMALL] += 1
            # the stamp only marks the item live; its place in the deque is the eviction order
            self._stamp += 1
            node.stamp = self._stamp
            self._queues[_SMALL].appendleft((self._stamp, node))
            return
        super().listed(entry)

    def read(self, entry: Entry) -> None:
        if entry.key in self._unread:
            self._unread.discard(entry.key)
            return
        if self._strict and self._nodes[entry.key].queue == _COPIES:
            return
        super().read(entry)

    def freed(self, entry: Entry) -> None:
        self._unread.discard(entry.key)
        self._copies.discard(entry.key)
        self.to_drop.discard(entry.key)
        super().freed(entry)

    def victims(self, needed: int, protect: Container[str]) -> list[Entry]:
        out = super().victims(needed, protect)
        if self._noghost:
            for entry in out:
                if entry.key in self._copies and self._ghost.pop(entry.key, None) is not None:
                    self._ghost_rows -= entry.rows
        return out


def _side(num_blocks: int, rule: str, eviction: str) -> OursSide:
    # `single`, `none` and `first` (copies marked by the driver) run `eviction`; the research
    # copy rules are S3-FIFO variants
    side = OursSide(num_blocks, eviction=eviction)
    if rule in COPY_RULES and rule != "first":
        evictable = side.table._evictable  # swapped in before the first entry, as bench/eviction.py
        side.table._policy = CopyRuleS3Fifo(
            num_blocks,
            evictable,
            skip_read=rule in ("demote", "demote-noghost", "tail"),
            tail=rule == "tail",
            noghost=rule == "demote-noghost",
            drop=rule == "drop",
            strict=rule == "first-strict",
        )
    return side


def replay_fleet(
    trace: Trace, region_blocks: int, arm: str, rule: PullRule | None = None, eviction: str = DEFAULT_POLICY
) -> dict[str, Any]:
    """Local hits, fleet hits (pulls) and encodes of `trace` under `arm` (`ARMS`): `single` is one
    table of 2x `region_blocks`, `none` two tables that do not share, a copy rule two tables that
    pull from each other. Requests alternate between the replicas (round-robin)."""
    if arm == "single":
        return replay_pair(trace, [_side(2 * region_blocks, arm, eviction)], share=False, rule=rule)
    sides = [_side(region_blocks, arm, eviction) for _ in range(2)]
    return replay_pair(trace, sides, share=arm in COPY_RULES, rule=rule)


def serving_trace(
    *, pool: int, passes: int = 0, draws: int = 0, alpha: float = 0.0, per_step: int = 8, seed: int = 8
) -> Trace:
    """One-image requests of `IMAGE_ROWS` rows, `per_step` arriving a step: `passes` shuffled
    passes over a pool of `pool` images (the serving bench's repeat), or `draws` Zipf(`alpha`)
    draws over it (its pressure shape)."""
    rng = random.Random(f"fleet/{pool}/{passes}/{draws}/{alpha}/{seed}")
    images = [f"i{n:06d}" for n in range(pool)]
    keys: list[str] = []
    if passes:
        for _ in range(passes):
            order = images[:]
            rng.shuffle(order)
            keys.extend(order)
    else:
        weights = list(itertools.accumulate(1.0 / (rank + 1) ** alpha for rank in range(pool)))
        keys = rng.choices(images, cum_weights=weights, k=draws)
    steps, rid = [], 0
    pending = deque(keys)
    while pending:
        arrivals = []
        for _ in range(min(per_step, len(pending))):
            key = pending.popleft()
            arrivals.append((rid, (Item(key, IMAGE_ROWS, rng.random() < 0.01),)))
            rid += 1
        steps.append(Step(tuple(arrivals), ()))
    return Trace(tuple(steps), per_step, 0, "serving")


def cases(quick: bool, steps: int | None) -> list[tuple[str, Trace, int]]:
    """(name, trace, blocks per replica) of every case replayed."""
    region = REGION_IMAGES * IMAGE_ROWS
    out = []
    for k in REPEAT_POOLS:
        pool = int(round(k * REGION_IMAGES))
        out.append((f"repeat pool {k:g}x", serving_trace(pool=pool, passes=5), region))
    total_images = 2 * REGION_IMAGES
    for alpha in ZIPF_ALPHAS:
        draws = 2000 if quick else 8000
        trace = serving_trace(pool=4 * total_images, draws=draws, alpha=alpha)
        out.append((f"pressure zipf {alpha:g}", trace, region))
    n_steps = steps or (1000 if quick else 3000)
    for source in SOURCES:
        trace = make_trace(steps=n_steps, live=256, num_blocks=0, source=source)
        footprint = trace.footprint_rows()
        for frac in TOTAL_FRACTIONS:
            out.append((f"{source} {int(100 * frac)}%", trace, max(1, int(footprint * frac / 2))))
    return out


def run(
    *,
    quick: bool = False,
    steps: int | None = None,
    arms: tuple[str, ...] = ARMS,
    eviction: str = DEFAULT_POLICY,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    say = progress or (lambda _m: None)
    params = {"quick": quick, "steps": steps, "eviction": eviction}
    out: dict[str, Any] = {"bench": "fleet_replay", "params": params, "cases": {}}
    for name, trace, blocks in cases(quick, steps):
        cell = {arm: replay_fleet(trace, blocks, arm, eviction=eviction) for arm in arms}
        cell["_region_blocks"] = blocks  # type: ignore[assignment]
        out["cases"][name] = cell
        say(f"{name}: " + " ".join(f"{a}={cell[a]['encode_ratio']:.3f}" for a in arms))
    out["summary"] = summary(out, arms)
    return out


def summary(res: dict[str, Any], arms: tuple[str, ...]) -> dict[str, Any]:
    """Per arm: the most it encodes above `keep` and above `single` (points of the encode ratio),
    and the mean change against `keep`, over every case."""
    out: dict[str, Any] = {}
    for arm in arms:
        if arm == "keep" or "keep" not in arms:
            continue
        d_keep = [c[arm]["encode_ratio"] - c["keep"]["encode_ratio"] for c in res["cases"].values()]
        d_single = [c[arm]["encode_ratio"] - c["single"]["encode_ratio"] for c in res["cases"].values()]
        w_keep = [c[arm]["work_s"] / max(1e-9, c["keep"]["work_s"]) for c in res["cases"].values()]
        out[arm] = {
            "worst_work_vs_keep": max(w_keep),
            "best_work_vs_keep": min(w_keep),
            "worst_vs_keep_points": 100 * max(d_keep),
            "best_vs_keep_points": 100 * min(d_keep),
            "mean_vs_keep_points": 100 * sum(d_keep) / len(d_keep),
            "worst_vs_single_points": 100 * max(d_single),
        }
    return out


def render(res: dict[str, Any], arms: tuple[str, ...]) -> str:
    lines = ["encode ratio (encodes / requests served); local / fleet hits for the sharing arms"]
    lines.append(f"{'case':<22}" + "".join(f"{a:>15}" for a in arms))
    for name, cell in res["cases"].items():
        lines.append(f"{name:<22}" + "".join(f"{cell[a]['encode_ratio']:>15.3f}" for a in arms))
        lines.append(
            f"{'  local/fleet':<22}"
            + "".join(f"{cell[a]['local_hits']:>8}/{cell[a]['fleet_hits']:<6}" for a in arms)
        )
        if "single" in arms:
            base = max(1e-9, cell["single"]["work_s"])
            lines.append(
                f"{'  work / single':<22}" + "".join(f"{cell[a]['work_s'] / base:>15.3f}" for a in arms)
            )
    for arm, s in res["summary"].items():
        lines.append(
            f"{arm:<16} vs keep: worst {s['worst_vs_keep_points']:+.2f}, "
            f"best {s['best_vs_keep_points']:+.2f}, mean {s['mean_vs_keep_points']:+.2f} points; "
            f"worst vs single {s['worst_vs_single_points']:+.2f}; "
            f"work vs keep {s['best_work_vs_keep']:.3f}-{s['worst_work_vs_keep']:.3f}x"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter traces (1000 steps, 2000 draws)")
    ap.add_argument("--steps", type=int, default=None, help="steps of a cache trace (default 3000)")
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    ap.add_argument(
        "--eviction", choices=POLICIES, default=DEFAULT_POLICY, help="policy of single, none and first"
    )
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    arms = tuple(args.arms)
    res = run(
        quick=args.quick,
        steps=args.steps,
        arms=arms,
        eviction=args.eviction,
        progress=lambda m: print(m, file=sys.stderr, flush=True),
    )
    print(render(res, arms), flush=True)
    if args.json:
        write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
