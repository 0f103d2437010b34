"""The loop's store interface over the SQLite state store.

Maps :class:`apportion.runtime.loop.StoreLike` onto :class:`apportion.store.StateStore`:
``list_jobs`` takes one consistent snapshot (``round_input``), ``record_round``
commits the round against that snapshot as one transaction (keyed
``run-<start>-<index>``, so a retried commit is idempotent), and
``record_progress`` writes measured progress (a job reaching its iterations
finishes) and measured iteration times as estimator samples; a failed worker
sends its job back to the queue from its last checkpoint.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from apportion.cluster import Cluster
from apportion.decision import Decision
from apportion.jobs import JobSpec
from apportion.runtime.executor import Event, Health, Progress
from apportion.store import RoundInput, StateStore
from apportion.store_faults import worker_fault

log = logging.getLogger(__name__)


class SqliteLoopStore:
    def __init__(self, store: StateStore, cluster: Cluster) -> None:
        self.store = store
        self.cluster = cluster
        self.run_id = f"{time.time():.0f}"
        self._snapshot: RoundInput | None = None
        self._alloc: dict[str, Any] = {}

    def now(self) -> float:
        """The store's clock: submit times are wall-clock seconds."""
        return time.time()

    def list_jobs(self, now_s: float) -> list[JobSpec]:
        self._snapshot = self.store.round_input()
        return list(self._snapshot.jobs)

    def record_round(self, index: int, now_s: float, decision: Decision,
                     events: list[Event]) -> None:
        assert self._snapshot is not None, "record_round before list_jobs"
        self.store.commit_round(decision, self._snapshot, self.cluster, now_s,
                                round_key=f"run-{self.run_id}-{index}")
        self._alloc = {a.job: a for a in decision.allocations}

    def record_progress(self, progress: list[Progress]) -> None:
        now = time.time()
        states = {r.id: r for r in self.store.jobs()}
        for p in progress:
            rec = states.get(p.job)
            if rec is None:
                continue
            try:
                if p.health is Health.FAILED:
                    if rec.state.value == "running":
                        worker_fault(self.store, p.job, now, detail=p.error or "worker failed")
                    continue
                if rec.state.value == "running" and p.iterations_done > rec.iterations_done:
                    self.store.record_progress(p.job, min(p.iterations_done, rec.iterations), now,
                                               source="executor")
                a = self._alloc.get(p.job)
                if a is not None and p.iter_time_s and p.health is Health.RUNNING:
                    self.store.record_sample(p.job, a.gpu_type, a.gpus, a.plan.as_dict(),
                                             a.placement, p.iter_time_s, now, source="executor")
            except Exception as exc:  # one bad report must not stop the loop
                log.warning("progress of %s not recorded: %s", p.job, exc)
