"""Prometheus series of the connector, fed by vLLM's EC-connector stats path.

vLLM's `PrometheusStatLogger` (frontend process) builds one `ECConnectorProm`, which calls
`ECTierConnector.build_prom_metrics(...)` once; every `SchedulerStats.ec_connector_stats` dict the
engine core sends (`ECTierStats.data`, see metadata.py) is then handed to `ECTierPromMetrics.observe`
with the engine's index. Series carry vLLM's labels (`model_name`, `engine`), plus one of
`direction`, `status`, `cause`, `what`, `how`, `outcome` or `reason` where a family is split.
docs/metrics.md lists every series. The fleet's series (`vllm:ec_fleet_*`) move only on a
replica with `fleet_peers`: without them the stats carry no `fleet_*` key (nothing is computed).
Metric classes come from vLLM (`metric_types`), so Ray's wrappers work too.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from vllm.distributed.ec_transfer.ec_connector.metrics import ECConnectorPromMetrics

from ec_connector.domain.protocol import AckStatus
from ec_connector.entrypoints.vllm.metadata import LEVELS

SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0)

# (series name, documentation, extra label or None, {label value or None: stats key})
COUNTERS: tuple[tuple[str, str, str | None, dict[str | None, str]], ...] = (
    ("vllm:ec_tier_hits", "Items vLLM asked the tier for (has_cache_item) that it held ready.", None,
     {None: "hits"}),
    ("vllm:ec_tier_misses", "Items vLLM asked the tier for that it did not hold ready.", None,
     {None: "misses"}),
    ("vllm:ec_tier_misses_saving", "Of the misses, items the tier held but was still saving (a repeat "
     "that came before its first request's save landed).", None, {None: "misses_saving"}),
    ("vllm:ec_tier_saves", "Encoder outputs copied into the tier (offloads completed on the writer rank).",
     None, {None: "saves_done"}),
    ("vllm:ec_tier_loads", "Entries copied from the tier into vLLM's encoder cache (done on every rank).",
     None, {None: "loads_done"}),
    ("vllm:ec_tier_copy_failures", "Saves or loads that a worker reported as failed.", "direction",
     {"save": "saves_failed", "load": "loads_failed"}),
    ("vllm:ec_tier_copy_bytes", "Bytes of completed copies between device memory and the tier.", "direction",
     {"save": "bytes_saved", "load": "bytes_loaded"}),
    ("vllm:ec_tier_evictions", "Ready entries evicted (FIFO) to make room for new ones.", None,
     {None: "evictions"}),
    ("vllm:ec_tier_evictions_for_runs", "Of the evictions, those made beyond the space needed so that a new "
     "entry's runs stay at least ec_min_run_bytes long and at most ec_max_entry_runs "
     "many.", None, {None: "evictions_for_runs"}),
    ("vllm:ec_tier_not_offloaded", "Items not offloaded because the region could not fit them.", None,
     {None: "not_offloaded"}),
    ("vllm:ec_tier_quarantines", "Entries whose blocks were quarantined: a save lease lapsed, or a peer "
     "READ failed or timed out.", "cause",
     {"save_lease": "save_leases_lapsed", "peer_read": "peer_quarantines"}),
    ("vllm:ec_tier_quarantines_released", "Quarantined entries whose quarantine ended (blocks freed).", None,
     {None: "quarantines_settled"}),
    ("vllm:ec_peer_requests", "XferReq messages a consumer sent to producers.", None,
     {None: "peer_requests_sent"}),
    ("vllm:ec_peer_acks_ok", "OK acks a consumer received (a READ follows).", None, {None: "peer_acks_ok"}),
    ("vllm:ec_peer_nacks", "NACKs a consumer received, by status.", "status",
     {s.value: f"peer_{s.value.lower()}" for s in AckStatus if s is not AckStatus.OK}),
    ("vllm:ec_peer_ack_timeouts", "Requests to a producer left unanswered past consumer_ack_timeout_s.", None,
     {None: "peer_ack_timeouts"}),
    ("vllm:ec_peer_reads", "NIXL READs that completed (bytes now in the consumer's tier).", None,
     {None: "peer_reads_done"}),
    ("vllm:ec_peer_read_bytes", "Bytes pulled from producers by completed NIXL READs.", None,
     {None: "peer_bytes_read"}),
    ("vllm:ec_peer_read_failures", "NIXL READs that could not be posted or ended in error.", None,
     {None: "peer_reads_failed"}),
    ("vllm:ec_peer_read_timeouts", "NIXL READs given up on after read_timeout_s.", None,
     {None: "peer_read_timeouts"}),
    ("vllm:ec_peer_lost", "Fetches dropped because the producer's control connection was lost.", None,
     {None: "peer_peers_lost"}),
    ("vllm:ec_peer_agents_replaced", "Producer agents a consumer replaced: a producer acked with a new "
     "agent (it restarted), and the old one was removed.", None, {None: "peer_agents_replaced"}),
    ("vllm:ec_peer_fallbacks", "Items a consumer gave up fetching and left to local encoding.", None,
     {None: "peer_fallbacks"}),
    ("vllm:ec_peer_unavailable_requests", "Requests failed through take_unavailable_requests (media gone, "
     "item not fetchable).", None, {None: "peer_unavailable_requests"}),
    ("vllm:ec_peer_rejected", "ec_transfer_params or acks a consumer rejected as malformed.", "what",
     {"params": "peer_bad_params", "ack": "peer_bad_acks"}),
    ("vllm:ec_peer_announced", "Items a producer announced in ec_transfer_params (both halves).", None,
     {None: "peer_announced"}),
    ("vllm:ec_peer_unservable", "Items a producer published without address (not held).", None,
     {None: "peer_unservable"}),
    ("vllm:ec_peer_grants", "Read grants (pins) a producer gave consumers.", None, {None: "peer_grants"}),
    ("vllm:ec_peer_grants_released", "Read grants a producer released: on the consumer's XferDone, or when "
     "the pin lease lapsed.", "how", {"done": "peer_grants_released", "lease": "grants_lapsed"}),
    ("vllm:ec_events_published", "Cache events sent on the event feed.", None, {None: "events_published"}),
    ("vllm:ec_events_dropped", "Cache events dropped because a subscriber's queue was full (HWM).", None,
     {None: "events_dropped"}),
    ("vllm:ec_fleet_lookups", "Local misses looked up in the fleet's peer directory.", None,
     {None: "fleet_lookups"}),
    ("vllm:ec_fleet_located", "Lookups that found a live peer holding the item.", None,
     {None: "fleet_located"}),
    ("vllm:ec_fleet_pulls_started", "Pulls from a peer started (a reservation made, XferReq sent).", None,
     {None: "fleet_pulls_started"}),
    ("vllm:ec_fleet_pulls_ended", "Pulls from a peer that ended: the item ready here (done), or fallen "
     "back to local encoding (failed).", "outcome",
     {"done": "fleet_pulls_done", "failed": "fleet_pulls_failed"}),
    ("vllm:ec_fleet_pulls_not_started", "Pulls not started because the local region could not take the item.",
     None, {None: "fleet_pulls_not_started"}),
    ("vllm:ec_fleet_pulls_skipped", "Located items left to local encoding, by reason.", "reason",
     {"not_worth_it": "fleet_not_worth_it", "size_mismatch": "fleet_size_mismatches",
      "recent_local": "fleet_skipped_recent_local", "in_flight_cap": "fleet_skipped_in_flight_cap"}),
    ("vllm:ec_fleet_peers_joined", "Peers that joined the directory (new, or restarted).", None,
     {None: "fleet_peers_joined"}),
    ("vllm:ec_fleet_peers_restarted", "Of the joins, peers back with a new boot or address (old records "
     "dropped).", None, {None: "fleet_peers_restarted"}),
    ("vllm:ec_fleet_peers_returned", "Peers back with the same boot after their feed dropped (records kept).",
     None, {None: "fleet_peers_returned"}),
    ("vllm:ec_fleet_peers_left", "Peers that dropped out: their feed disconnected, or they fell silent.",
     "how", {"disconnected": "fleet_peers_left", "silent": "fleet_peers_silent"}),
    ("vllm:ec_fleet_feed_events", "Peer feed events applied to the directory, or ignored.", "how",
     {"applied": "fleet_events_applied", "ignored": "fleet_events_ignored"}),
    ("vllm:ec_fleet_feed_gaps", "Gaps in a peer feed's sequence numbers (events missed).", None,
     {None: "fleet_feed_gaps"}),
    ("vllm:ec_fleet_feed_rejected", "Peer feed frames dropped: malformed, unauthenticated, or a hello "
     "claiming another feed's peer.", None, {None: "fleet_feed_frames_rejected"}),
    ("vllm:ec_fleet_stale_records", "Directory records forgotten after a pull from them failed.", None,
     {None: "fleet_stale_records_forgotten"}),
)  # fmt: skip

GAUGES: tuple[tuple[str, str, str], ...] = (
    ("vllm:ec_tier_entries", "Entries the region holds (any state).", "entries"),
    ("vllm:ec_tier_used_blocks", "Blocks (encoder-output rows) held by entries.", "used_blocks"),
    ("vllm:ec_tier_free_blocks", "Blocks not held by any entry.", "free_blocks"),
    ("vllm:ec_tier_used_bytes", "Bytes held by entries (used_blocks x block size).", "used_bytes"),
    ("vllm:ec_tier_capacity_bytes", "Bytes of the region's data area.", "capacity_bytes"),
)

# Levels: gauges whose reports carry their change since the previous report (metadata.LEVELS).
LEVEL_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("vllm:ec_fleet_directory_records", "Records (peer, entry) in the fleet's peer directory.",
     "fleet_directory_records"),
    ("vllm:ec_fleet_peers_live", "Peers the directory serves from (joined, feed up).", "fleet_peers_live"),
)  # fmt: skip
assert {key for *_, key in LEVEL_GAUGES} == LEVELS

HISTOGRAMS: tuple[tuple[str, str, str | None, dict[str | None, str]], ...] = (
    ("vllm:ec_tier_copy_seconds", "Seconds from planning a copy to its completion on every rank it involves, "
     "as the scheduler sees it (includes waiting for the worker step).", "direction",
     {"save": "save_seconds", "load": "load_seconds"}),
    ("vllm:ec_peer_read_seconds", "Seconds of one NIXL READ, from posting it to seeing it done.", None,
     {None: "peer_read_seconds"}),
    ("vllm:ec_peer_fetch_seconds", "Seconds from a consumer's XferReq to the item ready in its tier "
     "(ack, retries and READ).", None, {None: "peer_fetch_seconds"}),
)  # fmt: skip


def series_names() -> list[str]:
    """Every series family this module registers (counters without their `_total` suffix)."""
    tables = (COUNTERS, GAUGES, LEVEL_GAUGES, HISTOGRAMS)
    return [name for table in tables for name, *_ in table]


class ECTierPromMetrics(ECConnectorPromMetrics):
    """Registers the connector's series and records each stats report into them."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        # (engine index, stats key) -> metric child; one list per kind
        self._counters: dict[tuple[int, str], Counter] = {}
        self._gauges: dict[tuple[int, str], Gauge] = {}
        self._levels: dict[tuple[int, str], Gauge] = {}
        self._histograms: dict[tuple[int, str], Histogram] = {}
        for name, doc, label, keys in COUNTERS:
            metric = self._counter_cls(name=name, documentation=doc, labelnames=self._names(label))
            self._children(metric, keys, self._counters)
        for name, doc, key in GAUGES:
            metric = self._gauge_cls(
                name=name, documentation=doc, labelnames=labelnames, multiprocess_mode="mostrecent"
            )
            self._children(metric, {None: key}, self._gauges)
        for name, doc, key in LEVEL_GAUGES:
            # changes, added up (inc); summed over a multiprocess frontend's processes, so the level
            # is right whichever of them received an engine's reports
            metric = self._gauge_cls(
                name=name, documentation=doc, labelnames=labelnames, multiprocess_mode="sum"
            )
            self._children(metric, {None: key}, self._levels)
        for name, doc, label, keys in HISTOGRAMS:
            metric = self._histogram_cls(
                name=name, documentation=doc, labelnames=self._names(label), buckets=list(SECONDS_BUCKETS)
            )
            self._children(metric, keys, self._histograms)

    def _names(self, label: str | None) -> list[str]:
        return [*self._labelnames, label] if label else list(self._labelnames)

    def _children(self, metric: Any, keys: dict[str | None, str], into: dict[tuple[int, str], Any]) -> None:
        for engine, values in self.per_engine_labelvalues.items():
            for label_value, key in keys.items():
                extra = [label_value] if label_value is not None else []
                into[(engine, key)] = metric.labels(*values, *extra)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for key, value in transfer_stats_data.items():
            if (counter := self._counters.get((engine_idx, key))) is not None:
                if value > 0:
                    counter.inc(value)
            elif (gauge := self._gauges.get((engine_idx, key))) is not None:
                gauge.set(value)
            elif (level := self._levels.get((engine_idx, key))) is not None:
                if value:
                    level.inc(value)
            elif (histogram := self._histograms.get((engine_idx, key))) is not None:
                for seconds in value:
                    histogram.observe(seconds)
