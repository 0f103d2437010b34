"""The workload contract: what every rank of a job is given, and small helpers for user scripts.

A job's ``workload`` (see :class:`apportion.jobs.Workload`) is apportion's
built-in trainer or the user's own command. Every rank of every executor
(local, Slurm, Ray, Kubernetes) gets the same environment:

* torchrun's variables: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``;
* apportion's: ``APPORTION_JOB_ID``, ``APPORTION_PLAN`` (JSON with at least
  dp, tp, pp, micro_batches, zero, offload, accumulation, checkpointing),
  ``APPORTION_ITERATIONS`` (the target), ``APPORTION_CHECKPOINT_DIR`` and
  ``APPORTION_PROGRESS_FILE`` (rank 0 appends one JSON line per step with at
  least ``{"iteration": N}``).

A workload resumes from its checkpoint directory, checkpoints and exits 0 on
SIGTERM within the grace period, and exits 0 when it reaches the target.

This module is imported inside user training scripts, so it imports nothing
heavy (no torch, no numpy) at module level.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ENV_JOB_ID = "APPORTION_JOB_ID"
ENV_PLAN = "APPORTION_PLAN"
ENV_ITERATIONS = "APPORTION_ITERATIONS"
ENV_CHECKPOINT_DIR = "APPORTION_CHECKPOINT_DIR"
ENV_PROGRESS_FILE = "APPORTION_PROGRESS_FILE"
PROGRESS_FILE_NAME = "progress.jsonl"
CHECKPOINT_DIR_NAME = "checkpoint"


def plan_json(plan: Any) -> str:
    """``APPORTION_PLAN``: the plan's fields, plus the contract's short names."""
    d = dict(plan.as_dict())
    d.setdefault("zero", d.get("zero_stage", 0))
    return json.dumps(d, sort_keys=True)


def job_env(job_id: str, plan: Any, iterations: int, jobdir: str | Path, world: int,
            master_addr: str, master_port: int) -> dict[str, str]:
    """The variables every rank of one launch shares (paths inside the job's own folder)."""
    d = Path(jobdir)
    return {"WORLD_SIZE": str(world), "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
            ENV_JOB_ID: job_id, ENV_PLAN: plan_json(plan), ENV_ITERATIONS: str(int(iterations)),
            ENV_CHECKPOINT_DIR: str(d / CHECKPOINT_DIR_NAME),
            ENV_PROGRESS_FILE: str(d / PROGRESS_FILE_NAME)}


def rank_env(rank: int, local_rank: int, local_world: int) -> dict[str, str]:
    """The variables that differ between ranks."""
    return {"RANK": str(rank), "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_world)}


# -- inside a workload ----------------------------------------------------------------------
def plan() -> dict[str, Any]:
    """The execution plan this launch runs (``APPORTION_PLAN``); DP-only when unset."""
    raw = os.environ.get(ENV_PLAN)
    return json.loads(raw) if raw else {"dp": int(os.environ.get("WORLD_SIZE", "1")), "tp": 1,
                                        "pp": 1, "micro_batches": 1, "zero": 0, "offload": False,
                                        "accumulation": 1, "checkpointing": False}


def iterations() -> int:
    """The job's target iteration count (``APPORTION_ITERATIONS``)."""
    return int(os.environ[ENV_ITERATIONS])


def checkpoint_dir() -> Path:
    """Where to save and resume from (created if missing)."""
    p = Path(os.environ.get(ENV_CHECKPOINT_DIR, "checkpoint"))
    p.mkdir(parents=True, exist_ok=True)
    return p


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def report_progress(iteration: int, **fields: Any) -> None:
    """Rank 0 appends ``{"iteration": N, ...}`` to the progress file; other ranks do nothing."""
    if rank() != 0:
        return
    path = os.environ.get(ENV_PROGRESS_FILE)
    if not path:
        return
    line = json.dumps({"iteration": int(iteration), **fields}, sort_keys=True)
    with open(path, "a", encoding="utf-8") as fh:  # one write per line: readers see whole lines
        fh.write(line + "\n")


def read_progress(path: str | Path) -> dict[str, Any] | None:
    """The last complete progress line of a workload (executors read this), or None."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 65536))
            tail = fh.read().decode("utf-8", "replace")
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        return None
    for line in reversed(tail.splitlines() if tail.endswith("\n") else tail.splitlines()[:-1]):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("iteration"), int):
            return rec
    return None
