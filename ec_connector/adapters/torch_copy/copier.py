"""`TorchCopier`: validation and ticket bookkeeping shared by the CPU and CUDA engines."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ec_connector.adapters.torch_copy.cpu import CpuEngine
from ec_connector.adapters.torch_copy.cuda import CudaEngine
from ec_connector.adapters.torch_copy.plan import CopyTiming
from ec_connector.domain.config import MIN_RUN_BYTES
from ec_connector.domain.errors import LayoutMismatch, RegionError
from ec_connector.domain.layout import Layout
from ec_connector.domain.transfers import PlannedCopy, SaveJob
from ec_connector.ports.region import Region

# Runs this long or longer go to the copy engines, shorter ones to the gather kernel (the measured
# break-even on the H200); the tier's run floor defaults to the same figure, so it is defined once.
DMA_MIN_BYTES = MIN_RUN_BYTES


class TorchCopier:
    """Copies `[rows, hidden_dim]` tensors of the layout's dtype to and from the region's blocks.

    `device` is "cpu" or a CUDA device. Payloads must be on that device; non-contiguous payloads are
    copied to a contiguous tensor first. CUDA options (ignored on CPU): `streams` per direction;
    runs of at least `dma_min_bytes`, and every run of a load of at most four runs, of a save of at
    most sixteen, or of a batch with a long one and at most sixteen runs, or at most sixteen short
    ones or one short one per entry, go to the copy engines (None: none do); the other runs to the
    copy kernel, whose tiles `tile_bytes` and `num_warps` size, alongside. `save_launcher`: saves
    wholly on the copy engines are queued by a native thread (launcher.c), not the caller's (a gain
    from a stream of the caller's own, or where it makes no CUDA call right after: see
    `native/launcher.py`). Close the copier before its region: it holds a view of the region's memory
    (and, on CUDA, a registration) until `close()`. Not thread-safe: its callers serialize their
    calls (`TierWorker` makes every call under one lock).
    """

    def __init__(
        self,
        region: Region,
        *,
        device: str | torch.device = "cpu",
        streams: int = 2,
        tile_bytes: int = 16384,
        num_warps: int = 4,
        dma_min_bytes: int | None = DMA_MIN_BYTES,
        save_launcher: bool = False,
    ) -> None:
        layout = region.layout
        self._region_name = region.name
        self._layout: Layout = layout
        self._dtype: torch.dtype = getattr(torch, layout.dtype)
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        self.device = dev
        self._device_index = -1 if dev.type == "cpu" else dev.index
        self._closed = False
        self._ended_at_close: list[int] = []
        if dev.type == "cpu":
            self._engine: CpuEngine | CudaEngine = CpuEngine(region, self._dtype)
        elif dev.type == "cuda":
            self._engine = CudaEngine(
                region,
                self._dtype,
                dev,
                streams=streams,
                tile_bytes=tile_bytes,
                num_warps=num_warps,
                dma_min_bytes=dma_min_bytes,
                launcher=save_launcher,
            )
        else:
            raise ValueError(f"TorchCopier device {device!r} is not supported; use 'cpu' or 'cuda[:N]'")
        self._fits = self._fitting()

    @property
    def layout(self) -> Layout:
        return self._layout

    @property
    def launches_saves(self) -> bool:
        """Whether saves wholly on the copy engines go through the save launcher's thread."""
        return isinstance(self._engine, CudaEngine) and self._engine.launches_saves

    def check(self, payload: object, rows: int) -> None:
        """Raise LayoutMismatch unless `payload` is `rows` rows of the region's width and dtype."""
        if not self._fits(payload, rows):
            self._mismatch(payload, rows)

    def _fitting(self) -> Callable[[object, int], bool]:
        """The common case's check as one expression over closed-over constants (no attribute
        lookups per payload: a fifth of the checks' time); get_device is -1 on CPU, the index on CUDA."""
        tensor, dtype, width, index = torch.Tensor, self._dtype, self._layout.hidden_dim, self._device_index
        cuda = index >= 0

        def fits(p: object, rows: int) -> bool:
            return (
                type(p) is tensor
                and p.dtype is dtype  # type: ignore[attr-defined]
                and p.shape == (rows, width)  # type: ignore[attr-defined]
                and p.get_device() == index  # type: ignore[attr-defined]
                and (p.is_cuda if cuda else p.is_cpu)  # type: ignore[attr-defined]  # -1 on meta too
            )

        return fits

    def _mismatch(self, payload: object, rows: int) -> None:
        """Raise the LayoutMismatch that names what is wrong with `payload` (if anything is)."""
        lay = self._layout
        want = f"a torch.Tensor [{rows}, {lay.hidden_dim}] of torch.{lay.dtype} on {self.device}"
        if not isinstance(payload, torch.Tensor):
            raise LayoutMismatch(f"payload is a {type(payload).__name__}; expected {want}")
        if payload.dim() != 2:
            raise LayoutMismatch(
                f"payload has {payload.dim()} dimensions (shape {tuple(payload.shape)}); expected {want}"
            )
        if payload.dtype != self._dtype:
            raise LayoutMismatch(
                f"payload dtype is {payload.dtype} but region {self._region_name!r} holds "
                f"torch.{lay.dtype}; convert with .to(torch.{lay.dtype})"
            )
        n, width = payload.shape
        if width != lay.hidden_dim:
            raise LayoutMismatch(
                f"payload width is {width} but region {self._region_name!r} rows are "
                f"hidden_dim={lay.hidden_dim} wide; expected {want}"
            )
        if n != rows:
            raise LayoutMismatch(f"payload has {n} rows but its entry holds {rows}; expected {want}")
        if payload.device != self.device:
            raise LayoutMismatch(f"payload is on {payload.device}; expected {want}")

    def save(self, jobs: Sequence[SaveJob]) -> None:
        """Start copying each payload into its extents; non-blocking.

        Validates every job first: on LayoutMismatch nothing is written. The copier keeps the
        payloads alive until their copy ends.
        """
        self._open()
        copies = [job.copy for job in jobs]
        sources: list[torch.Tensor] = [job.payload for job in jobs]  # type: ignore[misc]  # checked next
        fits = self._fits
        for i, (p, copy) in enumerate(zip(sources, copies, strict=True)):
            if not fits(p, copy.rows):
                self._mismatch(p, copy.rows)
            if not p.is_contiguous():
                sources[i] = p.contiguous()
        if jobs:  # the engine plans the batch first: LayoutMismatch before anything is queued
            self._engine.save(copies, sources)

    def load(self, copies: Sequence[PlannedCopy]) -> list[object]:
        """Start copying each entry into a new tensor on the device; non-blocking.

        Returns `[rows, hidden_dim]` tensors in order (views of one allocation per batch); the caller
        owns them. Work queued afterwards on the caller's current stream sees the loaded bytes.
        """
        self._open()
        if not copies:
            return []
        return list(self._engine.load(copies))

    def poll(self) -> list[int]:
        """Tickets whose copies have ended since the last poll; non-blocking; each returned once."""
        if self._closed:
            out, self._ended_at_close = self._ended_at_close, []
            return out
        return self._engine.poll()

    def in_flight(self) -> int:
        """Number of copies started and not yet returned by poll."""
        return len(self._ended_at_close) if self._closed else self._engine.in_flight()

    def drain_timings(self) -> list[CopyTiming]:
        """Timings of the batches reported by poll since the last drain (for metrics)."""
        return [] if self._closed else self._engine.drain_timings()

    def close(self) -> None:
        """Wait for copies in flight, then release streams, buffers and the registration; idempotent.

        Tickets not yet returned are returned by the next `poll` (and counted by `in_flight`) once.
        """
        if self._closed:
            return
        self._closed = True
        self._ended_at_close = self._engine.close()

    def _open(self) -> None:
        if self._closed:
            raise RegionError(
                f"the copier of region {self._region_name!r} is closed; build a new TorchCopier"
            )
