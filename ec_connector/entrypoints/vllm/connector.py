"""`ECTierConnector`: a thin facade over the tier services, split by vLLM's connector role.

Each hook converts vLLM's arguments, calls one service method and converts the result. The
scheduler side and the worker side are built through the container; completion of copies travels
through the shared region, so it reaches the scheduler on every model runner.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.ec_transfer.ec_connector.base import (
    ECConnectorBase,
    ECConnectorMetadata,
    ECConnectorRole,
    ECConnectorWorkerMetadata,
)

from ec_connector.application.consumer import WantedItem
from ec_connector.container import build_container
from ec_connector.domain.config import parse_config
from ec_connector.entrypoints.vllm import settings as vllm_settings
from ec_connector.entrypoints.vllm.metadata import ECTierMetadata, ECTierStats
from ec_connector.logging import configure_logging, options_from_env, write_lines_off_thread

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.ec_transfer.ec_connector.metrics import ECConnectorPromMetrics
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request


def _share_vllm_log_handlers() -> None:
    """Our lines go out through vLLM's own handlers (its format, its destination); once."""
    ours = logging.getLogger("ec_connector")
    if not ours.handlers:
        for handler in logging.getLogger("vllm").handlers:
            ours.addHandler(handler)
        ours.propagate = not ours.handlers
    write_lines_off_thread()  # the step thread enqueues; a writer thread does the I/O


