"""The local executor's room: worker process groups on this machine (:mod:`.executor`) and
the GPUs this machine offers them (:mod:`.gpus`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from apportion.runtime.executors.executor import Executor, LaunchLog
from apportion.runtime.executors.registry import ExecutorType, register


def build(workdir: Path, launch_log: LaunchLog | None, options: dict[str, Any]) -> Executor:
    """``--executor local``: the run's grace period and checkpoint settings, where given."""
    from apportion.runtime.executors.local.executor import LocalExecutor

    return LocalExecutor(workdir, launch_log=launch_log, **options)


LOCAL = register(ExecutorType(
    "local", "worker process groups on this machine (a GPU of its own per rank, or the CPU)",
    build, reads=("stop_timeout_s", "checkpoint_every", "checkpoint_interval_s"),
    device=None, needs="apportion[torch] for apportion's own trainer"))
