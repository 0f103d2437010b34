"""The Slurm executor's room: one ``sbatch`` per allocation (:mod:`.executor`), the batch
script and its submission (:mod:`.batch`, :mod:`.submit`), the per-node agent
(:mod:`.task`), Slurm's commands and node limits (:mod:`.commands`, :mod:`.nodes`),
``apportion export slurm`` (:mod:`.export`), ``apportion cluster import --from slurm``
(:mod:`.importer`), and a private Slurm cluster on this machine for tests
(:mod:`.local_cluster`).

The agent (``python -m apportion.runtime.executors.slurm.task``) runs on every node of a
job: this file stays light, importing the executor only when one is built."""

from __future__ import annotations

from pathlib import Path

from apportion.runtime.executors.executor import Executor, LaunchLog
from apportion.runtime.executors.registry import ExecutorType, register

from apportion.cluster import Cluster


def build(workdir: Path, cluster: Cluster, launch_log: LaunchLog | None) -> Executor:
    """``--executor slurm``: site settings from the ``APPORTION_SLURM_*`` variables."""
    from apportion.runtime.executors.slurm.executor import from_environment

    return from_environment(workdir, cluster, launch_log=launch_log)


SLURM = register(ExecutorType(
    "slurm", "one sbatch per allocation with typed GRES, pinned to the decision's nodes "
    "(site settings: APPORTION_SLURM_*)", build,
    needs="Slurm's sbatch, squeue, scancel and scontrol; a work folder every node sees"))
