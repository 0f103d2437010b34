"""What ``submit`` stores: the jobs of a submit document, stamped with the store's clock.

One function shared by ``apportion submit`` (a YAML file) and ``POST /api/v1/jobs`` of
``apportion serve`` (a YAML or JSON body), so both accept exactly the same documents and
refuse bad ones with the same :class:`~apportion.errors.InputError` naming the field.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from apportion.config import jobs_from_data
from apportion.jobs import JobSpec


def jobs_to_submit(data: Any, source: str, now: float) -> list[JobSpec]:
    """The validated jobs of ``data`` (the jobs-YAML format); a job that gives no
    ``submit_time_s`` was submitted ``now``, the wall clock rounds schedule by, so queue
    bonuses see its real wait rather than a wait since the epoch."""
    jobs, _ = jobs_from_data(data, source)
    raw = data.get("jobs", []) if isinstance(data, dict) else []
    return [j if isinstance(r, dict) and "submit_time_s" in r
            else dataclasses.replace(j, submit_time_s=now) for j, r in zip(jobs, raw)]
