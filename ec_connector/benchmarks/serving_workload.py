"""The serving benchmark's workloads: which image each request carries, pass by pass (stdlib only).

A workload is a list of passes; a pass is a list of requests, one image each; only the passes
marked `measured` count. Every image is named by a seed and drawn as seeded noise, so every arm
and every round sees the same images in the same order, and a run on another machine too.

- ``unique``: every image new; a warm-up pass first (not measured), then `passes` measured ones.
- ``repeat``: a pool of `pool` images, each pass a fresh shuffle of the pool; the first pass
  fills (vLLM's own encoder cache and the tier), the next `passes` are measured. The pool must be
  larger than vLLM's own encoder cache and smaller than the region, so repeats come from the tier.
- ``pressure``: Zipf(`zipf`) draws over a pool holding 4× the region's bytes; one fill pass (not
  measured) long enough to reach the region's steady state, then `passes` measured ones of
  `requests`: eviction decides what hits. The fill (`pressure_fill` requests; 0: `auto_fill`)
  draws until the distinct images seen reach 3× what the region holds (capped at 3/4 of the
  pool): by then the region has been filled and turned over several times, so the measured
  passes see the policy's steady state, not a cold region that every policy fills alike.
- ``limit``: the ``repeat`` workload's requests with the encoder stubbed (see serving_hook.py).
- ``epd``: ``unique``'s shape (every image new, a warm-up pass) served encoder -> prefill/decode: an
  encoder-only producer engine first, then a consumer engine (serving_epd.py).
- ``fleet``: ``repeat`` and ``pressure`` (named ``fleet-repeat``, ``fleet-pressure``) served by
  replicas behind a round-robin client (serving_fleet.py); their pools are sized from the fleet's
  total region bytes, so one engine holding all of them sees the same requests.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import asdict, dataclass, field, replace
from typing import Any

FLEET_SHAPES = ("repeat", "pressure")
# "fleet" runs both fleet shapes; "fleet-repeat" / "fleet-pressure" one of them
FLEET_WORKLOADS = ("fleet", *(f"fleet-{s}" for s in FLEET_SHAPES))
WORKLOADS = ("unique", "repeat", "pressure", "limit", "epd", *FLEET_WORKLOADS)
PATCH = 14
MERGE = 2
# Qwen2-VL-7B's pixel bounds (tools/tiny_vlm.py --shape 7b)
MIN_PIXELS_7B = 3136
MAX_PIXELS_7B = 12845056
# The auto fill's target: distinct images drawn = FILL_REGIONS x the region's images, at most
# FILL_POOL_SHARE of the pool (a pool barely larger than the region never reaches 3 regions).
FILL_REGIONS = 3
FILL_POOL_SHARE = 0.75
_SEED_BASE = {"unique": 1 << 24, "repeat": 2 << 24, "pressure": 3 << 24, "limit": 2 << 24, "epd": 4 << 24}


def parse_size(text: str) -> tuple[int, int]:
    """'896x672' -> (896, 672); raises ValueError otherwise."""
    w, sep, h = text.lower().partition("x")
    if not sep or not w.isdigit() or not h.isdigit() or int(w) <= 0 or int(h) <= 0:
        raise ValueError(f"image size {text!r}: expected WIDTHxHEIGHT, e.g. 896x672")
    return int(w), int(h)


def resized(
    width: int, height: int, *, min_pixels: int, max_pixels: int, factor: int = PATCH * MERGE
) -> tuple[int, int]:
    """Qwen2-VL's smart_resize: both sides multiples of `factor`, pixels within [min, max]."""
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = math.floor(height / beta / factor) * factor
        w = math.floor(width / beta / factor) * factor
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return w, h


