"""Our side of `bench/compare_p2p.py`: a producer and a consumer process built as an engine builds them.

`build_container` wires each process; the producer stores an item, marks it ready and `publish`es
its params; the consumer's `ConsumerFetcher` fetches it through a control client and a peer
transport that record what crossed the wire (the ack's frame size, the READ's descriptors).
Both functions are `multiprocessing` targets (spawned), so they import `ec_connector` where they run.
"""

from __future__ import annotations

import os
import time
import traceback
from typing import TYPE_CHECKING, cast

from bench.compare_p2p_items import (
    ACK_TIMEOUT_S,
    HIDDEN,
    ITEM_TIMEOUT_S,
    ROW_BYTES,
    check_and_clear,
    pattern,
    prefault,
    record_item,
    stored_items,
)

if TYPE_CHECKING:  # for mypy only: the functions below import ec_connector where they run
    from ec_connector.container import Container
    from ec_connector.domain.entries import Entry

FINGERPRINT = "compare_p2p"


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

    def wait(self, timeout_s: float) -> bool:
        return self._inner.wait(timeout_s)

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
        for i, (key, rows, expected, params) in enumerate(stored_items(peer, items)):
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
            t1 = check_and_clear(area, key, runs, expected)
            record_item(
                out,
                i,
                rows,
                t0,
                t_read,
                t1,
                ack_bytes=control.ack_bytes[-1],
                descriptors=transport.descriptors[-1],
                start_read_s=transport.start_read_s[-1],
            )
        del area
        view.release()
    except Exception:
        out["error"] = traceback.format_exc()
    finally:
        peer.send(("stop",))
        container.shutdown_resources()
    conn.send(out)
