"""The Ray executor: the same torch workers as Ray actors in placement groups.

Each allocation becomes a placement group with one bundle per worker; every
bundle asks for one unit of a custom resource named after the GPU type (so
heterogeneous GPU types are modelled on CPU-only machines, and a real cluster
advertises them with ``ray start --resources='{"A100-80GB": 8}'``), plus a
real ``GPU`` where the Ray cluster has GPUs. Ray leaves an infeasible
placement group pending without a word, so creation waits at most
``placement_timeout_s`` and then raises :class:`PlacementError` naming the
missing resource, what was asked and what the cluster has.

``address=None`` starts an embedded local Ray whose custom resources describe
the given :class:`~apportion.cluster.Cluster` (``local_cluster()`` for this
machine); an address (``"ray://host:10001"`` or ``"auto"``) joins an existing
cluster: the scale-out path. Stopping and resizing use the same STOP-file
protocol as the local executor, so checkpoints live on a filesystem every
worker sees (local disk on one machine, shared storage on many).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apportion.runtime.executor import Event, Health, Progress, actions_for
from apportion.runtime.launch import launch_spec, read_json_file, write_json

from apportion.cluster import Cluster
from apportion.decision import Action, Allocation, Decision
from apportion.jobs import JobSpec

log = logging.getLogger(__name__)

STOP_FILE = "STOP"
PROGRESS_FILE = "progress.json"


class PlacementError(RuntimeError):
    """A placement group Ray could not place within the timeout."""


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError("the Ray executor needs the 'ray' package: "
                           "pip install 'ray[default]>=2.49' (the 'ray' extra)") from exc
    return ray


class _WorkerActor:
    """One rank: runs the trainer in the actor's process."""

    def run(self, config_path: str, env: dict[str, str], rank: int, world: int) -> int:
        os.environ.update(env)
        import torch
        from apportion.runtime import trainer
        torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))
        return trainer.run_worker(config_path, rank, world)


def bundles_for(alloc: Allocation, with_gpu: bool) -> list[dict[str, float]]:
    """One bundle per worker, carrying the GPU type as a custom resource (and GPU if real)."""
    b: dict[str, float] = {alloc.gpu_type: 1.0}
    if with_gpu:
        b["GPU"] = 1.0
    return [dict(b) for _ in range(alloc.plan.gpus)]


def missing_resources(bundles: list[dict[str, float]], available: dict[str, float]
                      ) -> dict[str, tuple[float, float]]:
    """Resources the bundles ask for beyond what the cluster has: name -> (asked, has)."""
    need: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            need[k] = need.get(k, 0.0) + v
    return {k: (v, float(available.get(k, 0.0))) for k, v in need.items()
            if v > available.get(k, 0.0) + 1e-9}


@dataclass
class _Group:
    job: JobSpec
    alloc: Allocation
    pg: Any
    actors: list[Any]
    refs: list[Any]
    dir: Path
    decision_wall: float
    health: Health = Health.STARTING
    error: str | None = None
    overhead_s: float | None = None
    codes: list[int | None] = field(default_factory=list)
    launch_id: str = ""


def _private_temp_dir() -> str:
    """A fresh, short Ray temp folder (its socket paths must stay under 107 bytes): another
    user's Ray, a stale /tmp/ray or RAY_ADDRESS in the environment never matter."""
    import tempfile

    base = "/tmp" if os.access("/tmp", os.W_OK) else tempfile.gettempdir()
    return tempfile.mkdtemp(prefix="ray-apo-", dir=base)


