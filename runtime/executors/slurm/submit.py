"""One allocation's Slurm submission, written once: the batch script with its ``#SBATCH`` lines.

``apportion run --executor slurm`` submits it (``sbatch --parsable SCRIPT``: every option
is in the script) and ``apportion export slurm`` writes it for an operator to read and
resubmit (``sbatch SCRIPT``), so what the operator reviews is what the executor submits:

* the job's options (name, folder, output, ``--no-requeue``, the partition, the site's
  options) and, per component (:mod:`.slurm_batch`: nodes asking the same thing), the
  nodes, GRES, CPUs and memory; components after the first follow ``#SBATCH hetjob``;
* ``--time``: the operator's limit, or the job's estimated remaining time (iterations
  left x the decision's iteration time) plus :data:`TIME_MARGIN` and :data:`STARTUP_S`,
  rounded up to a minute, which backfill needs to start jobs early; with a limit,
  ``--signal=TERM@<grace>`` asks the workers to checkpoint before Slurm ends the job
  (the run reads that as a checkpoint, not a failure). Without an estimate or a limit
  the partition's default applies, and the script says so;
* one ``srun`` step: one task per node running the node agent
  (:mod:`.slurm_task`) on the launch file the submission writes beside it.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apportion.runtime.cluster_import import GpuNames
from apportion.runtime.executors.slurm import batch
from apportion.runtime.executors.launch import launch_spec
from apportion.runtime.executors.slurm.commands import parse_gres
from apportion.runtime.workload import job_env

from apportion.cluster import Cluster
from apportion.decision import Allocation
from apportion.errors import InputError
from apportion.jobs import JobSpec, job_dirname

AGENT_MODULE = "apportion.runtime.executors.slurm.task"
TIME_MARGIN = 0.25  # of the estimated remaining time
STARTUP_S = 600.0  # start-up and checkpoint restore, on top of the estimate
_SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def format_time(seconds: float) -> str:
    """Slurm's ``D-HH:MM:SS`` (``HH:MM:SS`` under a day), rounded up to a whole minute."""
    minutes = max(1, math.ceil(seconds / 60.0 - 1e-9))
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00" if days else f"{hours:02d}:{mins:02d}:00"


def parse_time(text: str, flag: str = "--time-limit") -> int:
    """Seconds of a Slurm time: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``,
    ``D-HH:MM:SS``; anything else is an :class:`InputError` naming ``flag``."""
    m = _SLURM_TIME.match(text.strip())
    if not m:
        raise InputError(flag, flag.lstrip("-").replace("-", "_"), f"{text!r} is not a Slurm "
                         "time (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)")
    d, a, b, c = m.groups()
    if d is not None:  # D-HH[:MM[:SS]]
        secs = int(d) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:  # HH:MM:SS
        secs = int(a) * 3600 + int(b) * 60 + int(c)
    elif b is not None:  # MM:SS
        secs = int(a) * 60 + int(b)
    else:  # MM
        secs = int(a) * 60
    if secs <= 0:
        raise InputError(flag, flag.lstrip("-").replace("-", "_"), f"{text!r}: a time limit "
                         "must be positive")
    return secs


def estimated_remaining_s(job: JobSpec, alloc: Allocation) -> float | None:
    """Iterations left times the decision's iteration time (None: the decision has none)."""
    if not alloc.iter_time_s or alloc.iter_time_s <= 0:
        return None
    return max(0, job.iterations - job.iterations_done) * float(alloc.iter_time_s)


def time_limit(job: JobSpec, alloc: Allocation, limit_s: float | None = None,
               margin: float = TIME_MARGIN) -> tuple[str | None, str]:
    """``--time``'s value and where it came from (the operator's limit, or the estimate)."""
    if limit_s is not None:
        return format_time(limit_s), "the operator's limit"
    est = estimated_remaining_s(job, alloc)
    if est is None:
        return None, "no estimate in the decision (iter_time_s): the partition's default"
    why = (f"estimated remaining {est / 3600:.2f} h (iterations left x "
           f"{alloc.iter_time_s:.4g} s) + {margin:.0%} + {STARTUP_S / 60:.0f} min")
    return format_time(est * (1.0 + margin) + STARTUP_S), why


def gres_type_for(node: str, gpu_type: str, record: Mapping[str, str] | None,
                  cluster: Cluster | None) -> str | None:
    """The node's GRES type for apportion's ``gpu_type`` (None: untyped GRES): Slurm's own
    (``scontrol show node``'s ``Gres``), else the imported cluster's ``gpu_type_raw``, else
    the catalog name in lower case."""
    gres = [g for g in parse_gres((record or {}).get("Gres", "")) if g.name == "gpu"]
    types = sorted({g.type for g in gres if g.type})
    if len(types) == 1:
        return types[0]
    if len(types) > 1:
        names = GpuNames()
        match = [t for t in types if names.lookup(t) == gpu_type]
        if match:
            return match[0]
    if cluster is not None:
        for g in cluster.groups:
            if node in g.node_names() and g.label("gpu_type_raw"):
                return g.label("gpu_type_raw")
    return None if gres else gpu_type.lower()


