"""The Ray executor: a job's ranks as Ray actors in a placement group, on the nodes chosen.

Two modes. **Embedded** (no address): a fresh local Ray instance of its own
(``ray.init(address="local")`` with its own short temp dir), never a stale
``/tmp/ray`` session or a Ray cluster already running on the host; the
cluster's GPU types are custom resources of that one node (``{"T4": 4}``).
**Joined** (``--ray-address``, or ``RAY_ADDRESS``): an existing cluster, whose
node names and GPU types come from :mod:`apportion.runtime.executors.ray.importer`
(``accelerator_type:*`` resources or ``ray.io/accelerator-type`` labels,
custom resources otherwise): ``apportion cluster import --from ray`` writes
the cluster YAML with those names, and a decision's placement maps back to
Ray node ids.

Each allocation becomes one placement group with **one bundle per node of the
placement** (``{"GPU": k}`` where the node has GPUs, plus the type's custom
resource where it has one), pinned to that node with a ``ray.io/node-id``
label selector; every rank is an actor in its node's bundle that requests
``GPU`` where GPUs exist (Ray then shows it exactly its GPU:
``CUDA_VISIBLE_DEVICES``). ``MASTER_ADDR`` is rank 0's node address and
``MASTER_PORT`` a port free there. Ranks get the workload contract's
environment; the built-in trainer runs inside the actor, any other workload
kind runs its command as the actor's child process (STOP in the job folder
becomes SIGTERM for it). Ray leaves an infeasible placement group pending
without a word, so creation waits ``placement_timeout_s`` and then raises
:class:`PlacementError` naming what is missing.

A launch that cannot start (a placement group never ready, an actor that
cannot start, a command that does not exist) fails that launch with the
reason, as does a workload that exits 0 short of its target without being
asked to stop: the launch record says so, the next poll reports the job
failed (the run's fault policy counts it towards ``--max-retries``), and
every other job keeps running.

Checkpoints and progress files live on a filesystem every worker sees (local
disk on one machine, shared storage on many). Launches are recorded in the
launch log; the actors of a killed run die with it (they are not detached),
so a restarted run closes those records and resumes from the checkpoints.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apportion.runtime.executors.executor import (
    Event,
    Executor,
    FailureGate,
    Health,
    LaunchLog,
    LingerWatch,
    MemoryLaunchLog,
    Progress,
    actions_for,
    steps_to_launch,
)
from apportion.runtime.executors.confined import touch_in
from apportion.runtime.executors.launch import launch_spec
from apportion.runtime.executors.ray.importer import describe_nodes
from apportion.runtime.workers.train_config import read_json_file
from apportion.runtime.workload import (
    PROGRESS_FILE_NAME,
    ProgressView,
    file_size,
    ranks_by_node,
    read_progress_since,
)

from apportion.cluster import Cluster
from apportion.decision import Action, Allocation, Decision
from apportion.jobs import JobSpec, job_dirname
from apportion.ray_home import owned_temp_dir, probe, remove

log = logging.getLogger(__name__)

STOP_FILE = "STOP"
STATUS_FILE = "progress.json"
EXIT_CANNOT_START = 127  # a shell's code for a command it cannot run


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
    """One rank: the built-in trainer in this process, or the workload's command as a child."""

    def where(self) -> dict[str, Any]:
        """This node's address and id, a port free on it (rank 0 hosts the rendezvous), and
        the GPUs Ray gave this actor."""
        import socket

        import ray
        with socket.socket() as s:
            s.bind(("", 0))
            port = int(s.getsockname()[1])
        return {"address": ray.util.get_node_ip_address(), "port": port,
                "node_id": ray.get_runtime_context().get_node_id(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "pid": os.getpid()}

    def run(self, kind: str, command: list[str], env: dict[str, str], cwd: str, jobdir: str,
            rank: int, world: int) -> dict[str, Any]:
        os.environ.update(env)
        if kind == "builtin":
            import torch
            from apportion.runtime.workers import trainer
            torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))
            try:
                return {"code": trainer.run_worker(command[-1], rank, world), "tail": ""}
            except Exception as exc:  # noqa: BLE001 - the reason goes back to the executor
                return {"code": 1, "tail": f"{type(exc).__name__}: {exc}"}
        import signal
        import subprocess
        import sys

        from apportion.runtime.executors.confined import open_in
        from apportion.runtime.executors.local.executor import stderr_tail
        d = Path(jobdir)
        # `python` in a workload's command is the interpreter of apportion's workers, whatever
        # PATH the job sets (its own PATH follows it), as with every executor
        path = os.pathsep.join([os.path.dirname(sys.executable),
                                env.get("PATH", os.environ.get("PATH", ""))])
        try:
            with os.fdopen(open_in(d, f"rank{rank}.log"), "ab") as out, \
                    os.fdopen(open_in(d, f"rank{rank}.err"), "ab") as err:
                p = subprocess.Popen(command, env={**os.environ, **env, "PATH": path},
                                     cwd=cwd or jobdir, stdout=out, stderr=err,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:  # a missing binary, a bad working folder: this rank's failure
            return {"code": EXIT_CANNOT_START,
                    "tail": f"launch failed: cannot start {command[:1]}: "
                            f"{type(exc).__name__}: {exc}"}
        termed = False
        while p.poll() is None:
            if not termed and (d / STOP_FILE).exists():  # the contract's stop: SIGTERM
                os.killpg(p.pid, signal.SIGTERM)
                termed = True
            time.sleep(0.2)
        return {"code": p.returncode, "tail": stderr_tail(d, [rank]) if p.returncode else ""}


def bundles_for(alloc: Allocation, with_gpu: bool, type_resource: bool = True
                ) -> list[dict[str, float]]:
    """One bundle per node of the placement: ``GPU`` where GPUs exist, and the GPU type as a
    custom resource where the cluster declares types that way."""
    out = []
    for k in alloc.placement.values():
        b: dict[str, float] = {}
        if with_gpu:
            b["GPU"] = float(k)
        if type_resource or not with_gpu:
            b[alloc.gpu_type] = float(k)
        out.append(b)
    return out


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
    pg: Any  # None for a launch that never got one
    actors: list[Any]
    refs: list[Any]
    dir: Path
    decision_wall: float
    kind: str = "builtin"
    launch_id: str = ""
    offset: int = 0
    checkpoint_start: int = 0
    health: Health = Health.STARTING
    error: str | None = None
    overhead_s: float | None = None
    results: list[dict[str, Any] | None] = field(default_factory=list)
    view: ProgressView = field(default_factory=ProgressView)
    loss: float | None = None
    stopping: bool = False
    master: tuple[str, int] = ("", 0)

    @property
    def iterations_done(self) -> int:
        it = self.view.iteration
        return max(self.checkpoint_start, it if it is not None else self.job.iterations_done)

    @property
    def checkpoint(self) -> int:
        return max(self.checkpoint_start, self.view.checkpoint_iteration or 0)


class RayExecutor(Executor):
    """Actors in placement groups; one group per job, one bundle per node of its placement."""

    name = "ray"

    def __init__(self, workdir: str | Path, cluster: Cluster | None = None,
                 address: str | None = None, placement_timeout_s: float = 60.0,
                 stop_timeout_s: float = 120.0, seed: int = 0, threads_per_worker: int = 1,
                 num_cpus: int | None = None, launch_log: LaunchLog | None = None,
                 checkpoint_every: int = 0, checkpoint_interval_s: float = 120.0,
                 linger_s: float = 30.0, start_timeout_s: float = 300.0) -> None:
        ray = _ray()
        self.workdir = Path(workdir).absolute()
        self.placement_timeout_s = placement_timeout_s
        self.start_timeout_s = start_timeout_s  # placed actors that never answer: failed
        self.stop_timeout_s = stop_timeout_s
        self.linger = LingerWatch(linger_s)  # a group alive after its final checkpoint
        self.seed, self.threads = seed, threads_per_worker
        self.checkpoint_every, self.checkpoint_interval_s = checkpoint_every, checkpoint_interval_s
        self.launch_log: LaunchLog = launch_log if launch_log is not None else MemoryLaunchLog()
        self.embedded = address is None
        self._temp_dir: str | None = None
        self._connected = False
        if not ray.is_initialized():
            if self.embedded:
                # always a fresh instance of our own: never a stale /tmp/ray session, never a
                # cluster that happens to run on this host (RAY_ADDRESS included)
                self._temp_dir = owned_temp_dir("run-")  # removed by close, or the next start
                resources = dict(cluster.capacity_by_type()) if cluster is not None else {}
                ray.init(address="local", num_cpus=num_cpus or max(os.cpu_count() or 1, 1),
                         num_gpus=0, resources=resources, include_dashboard=False,
                         log_to_driver=False, _temp_dir=self._temp_dir)
            else:
                probe(address)
                ray.init(address=address, log_to_driver=False)
            self._connected = True
        self._actor_cls = ray.remote(_WorkerActor)
        self.groups: dict[str, _Group] = {}
        self.stopped: dict[str, _Group] = {}
        self.failures = FailureGate()

    def close(self) -> None:
        """Disconnect (and stop the embedded instance); the run calls it last."""
        ray = _ray()
        if self._connected and ray.is_initialized():
            ray.shutdown()
        self._connected = False
        if self._temp_dir:  # and any of its processes that outlived the shutdown
            remove(self._temp_dir)

    # -- placement -----------------------------------------------------------------
    def ray_nodes(self) -> dict[str, dict[str, Any]]:
        """Alive Ray nodes by the names ``apportion cluster import --from ray`` gives them."""
        return {d["name"]: d for d in describe_nodes(_ray().nodes())}

    def _bundles(self, alloc: Allocation) -> tuple[list[dict[str, float]], list[dict[str, str]]]:
        ray = _ray()
        if self.embedded:  # one Ray node stands for the whole (local) cluster
            return bundles_for(alloc, ray.cluster_resources().get("GPU", 0) > 0), []
        nodes = self.ray_nodes()
        raw = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
        bundles, selectors = [], []
        for node, k in alloc.placement.items():
            d = nodes.get(node)
            if d is None:
                raise PlacementError(f"job {alloc.job}: node {node!r} of its placement is not a "
                                     f"node of the Ray cluster ({', '.join(sorted(nodes))}); "
                                     "write the cluster YAML with `apportion cluster import "
                                     "--from ray`")
            res = raw[d["node_id"]].get("Resources") or {}
            b: dict[str, float] = {}
            if res.get("GPU", 0) > 0:
                b["GPU"] = float(k)
            if res.get(alloc.gpu_type, 0) > 0:
                b[alloc.gpu_type] = float(k)
            bundles.append(b or {"CPU": 0.01})
            selectors.append({"ray.io/node-id": d["node_id"]})
        return bundles, selectors

    def _place(self, alloc: Allocation) -> Any:
        return self._place_bundles(alloc)[0]

    def _place_bundles(self, alloc: Allocation) -> tuple[Any, list[dict[str, float]]]:
        ray = _ray()
        from ray.util.placement_group import placement_group, remove_placement_group
        bundles, selectors = self._bundles(alloc)
        pg = placement_group(bundles, strategy="PACK",
                             bundle_label_selector=selectors or None)
        ready, _ = ray.wait([pg.ready()], timeout=self.placement_timeout_s)
        if not ready:
            remove_placement_group(pg)
            what = _beyond_nodes(ray, list(alloc.placement), bundles, selectors)
            if not what:
                missing = missing_resources(bundles, ray.available_resources())
                what = ", ".join(f"{k!r}: asks {a:g}, available {h:g}" for k, (a, h) in
                                 sorted(missing.items())) or "no single resource short; fragmented"
            raise PlacementError(f"job {alloc.job}: placement group of {len(bundles)} bundles "
                                 f"{bundles[0]} not placed within {self.placement_timeout_s:g}s "
                                 f"({what})")
        return pg, bundles

    def _launch(self, job: JobSpec, alloc: Allocation, action: str, t0: float) -> Event:
        """Start one group, recorded intent first. Whatever keeps it from starting (a
        placement group never ready, actors that cannot start or never answer) fails this
        launch with the reason, and frees what it got."""
        jobdir = self.workdir / job_dirname(job.id)
        ck = read_progress_since(jobdir / PROGRESS_FILE_NAME).checkpoint_iteration or 0
        lid = self.launch_log.begin(job.id, self.name, action, alloc.plan.as_dict(),
                                    dict(alloc.placement), str(jobdir), ck)
        got: dict[str, Any] = {"pg": None, "actors": []}
        try:
            return self._start(job, alloc, action, t0, lid, ck, got)
        except Exception as exc:  # noqa: BLE001 - this job's launch failed, not the run
            self._release(got["pg"], got["actors"])
            why = (str(exc) if isinstance(exc, PlacementError)
                   else f"launch failed: {type(exc).__name__}: {exc}")[:4000]
            log.error("job %s: %s", job.id, why)
            self.launch_log.ended(lid, "failed", why, ck)
            prev = self.stopped.get(job.id)
            self.stopped[job.id] = _Group(job, alloc, None, [], [], jobdir, t0,
                                          kind=job.workload.kind if job.workload else "builtin",
                                          launch_id=str(lid), checkpoint_start=ck,
                                          health=Health.FAILED, error=why,
                                          overhead_s=prev.overhead_s if prev else None)
            return Event(job.id, "failed", 0, alloc.gpu_type, why)

    def _release(self, pg: Any, actors: list[Any]) -> None:
        ray = _ray()
        from ray.util.placement_group import remove_placement_group
        for a in actors:
            try:
                ray.kill(a)
            except Exception as exc:  # noqa: BLE001 - already dead
                log.debug("kill %s: %s", _actor_id(a), exc)
        if pg is not None:
            try:
                remove_placement_group(pg)
            except Exception as exc:  # noqa: BLE001 - already removed
                log.debug("remove placement group: %s", exc)

    def _start(self, job: JobSpec, alloc: Allocation, action: str, t0: float, lid: int,
               ck: int, got: dict[str, Any]) -> Event:
        from apportion.runtime.executors.local.executor import prepare
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        ray = _ray()
        pg, bundles = self._place_bundles(alloc)
        got["pg"] = pg
        jobdir = self.workdir / job_dirname(job.id)
        progress = jobdir / PROGRESS_FILE_NAME
        nodes = list(alloc.placement)
        placement = dict(alloc.placement)
        if sum(placement.values()) != alloc.plan.gpus:
            placement = {nodes[0] if nodes else "local": alloc.plan.gpus}
            nodes = list(placement)
        actors = []
        for node, _, _, _ in ranks_by_node(placement):
            idx = nodes.index(node)
            b = bundles[idx] if idx < len(bundles) else {}
            opts: dict[str, Any] = {"num_cpus": 0, "scheduling_strategy":
                                    PlacementGroupSchedulingStrategy(
                                        pg, placement_group_bundle_index=idx)}
            if b.get("GPU"):
                opts["num_gpus"] = 1
            if b.get(alloc.gpu_type):
                opts["resources"] = {alloc.gpu_type: 1.0}
            actors.append(self._actor_cls.options(**opts).remote())
        got["actors"] = actors
        where = ray.get([a.where.remote() for a in actors], timeout=self.start_timeout_s)
        master = (where[0]["address"], int(where[0]["port"]))  # rank 0's node
        spec = launch_spec(job, alloc, action, self.workdir, master_addr=master[0],
                           master_port=master[1], seed=self.seed, threads=self.threads,
                           launch_id=str(lid), checkpoint_every=self.checkpoint_every,
                           checkpoint_interval_s=self.checkpoint_interval_s)
        prepare(spec)
        offset = file_size(progress)
        refs = [a.run.remote(spec.kind, spec.command, {**spec.env, **rank_env}, spec.cwd,
                             spec.workdir, int(rank_env["RANK"]), spec.workers)
                for a, rank_env in zip(actors, spec.per_worker_env, strict=True)]
        self.launch_log.started(lid, [{"rank": r, "node": n, "actor": _actor_id(a), **w}
                                      for r, (a, n, w) in enumerate(zip(actors, spec.nodes,
                                                                        where, strict=True))])
        self.stopped.pop(job.id, None)
        self.groups[job.id] = _Group(job, alloc, pg, actors, refs, jobdir, t0, kind=spec.kind,
                                     launch_id=str(lid), offset=offset, checkpoint_start=ck,
                                     master=master)
        return Event(job.id, action, spec.workers, alloc.gpu_type, alloc.plan.label(),
                     spec=spec.as_dict())

    def _collect(self, g: _Group, timeout_s: float) -> bool:
        """Wait for the ranks' results, then free the actors and the group. True when every
        rank exited 0 in time."""
        ray = _ray()
        from ray.util.placement_group import remove_placement_group
        ready, pending = ray.wait(g.refs, num_returns=len(g.refs), timeout=timeout_s)
        results: list[dict[str, Any] | None] = []
        for ref in g.refs:
            if ref not in ready:
                results.append(None)
                continue
            try:
                results.append(ray.get(ref, timeout=0))
            except Exception as exc:  # noqa: BLE001 - the actor died or raised
                results.append({"code": 1, "tail": str(exc).splitlines()[-1][:1000]})
        g.results = results
        for a in g.actors:
            ray.kill(a)
        remove_placement_group(g.pg)
        return not pending and all(r is not None and r["code"] == 0 for r in results)

    def _read(self, g: _Group) -> None:
        g.view = read_progress_since(g.dir / PROGRESS_FILE_NAME, g.offset)
        loss = (g.view.last or {}).get("loss")
        if isinstance(loss, (int, float)) and not isinstance(loss, bool):
            g.loss = float(loss)
        it = g.view.iteration
        if g.health == Health.STARTING and it is not None and (
                it > g.checkpoint_start or "loss" in (g.view.last or {})):
            g.health = Health.RUNNING
            wall = (g.view.last or {}).get("wall")
            g.overhead_s = max(0.0, (float(wall) if isinstance(wall, (int, float))
                                     else time.time()) - g.decision_wall)

    def _settle(self, g: _Group, clean: bool) -> str:
        """Classify an ended group; returns the launch outcome."""
        self._read(g)
        status = read_json_file(g.dir / STATUS_FILE) or {}
        own = status.get("launch_id") == g.launch_id
        if clean:
            done = g.iterations_done >= g.job.iterations
            if g.kind == "builtin":
                done = own and status.get("state") == "finished"
            if done or g.stopping:
                g.health = Health.FINISHED if done else Health.CHECKPOINTED
                return "finished" if done else "checkpointed"
            # exited 0 short of its target unasked: a failure, so a workload that does it
            # counts towards --max-retries instead of being relaunched for ever
            g.health = Health.FAILED
            g.error = (f"the workload exited 0 at iteration {g.iterations_done} of "
                       f"{g.job.iterations} without being asked to stop (it must train to "
                       "APPORTION_ITERATIONS, or checkpoint and exit 0 on SIGTERM)")
            return "failed"
        if g.stopping:
            if g.checkpoint >= g.job.iterations:  # killed after its final checkpoint: done
                g.health = Health.FINISHED
                return "finished"
            g.health = Health.CHECKPOINTED
            log.warning("%s: launch %s stopped uncleanly: exit codes %s", g.job.id, g.launch_id,
                        [r["code"] if r else None for r in g.results])
            return "stopped"
        g.health = Health.FAILED
        codes = [r["code"] if r else None for r in g.results]
        tails = [r["tail"] for r in g.results if r and r.get("tail")]
        g.error = (status.get("error") if own and status.get("error") else None) or (
            f"workload failed; exit codes {codes}" + (f"; last stderr lines:\n{tails[0]}"
                                                      if tails else ""))
        return "failed"

    def _close(self, g: _Group, outcome: str) -> None:
        if g.launch_id:
            self.launch_log.ended(int(g.launch_id), outcome, g.error or "", g.checkpoint)

    # -- the protocol ----------------------------------------------------------------
    def apply(self, decision: Decision, state: Sequence[JobSpec]) -> list[Event]:
        t0 = time.time()
        with self.failures.quiet():
            self.poll()
        held = self.failures.unseen(self.stopped)
        by_id = {j.id: j for j in state}
        alive = set(self.groups)
        done = {j for j, g in self.stopped.items() if g.health == Health.FINISHED}
        steps = actions_for(decision, self.groups, alive, done)
        events: list[Event] = []
        stopping = [s for s in steps if s.action in (Action.PREEMPT, Action.RESIZE, Action.MIGRATE)]
        for s in stopping:
            g = self.groups[s.job]
            self.launch_log.stopping(int(g.launch_id), s.action.value)
            g.stopping = True
            touch_in(g.dir, STOP_FILE)
        for s in stopping:
            g = self.groups.pop(s.job)
            clean = self._collect(g, self.stop_timeout_s)
            self._close(g, self._settle(g, clean))
            self.stopped[s.job] = g
            if s.action == Action.PREEMPT:
                events.append(Event(s.job, "preempt", 0, g.alloc.gpu_type,
                                    "checkpointed" if clean else "stopped uncleanly"))
        for s in steps_to_launch(steps, held, events):
            job = by_id.get(s.job) or self.stopped[s.job].job
            events.append(self._launch(job, s.allocation, "restart" if s.restart
                                       else s.action.value, t0))
        return events

    def poll(self) -> list[Progress]:
        ray = _ray()
        out = []
        for job_id in sorted(set(self.groups) | set(self.stopped)):
            g = self.groups.get(job_id) or self.stopped[job_id]
            if job_id in self.groups:
                ready, _ = ray.wait(g.refs, num_returns=len(g.refs), timeout=0)
                if len(ready) == len(g.refs) or any(_failed(ray, r) for r in ready):
                    if len(ready) < len(g.refs):  # a rank failed: its siblings would wait
                        touch_in(g.dir, STOP_FILE)  # for it; their commands get SIGTERM
                    clean = self._collect(g, 5.0)
                    self._close(g, self._settle(g, clean))
                    self.stopped[job_id] = self.groups.pop(job_id)
                else:
                    self._read(g)
                    self._reap_lingering(g)
            out.append(Progress(job_id, g.iterations_done, g.job.iterations, g.health,
                                _iter_time(g), g.loss, g.alloc.plan.gpus, g.alloc.plan.label(),
                                g.overhead_s, g.error, g.checkpoint, g.launch_id,
                                g.view.grad_stats if g.view is not None else None,
                                g.alloc.global_batch_size))
        return self.failures.saw(out)

    def _reap_lingering(self, g: _Group) -> None:
        """A group alive ``linger_s`` after its final checkpoint at the target is stopped
        (its actors killed) and its job finished (:class:`LingerWatch`)."""
        if not self.linger.due(f"{g.job.id}/{g.launch_id}", g.checkpoint, g.job.iterations,
                               g.stopping):
            return
        log.warning("%s: launch %s alive %g s after its final checkpoint; killed", g.job.id,
                    g.launch_id, self.linger.linger_s)
        self.launch_log.stopping(int(g.launch_id), "linger")
        g.stopping = True
        touch_in(g.dir, STOP_FILE)
        clean = self._collect(g, 5.0)
        self._close(g, self._settle(g, clean))
        self.stopped[g.job.id] = self.groups.pop(g.job.id)

    def shutdown(self, checkpoint: bool = True) -> list[Event]:
        events = []
        for g in self.groups.values():
            self.launch_log.stopping(int(g.launch_id), "shutdown")
            g.stopping = True
            touch_in(g.dir, STOP_FILE)
        for job_id in list(self.groups):
            g = self.groups.pop(job_id)
            clean = self._collect(g, self.stop_timeout_s if checkpoint else 1.0)
            self._close(g, self._settle(g, clean))
            self.stopped[job_id] = g
            events.append(Event(job_id, "preempt", 0, g.alloc.gpu_type,
                                "checkpointed on shutdown" if clean else "stopped uncleanly"))
        return events


def _beyond_nodes(ray: Any, names: list[str], bundles: list[dict[str, float]],
                  selectors: list[dict[str, str]]) -> str:
    """Bundles pinned to a node that asks more than the node has at all (a cluster file that
    overstates it): such a group never becomes ready, whatever else ends."""
    if not selectors:
        return ""
    totals = {n["NodeID"]: n.get("Resources") or {} for n in ray.nodes() if n.get("Alive")}
    out = []
    for name, b, sel in zip(names, bundles, selectors):
        has = totals.get(sel.get("ray.io/node-id", ""), {})
        out += [f"node {name}: {k!r}: asks {v:g}, the node has {has.get(k, 0.0):g}"
                for k, v in sorted(b.items()) if v > has.get(k, 0.0) + 1e-9]
    return "; ".join(out)


def _actor_id(actor: Any) -> str:
    aid = getattr(actor, "_actor_id", None)
    return aid.hex() if aid is not None else ""


def _iter_time(g: _Group) -> float | None:
    t = (g.view.last or {}).get("iter_time_s")
    return float(t) if isinstance(t, (int, float)) and t > 0 else None


def _failed(ray: Any, ref: Any) -> bool:
    try:
        res = ray.get(ref, timeout=0)
    except Exception:  # noqa: BLE001 - a rank that raised has failed
        return True
    return not isinstance(res, dict) or res.get("code") != 0
