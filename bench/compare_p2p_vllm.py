"""vLLM's side of `bench/compare_p2p.py`: its in-tree CPU connector's classes, driven as its scheduler does.

`EmbeddingCache`, `ECSharedRegion`, `NixlDataTransport` and the producer/consumer sessions on
vLLM's ZMQ transports, loaded through `bench.vllm_baseline` (without vLLM's package imports unless
`full_vllm_import`). Both functions are `multiprocessing` targets (spawned) and mirror the ours
side's contract: the producer answers ("up"/"params"/"error") on its pipe, the consumer sends one
result dict.
"""

from __future__ import annotations

import math
import time
import traceback

from bench.compare_p2p_items import (
    ACK_TIMEOUT_S,
    HIDDEN,
    ITEM_TIMEOUT_S,
    ROW_BYTES,
    block_runs,
    check_and_clear,
    pattern,
    prefault,
    record_item,
    stored_items,
)
from bench.vllm_baseline import load, version

EC = "vllm.distributed.ec_transfer.ec_connector.cpu"
REGION_2GIB_BLOCKS = (2 << 30) // ROW_BYTES


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
        _release(data, region)


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
        for i, (key, rows, expected, params) in enumerate(stored_items(peer, items)):
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
            t1 = check_and_clear(area, key, runs, expected)
            record_item(out, i, rows, t0, t_read, t1, ack_bytes=ack_sizes[-1], descriptors=len(indices))
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
        _release(data, region)
    conn.send(out)


def _release(data, region) -> None:  # noqa: ANN001
    """Deregister a side's NIXL memory, then remove its region (either may not have been made)."""
    if data is not None:
        data.deregister()
    if region is not None:
        region.cleanup()


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