class RayExecutor:
    """Actors in placement groups; one group per job, sized by its allocation."""

    name = "ray"

    def __init__(self, workdir: str | Path, cluster: Cluster | None = None,
                 address: str | None = None, placement_timeout_s: float = 30.0,
                 stop_timeout_s: float = 120.0, seed: int = 0, threads_per_worker: int = 1,
                 num_cpus: int | None = None) -> None:
        ray = _ray()
        self.workdir = Path(workdir)
        self.placement_timeout_s = placement_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.seed, self.threads = seed, threads_per_worker
        if not ray.is_initialized():
            if address is None:  # our own Ray: never join a running one or a stale /tmp/ray
                resources = dict(cluster.capacity_by_type()) if cluster is not None else {}
                ray.init(address="local", _temp_dir=_private_temp_dir(),
                         num_cpus=num_cpus or max(os.cpu_count() or 1, 1), resources=resources,
                         include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=address, log_to_driver=False)
        self._actor_cls = ray.remote(_WorkerActor)
        self.groups: dict[str, _Group] = {}
        self.stopped: dict[str, _Group] = {}
        self._launches = 0

    # -- placement -----------------------------------------------------------------
    def _place(self, alloc: Allocation) -> Any:
        ray = _ray()
        from ray.util.placement_group import placement_group, remove_placement_group
        with_gpu = ray.cluster_resources().get("GPU", 0) > 0
        bundles = bundles_for(alloc, with_gpu)
        pg = placement_group(bundles, strategy="PACK")
        ready, _ = ray.wait([pg.ready()], timeout=self.placement_timeout_s)
        if not ready:
            remove_placement_group(pg)
            missing = missing_resources(bundles, ray.available_resources())
            what = ", ".join(f"{k!r}: asks {a:g}, available {h:g}" for k, (a, h) in
                             sorted(missing.items())) or "no single resource short; fragmented"
            raise PlacementError(f"job {alloc.job}: placement group of {len(bundles)} bundles "
                                 f"{bundles[0]} not placed within {self.placement_timeout_s:g}s "
                                 f"({what})")
        return pg

    def _launch(self, job: JobSpec, alloc: Allocation, action: str, t0: float) -> Event:
        from apportion.runtime.local import free_port
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        pg = self._place(alloc)
        self._launches += 1
        spec = launch_spec(job, alloc, action, self.workdir, master_port=free_port(),
                           seed=self.seed, threads=self.threads,
                           launch_id=f"{job.id}-{self._launches}")
        jobdir = Path(spec.workdir)
        jobdir.mkdir(parents=True, exist_ok=True)
        write_json(jobdir / "config.json", spec.config)
        (jobdir / STOP_FILE).unlink(missing_ok=True)
        actors, refs = [], []
        for r, rank_env in enumerate(spec.per_worker_env):
            actor = self._actor_cls.options(
                num_cpus=0, resources={alloc.gpu_type: 1.0},
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=r)
            ).remote()
            actors.append(actor)
            refs.append(actor.run.remote(spec.command[-1], {**spec.env, **rank_env}, r,
                                         spec.workers))
        self.stopped.pop(job.id, None)
        self.groups[job.id] = _Group(job, alloc, pg, actors, refs, jobdir, t0,
                                     launch_id=spec.config["launch_id"])
        return Event(job.id, action, spec.workers, alloc.gpu_type, alloc.plan.label(),
                     spec=spec.as_dict())

    def _finish(self, g: _Group, timeout_s: float) -> bool:
        ray = _ray()
        from ray.util.placement_group import remove_placement_group
        ready, pending = ray.wait(g.refs, num_returns=len(g.refs), timeout=timeout_s)
        clean = not pending
        codes: list[int | None] = []
        for ref in g.refs:
            try:
                codes.append(ray.get(ref, timeout=0) if ref in ready else None)
            except Exception as exc:  # noqa: BLE001 - RayTaskError wraps whatever the rank raised
                codes.append(1)
                g.error = g.error or str(exc).splitlines()[-1][:500]
        g.codes = codes
        for a in g.actors:
            ray.kill(a)
        remove_placement_group(g.pg)
        return clean and all(c == 0 for c in codes)

    # -- the protocol ----------------------------------------------------------------
    def apply(self, decision: Decision, state: Sequence[JobSpec]) -> list[Event]:
        t0 = time.time()
        self.poll()
        by_id = {j.id: j for j in state}
        alive = set(self.groups)
        done = {j for j, g in self.stopped.items() if g.health in (Health.FINISHED, Health.FAILED)}
        steps = actions_for(decision, self.groups, alive, done)
        events: list[Event] = []
        stopping = [s for s in steps if s.action in (Action.PREEMPT, Action.RESIZE, Action.MIGRATE)]
        for s in stopping:
            (self.groups[s.job].dir / STOP_FILE).touch()
        for s in stopping:
            g = self.groups.pop(s.job)
            clean = self._finish(g, self.stop_timeout_s)
            g.health = Health.CHECKPOINTED
            self.stopped[s.job] = g
            if s.action == Action.PREEMPT:
                events.append(Event(s.job, "preempt", 0, g.alloc.gpu_type,
                                    "checkpointed" if clean else "stopped uncleanly"))
        for s in steps:
            if s.allocation is None:
                continue
            if s.action == Action.KEEP and not s.restart:
                events.append(Event(s.job, "keep", s.allocation.plan.gpus, detail="no change"))
                continue
            job = by_id.get(s.job) or self.stopped[s.job].job
            try:
                events.append(self._launch(job, s.allocation, s.action.value, t0))
            except PlacementError as exc:
                log.error("%s", exc)
                events.append(Event(s.job, "pending", 0, s.allocation.gpu_type, str(exc)))
        return events

    def poll(self) -> list[Progress]:
        ray = _ray()
        out = []
        for job_id in sorted(set(self.groups) | set(self.stopped)):
            g = self.groups.get(job_id) or self.stopped[job_id]
            prog = read_json_file(g.dir / PROGRESS_FILE) or {}
            if job_id in self.groups:
                ready, _ = ray.wait(g.refs, num_returns=len(g.refs), timeout=0)
                if len(ready) == len(g.refs) or any(_failed(ray, r) for r in ready):
                    ok = self._finish(g, 5.0)
                    g.health = (Health.FINISHED if ok and prog.get("state") == "finished"
                                else Health.CHECKPOINTED if ok else Health.FAILED)
                    if g.health == Health.FAILED:
                        g.error = prog.get("error") or g.error or f"exit codes {g.codes}"
                    self.stopped[job_id] = self.groups.pop(job_id)
                elif prog.get("first_step_wall") and prog.get("launch_id") == g.launch_id:
                    g.health = Health.RUNNING
                    if g.overhead_s is None:
                        g.overhead_s = float(prog["first_step_wall"]) - g.decision_wall
            out.append(Progress(job_id, int(prog.get("iterations_done", g.job.iterations_done)),
                                g.job.iterations, g.health, prog.get("iter_time_s"),
                                prog.get("loss"), g.alloc.plan.gpus, g.alloc.plan.label(),
                                g.overhead_s, g.error))
        return out

    def shutdown(self, checkpoint: bool = True) -> list[Event]:
        events = []
        for g in self.groups.values():
            (g.dir / STOP_FILE).touch()
        for job_id in list(self.groups):
            g = self.groups.pop(job_id)
            clean = self._finish(g, self.stop_timeout_s if checkpoint else 1.0)
            g.health = Health.CHECKPOINTED
            self.stopped[job_id] = g
            events.append(Event(job_id, "preempt", 0, g.alloc.gpu_type,
                                "checkpointed on shutdown" if clean else "stopped uncleanly"))
        return events


def _failed(ray: Any, ref: Any) -> bool:
    try:
        return ray.get(ref, timeout=0) != 0
    except Exception:  # noqa: BLE001 - a rank that raised has failed
        return True
