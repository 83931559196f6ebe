"""`ECTierConnector`: a thin facade over the tier services, split by vLLM's connector role.

Each hook converts vLLM's arguments, calls one service method and converts the result. The extra
config is parsed once, here, and handed to the container, which gives the scheduler's instance its
scheduler side (the tier, its supply, its publisher) and a stats service, and each worker's
instance its TierWorker. Completion of copies travels through the shared region, so it reaches the
scheduler on every model runner.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.ec_transfer.ec_connector.base import (
    ECConnectorBase,
    ECConnectorMetadata,
    ECConnectorRole,
    ECConnectorWorkerMetadata,
)

from ec_connector.adapters import profile_ranges as ranges
from ec_connector.adapters.nixl_data.settings import require_nixl
from ec_connector.application.consumer import WantedItem
from ec_connector.application.roles import Allocations, Publisher, StatsService, StepPolls, Supply
from ec_connector.application.scheduler import TierScheduler
from ec_connector.application.scoping import RequestScopes
from ec_connector.application.worker import TierWorker
from ec_connector.container import build_container, parse_settings
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
    """Encoder-cache connector: a /dev/shm CPU tier shared by the instance's processes.

    vLLM makes one instance per role and calls each hook on its own role's instance: the
    scheduler's holds its scheduler side (`_scheduler`: the tier, `_supply`, `_publisher`,
    `_scopes`, `_fleet`, `_polls`) and `_stats`, each worker's holds `_worker`. The scheduler side keys every
    item by its entry key (`_scopes`: vLLM's identifier, scoped by the request's `cache_salt`); the
    worker side maps entry keys back to vLLM's identifiers. The hooks that vLLM
    calls on every instance (get_finished, clear_connector_metadata, has_pending_push_work,
    get_ec_connector_stats, shutdown) answer for the role they run on.
    """

    _scheduler: TierScheduler  # the scheduler's instance only, as are the next five
    _supply: Supply
    _publisher: Publisher
    _scopes: RequestScopes
    _fleet: Allocations
    _polls: StepPolls
    _stats: StatsService
    _worker: TierWorker  # each worker's instance only

    def __init__(self, vllm_config: VllmConfig, role: ECConnectorRole) -> None:
        super().__init__(vllm_config=vllm_config, role=role)
        configure_logging(**options_from_env(os.environ))  # VLLM_EC_LOG_JSON, VLLM_EC_LOG_LEVEL
        _share_vllm_log_handlers()
        ec = vllm_config.ec_transfer_config
        config = parse_settings(ec.ec_connector_extra_config, role=ec.ec_role)
        if config.tier.enable_nixl:
            require_nixl()
        self._on_scheduler = role == ECConnectorRole.SCHEDULER
        self._model_config = vllm_config.model_config
        if self._on_scheduler:
            self._container = build_container(config, **vllm_settings.scheduler_settings(vllm_config, config))
            side = self._container.scheduler_side()
            self._scheduler, self._supply, self._publisher = side.tier, side.supply, side.publisher
            self._scopes, self._fleet = side.scopes, side.fleet
            self._polls = StepPolls(side.supply, config.tier.step_ack_wait_s, config.tier.step_pull_wait_s)
            self._stats = self._container.stats()
        else:
            self._container = build_container(config, **vllm_settings.worker_settings(vllm_config, config))
            self._worker = self._container.tier_worker()
        if ranges.enabled(os.environ):  # VLLM_EC_PROFILE_RANGES: profiler ranges around the hooks
            ranges.wrap_hooks(self, ranges.SCHEDULER_HOOKS if self._on_scheduler else ranges.WORKER_HOOKS)

    # -- worker side ------------------------------------------------------------------------

    def bind_connector_metadata(self, connector_metadata: ECConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if not isinstance(connector_metadata, ECTierMetadata):
            shown = type(connector_metadata).__name__
            raise TypeError(f"ECTierConnector was bound {shown}, not its own ECTierMetadata")
        self._worker.bind(connector_metadata.plan)

    def start_load_caches(self, encoder_cache: dict[str, torch.Tensor], **kwargs: Any) -> None:
        self._worker.start_loads(encoder_cache)

    def save_caches(self, encoder_cache: dict[str, torch.Tensor], mm_hash: str, **kwargs: Any) -> None:
        self._worker.save(encoder_cache, mm_hash)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if not self._on_scheduler:
            self._worker.flush()
        return None, None

    def build_connector_worker_meta(self) -> ECConnectorWorkerMetadata | None:
        return None

    def clear_connector_metadata(self) -> None:
        if not self._on_scheduler:
            self._worker.clear()
        super().clear_connector_metadata()

    # -- scheduler side ---------------------------------------------------------------------

    def has_cache_item(self, identifier: str) -> bool:
        # vLLM asks for the items of the request it has just passed to ensure_cache_available; an
        # identifier of no such item has no checked scope, so it is a miss (docs/fleet.md)
        key = self._scopes.lookup(identifier)
        return key is not None and self._scheduler.has_item(key)

    def ensure_cache_available(self, request: Request, num_computed_tokens: int) -> bool:
        keys = self._scopes.enter(request.cache_salt, [f.identifier for f in request.mm_features])
        # the items are listed only if the supply reads them (a LocalSupply never does)
        items = _Lazy(lambda: self._wanted(request, num_computed_tokens, keys))
        return self._polls.ensure_available(request.request_id, request.ec_transfer_params, items)

    def _wanted(
        self, request: Request, num_computed_tokens: int, keys: Mapping[str, str]
    ) -> list[WantedItem]:
        return [
            WantedItem(keys[f.identifier], f.mm_position.get_num_embeds(), self._has_media(f))
            for f in request.mm_features
            if f.mm_position.offset + f.mm_position.length > num_computed_tokens  # still needed
        ]

    def _has_media(self, feature: Any) -> bool:
        """Whether the worker could encode the item itself: it carries processed input beyond the
        placeholder metadata. A metadata-only item (what vLLM accepts on an EC consumer: an
        `image_embeds` part holding e.g. only `image_grid_thw`) can only come from a producer."""
        if feature.data is None:
            return False
        metadata = self._metadata.fields_for(feature.modality)
        return any(elem.data is not None for key, elem in feature.data.items() if key not in metadata)

    @functools.cached_property
    def _metadata(self) -> Any:
        """vLLM's resolver of an item's placeholder metadata, made at first use (P2P roles only)."""
        from vllm.distributed.ec_transfer.ec_connector.utils import PlaceholderMetadataResolver

        return PlaceholderMetadataResolver(self._model_config)

    def take_unavailable_requests(self) -> set[str]:
        return self._supply.take_unavailable()

    def update_state_after_alloc(self, request: Request, index: int) -> None:
        feature = request.mm_features[index]
        key = self._scopes.key(request.cache_salt, feature.identifier)
        rows = feature.mm_position.get_num_embeds()
        self._scheduler.on_allocated(key, rows)
        self._fleet.note_local(key, rows)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> ECConnectorMetadata:
        plan = self._scheduler.take_plan()
        self._polls.step_ended()
        return ECTierMetadata(plan=plan)

    def request_finished(self, request: Request) -> tuple[bool, dict[str, Any] | None]:
        if not request.mm_features:
            return False, None
        # the items' metadata is collected only if the publisher reads it (a NoPublisher never does)
        return False, self._publisher.publish(_LazyMapping(lambda: self._item_metadata(request)))

    def _item_metadata(self, request: Request) -> dict[str, Any]:
        from vllm.distributed.ec_transfer.ec_connector.utils import collect_ec_item_metadata

        items = collect_ec_item_metadata(request.mm_features, self._metadata)
        salt = request.cache_salt
        return {self._scopes.key(salt, identifier): item["metadata"] for identifier, item in items.items()}

    def has_pending_push_work(self) -> bool:
        if not self._on_scheduler:
            return False
        supply = self._supply
        supply.poll()
        return supply.has_pending_work() or self._scheduler.has_pending_work()

    def get_ec_connector_stats(self) -> ECTierStats | None:
        if not self._on_scheduler:
            return None
        stats = ECTierStats(data=self._stats.report())
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
        if not self._on_scheduler:
            self._worker.close()
        self._container.shutdown_resources()


class _Lazy(Sequence[WantedItem]):
    """A request's wanted items, listed at first read."""

    def __init__(self, make: Callable[[], list[WantedItem]]) -> None:
        self._make = make

    @functools.cached_property
    def _items(self) -> list[WantedItem]:
        return self._make()

    def __getitem__(self, index: Any) -> Any:
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[WantedItem]:
        return iter(self._items)


class _LazyMapping(Mapping[str, Any]):
    """A finished request's item metadata (identifier -> placeholder metadata), collected at first read."""

    def __init__(self, make: Callable[[], dict[str, Any]]) -> None:
        self._make = make

    @functools.cached_property
    def _items(self) -> dict[str, Any]:
        return self._make()

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)
