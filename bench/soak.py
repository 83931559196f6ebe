"""Soak: ≥ 10,000 P2P transfers between two processes, with misses and faults mixed in, watching
RSS, file descriptors, threads and /dev/shm over time.

The producer is tests/fault/peer_producer.py (composition root: /dev/shm region, CPU torch copier,
NIXL agent, ZMQ ROUTER + producer desk) in a child process; the consumer is the fault suite's
`ConsumerSide` (real region, NIXL agent, ZMQ DEALER, fetcher) in this process. Each round the
producer stores and announces a batch of items and the consumer fetches them as one request:

    hits       items stored and announced: READ, bytes verified (every --verify-every th)
    misses     items published without address (encode locally) and forged addresses (NACK_MISSING)
    not ready  one item a round is announced before its save lands; it lands after the first NACK
    faults     every --stop-every rounds the producer is SIGSTOPped for one round (ack timeouts);
               every --restart-every rounds it is SIGKILLed and restarted on the same port

Every --sample-every rounds a row goes to the CSV: rounds, transfers by outcome, RSS / fds /
threads of both processes, files in the shm directory and /dev/shm used bytes. At the end it prints
the drift of the consumer (RSS and fds from the first sample after warm-up to the last) and of the
producer over its last life, and checks that nothing is left pinned or leaked.

    .venv/bin/python bench/soak.py --transfers 10000 --out /tmp/ec_soak.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fault.harness import ConsumerSide, ProducerProcess  # noqa: E402
from tests.fault.peer_producer import payload  # noqa: E402


class _ProducerKw(TypedDict):
    """The keyword arguments each (re)started ProducerProcess gets."""

    cpu_bytes: int
    extra: dict[str, Any]


def rss_kib(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def count(path: str) -> int:
    try:
        return len(os.listdir(path))
    except OSError:
        return -1


def shm_used_bytes() -> int:
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transfers", type=int, default=10_000, help="items to handle in all (default 10000)")
    ap.add_argument("--batch", type=int, default=16, help="items per round (one request)")
    ap.add_argument("--rows", type=int, default=32, help="rows per item (128-byte rows)")
    ap.add_argument("--stop-every", type=int, default=97)
    ap.add_argument("--restart-every", type=int, default=241)
    ap.add_argument("--sample-every", type=int, default=10)
    ap.add_argument("--verify-every", type=int, default=1)
    ap.add_argument("--out", default="/tmp/ec_soak.csv")
    ap.add_argument("--trace", action="store_true", help="tracemalloc: print where Python memory grew")
    args = ap.parse_args()

    shm_dir = Path("/dev/shm") / f"ec_soak_{uuid.uuid4().hex[:8]}"
    shm_dir.mkdir(mode=0o700)
    name = "soak-producer"
    producer_kw: _ProducerKw = {
        "cpu_bytes": 4096 * 128,
        "extra": {"announce_lease_s": 5.0, "producer_pin_lease_s": 5.0},
    }
    producer = ProducerProcess(name, shm_dir, **producer_kw)
    consumer = ConsumerSide(
        shm_dir, blocks=2048, extra={"read_timeout_s": 2.0, "consumer_ack_timeout_s": 0.5}
    )
    outcomes = {
        "read": 0,
        "local_no_address": 0,
        "fallback_missing": 0,
        "fallback_other": 0,
        "not_ready_read": 0,
    }
    rows_out: list[dict] = []
    started = time.monotonic()
    producer_born = started
    rounds = transfers = restarts = stops = 0
    mismatches = 0
    try:
        while transfers < args.transfers:
            rounds += 1
            tag = f"r{rounds}"
            hits = [f"{tag}-h{i}" for i in range(args.batch - 4)]
            for key in hits:
                producer.call("store", key=key, rows=args.rows)
            params = producer.call("publish", keys=hits)
            late = f"{tag}-late"
            producer.call("reserve", key=late, rows=args.rows)
            params.update(producer.call("publish", keys=[late]))
            params[f"{tag}-local"] = {"metadata": {}}  # the producer could not store it
            forged = f"{tag}-forged"
            params[forged] = {**params[hits[0]]}  # an address for an item it never held
            items = [(k, args.rows) for k in params]
            landed: list[bool] = []

            def land_late(side: ConsumerSide, late=late, landed=landed, producer=producer) -> None:
                if not landed and side.stats.nack_not_ready > 0 and side.scheduler.holds(late):
                    landed.append(True)
                    producer.call("land", key=late)

            stop_now = args.stop_every and rounds % args.stop_every == 0
            if stop_now:
                producer.signal(signal.SIGSTOP)
                stops += 1
            before = dict(consumer.stats.as_dict())
            got = consumer.fetch(params, items, bound_s=10.0, on_step=None if stop_now else land_late)
            if stop_now:
                producer.signal(signal.SIGCONT)
                if not landed:
                    producer.call("land", key=late)
            after = consumer.stats.as_dict()
            for key, outcome in got.items():
                if outcome == "read":
                    outcomes["not_ready_read" if key == late else "read"] += 1
                    if rounds % args.verify_every == 0 and consumer.local_bytes(key) != payload(
                        key, args.rows
                    ):
                        mismatches += 1
                elif key.endswith("-local"):
                    outcomes["local_no_address"] += 1
                elif key == forged and after["nack_missing"] > before["nack_missing"]:
                    outcomes["fallback_missing"] += 1
                else:
                    outcomes["fallback_other"] += 1
            transfers += len(items)
            if args.restart_every and rounds % args.restart_every == 0:
                producer.kill()
                producer.stop()
                producer = ProducerProcess(name, shm_dir, port=producer.port, **producer_kw)
                producer_born = time.monotonic()
                restarts += 1
                rows_out.append({"event": "restart"})
            if args.trace and rounds == args.sample_every:
                import tracemalloc

                tracemalloc.start(8)
                traced = tracemalloc.take_snapshot()
            if rounds % args.sample_every == 0 or transfers >= args.transfers:
                ppid = producer.proc.pid
                row = {
                    "event": "sample",
                    "seconds": round(time.monotonic() - started, 2),
                    "rounds": rounds,
                    "transfers": transfers,
                    **outcomes,
                    "consumer_rss_kib": rss_kib(),
                    "consumer_fds": count("/proc/self/fd"),
                    "consumer_threads": count("/proc/self/task"),
                    "producer_rss_kib": rss_kib(ppid),
                    "producer_fds": count(f"/proc/{ppid}/fd"),
                    "producer_threads": count(f"/proc/{ppid}/task"),
                    "producer_age_s": round(time.monotonic() - producer_born, 1),
                    "shm_dir_files": count(str(shm_dir)),
                    "dev_shm_used_bytes": shm_used_bytes(),
                    "consumer_entries": consumer.scheduler.occupancy().entries,
                }
                rows_out.append(row)
                print(json.dumps(row), flush=True)
        if args.trace:
            import gc

            gc.collect()
            growth = tracemalloc.take_snapshot().compare_to(traced, "traceback")
            for stat in growth[:6]:
                print(f"{stat.size_diff / 1024:+.1f} KiB in {stat.count_diff:+d} blocks:", flush=True)
                for line in stat.traceback.format()[-8:]:
                    print("   ", line, flush=True)
        consumer.assert_clean()
        state = producer.state()
        deadline = time.monotonic() + 10
        while (state := producer.state())["grants"] and time.monotonic() < deadline:
            producer.call("poll")
            time.sleep(0.05)
    finally:
        producer.stop()
        consumer.close()
        left = count(str(shm_dir))
        shutil.rmtree(shm_dir, ignore_errors=True)

    samples = [r for r in rows_out if r["event"] == "sample"]
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(samples[-1]))
        writer.writeheader()
        writer.writerows(samples)
    warm = samples[len(samples) // 10]  # the first tenth warms caches and pools up
    last = samples[-1]
    last_life = [
        r
        for r in samples
        if r["producer_age_s"] <= last["producer_age_s"]
        and r["seconds"] >= last["seconds"] - last["producer_age_s"]
    ]
    p0 = last_life[min(1, len(last_life) - 1)]
    elapsed = time.monotonic() - started
    summary = {
        "transfers": transfers,
        "rounds": rounds,
        "seconds": round(elapsed, 1),
        "transfers_per_s": round(transfers / elapsed, 1),
        "outcomes": outcomes,
        "byte_mismatches": mismatches,
        "producer_stops": stops,
        "producer_restarts": restarts,
        "consumer_stats": consumer.stats.as_dict(),
        "consumer_rss_drift_kib": last["consumer_rss_kib"] - warm["consumer_rss_kib"],
        "consumer_rss_kib": [warm["consumer_rss_kib"], last["consumer_rss_kib"]],
        "consumer_fd_drift": last["consumer_fds"] - warm["consumer_fds"],
        "consumer_thread_drift": last["consumer_threads"] - warm["consumer_threads"],
        "producer_rss_drift_kib_last_life": last["producer_rss_kib"] - p0["producer_rss_kib"],
        "producer_fd_drift_last_life": last["producer_fds"] - p0["producer_fds"],
        "producer_last_life_rows": [p0["transfers"], last["transfers"]],
        "producer_final_state": {k: state[k] for k in ("pinned", "grants", "free_blocks", "num_blocks")},
        "shm_dir_files_at_end": left,
        "csv": args.out,
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
