"""The Slurm executor: every allocation is one ``sbatch``; state from Slurm, progress from files.

``apportion run --executor slurm --cluster CLUSTER.yaml`` (the cluster from
``apportion cluster import --from slurm``, so node names are Slurm's):

* **start**: one batch job per allocation, pinned with ``--nodelist`` to the
  chosen nodes, ``--gres=gpu:<type>:<n>`` per node with the node's own GRES
  type (read from ``scontrol show node``; the catalog name is apportion's,
  the GRES type Slurm's), the GPUs' share of the node's CPUs and memory, and
  one task per node running the agent ``runtime.executors.slurm.task``, which starts
  the node's ranks with the workload contract (``runtime.workload``).
  Different GPU counts on different nodes make a heterogeneous job (see
  ``runtime.executors.slurm.batch``).
* **what runs**: the job's ``workload`` (the user's command, one process per
  rank) or apportion's built-in trainer (``python -m
  apportion.runtime.workers.trainer CONFIG.json``).
* **state**: ``squeue --me -t all`` (one call for every job, rate-limited by
  ``query_interval_s``), then ``sacct`` for jobs the controller has
  forgotten (where accounting is configured), then the agents' exit files.
* **progress**: the job's progress file (``APPORTION_PROGRESS_FILE``, one JSON
  line per step; the built-in trainer's ``progress.json``), read into the
  store by the run loop.
* **what it asks for**: never more than Slurm says a node has: each node's
  CPUs and memory request is capped at the GPUs' share of its ``CPUEfctv``
  and ``RealMemory`` (``runtime.executors.slurm.nodes``), and where the
  cluster file disagrees with Slurm the executor says so before its first
  launch.
* **failure**: a non-zero exit (or a Slurm end state such as ``NODE_FAIL``,
  ``TIMEOUT``, ``OUT_OF_MEMORY``) is a failure whose reason is the failing
  rank's last stderr lines (or the batch output's when no rank ran); so is a
  workload that exits 0 short of its target without being asked to stop, and
  an ``sbatch`` that Slurm refuses (its reason is Slurm's message). Every
  launch, refused ones included, is a record of the launch log (the state
  store's under ``apportion run``), which is what the run's fault policy
  counts towards ``--max-retries``.
* **preempt, resize, migrate**: ``scancel --signal=TERM`` (the ranks
  checkpoint and exit 0); ranks still running ``grace_s`` later are killed
  by their node's agent (and a job still there 15 s after that is cancelled);
  the job is resubmitted on its new placement and resumes from its
  checkpoint. All stops of a round are requested together and awaited
  before any launch, so a job never runs twice against one checkpoint.
* **restarts of apportion**: each job's folder records its current Slurm
  job (``slurm-job.json``); a new executor on the same work folder adopts
  the jobs still in Slurm instead of launching them twice, so killing
  ``apportion run`` loses nothing, and stopping it (SIGINT/SIGTERM)
  checkpoints every job first.

The work folder must be on storage every node sees (it holds checkpoints,
launch files and logs), and ``python`` (this interpreter unless given) must
exist at the same path on the nodes, as on clusters with a shared software
tree. Site options (account, QoS, constraints) go in ``sbatch_args``.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apportion.runtime.executors.slurm import batch
from apportion.runtime.executors.slurm import submit
from apportion.runtime.executors.executor import (
    Event,
    Executor,
    FailureGate,
    Health,
    LaunchLog,
    MemoryLaunchLog,
    Progress,
    Reconciled,
    actions_for,
    steps_to_launch,
)
from apportion.runtime.executors.slurm.commands import (
    ACTIVE_STATES,
    SlurmError,
    parse_records,
    run,
    sacct_states,
    squeue_states,
)
from apportion.runtime.executors.slurm.nodes import (
    MEMORY_HEADROOM,
    NodeLimits,
    cap_requests,
    disagreements,
    limits_from_records,
)
from apportion.runtime.executors.confined import UnsafeFolder, confine
from apportion.runtime.executors.slurm.submit import gres_type_for
from apportion.runtime.executors.slurm.task import exit_path, launch_marker
from apportion.runtime.workers.train_config import read_json_file, write_json
from apportion.runtime.workload import (
    CHECKPOINT_DIR_NAME,
    PROGRESS_FILE_NAME,
    gradient_stats,
    read_progress,
    read_progress_since,
)

from apportion.cluster import Cluster
from apportion.decision import Action, Allocation, Decision
from apportion.errors import InputError
from apportion.jobs import JobSpec, job_dirname
from apportion.plans import ExecutionPlan

log = logging.getLogger(__name__)

RECORD_FILE = "slurm-job.json"
BUILTIN_PROGRESS = "progress.json"
AGENT_MODULE = submit.AGENT_MODULE
STDERR_LINES = 12
COMMENT_PREFIX = "apportion-launch:"
BACKSTOP_S = 15.0  # beyond the grace, before apportion cancels a job whose agent did not end it


@dataclass
class _Launch:
    """One Slurm job of one apportion job (the current launch)."""

    job_id: str
    iterations: int
    alloc: Allocation
    slurm_id: str
    launch_id: str
    dir: Path
    builtin: bool
    decision_wall: float
    start_iteration: int
    action: str = "start"
    health: Health = Health.STARTING
    error: str | None = None
    overhead_s: float | None = None
    stop_requested: bool = False
    slurm_state: str = "PENDING"
    slurm_reason: str = ""
    iterations_done: int = 0
    iter_time_s: float | None = None
    loss: float | None = None
    grad_stats: tuple[float, float] | None = None  # the workload's last (grad_sqr, grad_var)
    first_seen: tuple[int, float] | None = None  # (iteration, wall) when this launch first stepped
    history: list[tuple[str, float]] = field(default_factory=list)
    log_id: int | None = None  # its record in the launch log
    logged: bool = False  # this executor's launch log holds that record (begun or adopted here)
    checkpoint_start: int = 0

    def record(self) -> dict[str, Any]:
        return {"job": self.job_id, "iterations": self.iterations, "slurm_job_id": self.slurm_id,
                "launch_id": self.launch_id, "builtin": self.builtin,
                "decision_wall": self.decision_wall, "start_iteration": self.start_iteration,
                "action": self.action, "allocation": self.alloc.as_dict(),
                "log_id": self.log_id, "checkpoint_start": self.checkpoint_start}

    @property
    def checkpoint(self) -> int:
        """The last checkpoint this launch's workload reported (its start's, if none)."""
        ck = read_progress_since(self.dir / PROGRESS_FILE_NAME).checkpoint_iteration
        return max(self.checkpoint_start, ck or 0)


def allocation_from_dict(d: Mapping[str, Any]) -> Allocation:
    """The inverse of :meth:`Allocation.as_dict` (for launches adopted after a restart)."""
    return Allocation(str(d["job"]), str(d["gpu_type"]), int(d["gpus"]), int(d["stages"]),
                      ExecutionPlan(**d["plan"]), {str(k): int(v) for k, v in d["placement"].items()},
                      float(d.get("est_throughput") or 0.0), Action(d.get("action", "start")),
                      d.get("iter_time_s"), d.get("normalized_throughput"),
                      d.get("mem_per_gpu_gib"), int(d.get("cpus") or 0),
                      float(d.get("host_memory_gib") or 0.0))


class SlurmExecutor(Executor):
    """Allocations as Slurm batch jobs (see the module doc)."""

    name = "slurm"

    def __init__(self, workdir: str | Path, cluster: Cluster | None = None,
                 partition: str | None = None, sbatch_args: Sequence[str] = (),
                 grace_s: float = 60.0, python: str = sys.executable,
                 env: Mapping[str, str] | None = None, request_memory: bool = True,
                 query_interval_s: float = 1.0, seed: int = 0, threads_per_worker: int = 1,
                 lr: float = 1e-3, checkpoint_every: int = 0, adopt: bool = True,
                 launch_log: LaunchLog | None = None,
                 memory_headroom: float = MEMORY_HEADROOM, time_limit_s: float | None = None,
                 time_margin: float = submit.TIME_MARGIN) -> None:
        self.workdir = Path(workdir).resolve()
        self.time_limit_s, self.time_margin = time_limit_s, time_margin
        self.launch_log: LaunchLog = launch_log if launch_log is not None else MemoryLaunchLog()
        self.memory_headroom = memory_headroom
        self.cluster = cluster
        self.partition = partition
        self.sbatch_args = list(sbatch_args)
        self.stop_timeout_s: float = grace_s  # the grace of a stop, before the kill
        self.python = python
        self.env = {**os.environ, **(env or {})}
        self.request_memory = request_memory
        self.query_interval_s = query_interval_s
        self.seed, self.threads, self.lr, self.checkpoint_every = (seed, threads_per_worker, lr,
                                                                   checkpoint_every)
        self.runs: dict[str, _Launch] = {}
        self.stopped: dict[str, _Launch] = {}
        self.failures = FailureGate()
        self._nodes: dict[str, dict[str, str]] = {}
        self._states: dict[str, tuple[str, str]] = {}
        self._states_at = -1e9
        self._adopted: set[str] = set()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._checked = False  # the cluster file against Slurm: once, at the first apply
        if adopt:
            self._adopt()

    def check_cluster(self) -> list[str]:
        """Compare the cluster file with what Slurm says each node has, and warn where they
        disagree: the rounds plan on the file, while requests are capped at Slurm's figures
        (a file that overstates a node made every launch there be refused)."""
        if self.cluster is None:
            return []
        found = self._limits(list(self.cluster.nodes))
        if not found:
            return []  # Slurm did not answer: warned already; requests are capped once it does
        lines = disagreements(self.cluster, found)
        for line in lines:
            log.warning("%s", line)
        if lines:
            log.warning("requests ask at most what Slurm says each node has; `apportion "
                        "cluster import --from slurm` writes a cluster file that agrees")
        return lines

    def adopted_jobs(self) -> set[str]:
        """Jobs whose Slurm jobs, left by an earlier run, this executor took over when it
        started (a restarted run keeps them running instead of requeueing them)."""
        return set(self._adopted)

    def stop_adopted(self) -> bool:
        """``--orphans stop``: checkpoint and stop the Slurm jobs an earlier run left (TERM,
        then cancel after the grace period); the run requeues them from their checkpoints."""
        runs = [self.runs[j] for j in sorted(self._adopted) if j in self.runs]
        if runs:
            log.warning("stopping %d slurm jobs an earlier run left: %s", len(runs),
                        ", ".join(f"{r.job_id} ({r.slurm_id})" for r in runs))
            self._stop(runs, why="--orphans stop")
        self._adopted.clear()
        return True

    # -- Slurm ---------------------------------------------------------------------
    def _run(self, args: list[str], timeout_s: float = 60.0) -> str:
        return run(args, env=self.env, timeout_s=timeout_s)

    def _query(self, force: bool = False) -> dict[str, tuple[str, str]] | None:
        """Slurm's state of every job this executor knows (one squeue; sacct for the rest);
        None while squeue does not answer (nothing is concluded from silence)."""
        now = time.monotonic()
        if not force and now - self._states_at < self.query_interval_s:
            return self._states
        ids = {r.slurm_id for r in self.runs.values()}
        try:
            states = squeue_states(self._run(["squeue", "--me", "-h", "-t", "all",
                                              "-o", "%i|%T|%r"]))
        except SlurmError as exc:  # slurmctld restarting or overloaded: keep what was known
            log.warning("squeue: %s; job states unchanged until it answers", exc)
            self._states_at = now  # ask again after the interval; until then the last answer
            return None
        missing = sorted(i for i in ids if i not in states)
        if missing:
            try:
                states.update(sacct_states(self._run(
                    ["sacct", "-n", "-P", "-X", "-j", ",".join(missing),
                     "-o", "JobID,State,ExitCode"])))
            except SlurmError as exc:  # no accounting storage here: the exit files decide
                log.debug("sacct: %s", exc)
        self._states, self._states_at = states, now
        return states

    def _node_info(self, names: Sequence[str]) -> dict[str, dict[str, str]]:
        if any(n not in self._nodes for n in names):
            try:
                for rec in parse_records(self._run(["scontrol", "show", "node", "-o"])):
                    if rec.get("NodeName"):
                        self._nodes[rec["NodeName"]] = rec
            except SlurmError as exc:
                log.warning("scontrol show node: %s", exc)
        return {n: self._nodes.get(n, {}) for n in names}

    def _limits(self, names: Sequence[str]) -> dict[str, NodeLimits]:
        """What Slurm lets a job ask of each of ``names`` (the nodes it knows)."""
        return limits_from_records(rec for rec in self._node_info(names).values() if rec)

    def gres_type(self, node: str, gpu_type: str) -> str | None:
        """The node's Slurm GRES type for apportion's GPU type ``gpu_type`` (None: untyped)."""
        return gres_type_for(node, gpu_type, self._node_info([node])[node], self.cluster)

    # -- launching ---------------------------------------------------------------------
    def _requests(self, alloc: Allocation) -> dict[str, tuple[int, int | None]]:
        """Per node (CPUs, memory MiB): the GPUs' share of the node as the cluster file
        describes it, at most their share of what Slurm says the node has."""
        c = self.cluster
        if c is not None and all(n in c.nodes for n in alloc.placement):
            asked = batch.node_requests(alloc, {n: c.nodes[n].cpus for n in alloc.placement},
                                        {n: c.nodes[n].host_memory_gib for n in alloc.placement},
                                        {n: c.nodes[n].gpus for n in alloc.placement},
                                        self.request_memory)
        else:
            asked = batch.node_requests(alloc, request_memory=self.request_memory)
        return cap_requests(asked, alloc.placement, self._limits(list(alloc.placement)),
                            self.memory_headroom)

    def _progress_now(self, jobdir: Path, builtin: bool) -> int:
        if builtin:
            prog = read_json_file(jobdir / BUILTIN_PROGRESS) or {}
            return int(prog.get("iterations_done") or 0)
        rec = read_progress(jobdir / PROGRESS_FILE_NAME)
        return int(rec["iteration"]) if rec else 0

    def _submit(self, job: JobSpec, alloc: Allocation, action: str, t0: float) -> Event:
        jobdir = self.workdir / job_dirname(job.id)
        launch_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        wl = job.workload
        builtin = wl is None or wl.kind == "builtin"
        try:  # made or checked (no links, this user's, nobody else may write it) first
            confine(jobdir, (CHECKPOINT_DIR_NAME,))
        except UnsafeFolder as exc:
            return self._failed(_Launch(job.id, job.iterations, alloc, "", launch_id, jobdir,
                                        builtin, t0, job.iterations_done, action,
                                        iterations_done=job.iterations_done),
                                f"launch refused: {exc}")
        nodes = sorted(alloc.placement)
        info = self._node_info(nodes)
        sub = submit.build(job, alloc, self.workdir, launch_id=launch_id, action=action,
                           master_addr=info[nodes[0]].get("NodeAddr") or nodes[0],
                           gres_types={n: self.gres_type(n, alloc.gpu_type) for n in nodes},
                           requests=self._requests(alloc), partition=self.partition,
                           options=[f"--comment={COMMENT_PREFIX}{launch_id}",
                                    *self.sbatch_args],
                           python=self.python, grace_s=self.stop_timeout_s,
                           limit_s=self.time_limit_s, margin=self.time_margin, seed=self.seed, threads=self.threads,
                           lr=self.lr, checkpoint_every=self.checkpoint_every)
        if sub.config is not None:
            write_json(jobdir / "config.json", sub.config)
            (jobdir / "STOP").unlink(missing_ok=True)
        launch, world = sub.launch, sub.launch["world"]
        write_json(sub.launch_file, launch)
        cmd = sub.command
        sub.script_file.write_text(sub.script)
        start_it = max(self._progress_now(jobdir, builtin), job.iterations_done)
        prev = self.stopped.pop(job.id, None) or self.runs.pop(job.id, None)
        run_ = _Launch(job.id, job.iterations, alloc, "", launch_id, jobdir, builtin, t0,
                       start_it, action, iterations_done=start_it,
                       history=prev.history if prev else [])
        run_.checkpoint_start = run_.checkpoint
        self._begin(run_)
        try:
            # recorded before sbatch too: a kill between the two leaves a launch id that a
            # restarted executor finds in squeue by the job's comment, never an unknown job
            write_json(jobdir / RECORD_FILE, run_.record())
            out = self._run(cmd).strip()
            slurm_id = out.split(";", 1)[0].strip()
            if not slurm_id.isdigit():
                raise SlurmError(f"sbatch answered {out!r}, not a job id")
        except SlurmError as exc:  # refused (a request no node can satisfy, a bad account...):
            # this launch failed with Slurm's reason; the next poll reports it
            if "no answer within" in str(exc):
                self._cancel_by_comment(launch_id)  # a slow controller may have taken it
            return self._failed(run_, f"sbatch did not accept the launch: {exc}")
        except OSError as exc:
            return self._failed(run_, f"launch failed: {type(exc).__name__}: {exc}")
        run_.slurm_id = slurm_id
        write_json(jobdir / RECORD_FILE, run_.record())
        if run_.logged and run_.log_id is not None:
            self.launch_log.started(run_.log_id, [{"slurm_job_id": slurm_id,
                                                   "nodes": sorted(alloc.placement)}])
        self.runs[job.id] = run_
        self._states_at = -1e9
        log.info("%s %s: slurm job %s, %d ranks on %s", action, job.id, slurm_id, world,
                 ",".join(sorted(alloc.placement)))
        return Event(job.id, action, world, alloc.gpu_type,
                     f"slurm job {slurm_id}: {alloc.plan.label()}",
                     spec={**launch, "sbatch": cmd, "script": str(sub.script_file),
                           "time": sub.time, "slurm_job_id": slurm_id})

    def _cancel_by_comment(self, launch_id: str) -> None:
        """Cancel the Slurm job of ``launch_id`` if sbatch queued it after all (best effort:
        a launch reported failed must leave no job running unwatched)."""
        try:
            text = self._run(["squeue", "--me", "-h", "-t", "all", "-o", "%i|%k"])
            for line in text.splitlines():
                jid, _, comment = line.partition("|")
                if comment.strip() == f"{COMMENT_PREFIX}{launch_id}":
                    self._run(["scancel", jid.split("+")[0].strip()])
        except SlurmError as exc:
            log.warning("launch %s: cannot check whether Slurm queued it (%s)", launch_id, exc)

    # -- the launch log -----------------------------------------------------------------
    def _begin(self, r: _Launch) -> None:
        r.log_id = self.launch_log.begin(r.job_id, self.name, r.action, r.alloc.plan.as_dict(),
                                         dict(r.alloc.placement), str(r.dir), r.checkpoint_start)
        r.logged = True

    def _end(self, r: _Launch, clean: bool = True) -> None:
        """Close the launch's record with how it ended (once; only a record this executor's
        log holds: an adopted launch's record is another store's until a run adopts it)."""
        if not r.logged or r.log_id is None:
            return
        outcome = {Health.FINISHED: "finished", Health.FAILED: "failed"}.get(
            r.health, "checkpointed" if clean else "stopped")
        self.launch_log.ended(r.log_id, outcome, r.error or "", r.checkpoint)
        r.logged = False

    def _failed(self, r: _Launch, why: str) -> Event:
        """A launch that never started: failed with ``why``, its record closed; reported by
        the next poll (the fault policy counts it) and not relaunched before that."""
        r.health, r.error, r.slurm_state = Health.FAILED, why[:4000], "REFUSED"
        log.error("job %s: %s", r.job_id, why)
        if not r.logged:
            self._begin(r)
        self._end(r)
        self.runs.pop(r.job_id, None)
        self.stopped[r.job_id] = r
        return Event(r.job_id, "failed", 0, r.alloc.gpu_type, r.error)

    def reconcile(self, records: Sequence[Any], jobs: Mapping[str, JobSpec],
                  adopt: bool = True) -> list[Reconciled]:
        """The open launch records an earlier run left whose Slurm jobs this executor adopted
        when it started (they still run): adopted, so the run takes them over instead of
        closing them and requeueing their jobs. Every other record is the run's to close."""
        if not adopt:
            return []  # --orphans stop: stop_adopted() stops them; their records close then
        mine = {r.log_id: r for j, r in self.runs.items()
                if j in self._adopted and r.log_id is not None}
        out = []
        for rec in records:
            r = mine.get(int(rec.id if hasattr(rec, "id") else rec["id"]))
            if r is None:
                continue
            r.logged = True  # this run's log holds its record now
            out.append(Reconciled(int(r.log_id or 0), r.job_id, "adopted", None, r.checkpoint,
                                  f"slurm job {r.slurm_id} ({r.slurm_state})"))
        return out

    # -- stopping ------------------------------------------------------------------------
    def _stop(self, runs: Sequence[_Launch], checkpoint: bool = True,
              why: str = "stop") -> dict[str, bool]:
        """Stop jobs together: TERM (checkpoint), wait ``grace_s``, then cancel. True: clean."""
        states = self._query(force=True) or {}
        for r in runs:
            r.stop_requested = True
            if r.logged and r.log_id is not None:
                self.launch_log.stopping(r.log_id, why)
            st = states.get(r.slurm_id, ("", ""))[0]
            args = ["scancel", r.slurm_id]
            if checkpoint and st not in ("PENDING", "CONFIGURING"):
                args = ["scancel", "--signal=TERM", r.slurm_id]  # the steps' tasks, not the script
            try:
                self._run(args)
            except SlurmError as exc:  # already completing or gone
                log.info("%s: %s", r.job_id, exc)
        # the agents SIGKILL ranks still running after the grace, so the jobs end by themselves;
        # a job that does not (an agent that hangs, a step not started) is cancelled
        ended = {r.job_id: self._wait_ended(r, self.stop_timeout_s + BACKSTOP_S) for r in runs}
        late = [r for r in runs if not ended[r.job_id]]
        for r in late:
            log.warning("%s: slurm job %s still running %gs after SIGTERM; scancel", r.job_id,
                        r.slurm_id, self.stop_timeout_s + BACKSTOP_S)
            try:
                self._run(["scancel", r.slurm_id])
            except SlurmError as exc:
                log.info("%s: %s", r.job_id, exc)
        for r in late:
            if not self._wait_ended(r, 120.0):
                log.error("%s: slurm job %s did not end after scancel", r.job_id, r.slurm_id)
        clean = {}
        states = self._query(force=True) or {}
        for r in runs:
            self._settle(r, states.get(r.slurm_id))
            killed = any(e.get("killed_after_grace") for e in self._exits(r))
            clean[r.job_id] = ended[r.job_id] and not killed
            self._end(r, clean[r.job_id])
            self.runs.pop(r.job_id, None)
            self.stopped[r.job_id] = r
        return clean

    def _wait_ended(self, r: _Launch, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            states = self._query(force=True)
            st = states.get(r.slurm_id) if states is not None else ("UNKNOWN", "")
            if st is None or st[0] not in ACTIVE_STATES | {"UNKNOWN"}:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)

    # -- reading results -------------------------------------------------------------------
    def _exits(self, r: _Launch) -> list[dict[str, Any]]:
        out = []
        for n in sorted(r.alloc.placement):
            rec = read_json_file(exit_path(r.dir, r.launch_id, n))
            if rec:
                out.append(rec)
        return out

    def _stderr_tail(self, r: _Launch, rank: int) -> str:
        try:
            text = (r.dir / f"rank{rank}.stderr").read_text(errors="replace")
        except OSError:
            return ""
        marker = launch_marker(r.launch_id)
        if marker in text:
            text = text.rsplit(marker, 1)[1].split("\n", 1)[-1]
        return "\n".join(text.strip().splitlines()[-STDERR_LINES:])

    def _failure(self, r: _Launch, state: str, exits: list[dict[str, Any]]) -> str:
        for e in exits:
            for rank in e.get("failed", []):
                code = e["codes"].get(str(rank))
                tail = self._stderr_tail(r, int(rank))
                return (f"rank {rank} on {e['node']} exited with {code} (slurm job {r.slurm_id} "
                        f"{state or 'ended'})" + (f": {tail}" if tail else ""))
        try:  # no rank failed by itself: the agent or Slurm did
            text = (r.dir / f"slurm-{r.slurm_id}.out").read_text(errors="replace")
        except OSError:
            text = ""
        tail = "\n".join(text.strip().splitlines()[-STDERR_LINES:])
        return f"slurm job {r.slurm_id} {state or 'ended'}" + (f": {tail}" if tail else "")

    def _read_progress(self, r: _Launch) -> None:
        now = time.time()
        if r.builtin:
            prog = read_json_file(r.dir / BUILTIN_PROGRESS) or {}
            if prog:
                r.iterations_done = max(r.start_iteration, int(prog.get("iterations_done") or 0))
                r.loss = prog.get("loss")
                r.grad_stats = gradient_stats(prog) or r.grad_stats
                if prog.get("launch_id") == r.launch_id:
                    r.iter_time_s = prog.get("iter_time_s") or r.iter_time_s
                    if prog.get("first_step_wall") and r.first_seen is None:
                        r.first_seen = (r.iterations_done, float(prog["first_step_wall"]))
            return
        rec = read_progress(r.dir / PROGRESS_FILE_NAME)
        if rec is None:
            return
        it = int(rec["iteration"])
        r.iterations_done = it
        r.loss = rec.get("loss") if isinstance(rec.get("loss"), (int, float)) else r.loss
        r.grad_stats = gradient_stats(rec) or r.grad_stats
        if it > r.start_iteration:
            wall = float(rec["wall"]) if isinstance(rec.get("wall"), (int, float)) else now
            if r.first_seen is None:
                r.first_seen = (it, wall)
            given = rec.get("iter_time_s", rec.get("time_s"))
            if isinstance(given, (int, float)) and given > 0:
                r.iter_time_s = float(given)
            elif it > r.first_seen[0]:
                r.iter_time_s = (wall - r.first_seen[1]) / (it - r.first_seen[0])

    def _settle(self, r: _Launch, st: tuple[str, str] | None) -> None:
        """A launch that ended: finished, checkpointed or failed (with its reason)."""
        self._read_progress(r)
        state = st[0] if st else ""
        exits = self._exits(r)
        failed = any(e.get("failed") for e in exits)
        ok_end = state in ("COMPLETED", "") and not failed and (exits or state == "COMPLETED")
        if r.iterations_done >= r.iterations and not failed:
            r.health = Health.FINISHED
        elif (r.stop_requested or any(e.get("stop_requested") for e in exits)) and (
                not failed or state == "CANCELLED"):  # asked to stop: by this executor, the
            r.health = Health.CHECKPOINTED  # run before it, or Slurm (preemption, time limit)
        elif ok_end:  # exited 0 short of its target unasked: a failure, so a workload that
            # does it counts towards --max-retries instead of being relaunched for ever
            r.health = Health.FAILED
            r.error = (f"the workload exited 0 at iteration {r.iterations_done} of "
                       f"{r.iterations} without being asked to stop (slurm job {r.slurm_id}; "
                       "it must train to APPORTION_ITERATIONS, or checkpoint and exit 0 on "
                       "SIGTERM)")
        else:
            r.health = Health.FAILED
            r.error = self._failure(r, state, exits)
        r.slurm_state = state or "GONE"

    def _adopt(self) -> None:
        """Take over the jobs a previous executor on this work folder left in Slurm."""
        records = []
        for d in sorted(p for p in self.workdir.iterdir() if p.is_dir()):
            rec = read_json_file(d / RECORD_FILE)
            if isinstance(rec, dict) and rec.get("launch_id"):
                records.append((d, rec))
        if not records:
            return
        by_comment: dict[str, str] = {}
        try:
            text = self._run(["squeue", "--me", "-h", "-t", "all", "-o", "%i|%T|%r|%k"])
            states: dict[str, tuple[str, str]] | None = squeue_states(text)
            by_comment = {ln.split("|")[3].strip(): ln.split("|")[0].split("+")[0]
                          for ln in text.splitlines() if ln.count("|") >= 3}
        except SlurmError as exc:
            log.warning("cannot ask Slurm about earlier jobs in %s (%s): taking them as "
                        "running until it answers", self.workdir, exc)
            states = None
        for d, rec in records:
            try:
                r = _Launch(str(rec["job"]), int(rec["iterations"]),
                            allocation_from_dict(rec["allocation"]), str(rec["slurm_job_id"]),
                            str(rec["launch_id"]), d, bool(rec["builtin"]),
                            float(rec["decision_wall"]), int(rec["start_iteration"]),
                            str(rec.get("action", "start")),
                            log_id=int(rec["log_id"]) if rec.get("log_id") is not None else None,
                            checkpoint_start=int(rec.get("checkpoint_start") or 0))
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("%s: unreadable launch record (%s); ignored", d / RECORD_FILE, exc)
                continue
            if not r.slurm_id:  # killed between recording and sbatch: find it by its comment
                r.slurm_id = by_comment.get(f"{COMMENT_PREFIX}{r.launch_id}", "") if states else ""
                if not r.slurm_id:
                    continue  # never submitted
            st = states.get(r.slurm_id) if states is not None else ("UNKNOWN", "")
            if st is not None and st[0] in ACTIVE_STATES | {"UNKNOWN"}:
                r.slurm_state = st[0]
                self.runs[r.job_id] = r
                self._adopted.add(r.job_id)
                log.warning("adopted %s: slurm job %s (%s) from an earlier run", r.job_id,
                            r.slurm_id, st[0])
            else:  # it ended while no executor watched it: report how
                self._settle(r, st)
                self.stopped[r.job_id] = r

    # -- the protocol ------------------------------------------------------------------
    def apply(self, decision: Decision, state: Sequence[JobSpec]) -> list[Event]:
        t0 = time.time()
        if not self._checked:
            self._checked = True
            self.check_cluster()
        self._states_at = -1e9  # decide on Slurm's state now, not a cached one
        with self.failures.quiet():
            self.poll()
        held = self.failures.unseen(self.stopped)
        by_id = {j.id: j for j in state}
        finished = {j for j, r in self.stopped.items() if r.health == Health.FINISHED}
        steps = actions_for(decision, self.runs, self.runs, finished)
        events: list[Event] = []
        stopping = [self.runs[s.job] for s in steps if s.job in self.runs and s.action in
                    (Action.PREEMPT, Action.RESIZE, Action.MIGRATE)]
        why = {s.job: s.action.value for s in steps}
        clean = self._stop(stopping, why=",".join(sorted({why[r.job_id] for r in stopping}))) \
            if stopping else {}
        for s in steps:
            if s.action == Action.PREEMPT:
                r = self.stopped[s.job]
                events.append(Event(s.job, "preempt", 0, r.alloc.gpu_type,
                                    "checkpointed" if clean.get(s.job) else
                                    f"killed after the {self.stop_timeout_s:g}s grace"))
        for s in steps_to_launch(steps, held, events):
            done = self.stopped.get(s.job)
            if done is not None and done.health == Health.FINISHED:  # ended while being stopped
                events.append(Event(s.job, "finished", 0, s.allocation.gpu_type,
                                    "reached its iterations before the change"))
                continue
            job = by_id.get(s.job)
            if job is None:
                raise KeyError(f"decision allocates unknown job {s.job!r}")
            action = "restart" if s.restart else s.action.value
            try:
                events.append(self._submit(job, s.allocation, action, t0))
            except Exception as exc:  # noqa: BLE001 - a launch that cannot even be written
                # (its folder, its files) is this job's failure, never the run's
                failed = _Launch(job.id, job.iterations, s.allocation, "",
                                 f"unsubmitted-{uuid.uuid4().hex[:8]}",
                                 self.workdir / job_dirname(job.id),
                                 job.workload is None or job.workload.kind == "builtin", t0,
                                 job.iterations_done, action, iterations_done=job.iterations_done)
                events.append(self._failed(failed, f"launch failed: {type(exc).__name__}: {exc}"))
        return events

    def poll(self) -> list[Progress]:
        states = self._query() if self.runs else None
        if states is not None:
            for job_id, r in list(self.runs.items()):
                st = states.get(r.slurm_id)
                if st is None or st[0] not in ACTIVE_STATES:
                    self._settle(r, st)
                    self._end(r)
                    self.stopped[job_id] = self.runs.pop(job_id)
                    continue
                r.slurm_state, r.slurm_reason = st
                self._read_progress(r)
                if st[0] == "RUNNING" and r.first_seen is not None:
                    r.health = Health.RUNNING
                    if r.overhead_s is None:
                        r.overhead_s = max(0.0, r.first_seen[1] - r.decision_wall)
                        r.history.append((r.action, r.overhead_s))
        out = []
        for job_id in sorted(set(self.runs) | set(self.stopped)):
            r = self.runs.get(job_id) or self.stopped[job_id]
            out.append(Progress(job_id, r.iterations_done, r.iterations, r.health, r.iter_time_s,
                                r.loss, r.alloc.plan.gpus, r.alloc.plan.label(), r.overhead_s,
                                r.error, launch_id=r.launch_id, grad_stats=r.grad_stats,
                                batch=r.alloc.global_batch_size))
        return self.failures.saw(out)

    def shutdown(self, checkpoint: bool = True) -> list[Event]:
        runs = list(self.runs.values())
        clean = self._stop(runs, checkpoint, why="shutdown") if runs else {}
        return [Event(r.job_id, "preempt", 0, r.alloc.gpu_type,
                      ("checkpointed on shutdown" if checkpoint else "cancelled on shutdown")
                      if clean.get(r.job_id) else "killed after the grace period")
                for r in runs]

    def overheads(self) -> dict[str, list[tuple[str, float]]]:
        """(action, seconds from the decision to the relaunched job's first step) per launch."""
        self.poll()
        return {j: list(r.history) for j, r in {**self.stopped, **self.runs}.items() if r.history}

    def slurm_job(self, job_id: str) -> str | None:
        """The Slurm job id of ``job_id``'s current (or last) launch."""
        r = self.runs.get(job_id) or self.stopped.get(job_id)
        return r.slurm_id if r else None


