"""The round store over the SQLite state store, its launch log and fault policy.

Maps :class:`apportion.round_store.RoundStore` onto :class:`apportion.store.StateStore`
for every driver that commits to it (``solve-round --state``, ``run``, ``serve``):
``list_jobs`` takes one consistent snapshot (``round_input``), ``cluster_now`` is the
configured cluster less the nodes the store holds down or quarantined, ``record_round``
commits the round against that snapshot, on that cluster, as one transaction (keyed
``run-<start>-<index>``, or the key the driver names, so a retried commit is
idempotent) *before* anyone acts on it, and ``record_progress`` writes measured progress
and the last checkpoint (a job reaching its iterations finishes) and measured iteration
times as estimator samples.

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from apportion.runtime.executors.executor import Event, Health, Progress

from apportion import store_launches as sl
from apportion.cluster import Cluster
from apportion.decision import Decision
from apportion.jobs import JobSpec
from apportion.lifecycle import JobState
from apportion.store import CommitResult, RoundInput, StateStore
from apportion.store_faults import effective_cluster, worker_fault
from apportion.store_history import JobHistory, finished_jcts, job_histories

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


class SqliteRoundStore:
    """The SQLite state store as a :class:`~apportion.round_store.RoundStore`.

    ``round_key`` keys the next commit (``solve-round --round-key``, or the snapshot's
    generation for a one-off round: :meth:`key_for`); without one a run's rounds are keyed
    ``run-<start>-<index>``. ``last_commit`` is what the last :meth:`record_round` did.
    """

    def __init__(self, store: StateStore, cluster: Cluster,
                 policy: FaultPolicy | None = None, round_key: str | None = None) -> None:
        self.store = store
        self.cluster = cluster
        self.policy = policy or FaultPolicy()
        self.round_key = round_key
        self.run_id = f"{time.time():.0f}-{os.getpid()}"
        self.last_commit: CommitResult | None = None
        self._snapshot: RoundInput | None = None
        self._planned: Cluster = cluster  # the cluster the next round plans on
        self._alloc: dict[str, Any] = {}
        self._handled: set[str] = set()  # failed launches the policy has acted on
        self._token: tuple[int, int, float] | None = None  # the store's change token at list_jobs

    def now(self, elapsed_s: float) -> float:
        """The store's clock: submit times are wall-clock seconds."""
        return time.time()

    def list_jobs(self, now_s: float) -> list[JobSpec]:
        self._token = self.store.change_token()  # read first: a change during the read counts
        self._snapshot = self.store.round_input()
        return list(self._snapshot.jobs)

    @property
    def snapshot(self) -> RoundInput:
        """The last :meth:`list_jobs`'s read (the next commit's base)."""
        if self._snapshot is None:
            raise RuntimeError("no round read yet: list_jobs first")
        return self._snapshot

    def key_for(self, index: int) -> str:
        """The key round ``index`` commits under."""
        return self.round_key or f"run-{self.run_id}-{index}"

    def waiting(self, now_s: float) -> bool:
        return False  # a job is submitted when it arrives: none waits for a later time

    def arrived(self, since_s: float, until_s: float) -> bool:
        """Whether something the last round did not see happened since it read the store: a
        submission, a cancellation, a job's end, a node's fault or return (any process's:
        ``submit``, the API, a worker's progress). The run loop then starts the next round
        early (debounced), the interval being only the upper bound."""
        return self._token is not None and self.store.change_token() != self._token

    def cluster_now(self, cluster: Cluster, now_s: float) -> Cluster:
        """The cluster this round may plan on: ``cluster`` without the nodes the store holds
        down or quarantined; the round commits on it."""
        self._planned = effective_cluster(self.store, cluster, now_s)
        return self._planned

    def history(self, now_s: float) -> dict[str, JobHistory]:
        """Attained service of the jobs of the last snapshot (history-aware policies)."""
        ids = {j.id for j in self._snapshot.jobs} if self._snapshot is not None else None
        return job_histories(self.store, now_s, ids)

    def finished_jcts(self) -> dict[str, float]:
        return finished_jcts(self.store)

    def record_round(self, index: int, now_s: float, decision: Decision,
                     events: Sequence[Event]) -> CommitResult:
        self.last_commit = self.store.commit_round(decision, self.snapshot, self._planned,
                                                   now_s, round_key=self.key_for(index))
        self._alloc = {a.job: a for a in decision.allocations}
        return self.last_commit

    def record_events(self, index: int, events: Sequence[Event]) -> None:
        """Nothing more to write: every executor records its launches in the store through
        its launch log (:class:`SqliteLaunchLog`), intent first."""

    def mark_stopped(self, job_ids: Sequence[str]) -> None:
        """Nothing more to write: each stopped job's checkpoint reached the store with the
        progress polled after the shutdown, and the next run requeues every job the store
        holds running that no worker runs (``reconcile``)."""

    def record_progress(self, progress: Sequence[Progress]) -> None:
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
                if p.grad_stats is not None and p.health is Health.RUNNING:
                    # what the workload measured of its gradients: its efficiency at any batch
                    self.store.record_gradient_stats(p.job, *p.grad_stats, now)
                if a is not None and p.iter_time_s and p.health is Health.RUNNING:
                    self.store.record_sample(p.job, a.gpu_type, a.gpus, a.plan.as_dict(),
                                             a.placement, p.iter_time_s, now, source="executor",
                                             batch=p.batch)  # a step at the batch it runs
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
