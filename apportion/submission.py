"""What ``submit`` stores: the jobs of a submit document, stamped with the store's clock.

One rule shared by ``apportion submit`` (a queue file: the jobs YAML or JSON lines) and
``POST /api/v1/jobs`` of ``apportion serve`` (a YAML or JSON body), so both accept
exactly the same jobs and refuse bad ones with the same
:class:`~apportion.errors.InputError` naming the field.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from apportion.config import jobs_from_data, load_queue
from apportion.jobs import JobSpec


def stamped(jobs: list[JobSpec], timed: list[bool], now: float) -> list[JobSpec]:
    """A job that gives no ``submit_time_s`` was submitted ``now``, the wall clock rounds
    schedule by, so queue bonuses see its real wait rather than a wait since the epoch."""
    return [j if t else dataclasses.replace(j, submit_time_s=now) for j, t in zip(jobs, timed)]


def jobs_to_submit(data: Any, source: str, now: float) -> list[JobSpec]:
    """The validated jobs of ``data`` (the jobs-YAML format), stamped (:func:`stamped`)."""
    jobs, _ = jobs_from_data(data, source)
    raw = data.get("jobs", []) if isinstance(data, dict) else []
    return stamped(jobs, [isinstance(r, dict) and "submit_time_s" in r for r in raw], now)


def queue_to_submit(path: str | Path, now: float, max_bytes: int | None = None) -> list[JobSpec]:
    """The validated jobs of a queue file (YAML or JSON lines:
    :func:`apportion.config.load_queue`), stamped (:func:`stamped`)."""
    q = load_queue(path, max_bytes)
    return stamped(q.jobs, q.timed, now)