def image_tokens(width: int, height: int, *, min_pixels: int, max_pixels: int) -> int:
    """Image tokens (= encoder output rows) of one image: (w/28)·(h/28) after smart_resize."""
    w, h = resized(width, height, min_pixels=min_pixels, max_pixels=max_pixels)
    return (w // (PATCH * MERGE)) * (h // (PATCH * MERGE))


@dataclass(frozen=True)
class Pass:
    label: str
    measured: bool
    seeds: tuple[int, ...]  # one image per request, by seed


@dataclass(frozen=True)
class Workload:
    name: str
    size: tuple[int, int]
    passes: tuple[Pass, ...]
    stub_encoder: bool = False
    pool: int = 0  # distinct images the workload draws from (0: every image new)
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.name}@{self.size[0]}x{self.size[1]}"

    def measured_requests(self) -> int:
        return sum(len(p.seeds) for p in self.passes if p.measured)

    def total_requests(self) -> int:
        return sum(len(p.seeds) for p in self.passes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Workload:
        passes = tuple(Pass(p["label"], p["measured"], tuple(p["seeds"])) for p in d["passes"])
        return Workload(d["name"], tuple(d["size"]), passes, d["stub_encoder"], d["pool"], d.get("notes", {}))  # type: ignore[arg-type]


def _seed_base(name: str, size: tuple[int, int], seed: int) -> int:
    return _SEED_BASE[name] + _size_salt(size) * 4096 + seed * 7_777_777


def _ranked(rng: random.Random, base: int, pool: int) -> list[int]:
    """Popularity rank -> image, shuffled so that popularity is not the seed order."""
    ranks = list(range(base, base + pool))
    rng.shuffle(ranks)
    return ranks


def pressure_ranking(size: tuple[int, int], pool: int, seed: int = 0) -> list[int]:
    """The pressure workload's images (seeds) most popular first, as `build` ranks them: its
    rank-k image is drawn with weight 1/(k+1)^zipf."""
    return _ranked(random.Random(f"pressure/{size}/{seed}"), _seed_base("pressure", size, seed), pool)


def _size_salt(size: tuple[int, int]) -> int:
    return (size[0] * 7919 + size[1]) % (1 << 20) << 2


def zipf_draws(rng: random.Random, n_items: int, count: int, alpha: float) -> list[int]:
    """`count` item indices in [0, n_items), item k drawn with weight 1/(k+1)^alpha."""
    cum, total = [], 0.0
    for k in range(n_items):
        total += 1.0 / (k + 1) ** alpha
        cum.append(total)
    return rng.choices(range(n_items), cum_weights=cum, k=count)


def build(
    name: str,
    size: tuple[int, int],
    *,
    requests: int,
    passes: int,
    item_bytes: int,
    region_bytes: int,
    repeat_pool: int = 0,
    pressure_pool: int = 0,
    pressure_fill: int = 0,
    zipf: float = 0.8,
    seed: int = 0,
) -> Workload:
    """One workload of `name` at image `size`; pools default from the region and item sizes.

    repeat pool (0: auto) = `requests` capped at 80% of the images the region holds;
    pressure pool (0: auto) = the images in 4× the region's bytes; pressure fill (0: auto) =
    `auto_fill`'s requests.
    """
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}: expected one of {WORKLOADS}")
    if name in FLEET_WORKLOADS:
        raise ValueError(f"{name} is served as the fleet's shapes: use fleet_workloads()")
    if requests <= 0 or passes <= 0:
        raise ValueError("requests per pass and passes must be positive")
    base = _seed_base(name, size, seed)
    rng = random.Random(f"{name}/{size}/{seed}")
    fits = max(1, region_bytes // max(1, item_bytes))
    if name in ("unique", "epd"):
        out, n = [], 0
        for p in range(passes + 1):
            out.append(
                Pass("warmup" if p == 0 else f"pass{p}", p > 0, tuple(range(base + n, base + n + requests)))
            )
            n += requests
        return Workload(name, size, tuple(out), notes={"region_images": fits})
    if name in ("repeat", "limit"):
        pool = repeat_pool or max(1, min(requests, int(fits * 0.8)))
        rng = random.Random(f"repeat/{size}/{seed}")  # limit replays repeat's exact requests
        seeds = list(range(base, base + pool))
        out = []
        for p in range(passes + 1):
            order = seeds[:]
            rng.shuffle(order)
            out.append(Pass("fill" if p == 0 else f"pass{p}", p > 0, tuple(order)))
        return Workload(
            name, size, tuple(out), stub_encoder=name == "limit", pool=pool, notes={"region_images": fits}
        )
    pool = pressure_pool or max(1, math.ceil(4 * region_bytes / max(1, item_bytes)))
    ranks = _ranked(rng, base, pool)
    fill = pressure_fill or auto_fill(rng, pool, fits, zipf)
    out = [Pass("fill", False, tuple(ranks[i] for i in zipf_draws(rng, pool, fill, zipf)))]
    for p in range(1, passes + 1):
        draws = zipf_draws(rng, pool, requests, zipf)
        out.append(Pass(f"pass{p}", True, tuple(ranks[i] for i in draws)))
    notes = {
        "region_images": fits,
        "zipf": zipf,
        "fill_requests": fill,
        "fill_rule": "given" if pressure_fill else f"auto: {fill_target(pool, fits)} distinct images",
        "distinct_before_measured": len(set(out[0].seeds)),
    }
    return Workload(name, size, tuple(out), pool=pool, notes=notes)


def fill_target(pool: int, fits: int) -> int:
    """Distinct images the auto fill draws: FILL_REGIONS regions' worth, capped at FILL_POOL_SHARE
    of the pool."""
    return max(1, min(FILL_REGIONS * fits, math.ceil(FILL_POOL_SHARE * pool)))


def auto_fill(rng: random.Random, pool: int, fits: int, alpha: float) -> int:
    """Requests until the Zipf(`alpha`) draws that `rng` will make next have named `fill_target`
    distinct images (at most 50 pools' worth of draws). `rng` is left as it was: the fill is then
    drawn from it, and `zipf_draws` draws one number a request, so those draws are this probe's."""
    probe = random.Random()
    probe.setstate(rng.getstate())
    target, seen = fill_target(pool, fits), set()
    for chunk in range(50):
        for n, k in enumerate(zipf_draws(probe, pool, pool, alpha)):
            seen.add(k)
            if len(seen) >= target:
                return chunk * pool + n + 1
    return 50 * pool


def fleet_workloads(
    size: tuple[int, int], *, region_bytes: int, name: str = "fleet", **options: Any
) -> list[Workload]:
    """The fleet arms' workloads for the workload `name` (``fleet``: repeat and pressure;
    ``fleet-<shape>``: that shape alone): `build`'s shapes at `size`, their pools sized from
    `region_bytes`, the fleet's total (every replica's region), named ``fleet-<shape>`` so the
    report keeps them apart from a single engine's rows. `options` are `build`'s."""
    if name not in FLEET_WORKLOADS:
        raise ValueError(f"unknown fleet workload {name!r}: expected one of {', '.join(FLEET_WORKLOADS)}")
    shapes = FLEET_SHAPES if name == "fleet" else (name.removeprefix("fleet-"),)
    return [
        replace(build(shape, size, region_bytes=region_bytes, **options), name=f"fleet-{shape}")
        for shape in shapes
    ]


def image_digest(pixels: bytes, size: tuple[int, int]) -> str:
    """The identifier the bench passes as `multi_modal_uuids`: a digest of the image's content."""
    h = hashlib.sha256(f"{size[0]}x{size[1]}:".encode())
    h.update(pixels)
    return "img-" + h.hexdigest()[:32]
