"""The loop's store interface over the SQLite state store, its launch log and fault policy.

Maps :class:`apportion.runtime.loop.StoreLike` onto :class:`apportion.store.StateStore`:
``list_jobs`` takes one consistent snapshot (``round_input``), ``record_round``
commits the round against that snapshot as one transaction (keyed
``run-<start>-<index>``, so a retried commit is idempotent) *before* the
executor acts on it, and ``record_progress`` writes measured progress and the
last checkpoint (a job reaching its iterations finishes) and measured
iteration times as estimator samples.

The fault policy (:class:`FaultPolicy`): a failed worker group sends its job
back to the queue from its last checkpoint, to be relaunched by the next
round; a job whose launches fail ``max_retries + 1`` times in a row without
saving a new checkpoint is failed with the last reason.

:class:`SqliteLaunchLog` is the executors' :class:`~apportion.runtime.executors.executor.LaunchLog`
over :mod:`apportion.store_launches` (launch ids from the store, intent first).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from apportion.runtime.executors.executor import Event, Health, Progress

from apportion import store_launches as sl
from apportion.cluster import Cluster
from apportion.decision import Decision
from apportion.jobs import JobSpec
from apportion.lifecycle import JobState
from apportion.store import RoundInput, StateStore
from apportion.store_faults import effective_cluster, worker_fault

log = logging.getLogger(__name__)


def run_owner() -> str:
    """Who holds launches: this process (pid, host, start time)."""
    return f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}"


@dataclass(frozen=True)
class FaultPolicy:
    """Relaunch a failed job from its checkpoint; fail it after ``max_retries`` failed
    launches in a row that saved nothing new."""

    max_retries: int = 3


class SqliteLaunchLog:
    """Launch records in the state store (per-store monotonic ids; intent before action)."""

    def __init__(self, store: StateStore, owner: str | None = None) -> None:
        self.store = store
        self.owner = owner or run_owner()

    def begin(self, job: str, executor: str, action: str, plan: dict[str, Any],
              placement: dict[str, int], jobdir: str, checkpoint_start: int) -> int:
        return sl.begin_launch(self.store, job, executor, action, plan, placement, jobdir,
                               self.owner, checkpoint_start)

    def started(self, launch_id: int, workers: list[dict[str, Any]]) -> None:
        sl.launch_started(self.store, launch_id, workers)

    def stopping(self, launch_id: int, why: str) -> None:
        sl.launch_stopping(self.store, launch_id, why)

    def ended(self, launch_id: int, outcome: str, detail: str = "",
              checkpoint_end: int | None = None) -> None:
        sl.launch_ended(self.store, launch_id, outcome, detail, checkpoint_end)


class SqliteLoopStore:
    def __init__(self, store: StateStore, cluster: Cluster,
                 policy: FaultPolicy | None = None) -> None:
        self.store = store
        self.cluster = cluster
        self.policy = policy or FaultPolicy()
        self.run_id = f"{time.time():.0f}-{os.getpid()}"
        self._snapshot: RoundInput | None = None
        self._alloc: dict[str, Any] = {}
        self._handled: set[str] = set()  # failed launches the policy has acted on

    def now(self) -> float:
        """The store's clock: submit times are wall-clock seconds."""
        return time.time()

    def list_jobs(self, now_s: float) -> list[JobSpec]:
        self._snapshot = self.store.round_input()
        return list(self._snapshot.jobs)

    def cluster_now(self, now_s: float) -> Cluster:
        """The cluster this round may plan on: the configured one without the nodes the
        store holds down or quarantined (what ``solve-round --state`` plans on too)."""
        return effective_cluster(self.store, self.cluster, now_s)

    def history(self, now_s: float) -> dict[str, Any]:
        """Attained service of the jobs of the last snapshot (history-aware policies)."""
        from apportion.store_history import job_histories

        ids = {j.id for j in self._snapshot.jobs} if self._snapshot is not None else None
        return job_histories(self.store, now_s, ids)

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
                if rec.state is JobState.RUNNING and (
                        p.iterations_done > rec.iterations_done or (
                            p.checkpoint_iterations or 0) > rec.checkpoint_iterations) and \
                        p.iterations_done >= rec.iterations_done:
                    rec = self.store.record_progress(
                        p.job, min(p.iterations_done, rec.iterations), now, source="executor",
                        checkpoint_iterations=p.checkpoint_iterations)
                elif p.health is Health.CHECKPOINTED and rec.state is not JobState.RUNNING \
                        and p.checkpoint_iterations is not None:
                    sl.settle_checkpoint(self.store, p.job, p.checkpoint_iterations,
                                         "stopped with a checkpoint")
                if p.health is Health.FAILED:
                    self._fault(p, rec, now)
                    continue
                a = self._alloc.get(p.job)
                if a is not None and p.iter_time_s and p.health is Health.RUNNING:
                    self.store.record_sample(p.job, a.gpu_type, a.gpus, a.plan.as_dict(),
                                             a.placement, p.iter_time_s, now, source="executor")
            except Exception as exc:  # noqa: BLE001 - one bad report must not stop the loop
                log.warning("progress of %s not recorded: %s", p.job, exc)

    def _fault(self, p: Progress, rec: Any, now: float) -> None:
        """A failed worker group: relaunch from the checkpoint, or fail the job."""
        key = f"{p.job}/{p.launch_id}"
        if key in self._handled or rec.state is not JobState.RUNNING:
            return
        self._handled.add(key)
        reason = p.error or "worker failed"
        n = sl.consecutive_failures(self.store, p.job)
        if n > self.policy.max_retries:
            self.store.fail(p.job, f"failed {n} times in a row without a new checkpoint "
                                   f"(max {self.policy.max_retries} retries); last: {reason}"[:4000],
                            at=now)
            log.error("job %s failed for good after %d attempts: %s", p.job, n, reason)
            return
        worker_fault(self.store, p.job, now, detail=reason[:4000])
        log.warning("job %s: worker group failed (%d in a row), back to the queue from iteration "
                    "%s: %s", p.job, n, p.checkpoint_iterations, reason.splitlines()[0][:300])