def _directive(option: str) -> str:
    """One ``#SBATCH`` line; a value with blanks or quotes is quoted as Slurm reads it."""
    if re.search(r'[\s"\\]', option):
        name, eq, value = option.partition("=")
        quoted = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        option = f"{name}={quoted}" if eq else quoted
    return f"#SBATCH {option}"


def directives(comps: Sequence[batch.Component], common: Sequence[str]) -> list[str]:
    """The job's options, then each component's, ``#SBATCH hetjob`` between components."""
    lines = [_directive(o) for o in common]
    for i, c in enumerate(comps):
        if i:
            lines.append("#SBATCH hetjob")
        lines += [_directive(o) for o in c.options()]
    return lines


@dataclass(frozen=True)
class Submission:
    """Everything one submission writes and runs."""

    jobdir: Path
    launch: dict[str, Any]  # the node agents' launch file
    launch_file: Path
    config: dict[str, Any] | None  # the built-in trainer's config.json (None: a user command)
    script: str
    script_file: Path
    components: list[batch.Component]
    time: str | None  # --time, or None (the partition's default)
    time_source: str

    @property
    def command(self) -> list[str]:
        """What submits it: every option is in the script."""
        return ["sbatch", "--parsable", str(self.script_file)]


def build(job: JobSpec, alloc: Allocation, workdir: Path, *, launch_id: str, action: str = "start",
          master_addr: str, gres_types: Mapping[str, str | None],
          requests: Mapping[str, tuple[int, int | None]], partition: str | None = None,
          options: Sequence[str] = (), python: str = "python3", grace_s: float = 60.0,
          limit_s: float | None = None, margin: float = TIME_MARGIN, seed: int = 0,
          threads: int = 1, lr: float = 1e-3, checkpoint_every: int = 0,
          script_file: Path | None = None, written_by: str = "apportion run --executor slurm"
          ) -> Submission:
    """The submission of ``alloc`` for ``job``: its launch file, config and batch script.

    ``workdir`` holds the job's folder (checkpoints, progress, logs: on storage every node
    sees); the launch file goes there as ``slurm-launch-<launch_id>.json`` and the script,
    unless ``script_file`` says otherwise, as ``slurm-<launch_id>.sh``."""
    jobdir = workdir / job_dirname(job.id)
    layout = batch.rank_layout(alloc.placement)
    world = sum(len(n["ranks"]) for n in layout)
    wl = job.workload
    builtin = wl is None or wl.kind == "builtin"
    env: dict[str, str] = {"OMP_NUM_THREADS": str(threads)}
    config = None
    if builtin:
        spec = launch_spec(job, alloc, action, workdir, master_addr=master_addr, python=python,
                           seed=seed, threads=threads, lr=lr, checkpoint_every=checkpoint_every,
                           launch_id=launch_id)
        config = spec.config
        command, cwd = spec.command, str(jobdir)
        env.update({k: v for k, v in spec.env.items() if k not in ("MASTER_PORT",)})
    else:
        command = list(wl.command)
        cwd = str(Path(wl.workdir).resolve()) if wl.workdir else str(jobdir)
    if wl is not None:
        env.update(wl.env)
    env.update(job_env(job.id, alloc.plan, job.iterations, jobdir, world, master_addr, 0))
    env.pop("MASTER_PORT")  # the first node's agent picks a port free there
    env.update({"APPORTION_GPU_TYPE": alloc.gpu_type, "APPORTION_LAUNCH_ID": launch_id})
    launch_file = jobdir / f"slurm-launch-{launch_id}.json"
    launch = {"job": job.id, "launch_id": launch_id, "jobdir": str(jobdir), "command": command,
              "cwd": cwd, "env": env, "nodes": layout, "world": world,
              "master_addr": master_addr, "kill_grace_s": grace_s}
    comps = batch.components(alloc.placement, gres_types, requests)
    time, why = time_limit(job, alloc, limit_s, margin)
    extra = list(options)
    if time is not None:
        extra += [f"--time={time}", f"--signal=TERM@{max(1, int(grace_s))}"]
    common = batch.common_options(f"{batch.JOB_NAME_PREFIX}{job_dirname(job.id)}", jobdir,
                                  partition, extra)
    script_file = script_file or jobdir / f"slurm-{launch_id}.sh"
    het = [f"--het-group=0-{len(comps) - 1}"] if len(comps) > 1 else []
    srun = ["srun", *het, "--kill-on-bad-exit=1", "--ntasks-per-node=1", python, "-m",
            AGENT_MODULE, str(launch_file)]
    nodes = ", ".join(f"{n} x{k}" for n, k in sorted(alloc.placement.items()))
    again = shlex.quote(str(script_file))
    lines = ["#!/bin/bash",
             (f"# apportion job {job.id}: {alloc.gpus} x {alloc.gpu_type} ({nodes}), plan "
              f"{alloc.plan.label()}"),
             f"# written by {written_by}; submit it again with: sbatch {again}",
             f"# --time: {why}",
             *directives(comps, common), "",
             " ".join(shlex.quote(a) for a in srun), ""]
    return Submission(jobdir, launch, launch_file, config, "\n".join(lines), script_file, comps,
                      time, why)
