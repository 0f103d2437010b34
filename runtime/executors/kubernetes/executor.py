"""The Kubernetes executor: decisions become TrainJobs (or JobSets, PyTorchJobs), status comes back.

The objects are :mod:`apportion.runtime.executors.kubernetes.manifests`'s, the same ``apportion
export k8s`` writes. Every round's objects are also written under the workdir
(``manifests/roundNNNN-<name>.yaml``) for audit; with an API server
(``--kubeconfig``, or the in-cluster service account) the executor also runs
their life cycle:

* **start**: create the ConfigMap and the job (suspended when a Kueue queue
  admits it: Kueue unsuspends the gang once it fits);
* **preempt**: *suspend* the job (Kueue: deactivate its Workload first, or
  Kueue would unsuspend it again); the pods get SIGTERM and the workers
  checkpoint within ``termination_grace_s``; the object stays, suspended;
* **resize / migrate / start of a suspended job**: suspend, wait until the
  pods are gone (the checkpoint is on the volume), then *patch* when only the
  ConfigMap changes (the plan: ``APPORTION_PLAN`` and ``config.json`` come
  from it) and *resume*; when the pod templates change (GPUs per pod, nodes,
  replicas: immutable in a JobSet), delete the job and create the new one, the
  create retried while the old object terminates (409);
* **poll**: read each job's conditions (TrainJob ``Complete``/``Failed``,
  JobSet ``Completed``/``Failed``, PyTorchJob ``Succeeded``/``Failed``,
  ``Suspended``) and, when the checkpoint volume is mounted here
  (``local_checkpoint_mount``), the progress the workers write on it
  (iterations, iteration time, loss) into the store;
* **stop** (``apportion run`` ends): jobs keep running unless ``drain``, which
  suspends (checkpoints) every running job. A restarted scheduler adopts the
  objects it finds (their allocation is in an annotation).

Every API call is retried on conflicts by
:class:`~apportion.runtime.executors.kubernetes.client.K8sClient`.
A placement the chosen API cannot express or a plan the workload cannot run
is refused for that job, and an object the API server refuses (a 4xx: an
admission webhook, a quota, a schema) fails that launch with the server's
message; either is reported as failed with the reason, never a crash. Every
launch is a record of the launch log (the state store's under ``apportion
run``): the run's fault policy counts the failed ones towards
``--max-retries``, and a restarted run hands the records of the objects it
adopted to this executor (:meth:`KubernetesExecutor.reconcile`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from apportion.runtime.executors.executor import (
    Event,
    Executor,
    Health,
    LaunchLog,
    MemoryLaunchLog,
    Progress,
    Reconciled,
    actions_for,
)
from apportion.runtime.executors.kubernetes.client import JOB_UID_LABEL, K8sClient
from apportion.runtime.executors.kubernetes.config import K8sConfig
from apportion.runtime.executors.kubernetes.manifests import (
    JOB_ID_ANNOTATION,
    JOB_KIND,
    MANAGED_BY,
    QUEUE_LABEL,
    Target,
    allocation_of,
    job_objects,
    object_name,
    workload_kind,
)
from apportion.runtime.workers.train_config import read_json_file
from apportion.runtime.workload import PROGRESS_FILE_NAME, gradient_stats, read_progress

from apportion.cluster import Cluster
from apportion.decision import Action, Allocation, Decision
from apportion.errors import InputError
from apportion.jobs import JobSpec, job_dirname

log = logging.getLogger(__name__)

DONE = {"Complete", "Completed", "Succeeded"}
BUILTIN_PROGRESS = "progress.json"  # the built-in trainer's (runtime.workers.trainer)


@dataclass
class Tracked:
    """One job object this executor manages."""

    alloc: Allocation
    state: str  # running | suspended | finished | failed | refused
    launch_id: str = ""
    launched_at_iter: int = 0
    error: str | None = None
    log_id: int | None = None  # its open record in the launch log (None: none open here)


def api_reason(exc: BaseException) -> str:
    """What the API server said, from its ``Status`` body where it sent one (``(422
    Unprocessable Entity) admission webhook ... denied the request: ...``)."""
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    body = getattr(exc, "body", None)
    message = None
    if isinstance(body, (str, bytes)):
        try:
            import json

            message = json.loads(body).get("message")
        except (ValueError, AttributeError):
            message = None
    if status is not None:
        return f"({status} {reason or ''}) {message or body or exc}".replace("( ", "(")
    return f"{type(exc).__name__}: {exc}"


def _suspend_body(api: str, value: bool) -> dict[str, Any]:
    if api == "pytorchjob":
        return {"spec": {"runPolicy": {"suspend": value}}}
    return {"spec": {"suspend": value}}


def _is_suspended(api: str, obj: dict[str, Any]) -> bool:
    spec = obj.get("spec") or {}
    return bool((spec.get("runPolicy") or {}).get("suspend") if api == "pytorchjob"
                else spec.get("suspend"))


def _unsuspended(api: str, spec: dict[str, Any] | None) -> dict[str, Any]:
    """A job spec without its suspend flag (what must match for a patch to do)."""
    out = dict(spec or {})
    if api == "pytorchjob":
        out["runPolicy"] = {k: v for k, v in (out.get("runPolicy") or {}).items()
                            if k != "suspend"}
    else:
        out.pop("suspend", None)
    return out


def _queued(obj: dict[str, Any]) -> bool:
    """Kueue admits this object (it carries a queue name)."""
    return bool(((obj.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL))


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type", ""): c for c in (obj.get("status") or {}).get("conditions") or []
            if c.get("status") == "True"}


class KubernetesExecutor(Executor):
    """Runs decisions on Kubernetes (see the module docstring)."""

    name = "kubernetes"

    def __init__(self, out_dir: str | Path, cluster: Cluster, cfg: K8sConfig | None = None,
                 client: K8sClient | None = None, drain: bool | None = None,
                 launch_log: LaunchLog | None = None) -> None:
        self.out_dir = Path(out_dir)
        self.launch_log: LaunchLog = launch_log if launch_log is not None else MemoryLaunchLog()
        self.cluster = cluster
        self.cfg = cfg if cfg is not None else K8sConfig()
        self.api = self.cfg.api
        self.kind = JOB_KIND[self.api]
        self.drain = self.cfg.drain if drain is None else drain
        self.client = client
        if client is not None:
            client.use_kueue_api(self.cfg.kueue_api)
        self.jobs: dict[str, JobSpec] = {}
        self.tracked: dict[str, Tracked] = {}
        self.round = 0
        if client is not None:
            self._adopt()

    # -- adoption: a restarted scheduler finds its objects ------------------------------------
    def _adopt(self) -> None:
        assert self.client is not None
        for obj in self.client.list(self.kind, f"{MANAGED_BY}=apportion"):
            meta = obj.get("metadata") or {}
            job = (meta.get("annotations") or {}).get(JOB_ID_ANNOTATION)
            alloc = allocation_of(obj)
            if job is None or alloc is None or meta.get("deletionTimestamp"):
                continue
            cond = _conditions(obj)
            stopped = _is_suspended(self.api, obj) and (
                not _queued(obj) or any(not (w.get("spec") or {}).get("active", True)
                                        for w in self.client.list("Workload", f"{JOB_UID_LABEL}="
                                                                  f"{meta.get('uid', '')}")))
            state = ("finished" if cond.keys() & DONE else "failed" if "Failed" in cond
                     else "suspended" if stopped else "running")
            self.tracked[job] = Tracked(alloc, state)
            log.info("adopted %s/%s (job %s, %s)", self.kind, meta.get("name"), job, state)

    def adopted_jobs(self) -> set[str]:
        """Jobs whose objects, left by an earlier run, run now (a restarted run keeps them
        running instead of requeueing them)."""
        return self._set("running")

    def reconcile(self, records: Sequence[Any], jobs: dict[str, JobSpec],
                  adopt: bool = True) -> list[Reconciled]:
        """The open launch records an earlier run left: the newest of each job whose object
        still runs is adopted (its objects outlive the run, whatever ``adopt`` says, since
        nothing here stops them), one whose object completed is finished; every other record
        is the run's to close."""
        newest: dict[str, Any] = {}
        for rec in records:
            newest[rec.job] = rec  # oldest first: the last one is the newest
        out = []
        for job, rec in sorted(newest.items()):
            t = self.tracked.get(job)
            if t is None:
                continue
            if t.state == "running":
                t.log_id = int(rec.id)
                out.append(Reconciled(int(rec.id), job, "adopted", None, rec.checkpoint_start,
                                      f"{self.kind} {object_name(job)} still runs"))
            elif t.state == "finished" and job in jobs:
                out.append(Reconciled(int(rec.id), job, "finished", None, jobs[job].iterations,
                                      f"{self.kind} {object_name(job)} completed"))
        return out

    # -- the launch log -------------------------------------------------------------------------
    def _begin(self, job: JobSpec, alloc: Allocation, action: str) -> int:
        base = Path(self.cfg.local_checkpoint_mount) if self.cfg.local_checkpoint_mount \
            else self.out_dir.parent  # where a restarted run looks for its last checkpoint
        return self.launch_log.begin(job.id, self.name, action, alloc.plan.as_dict(),
                                     dict(alloc.placement), str(base / job_dirname(job.id)),
                                     job.iterations_done)

    def _end(self, job: str, outcome: str, detail: str = "") -> None:
        """Close ``job``'s open launch record (once) with ``outcome``."""
        t = self.tracked.get(job)
        if t is None or t.log_id is None:
            return
        iters = self.jobs[job].iterations if outcome == "finished" and job in self.jobs else None
        self.launch_log.ended(t.log_id, outcome, detail, iters)
        t.log_id = None

    # -- apply ----------------------------------------------------------------------------------
    def _set(self, state: str) -> set[str]:
        return {j for j, t in self.tracked.items() if t.state == state}

    def apply(self, decision: Decision, state: Sequence[JobSpec]) -> list[Event]:
        self.round += 1
        by_id = {j.id: j for j in state}
        self.jobs.update(by_id)
        running = self._set("running")
        steps = actions_for(decision, running, running, self._set("finished"))
        events: list[Event] = []
        # stop first (all together), then launch: capacity is released before it is reused
        stopping = [s for s in steps if s.allocation is None
                    or s.action in (Action.RESIZE, Action.MIGRATE)]
        for s in stopping:
            try:
                self._suspend(s.job)
            except Exception as exc:  # noqa: BLE001 - reported, the round goes on
                log.error("job %s: suspend failed: %s", s.job, exc)
        self._wait_stopped([s.job for s in stopping])
        for s in steps:
            if s.allocation is None:
                self._end(s.job, "checkpointed", "suspended")
                self.tracked[s.job].state = "suspended"
                events.append(Event(s.job, "preempt", detail=f"{self.kind} suspended; the "
                                    "workers checkpoint on SIGTERM"))
            elif s.action is Action.KEEP and not s.restart:
                events.append(Event(s.job, "keep", s.allocation.gpus, s.allocation.gpu_type,
                                    "no change"))
            else:
                events.append(self._launch(by_id[s.job], s.allocation,
                                           "restart" if s.restart else s.action.value))
        return events

    def _launch(self, job: JobSpec, alloc: Allocation, action: str) -> Event:
        launch_id = f"{self.round}-{object_name(job.id)}"
        target = Target(self.cluster, self.cfg, self.api, launch_id=launch_id)
        if job.id in self.tracked:  # the launch it replaces (resized, moved, restarted)
            self._end(job.id, "checkpointed", f"relaunched: {action}")
        lid = self._begin(job, alloc, action)
        try:
            docs = job_objects(job, alloc, target)
        except InputError as exc:  # plan or placement this API / workload cannot take
            log.error("job %s not launched: %s", job.id, exc.message)
            self.tracked[job.id] = Tracked(alloc, "refused", launch_id, error=exc.message,
                                           log_id=lid)
            self._end(job.id, "failed", exc.message)
            return Event(job.id, "refused", alloc.gpus, alloc.gpu_type, exc.message)
        path = self.out_dir / f"round{self.round:04d}-{object_name(job.id)}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        old = self.tracked.get(job.id)
        how = "written"
        if self.client is not None:
            try:
                how = self._apply_objects(job, docs, old)
            except Exception as exc:  # noqa: BLE001 - the API refused or is gone: this
                # launch failed with the server's message; the next poll reports it
                msg = f"the API server refused {self.kind} {docs[-1]['metadata']['name']}: " \
                      f"{api_reason(exc)}"[:4000]
                log.error("job %s: %s", job.id, msg)
                self.tracked[job.id] = Tracked(alloc, "failed", launch_id, error=msg, log_id=lid)
                self._end(job.id, "failed", msg)
                return Event(job.id, "error", alloc.gpus, alloc.gpu_type, msg)
        self.tracked[job.id] = Tracked(alloc, "running", launch_id, job.iterations_done,
                                       log_id=lid)
        self.launch_log.started(lid, [{"kind": self.kind, "name": docs[-1]["metadata"]["name"]}])
        return Event(job.id, action, alloc.gpus, alloc.gpu_type, f"{self.kind} {how}: {path}",
                     spec={"manifests": docs})

    def _apply_objects(self, job: JobSpec, docs: list[dict[str, Any]],
                       old: Tracked | None) -> str:
        """Create, or patch-and-resume, or replace; returns which."""
        assert self.client is not None
        name = docs[-1]["metadata"]["name"]
        current = self.client.get(self.kind, name)
        if current is not None and current["metadata"].get("deletionTimestamp"):
            current = None  # terminating: create (retried until it is gone)
        if current is not None and old is not None and old.state in ("running", "suspended") \
                and self._patchable(current, docs):
            self.client.put_config_map(docs[0])
            self.client.patch(self.kind, name, {"metadata": {"annotations":
                                                             docs[-1]["metadata"]["annotations"]}})
            self._resume(job, current)
            return "patched"
        if current is not None:
            self._delete(name)
        self.client.put_config_map(docs[0])
        created: list[dict[str, Any]] = []
        try:
            for d in docs[1:]:
                self.client.create(d)
                created.append(d)
        except Exception:
            # a refused job leaves no part behind (a TrainingRuntime without its TrainJob
            # would make the next attempt's create conflict with it until the retries end)
            for d in reversed(created):
                try:
                    self.client.delete(d["kind"], d["metadata"]["name"])
                except Exception as exc:  # noqa: BLE001 - the refusal is what is reported
                    log.warning("%s/%s not removed: %s", d["kind"], d["metadata"]["name"], exc)
            raise
        return "replaced" if current is not None else "created"

    def _patchable(self, current: dict[str, Any], docs: list[dict[str, Any]]) -> bool:
        """Only the ConfigMap differs: the pod templates (immutable once created) are equal."""
        new = docs[-1]
        if _unsuspended(self.api, current.get("spec")) != _unsuspended(self.api, new.get("spec")):
            return False
        if self.api == "trainjob" and not self.cfg.runtime_ref:  # else: all in the TrainJob
            assert self.client is not None
            rt = self.client.get("TrainingRuntime", new["metadata"]["name"])
            return rt is not None and rt.get("spec") == docs[1]["spec"]
        return True

    def _delete(self, name: str) -> None:
        assert self.client is not None
        self.client.delete(self.kind, name)
        if self.api == "trainjob" and not self.cfg.runtime_ref:
            self.client.delete("TrainingRuntime", name)
        if self.cfg.gang == "volcano" and self.api != "pytorchjob":
            self.client.delete("PodGroup", name)  # its minMember is the old job's

    def _suspend(self, job: str) -> None:
        t = self.tracked.get(job)
        if t is None or self.client is None or t.state != "running":
            return
        name = object_name(job)
        obj = self.client.get(self.kind, name)
        if obj is None:
            return
        if _queued(obj):
            self.client.set_workloads_active(obj["metadata"].get("uid", ""), False)
        self.client.patch(self.kind, name, _suspend_body(self.api, True))

    def _resume(self, job: JobSpec, obj: dict[str, Any]) -> None:
        assert self.client is not None
        name = obj["metadata"]["name"]
        if _queued(obj):  # Kueue admits the gang again and unsuspends it
            self.client.set_workloads_active(obj["metadata"].get("uid", ""), True)
        else:
            self.client.patch(self.kind, name, _suspend_body(self.api, False))

    def _wait_stopped(self, jobs: list[str]) -> None:
        """Until every job's controller reports it suspended (its pods gone) or the timeout."""
        if self.client is None or not jobs:
            return
        deadline = time.monotonic() + self.cfg.stop_timeout_s
        pending = set(jobs)
        while pending:
            for j in sorted(pending):
                obj = self.client.get(self.kind, object_name(j))
                cond = _conditions(obj) if obj is not None else {}
                if obj is None or "Suspended" in cond or cond.keys() & DONE or "Failed" in cond:
                    pending.discard(j)
            if not pending:
                return
            if time.monotonic() > deadline:
                log.warning("still stopping after %.0fs: %s; going on (their pods are being "
                            "deleted)", self.cfg.stop_timeout_s, ", ".join(sorted(pending)))
                return
            time.sleep(self.cfg.retry_wait_s)

    # -- poll -------------------------------------------------------------------------------------
    def _progress(self, job: JobSpec, t: Tracked) -> tuple[int | None, float | None,
                                                             float | None, bool,
                                                             tuple[float, float] | None]:
        """(iterations done, iteration time, loss, this launch, the workload's last gradient
        statistics) from the checkpoint volume."""
        if not self.cfg.local_checkpoint_mount:
            return None, None, None, False, None
        d = Path(self.cfg.local_checkpoint_mount) / job_dirname(job.id)
        if workload_kind(job) == "builtin":
            p = read_json_file(d / BUILTIN_PROGRESS)
            if not isinstance(p, dict) or not isinstance(p.get("iterations_done"), int):
                return None, None, None, False, None
            mine = p.get("launch_id") == t.launch_id
            return (p["iterations_done"], p.get("iter_time_s") if mine else None, p.get("loss"),
                    mine, gradient_stats(p))
        rec = read_progress(d / PROGRESS_FILE_NAME)
        if rec is None:
            return None, None, None, False, None
        it = rec["iteration"]
        return (it, rec.get("iter_time_s"), rec.get("loss"), it > t.launched_at_iter,
                gradient_stats(rec))

    def poll(self) -> list[Progress]:
        out: list[Progress] = []
        for job_id, t in sorted(self.tracked.items()):
            job = self.jobs.get(job_id)
            if job is None:
                continue
            done, iter_time, loss, mine, stats = self._progress(job, t)
            iters = job.iterations_done if done is None else done
            health, error = self._health(job, t, iters, mine)
            if health is Health.FINISHED:
                iters = max(iters, job.iterations)
            if health in (Health.FINISHED, Health.FAILED):
                self._end(job_id, health.value, error or "")
            out.append(Progress(job_id, iters, job.iterations, health, iter_time, loss,
                                t.alloc.gpus, t.alloc.plan.label(), error=error,
                                launch_id=t.launch_id, grad_stats=stats,
                                batch=t.alloc.global_batch_size))
        return out

    def _health(self, job: JobSpec, t: Tracked, iters: int,
                mine: bool) -> tuple[Health, str | None]:
        if t.state == "refused":
            return Health.FAILED, t.error
        if t.state == "finished":
            return Health.FINISHED, None
        if t.state == "failed":
            return Health.FAILED, t.error
        if t.state == "suspended":
            return Health.CHECKPOINTED, None
        if self.client is None:
            return (Health.RUNNING if mine else Health.STARTING), None
        try:
            obj = self.client.get(self.kind, object_name(job.id))
        except Exception as exc:  # noqa: BLE001 - the API is unreachable: report what we know
            log.warning("status of %s not read: %s", job.id, exc)
            return (Health.RUNNING if mine else Health.STARTING), None
        if obj is None:
            t.state, t.error = "failed", f"{self.kind} was deleted outside apportion"
            return Health.FAILED, t.error
        cond = _conditions(obj)
        if cond.keys() & DONE:
            if self.cfg.local_checkpoint_mount and iters < job.iterations:
                t.state = "failed"
                t.error = (f"{self.kind} completed at iteration {iters} of {job.iterations} "
                           "(workers stopped early, e.g. evicted); resume from the checkpoint")
                return Health.FAILED, t.error
            t.state = "finished"
            return Health.FINISHED, None
        if "Failed" in cond:
            c = cond["Failed"]
            t.state, t.error = "failed", f"{c.get('reason', 'Failed')}: {c.get('message', '')}"
            return Health.FAILED, t.error
        return (Health.RUNNING if mine else Health.STARTING), None

    # -- stop -------------------------------------------------------------------------------------
    def shutdown(self, checkpoint: bool = True) -> list[Event]:
        """Leave jobs running (the default), or with ``drain`` suspend them all (checkpoint)."""
        running = sorted(self._set("running"))
        if not self.drain:
            if running:
                log.warning("leaving %d jobs running on Kubernetes (drain to stop them): %s",
                            len(running), ", ".join(running))
            return []
        for j in running:
            self._suspend(j)
        self._wait_stopped(running)
        events = []
        for j in running:
            self._end(j, "checkpointed", "drained")
            self.tracked[j].state = "suspended"
            events.append(Event(j, "preempt", detail=f"drained: {self.kind} suspended"))
        return events

    def close(self) -> None:
        if self.client is not None:
            api = getattr(self.client.custom, "api_client", None)
            close = getattr(api, "close", None)
            if callable(close):
                close()
