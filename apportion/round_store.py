"""The store a driver's rounds read and commit through: one protocol, every method named.

A :class:`~apportion.policies.scheduler.Scheduler` reads each round's queue, cluster and
history from its store and commits the round through it; ``apportion run`` (and
``serve``) also record what the executor did and the progress it polled. Every method a
driver calls is named here, so an implementation is checked whole (``isinstance`` on this
runtime-checkable protocol, and ``tests/test_round_store.py`` for every implementation)
and a driver never asks a store with ``getattr`` whether it happens to have one.

Implementations: the SQLite state store through
:class:`apportion.runtime.store_adapter.SqliteRoundStore` (operators: ``solve-round
--state``, ``run``, ``serve``) and :class:`apportion.runtime.loop.MemoryStore` (in
memory: tests and embedding). The simulator keeps its jobs' state itself (its views carry
the history a store would give) and hands the pipeline its own hooks.

What the store knows of faults lives here too, once: :meth:`RoundStore.cluster_now` is
the cluster a round may plan on (the configured one less the nodes the store holds down
or quarantined), and :func:`catalog_failures` the jobs a commit fails because no catalog
or rate can plan them (``StateStore.commit_round`` fails them; every driver reports them
from here).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from apportion.cluster import Cluster
from apportion.decision import Decision, Pending, Reason
from apportion.jobs import JobSpec

__all__ = ["RoundStore", "catalog_failures"]


@runtime_checkable
class RoundStore(Protocol):
    """Every call a driver makes on its store (``events`` and ``progress`` are the
    executors' :class:`~apportion.runtime.executors.executor.Event` and ``Progress``)."""

    def now(self, elapsed_s: float) -> float:
        """The store's clock, given the seconds since the driver started: wall-clock time
        where submit times are wall-clock (SQLite), else ``elapsed_s`` (in memory)."""
        ...

    def list_jobs(self, now_s: float) -> list[JobSpec]:
        """The jobs to schedule now (submitted, not finished or failed), each with
        ``iterations_done`` and ``running`` (its current allocation, or None): one
        consistent read, which the next :meth:`record_round` commits against."""
        ...

    def waiting(self, now_s: float) -> bool:
        """Whether jobs are submitted for a later time (a run ``--until-idle`` waits)."""
        ...

    def arrived(self, since_s: float, until_s: float) -> bool:
        """Whether a job became visible in (``since_s``, ``until_s``]: solve again now."""
        ...

    def cluster_now(self, cluster: Cluster, now_s: float) -> Cluster:
        """The cluster a round at ``now_s`` may plan on: ``cluster`` (the configured one)
        without the nodes the store holds down or quarantined."""
        ...

    def history(self, now_s: float) -> Mapping[str, Any]:
        """Attained service of the jobs last listed (job id -> ``store_history.JobHistory``):
        what history-aware policies read."""
        ...

    def finished_jcts(self) -> Mapping[str, float]:
        """Every finished job's JCT (job id -> s): what a policy that ranks the tail
        against the jobs it has seen starts from."""
        ...

    def record_round(self, index: int, now_s: float, decision: Decision,
                     events: Sequence[Any]) -> Any:
        """Commit one round (the intent, before anyone acts on it) against the last
        :meth:`list_jobs`, on the cluster the last :meth:`cluster_now` returned; returns
        what the commit did (the SQLite store's ``CommitResult``)."""
        ...

    def record_events(self, index: int, events: Sequence[Any]) -> None:
        """What the executor did for a recorded round."""
        ...

    def record_progress(self, progress: Sequence[Any]) -> None:
        """Polled progress; finished and failed jobs leave the schedule."""
        ...

    def mark_stopped(self, job_ids: Sequence[str]) -> None:
        """After a shutdown: the jobs hold no resources and resume from their checkpoints."""
        ...


def catalog_failures(decision: Decision) -> list[Pending]:
    """The jobs a committed round fails: admission found a model or GPU type no catalog or
    rate knows, so no round can ever plan them (``StateStore.commit_round`` fails them
    whichever driver committed the round)."""
    return [p for p in decision.pending if p.stage == "admit" and p.reason is Reason.CATALOG]
