"""Settling what an earlier (killed) run left, before a run's first round.

A run killed with SIGKILL leaves its workers running and its launch records open. The
executor adopts what it can (the local executor's groups that still run; Slurm jobs and
Kubernetes objects it finds when it starts) or stops it (``--orphans stop``); every other
open launch is closed, and every job the store thinks is running but nothing runs goes
back to the queue from its last checkpoint on disk.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from apportion.runtime.executors.executor import Executor
from apportion.runtime.executors.procs import stop_holders
from apportion.runtime.workload import PROGRESS_FILE_NAME, read_progress_since

from apportion import store_launches as sl
from apportion.jobs import job_dirname
from apportion.lifecycle import ACTIVE, JobState

log = logging.getLogger(__name__)

__all__ = ["reconcile"]

#: how long processes a local run left have to checkpoint and exit, when the executor now
#: has no grace period of its own (dry-run, Kubernetes)
LOCAL_GRACE_S = 30.0


def reconcile(store: Any, ex: Executor, workdir: Path, adopt: bool = True,
              owner: str = "run") -> list[Any]:
    """Settle what an earlier (killed) run left, before the first round: adopt or stop its
    worker groups, close their launch records, and requeue from its last checkpoint every
    job the store thinks is running but nothing runs. Executors that find their own
    leftovers when they start (Slurm jobs, Kubernetes objects) say which jobs they adopted
    (``adopted_jobs``); with ``adopt`` off, one that can (``stop_adopted``) stops them
    first. A launch adopted becomes ``owner``'s (this run's, as its launch log names it).
    Returns what was done per launch."""
    jobs = {r.id: r.to_jobspec() for r in store.jobs(ACTIVE)}
    records = sl.open_launches(store)
    done: list[Any] = []
    mine = [r for r in records if r.executor == ex.name]
    if mine:
        done = ex.reconcile(mine, jobs, adopt=adopt)
    handled = {d.launch_id for d in done}
    # executors that find their own leftovers (Slurm jobs, Kubernetes objects) adopted them
    # when they started: those jobs keep running
    adopted = set(ex.adopted_jobs())
    if adopted and not adopt and ex.stop_adopted():
        adopted = set()  # --orphans stop: checkpointed, then requeued below
    for d in done:
        if d.action == "adopted":
            sl.adopt_launch(store, d.launch_id, owner)
            adopted.add(d.job)
            log.warning("job %s: adopted launch %d left by an earlier run (%s)", d.job,
                        d.launch_id, d.detail)
            continue
        sl.launch_ended(store, d.launch_id, d.action, d.detail, d.checkpoint)
        sl.settle_checkpoint(store, d.job, d.checkpoint, f"launch {d.launch_id}: {d.detail}")
        log.warning("job %s: launch %d left by an earlier run %s at checkpoint %d (%s)", d.job,
                    d.launch_id, d.action, d.checkpoint, d.detail)
    for r in records:  # launches this executor cannot reconcile: their workers died with it
        if r.id in handled:
            continue
        if r.executor == "local":  # another executor's run now: stop what a local run left
            grace = LOCAL_GRACE_S if ex.stop_timeout_s is None else ex.stop_timeout_s
            stop_holders(Path(r.jobdir), grace)
        ck = read_progress_since(Path(r.jobdir) / PROGRESS_FILE_NAME).checkpoint_iteration or 0
        ck = max(ck, r.checkpoint_start)
        sl.launch_ended(store, r.id, "stopped", "its run died; this executor cannot adopt it", ck)
        sl.settle_checkpoint(store, r.job, ck, f"launch {r.id}: its run died")
    for rec in store.jobs(frozenset({JobState.RUNNING})):
        if rec.id in adopted:
            continue
        view = read_progress_since(workdir / job_dirname(rec.id) / PROGRESS_FILE_NAME)
        ck = view.checkpoint_iteration or 0
        sl.settle_checkpoint(store, rec.id, ck, "running in the store, but no worker runs it: "
                             "back to the queue from its last checkpoint")
        # the store keeps the later of its own checkpoint and the progress file's
        log.warning("job %s: no worker runs it; requeued from checkpoint %d", rec.id,
                    store.job(rec.id).checkpoint_iterations)
    return done
