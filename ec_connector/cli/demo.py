"""The synthetic demo: the local CPU tier serving a stream of requests with repeated images.

It plays vLLM's part (lookups, allocation, the encoder, the copies) through the same scheduler and
worker services the vLLM facade uses, over a real /dev/shm region and the torch copier on CPU.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ec_connector.container import build_container, parse_settings
from ec_connector.logging import attach_stderr_handler, configure_logging

HIDDEN = 1024
PATCH = 14
MERGE = 2


class VisionEncoder(torch.nn.Module):
    """A small ViT-like stem: 14×14 patches → MLP → 2×2 merge; real CPU work per image."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Sequential(
            torch.nn.Linear(3 * PATCH * PATCH, HIDDEN),
            torch.nn.GELU(),
            torch.nn.Linear(HIDDEN, HIDDEN),
        )
        self.merge = torch.nn.Linear(HIDDEN * MERGE * MERGE, HIDDEN)

    @torch.inference_mode()
    def forward(self, image: torch.Tensor) -> torch.Tensor:
        c, h, w = image.shape
        patches = image.unfold(1, PATCH, PATCH).unfold(2, PATCH, PATCH)
        gh, gw = patches.shape[1], patches.shape[2]
        x = self.proj(patches.permute(1, 2, 0, 3, 4).reshape(gh * gw, c * PATCH * PATCH))
        x = x.reshape(gh // MERGE, MERGE, gw // MERGE, MERGE, HIDDEN).permute(0, 2, 1, 3, 4)
        return self.merge(x.reshape(-1, HIDDEN * MERGE * MERGE)).to(torch.bfloat16)


def rows_of(image: torch.Tensor) -> int:
    _, h, w = image.shape
    return (h // PATCH // MERGE) * (w // PATCH // MERGE)


@dataclass
class Tally:
    items: int = 0
    reloaded: int = 0
    encoded: int = 0
    verified: int = 0
    encode_s: float = 0.0
    reload_s: float = 0.0
    first_encoding: dict[str, torch.Tensor] = field(default_factory=dict)


def _workload(args: argparse.Namespace) -> list[list[int]]:
    rng = random.Random(args.seed)
    weights = [1.0 / (i + 1) for i in range(args.images)]
    return [rng.choices(range(args.images), weights, k=rng.randint(1, 3)) for _ in range(args.requests)]


def run_demo(args: argparse.Namespace) -> int:
    configure_logging(json=args.json_logs, level="DEBUG" if args.verbose else "WARNING")
    attach_stderr_handler()
    torch.manual_seed(args.seed)
    encoder = VisionEncoder().eval()
    sides = [(14 * MERGE) * k for k in (6, 8, 10, 12, 14, 16)]
    images = [torch.rand(3, sides[i % len(sides)], sides[(i * 7) % len(sides)]) for i in range(args.images)]
    instance = f"demo-{os.getpid()}"
    config = parse_settings({"ec_cpu_bytes": args.cpu_mib << 20}, role="ec_both")  # what vLLM would pass
    container = build_container(
        config,
        hidden_dim=HIDDEN,
        dtype="bfloat16",
        instance=instance,
        tier="shm",
        device="cpu",
        shm_dir=args.shm_dir,
        participants=1,
    )
    scheduler = container.tier_scheduler()
    worker = container.tier_worker()
    region_file = Path(args.shm_dir) / f"{container.region().name}"
    print(f"ec_connector demo: ec_both, {args.cpu_mib} MiB tier in {region_file}")
    print(f"  {args.requests} requests over {args.images} distinct images, bf16 rows of {HIDDEN}")
    tally = Tally()
    started = time.perf_counter()
    for request in _workload(args):
        _serve(request, images, encoder, scheduler, worker, tally)
    wall = time.perf_counter() - started
    stats, occ = scheduler.stats, scheduler.occupancy()
    worker.close()
    container.shutdown_resources()
    _report(tally, stats, occ, wall, region_file)
    return 0 if tally.verified == tally.reloaded else 1


def _serve(request, images, encoder, scheduler, worker, tally: Tally) -> None:
    items = [(f"img-{i:02d}", i) for i in request]
    hits = {key for key, _ in items if scheduler.has_item(key)}
    for key, i in items:
        scheduler.on_allocated(key, rows_of(images[i]))
    worker.bind(scheduler.take_plan())
    cache: dict[str, object] = {}
    t0 = time.perf_counter()
    worker.start_loads(cache)
    tally.reload_s += time.perf_counter() - t0
    for key, i in dict(items).items():
        tally.items += 1
        if key in hits:
            continue
        t0 = time.perf_counter()
        cache[key] = encoder(images[i])
        tally.encode_s += time.perf_counter() - t0
        tally.encoded += 1
        tally.first_encoding.setdefault(key, cache[key])  # type: ignore[arg-type]
        worker.save(cache, key)
    t0 = time.perf_counter()
    worker.clear()
    tally.reload_s += time.perf_counter() - t0
    for key in hits:
        tally.reloaded += 1
        if torch.equal(cache[key], tally.first_encoding[key]):  # type: ignore[arg-type]
            tally.verified += 1
    scheduler.poll()


def _report(tally: Tally, stats, occ, wall: float, region_file: Path) -> None:
    per_encode = tally.encode_s / max(tally.encoded, 1) * 1e3
    per_reload = tally.reload_s / max(tally.reloaded, 1) * 1e3
    print(f"  items served        {tally.items}")
    print(f"  encoded             {tally.encoded}  ({per_encode:.2f} ms each)")
    print(
        f"  reloaded from tier  {tally.reloaded}  ({per_reload:.2f} ms each; "
        f"{tally.verified}/{tally.reloaded} byte-identical to the first encoding)"
    )
    print(f"  hit ratio           {stats.hits / max(stats.hits + stats.misses, 1):.0%}")
    print(
        f"  offloads            {stats.saves_done} done, {stats.evictions} evictions, "
        f"{stats.not_offloaded} not offloaded (region full)"
    )
    print(f"  bytes               {stats.bytes_saved} saved, {stats.bytes_loaded} reloaded")
    print(f"  region at the end   {occ.entries} entries, {occ.used_bytes}/{occ.capacity_bytes} bytes")
    saved_s = tally.reloaded * (per_encode - per_reload) / 1e3
    print(
        f"  encoder work saved  ~{saved_s:.1f} s ({tally.reloaded} reloads instead of encodes); "
        f"the whole run took {wall:.1f} s"
    )
    gone = not region_file.exists()
    print(f"  region file removed {'yes' if gone else 'NO'} ({region_file.name})")
