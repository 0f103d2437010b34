"""The Slurm agent under its former name: batch scripts that ``apportion export slurm``
wrote before the Slurm room (``runtime/executors/slurm/``) run ``python -m
apportion.runtime.executors.slurm_task LAUNCH.json``, and resubmitted they must still
start their ranks; it is :mod:`apportion.runtime.executors.slurm.task`."""

from __future__ import annotations

import sys

from apportion.runtime.executors.slurm.task import main

if __name__ == "__main__":
    sys.exit(main())
