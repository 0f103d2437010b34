"""The Ray executor's room: actors in placement groups (:mod:`.executor`) and ``apportion
cluster import --from ray`` (:mod:`.importer`)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from apportion.runtime.executors.executor import Executor, LaunchLog
from apportion.runtime.executors.registry import ExecutorType, register

from apportion.cluster import Cluster
from apportion.errors import InputError

#: how long a placement group may wait for its resources before that launch fails (an
#: autoscaling cluster adding nodes may need longer than the default minute)
PLACEMENT_TIMEOUT_ENV = "APPORTION_RAY_PLACEMENT_TIMEOUT_S"


def env_seconds(name: str, default: float) -> float:
    """A positive number of seconds from the environment variable ``name`` (exit 2 if not)."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise InputError(name, name, f"must be a positive number of seconds, got {raw!r}")
    return value


def check(options: dict[str, Any]) -> None:
    """The placement wait's variable, before the run opens anything."""
    env_seconds(PLACEMENT_TIMEOUT_ENV, 60.0)


def build(workdir: Path, cluster: Cluster, launch_log: LaunchLog | None,
          options: dict[str, Any]) -> Executor:
    """``--executor ray``: joins ``--ray-address`` (``$RAY_ADDRESS``), or starts a Ray of
    its own on this machine."""
    from apportion.runtime.executors.ray.executor import RayExecutor

    opts = dict(options)
    return RayExecutor(workdir, cluster=cluster, address=opts.pop("ray_address", None),
                       launch_log=launch_log,
                       placement_timeout_s=env_seconds(PLACEMENT_TIMEOUT_ENV, 60.0), **opts)


RAY = register(ExecutorType(
    "ray", "actors in placement groups, one bundle per node of the placement, on a Ray "
    "cluster (--ray-address) or a Ray of its own", build,
    reads=("stop_timeout_s", "checkpoint_every", "checkpoint_interval_s", "ray_address"),
    check=check, needs="apportion[ray]"))