def from_environment(workdir: Path, cluster: Cluster,
                     launch_log: LaunchLog | None = None) -> SlurmExecutor:
    """The executor ``apportion run --executor slurm`` builds; site settings from variables:
    ``APPORTION_SLURM_PARTITION``, ``APPORTION_SLURM_SBATCH_ARGS`` (shell words, e.g.
    ``--account=lab --qos=normal``), ``APPORTION_SLURM_GRACE_S`` (default 60),
    ``APPORTION_SLURM_PYTHON`` (the interpreter on the nodes), and the time limit:
    ``APPORTION_SLURM_TIME_LIMIT`` (a Slurm time for every job) or
    ``APPORTION_SLURM_TIME_MARGIN`` (the share added to each job's estimated remaining
    time, default 0.25)."""
    env = os.environ
    try:
        grace = float(env.get("APPORTION_SLURM_GRACE_S", "60"))
    except ValueError:
        raise InputError("APPORTION_SLURM_GRACE_S", "grace", "not a number of seconds") from None
    limit = env.get("APPORTION_SLURM_TIME_LIMIT")
    limit_s = submit.parse_time(limit, "APPORTION_SLURM_TIME_LIMIT") if limit else None
    try:
        margin = float(env.get("APPORTION_SLURM_TIME_MARGIN", str(submit.TIME_MARGIN)))
    except ValueError:
        margin = -1.0
    if not (0.0 <= margin <= 100.0):
        raise InputError("APPORTION_SLURM_TIME_MARGIN", "margin", "not a share between 0 and "
                         "100 (0.25: a quarter more than the estimate)")
    return SlurmExecutor(workdir, cluster=cluster, partition=env.get("APPORTION_SLURM_PARTITION"),
                         sbatch_args=shlex.split(env.get("APPORTION_SLURM_SBATCH_ARGS", "")),
                         grace_s=grace, python=env.get("APPORTION_SLURM_PYTHON", sys.executable),
                         launch_log=launch_log, time_limit_s=limit_s, time_margin=margin)
