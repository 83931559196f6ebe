"""The worker side of the local tier: run the step's copies and report their completion.

Runs in every worker process (one per TP/PCP rank). Only the writer rank (TP0/PCP0) saves, since
every rank computes the same encoder output; every rank loads. Completions go into the region's
completion table, one report per rank, so the scheduler side sees them on every model runner.

vLLM calls the worker hooks only in steps that schedule tokens, so copies still in flight when the
engine goes idle would never be reported from the hooks alone (and the scheduler would keep the
engine stepping for nothing). A watcher thread therefore reports copies that end between steps;
every copier and region call is made under one lock. The watcher keeps off the step thread's way:
it sleeps one interval after being woken (the copies of the launch that woke it have just begun)
and polls only once the step thread has not flushed for an interval (while steps come that often,
they report what ends); a flush that leaves nothing in flight puts it back to sleep. A poll at the
moment of the launch took the GIL and the lock from the step thread, which paid for it in its
save and flush (measured on the H200). Reports that find the rank's completion ring full (more than its
slots in one step) wait in order and are posted as the scheduler side drains.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog

from ec_connector.domain.config import Role
from ec_connector.domain.errors import LayoutMismatch
from ec_connector.domain.scope import identifier_of
from ec_connector.domain.transfers import Completion, PlannedCopy, SaveJob, StepPlan
from ec_connector.logging import debug_enabled
from ec_connector.ports.copier import Copier
from ec_connector.ports.region import Region

log = structlog.get_logger(__name__)
_debug = debug_enabled(__name__)


class TierWorker:
    """Worker-side use cases: start loads, queue and launch saves, post completions."""

    def __init__(
        self,
        *,
        role: Role,
        rank: int,
        writer: bool,
        region: Region,
        copier: Copier,
        watch_interval_s: float = 0.002,
    ) -> None:
        self._role = role
        self._rank = rank
        self._writes = writer and role.saves
        self._region = region
        self._copier = copier
        self._plan = StepPlan()
        self._saves: dict[str, list[PlannedCopy]] = {}  # vLLM's identifier -> the copies saving it
        self._queued: list[SaveJob] = []
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stopping = False
        self._watch_interval_s = watch_interval_s
        self._watcher: threading.Thread | None = None
        self._last_flush = time.monotonic()
        # reports wait here while the rank's completion ring is full (the scheduler drains it each
        # step); the step thread and the watcher post them in order as room appears
        self._unposted: deque[Completion] = deque()
        self._ring_full = False

    @property
    def rank(self) -> int:
        return self._rank

    def bind(self, plan: StepPlan) -> None:
        """Take this step's plan (saves are kept only on the writer rank).

        Copies carry entry keys (domain/scope.py); vLLM's encoder cache is keyed by identifier, so
        saves are indexed by the identifier each key stands for (several scopes may save one item)."""
        self._plan = plan
        saves: dict[str, list[PlannedCopy]] = {}
        if self._writes:
            for copy in plan.saves:
                saves.setdefault(identifier_of(copy.key), []).append(copy)
        self._saves = saves

    def start_loads(self, cache: MutableMapping[str, Any]) -> None:
        """Start every planned reload; put each new buffer into `cache` under the identifier of its
        entry key (vLLM's key)."""
        loads = self._plan.loads
        if not loads or not self._role.loads:
            return
        try:
            with self._lock:
                buffers = self._copier.load(loads)
        except LayoutMismatch:
            log.exception("reload_rejected", rank=self._rank, tickets=[c.ticket for c in loads])
            for copy in loads:
                self._report(copy.ticket, ok=False)
            return
        for copy, buffer in zip(loads, buffers, strict=True):
            cache[identifier_of(copy.key)] = buffer
        if _debug():
            rows = sum(c.rows for c in loads)
            log.debug("tier_reload_batch", rank=self._rank, entries=len(loads), rows=rows)

    def save(self, cache: Mapping[str, object], identifier: str) -> None:
        """Queue the offloads of item `identifier` (vLLM's key in `cache`) that this step planned on
        this rank, one per entry key; a no-op when none was planned.

        Payloads are validated once, by the copier, when `flush` launches the batch; a batch it
        refuses is split there, so one bad payload fails only its own copy.
        """
        copies = self._saves.pop(identifier, None)
        if copies is None:
            return
        payload = cache.get(identifier)
        if payload is None:
            log.warning("offload_rejected", mm_hash=identifier, reason="not in the encoder cache")
            for copy in copies:
                self._report(copy.ticket, ok=False)
            return
        self._queued.extend(SaveJob(copy, payload) for copy in copies)

    def flush(self) -> None:
        """Launch the queued saves as one batch and report every copy that has ended."""
        with self._lock:
            if self._queued:
                batch, self._queued = self._queued, []
                self._launch(batch)
            self._report_ended()
            self._post_unposted()
            still_running = self._busy()
        self._last_flush = time.monotonic()
        if still_running:
            self._ensure_watcher()
            self._wake.set()
        elif self._wake.is_set():
            # nothing in flight or waiting: the watcher sleeps until copies start again (only this
            # thread starts them), instead of waking each interval to find steps still flowing
            self._wake.clear()

    def _launch(self, batch: list[SaveJob]) -> None:
        try:
            self._copier.save(batch)  # nothing is written when it raises
        except LayoutMismatch:
            good = self._accepted(batch)
            if len(good) < len(batch):
                if good:
                    self._launch(good)
                return
            # every payload fits: the batch itself is wrong (extents beyond the region, miscounted)
            log.exception("offload_batch_rejected", rank=self._rank, entries=len(batch))
            for job in batch:
                self._report(job.copy.ticket, ok=False)
            return
        if _debug():
            rows = sum(job.copy.rows for job in batch)
            log.debug("tier_offload_batch", rank=self._rank, entries=len(batch), rows=rows)

    def _accepted(self, batch: list[SaveJob]) -> list[SaveJob]:
        """The jobs whose payload fits their entry; the others are reported failed and logged."""
        good = []
        for job in batch:
            try:
                self._copier.check(job.payload, job.copy.rows)
            except LayoutMismatch as err:
                log.warning("offload_rejected", mm_hash=job.copy.key, reason=str(err))
                self._report(job.copy.ticket, ok=False)
            else:
                good.append(job)
        return good

    def clear(self) -> None:
        """End the step: launch what is queued; planned saves that never came are dropped."""
        self.flush()
        for copies in self._saves.values():
            for copy in copies:
                self._report(copy.ticket, ok=False)
        self._plan = StepPlan()
        self._saves = {}

    def has_in_flight(self) -> bool:
        with self._lock:
            return bool(self._queued) or self._busy()

    def close(self) -> None:
        """Finish what is in flight, report it, release the copier; idempotent."""
        self.flush()
        self._stopping = True
        self._wake.set()
        if self._watcher is not None:
            self._watcher.join()
        with self._lock:
            self._copier.close()
            self._report_ended()
            if self._unposted:
                log.warning("completions_unposted_at_close", rank=self._rank, count=len(self._unposted))

    def _busy(self) -> bool:
        """Copies in flight, or reports waiting for room in the completion ring (under the lock)."""
        return self._copier.in_flight() > 0 or bool(self._unposted)

    def _report(self, ticket: int, *, ok: bool) -> None:
        self._report_many([ticket], ok=ok)

    def _report_many(self, tickets: list[int], *, ok: bool) -> None:
        """Post reports in order: at once when none wait, else behind those that wait."""
        with self._lock:  # one writer per rank's ring: the step thread or the watcher
            if not self._unposted:
                posted = self._post(tickets, ok)
                if posted == len(tickets):
                    return
                tickets = tickets[posted:]
            self._unposted.extend(Completion(self._rank, t, ok) for t in tickets)
            self._post_unposted()

    def _post_unposted(self) -> None:
        """Post waiting reports in order, runs of one outcome at a time; stops at a full ring."""
        unposted = self._unposted
        while unposted:
            ok = unposted[0].ok
            run = []
            for waiting in unposted:
                if waiting.ok is not ok:
                    break
                run.append(waiting.ticket)
            posted = self._post(run, ok)
            for _ in range(posted):
                unposted.popleft()
            if posted < len(run):
                return

    def _post(self, tickets: list[int], ok: bool) -> int:
        """One post into the rank's ring (one pass over the slots, one count update); how many fit."""
        posted = self._region.post_completions(self._rank, tickets, ok=ok)
        if posted < len(tickets):
            if not self._ring_full:
                self._ring_full = True
                log.warning("completion_ring_full", rank=self._rank, not_posted=len(tickets) - posted)
        else:
            self._ring_full = False
        return posted

    def _report_ended(self) -> None:
        ended = self._copier.poll()
        if ended:
            self._report_many(ended, ok=True)

    def _ensure_watcher(self) -> None:
        if self._watcher is None and not self._stopping:
            self._watcher = threading.Thread(
                target=self._watch, name=f"ec-tier-watch-rank{self._rank}", daemon=True
            )
            self._watcher.start()

    def _watch(self) -> None:
        """Report copies that end between steps; sleeps while nothing is in flight."""
        interval = self._watch_interval_s
        while not self._stopping:
            self._wake.wait()
            time.sleep(interval)
            if time.monotonic() - self._last_flush < interval:
                continue  # the step thread flushed since: it reports, and the watcher stays out of its way
            with self._lock:
                if self._stopping:
                    return
                self._report_ended()
                self._post_unposted()
                idle = not self._busy()
            if idle:
                self._wake.clear()
                with self._lock:  # a flush may have started copies after the check above
                    if self._busy():
                        self._wake.set()
