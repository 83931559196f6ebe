"""Workload traces for the cache benches (compare_cache.py, bench/eviction.py).

A trace is a sequence of engine steps: requests arrive with 1-4 multimodal items each and finish
5-75 steps later, so that about `live` requests are alive at any step (the scheduler's running and
waiting set). Items are (key, rows) with rows of 7 KiB (bf16, hidden 3584, a Qwen2.5-VL-7B-sized
model). What differs between traces is where items come from (`SOURCES`):

- `compare`: the original cache trace. 40% of items repeat an image of a pool of 400 (index
  `400 * u**2`, a skew towards the first ones), the rest are new; sizes 64 / 256 / 880 / 2040 rows
  (a thumbnail, 448x448, 1280x720, 1920x1080) mixed 20/30/35/15%.
- `zipf0.6`, `zipf0.8`, `zipf1.0`: every item drawn from a pool of `pool` images with Zipf
  probabilities of exponent alpha (the usual model of popularity), the same size mix.
- `scan`: `zipf0.8`, with a burst of one-hit images (never seen again) every 40 steps, as many
  items as 40 steps of the Zipf stream bring: half of all items are one-hit.
- `mixed`: `zipf0.8` with sizes log-uniform from 64 rows to 16 MiB (2,341 rows).
- `drift`: `zipf0.8` whose popularity moves: every 500 steps the pool's ranking is drawn afresh
  (yesterday's popular images become rare, rare ones popular), so a policy that trusts old
  counts keeps stale images.

The engine-shaped traces (`ENGINE_SOURCES`) are the serving bench's pressure workload
(serving_workload.py) at length: one request a step, one 896x672 image each (768 rows: 5.25 MiB),
no save fails, a pool of `ENGINE_POOL` images, the serving bench's own Zipf sampler and ranking
(`serving_workload.build`, `zipf_draws`):

- `engine0.6`, `engine0.8`, `engine1.0`: Zipf alpha over the pool, stationary;
- `engine-drift`: Zipf 0.8 whose ranking is drawn afresh every `ENGINE_DRIFT_EVERY` requests;
- `engine-swap` (`SWAP_SOURCES`, replayed only when named): the serving bench's repeat workload
  first (`SWAP_POOL` images, each requested `SWAP_ROUNDS` times, a fresh shuffle a round), then
  `engine0.8` over other images: the working set changes whole, as when one engine serves the
  bench's repeat and then its pressure workload.

Few, equal, large items: a region of 10-25% of the footprint holds 40-100 of them, so a policy
makes a few hundred evictions a trace where the other traces make tens of thousands.

Everything is seeded: the same arguments give the same trace.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ec_connector.benchmarks.serving_workload import build, pressure_ranking, zipf_draws

ROW_BYTES = 3584 * 2  # bf16 rows of a hidden-3584 model: 7 KiB
IMAGE_MIX = ((64, 0.20), (256, 0.30), (880, 0.35), (2040, 0.15))  # rows, share
MAX_ROWS = (16 << 20) // ROW_BYTES  # a 16 MiB encoder output
ITEMS_PER_REQUEST = ((1, 0.75), (2, 0.20), (4, 0.05))
REPEAT_SHARE = 0.40
POPULAR_POOL = 400
FAIL_SHARE = 0.01
SCAN_EVERY = 40  # steps between bursts of one-hit images
DRIFT_EVERY = 500  # steps between re-rankings of the `drift` trace's pool
SOURCES = ("compare", "zipf0.6", "zipf0.8", "zipf1.0", "scan", "mixed", "drift")
ENGINE_SOURCES = ("engine0.6", "engine0.8", "engine1.0", "engine-drift")
SWAP_SOURCES = ("engine-swap",)  # engine-shaped too, run when named (`bench/eviction.py --traces`)
ENGINE_SHAPED = ENGINE_SOURCES + SWAP_SOURCES
TRACES = SOURCES + ENGINE_SHAPED  # every trace `make_trace` knows
ENGINE_SIZE = (896, 672)  # the serving bench's image: 768 tokens on Qwen2-VL-7B
ENGINE_ROWS = 768
ENGINE_POOL = 400  # images; the H200 pressure run drew from 391 (4x a 512 MiB region)
ENGINE_DRIFT_EVERY = 500  # requests between re-rankings of `engine-drift` (1.25 pools' worth)
SWAP_POOL = 64  # `engine-swap`'s first working set: the serving bench's repeat pool
SWAP_ROUNDS = 4  # its fill and three measured passes


@dataclass(frozen=True, slots=True)
class Item:
    key: str
    rows: int
    fails: bool  # a save (or READ) into this allocation fails: discarded instead of marked ready


@dataclass(frozen=True, slots=True)
class Step:
    arrivals: tuple[tuple[int, tuple[Item, ...]], ...]  # (request id, its items)
    finishes: tuple[int, ...]


Ranking = tuple[int, float, tuple[str, ...]]
"""A popularity regime: (its first step, its Zipf exponent, the keys most popular first); the rank-k
key is drawn with weight 1/(k+1)^exponent and a key not listed is not drawn from the ranking."""


@dataclass(frozen=True, slots=True)
class Trace:
    steps: tuple[Step, ...]
    live: int
    num_blocks: int
    name: str = "compare"
    rankings: tuple[Ranking, ...] = ()  # the generator's own, in step order (none for `compare`)

    def items(self) -> list[Item]:
        """Every item in arrival order."""
        return [item for step in self.steps for _, items in step.arrivals for item in items]

    def footprint_rows(self) -> int:
        """Blocks of the distinct items (the working set of the whole trace)."""
        return sum({item.key: item.rows for item in self.items()}.values())


def _pick(rng: random.Random, table: tuple[tuple[int, float], ...]) -> int:
    x, acc = rng.random(), 0.0
    for value, share in table:
        acc += share
        if x < acc:
            return value
    return table[-1][0]


Source = Callable[[int], tuple[str, int]]  # step number -> (key, rows) of the next item


def _compare_source(rng: random.Random) -> Source:
    popular = [(f"{rng.getrandbits(256):064x}", _pick(rng, IMAGE_MIX)) for _ in range(POPULAR_POOL)]

    def draw(_now: int) -> tuple[str, int]:
        if rng.random() < REPEAT_SHARE:
            return popular[int(POPULAR_POOL * rng.random() ** 2)]
        return f"{rng.getrandbits(256):064x}", _pick(rng, IMAGE_MIX)

    return draw


def _zipf_source(
    rng: random.Random, alpha: float, pool: int, sizes: Callable[[], int], rankings: list[Ranking]
) -> Source:
    images = [(f"z{rng.getrandbits(128):032x}", sizes()) for _ in range(pool)]
    rankings.append((0, alpha, tuple(key for key, _ in images)))
    weights = list(itertools.accumulate(1.0 / (rank + 1) ** alpha for rank in range(pool)))

    def draw(_now: int) -> tuple[str, int]:
        return rng.choices(images, cum_weights=weights)[0]

    return draw


def _drift_source(rng: random.Random, pool: int, rankings: list[Ranking]) -> Source:
    images = [(f"d{rng.getrandbits(128):032x}", _pick(rng, IMAGE_MIX)) for _ in range(pool)]
    rankings.append((0, 0.8, tuple(key for key, _ in images)))
    weights = list(itertools.accumulate(1.0 / (rank + 1) ** 0.8 for rank in range(pool)))
    epoch = 0

    def draw(now: int) -> tuple[str, int]:
        nonlocal epoch
        if now // DRIFT_EVERY != epoch:
            epoch = now // DRIFT_EVERY
            rng.shuffle(images)  # a new ranking of the same images
            rankings.append((now, 0.8, tuple(key for key, _ in images)))
        return rng.choices(images, cum_weights=weights)[0]

    return draw


def _scan_source(rng: random.Random, pool: int, rankings: list[Ranking]) -> Source:
    zipf = _zipf_source(rng, 0.8, pool, lambda: _pick(rng, IMAGE_MIX), rankings)

    def draw(now: int) -> tuple[str, int]:
        if now % SCAN_EVERY == SCAN_EVERY - 1:  # the burst step: every item is seen once
            return f"s{rng.getrandbits(128):032x}", _pick(rng, IMAGE_MIX)
        return zipf(now)

    return draw


def _source(name: str, rng: random.Random, pool: int, rankings: list[Ranking]) -> Source:
    mix = lambda: _pick(rng, IMAGE_MIX)  # noqa: E731
    if name == "compare":
        return _compare_source(rng)
    if name.startswith("zipf"):
        return _zipf_source(rng, float(name[4:]), pool, mix, rankings)
    if name == "scan":
        return _scan_source(rng, pool, rankings)
    if name == "drift":
        return _drift_source(rng, pool, rankings)
    if name == "mixed":
        lo, hi = math.log(64), math.log(MAX_ROWS)
        return _zipf_source(rng, 0.8, pool, lambda: int(math.exp(rng.uniform(lo, hi))), rankings)
    raise ValueError(f"unknown trace {name!r}: expected one of {', '.join(TRACES)}")


def engine_requests(
    *, steps: int, source: str, seed: int = 8, pool: int = ENGINE_POOL, rankings: list[Ranking] | None = None
) -> list[int]:
    """The image (by seed) of each of `steps` requests of an engine-shaped trace (`ENGINE_SOURCES`).
    A stationary one is the serving bench's pressure workload: its fill (a quarter of the requests)
    and one pass, flattened. `engine-drift` draws with the same sampler and re-ranks the pool every
    `ENGINE_DRIFT_EVERY` requests. `rankings`, if given, gets the trace's popularity regimes
    (their first request, keys the images' seeds as text)."""
    found: list[Ranking] = [] if rankings is None else rankings
    if source == "engine-drift":
        rng = random.Random(f"engine-drift/{seed}")
        images = list(range(pool))
        out: list[int] = []
        while len(out) < steps:
            rng.shuffle(images)  # a new ranking of the same images
            found.append((len(out), 0.8, tuple(str(i) for i in images)))
            count = min(ENGINE_DRIFT_EVERY, steps - len(out))
            out.extend(images[k] for k in zipf_draws(rng, pool, count, 0.8))
        return out
    if source == "engine-swap":
        # the serving bench's repeat workload with its pool given (sizes play no part then)
        repeat = build(
            "repeat",
            ENGINE_SIZE,
            requests=SWAP_POOL,
            passes=SWAP_ROUNDS - 1,
            item_bytes=1,
            region_bytes=SWAP_POOL,
            repeat_pool=SWAP_POOL,
            seed=seed,
        )
        first = [s for p in repeat.passes for s in p.seeds][:steps]
        found.append((0, 0.0, tuple(str(i) for i in sorted(set(first)))))
        if steps == len(first):
            return first
        later: list[Ranking] = []
        rest = engine_requests(
            steps=steps - len(first), source="engine0.8", seed=seed, pool=pool, rankings=later
        )
        found.extend((start + len(first), alpha, keys) for start, alpha, keys in later)
        return first + rest
    if source not in ENGINE_SOURCES:
        raise ValueError(f"unknown engine trace {source!r}: expected one of {', '.join(ENGINE_SHAPED)}")
    fill = max(1, steps // 4)
    item_bytes = ENGINE_ROWS * ROW_BYTES
    zipf = float(source[len("engine") :])
    found.append((0, zipf, tuple(str(i) for i in pressure_ranking(ENGINE_SIZE, pool, seed))))
    wl = build(
        "pressure",
        ENGINE_SIZE,
        requests=max(1, steps - fill),
        passes=1,
        item_bytes=item_bytes,
        region_bytes=pool * item_bytes // 4,
        pressure_pool=pool,
        pressure_fill=fill,
        zipf=zipf,
        seed=seed,
    )
    return [s for p in wl.passes for s in p.seeds][:steps]


def engine_trace(
    requests: list[int],
    rows: int | Sequence[int],
    num_blocks: int,
    name: str,
    rankings: tuple[Ranking, ...] = (),
) -> Trace:
    """One request a step, each one image (its seed) of `rows` blocks, or of `rows[i]` for request
    i; saves never fail (the serving bench's replay, serving_expected.py)."""
    sizes = [rows] * len(requests) if isinstance(rows, int) else list(rows)
    if len(sizes) != len(requests):
        raise ValueError(f"engine_trace: {len(sizes)} sizes for {len(requests)} requests")
    steps = tuple(
        Step(((i, (Item(str(seed), size, False),)),), ())
        for i, (seed, size) in enumerate(zip(requests, sizes, strict=True))
    )
    return Trace(steps, 1, num_blocks, name, rankings)


def make_trace(
    *, steps: int, live: int, num_blocks: int, seed: int = 8, source: str = "compare", pool: int = 0
) -> Trace:
    """A workload of `live` concurrent requests over `steps` engine steps whose items come from
    `source` (one of `SOURCES`; `pool`: images in a Zipf pool, 0: 2,000). An engine-shaped
    `source` (`ENGINE_SOURCES`) ignores `live`: one request a step (`pool` 0: `ENGINE_POOL`).
    Deterministic for its arguments."""
    rankings: list[Ranking] = []
    if source in ENGINE_SHAPED:
        requests = engine_requests(
            steps=steps, source=source, seed=seed, pool=pool or ENGINE_POOL, rankings=rankings
        )
        return engine_trace(requests, ENGINE_ROWS, num_blocks, source, tuple(rankings))
    pool = pool or 2000
    rng = random.Random(seed)
    draw = _source(source, rng, pool, rankings)
    next_id = 0
    ends: dict[int, list[int]] = {}
    burst = source == "scan"

    def new_request(now: int) -> tuple[int, tuple[Item, ...]]:
        nonlocal next_id
        items = []
        for _ in range(_pick(rng, ITEMS_PER_REQUEST)):
            key, rows = draw(now)
            items.append(Item(key, rows, rng.random() < FAIL_SHARE))
        rid, next_id = next_id, next_id + 1
        ends.setdefault(now + rng.randint(5, 75), []).append(rid)
        return rid, tuple(items)

    out, alive, arrived = [], 0, 0
    for now in range(steps):
        finishes = tuple(ends.pop(now, ()))
        alive -= len(finishes)
        count = live - alive
        if burst and now % SCAN_EVERY == SCAN_EVERY - 1:
            count = max(count, arrived)  # the burst: as many requests as the period's other steps
            arrived = 0
        elif burst:
            arrived += count
        arrivals = tuple(new_request(now) for _ in range(count))
        alive += len(arrivals)
        out.append(Step(arrivals, finishes))
    return Trace(tuple(out), live, num_blocks, source, tuple(rankings))