class ECTierConnector(ECConnectorBase):
    """Encoder-cache connector: a /dev/shm CPU tier shared by the instance's processes."""

    def __init__(self, vllm_config: VllmConfig, role: ECConnectorRole) -> None:
        super().__init__(vllm_config=vllm_config, role=role)
        configure_logging(**options_from_env(os.environ))  # VLLM_EC_LOG_JSON, VLLM_EC_LOG_LEVEL
        _share_vllm_log_handlers()
        ec = vllm_config.ec_transfer_config
        config = parse_config(ec.ec_connector_extra_config, role=ec.ec_role)
        if config.enable_nixl:
            vllm_settings.require_nixl()
        self._scheduler = None
        self._worker = None
        self._desk = None
        self._fetcher = None
        self._polled = False
        self._reported: dict[str, int] = {}
        if role == ECConnectorRole.SCHEDULER:
            self._container = build_container(**vllm_settings.scheduler_settings(vllm_config))
            self._scheduler = self._container.tier_scheduler()
            if config.enable_nixl and config.role.saves:
                self._desk = self._container.producer_desk()
                self._container.control_server().start(self._desk.answer, self._desk.done)
            if config.enable_nixl and config.role.loads:
                self._fetcher = self._container.consumer_fetcher()
            if config.enable_nixl:
                from vllm.distributed.ec_transfer.ec_connector.utils import (
                    PlaceholderMetadataResolver,
                )

                self._metadata = PlaceholderMetadataResolver(vllm_config.model_config)
        else:
            self._container = build_container(**vllm_settings.worker_settings(vllm_config))
            self._worker = self._container.tier_worker()

    # -- worker side ------------------------------------------------------------------------

    def bind_connector_metadata(self, connector_metadata: ECConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        assert self._worker is not None and isinstance(connector_metadata, ECTierMetadata)
        self._worker.bind(connector_metadata.plan)

    def start_load_caches(self, encoder_cache: dict[str, torch.Tensor], **kwargs: Any) -> None:
        assert self._worker is not None
        self._worker.start_loads(encoder_cache)

    def save_caches(self, encoder_cache: dict[str, torch.Tensor], mm_hash: str, **kwargs: Any) -> None:
        assert self._worker is not None
        self._worker.save(encoder_cache, mm_hash)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self._worker is not None:
            self._worker.flush()
        return None, None

    def build_connector_worker_meta(self) -> ECConnectorWorkerMetadata | None:
        return None

    def clear_connector_metadata(self) -> None:
        if self._worker is not None:
            self._worker.clear()
        super().clear_connector_metadata()

    # -- scheduler side ---------------------------------------------------------------------

    def has_cache_item(self, identifier: str) -> bool:
        assert self._scheduler is not None
        return self._scheduler.has_item(identifier)

    def ensure_cache_available(self, request: Request, num_computed_tokens: int) -> bool:
        if self._fetcher is None:
            return True
        if not self._polled:
            self._polled = True
            self._fetcher.poll()
        items = [
            WantedItem(f.identifier, f.mm_position.get_num_embeds(), self._has_media(f))
            for f in request.mm_features
            if f.mm_position.offset + f.mm_position.length > num_computed_tokens  # still needed
        ]
        return self._fetcher.ensure_available(request.request_id, request.ec_transfer_params, items)

    def _has_media(self, feature: Any) -> bool:
        """Whether the worker could encode the item itself: it carries processed input beyond the
        placeholder metadata. A metadata-only item (what vLLM accepts on an EC consumer: an
        `image_embeds` part holding e.g. only `image_grid_thw`) can only come from a producer."""
        if feature.data is None:
            return False
        metadata = self._metadata.fields_for(feature.modality)
        return any(elem.data is not None for key, elem in feature.data.items() if key not in metadata)

    def take_unavailable_requests(self) -> set[str]:
        return self._fetcher.take_unavailable() if self._fetcher is not None else set()

    def update_state_after_alloc(self, request: Request, index: int) -> None:
        assert self._scheduler is not None
        feature = request.mm_features[index]
        self._scheduler.on_allocated(feature.identifier, feature.mm_position.get_num_embeds())

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> ECConnectorMetadata:
        assert self._scheduler is not None
        self._polled = False
        return ECTierMetadata(plan=self._scheduler.take_plan())

    def request_finished(self, request: Request) -> tuple[bool, dict[str, Any] | None]:
        if self._desk is None or not request.mm_features:
            return False, None
        from vllm.distributed.ec_transfer.ec_connector.utils import collect_ec_item_metadata

        items = collect_ec_item_metadata(request.mm_features, self._metadata)
        return False, self._desk.publish({key: item["metadata"] for key, item in items.items()})

    def has_pending_push_work(self) -> bool:
        if self._scheduler is None:
            return False
        if self._fetcher is not None:
            self._fetcher.poll()
            if self._fetcher.has_pending_work():
                return True
        return self._scheduler.has_pending_work()

    def get_ec_connector_stats(self) -> ECTierStats | None:
        if self._scheduler is None:
            return None
        tier = self._scheduler.snapshot()
        counters, samples, occupancy = tier.counters, tier.samples, tier.occupancy
        if self._desk is not None or self._fetcher is not None:
            # Peer counters have one writer each (this thread, or the desk's I/O thread for its
            # grant counters) and their latencies are observed on this thread: no lock is needed.
            peer = self._container.peer_stats()
            counters.update({f"peer_{k}": v for k, v in peer.as_dict().items()})
            samples.update(peer.latencies.take())
        events = self._container.events()
        counters["events_published"] = getattr(events, "published", 0)
        counters["events_dropped"] = getattr(events, "dropped", 0)
        delta = {k: v - self._reported.get(k, 0) for k, v in counters.items()}
        self._reported = counters
        stats = ECTierStats(
            data={
                **delta,
                **{f"{k}_seconds": v for k, v in samples.items()},
                "entries": occupancy.entries,
                "used_blocks": occupancy.used_blocks,
                "free_blocks": occupancy.free_blocks,
                "used_bytes": occupancy.used_bytes,
                "capacity_bytes": occupancy.capacity_bytes,
            }
        )
        return None if stats.is_empty() else stats

    @classmethod
    def build_ec_connector_stats(cls, data: dict[str, Any] | None = None) -> ECTierStats | None:
        return ECTierStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> ECConnectorPromMetrics | None:
        """Our series on vLLM's /metrics (called once by vLLM's PrometheusStatLogger); see prom.py."""
        from ec_connector.entrypoints.vllm.prom import ECTierPromMetrics

        return ECTierPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # -- both -------------------------------------------------------------------------------

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.close()
        self._container.shutdown_resources()
