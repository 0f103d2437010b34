"""The dry-run executor's room: each round's launch specs printed, nothing run
(:mod:`.executor`)."""

from __future__ import annotations

from pathlib import Path

from apportion.runtime.executors.executor import Executor
from apportion.runtime.executors.registry import ExecutorType, register


def build(workdir: Path) -> Executor:
    """``--executor dry-run``: prints each launch's spec as a JSON line on stdout."""
    from apportion.runtime.executors.dry_run.executor import DryRunExecutor

    return DryRunExecutor(workdir)


DRY_RUN = register(ExecutorType(
    "dry-run", "prints each launch spec as a JSON line and runs nothing (no job progresses)",
    build, device=None))
