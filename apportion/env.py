"""The environment variables apportion reads, each with one rule used everywhere
(:data:`VARIABLES` names them all; the rules of the first few are here).

* ``APPORTION_DATA``: the real data sets (traces, measured tables) -- default
  ``../shared/data`` beside the repository. Every reader (traces, ground truths, the
  estimator benchmarks, the fine-tuning comparison) asks :func:`data_root` at call time.
* ``APPORTION_CACHE``: the on-disk profile cache -- default ``$XDG_CACHE_HOME/apportion``,
  else ``~/.cache/apportion``, else (no usable home) ``<tmp>/apportion-cache-<uid>``. An
  unwritable cache is a warning, never a failure: profiles are then recomputed.
* ``APPORTION_LOG``: the log level on stderr (DEBUG, INFO, WARNING, ERROR); DEBUG also
  prints tracebacks (see :mod:`apportion.console`).
* ``APPORTION_PROGRESS_S``: seconds between plain progress lines (default 10).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

#: every variable apportion reads, for ``apportion --help`` (docs/environment.md says what
#: each does and its default; tests/test_help_texts.py finds every one the code reads here)
VARIABLES = ("APPORTION_STATE", "APPORTION_CLUSTER", "APPORTION_DATA", "APPORTION_CACHE",
             "APPORTION_LOG", "APPORTION_LOG_FORMAT", "APPORTION_PROGRESS_S",
             "APPORTION_MEMORY_LIMIT", "APPORTION_LOCAL_GPU_MEMORY_GIB", "APPORTION_TASK_DATA",
             "APPORTION_ALLOWED_HOSTS", "APPORTION_ALLOWED_ORIGINS", "RAY_ADDRESS",
             "APPORTION_RAY_PLACEMENT_TIMEOUT_S", "APPORTION_SLURM_PARTITION",
             "APPORTION_SLURM_SBATCH_ARGS", "APPORTION_SLURM_GRACE_S", "APPORTION_SLURM_PYTHON",
             "APPORTION_SLURM_TIME_LIMIT", "APPORTION_SLURM_TIME_MARGIN",
             "APPORTION_RENDEZVOUS_TIMEOUT_S", "APPORTION_PROFILE_MAX_AGE_DAYS")
#: what apportion sets for the workloads it launches (the workload contract), beside
#: torchrun's own
SET_FOR_WORKLOADS = ("APPORTION_JOB_ID", "APPORTION_PLAN", "APPORTION_ITERATIONS",
                     "APPORTION_CHECKPOINT_DIR", "APPORTION_PROGRESS_FILE",
                     "APPORTION_GLOBAL_BATCH_SIZE", "APPORTION_CHECKPOINT_EVERY",
                     "APPORTION_CHECKPOINT_INTERVAL_S", "APPORTION_LAUNCH_ID",
                     "APPORTION_GPU_TYPE", "APPORTION_DEEPSPEED_CONFIG")


def variables_help() -> str:
    """The environment line of ``apportion --help``."""
    return ("Environment (docs/environment.md says what each does): " + ", ".join(VARIABLES)
            + "; Ray's RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH for a token-authenticated "
            "cluster.")


def data_root() -> Path:
    """``$APPORTION_DATA``, else ``<repository>/../shared/data``."""
    env = os.environ.get("APPORTION_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1].parent / "shared" / "data"


def cache_dir() -> Path:
    """``$APPORTION_CACHE``, else the user's cache folder, else a per-user temporary one."""
    env = os.environ.get("APPORTION_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "apportion"
    home = os.path.expanduser("~")  # HOME, else the password database
    if os.path.isabs(home) and home != "/":
        return Path(home) / ".cache" / "apportion"
    return Path(tempfile.gettempdir()) / f"apportion-cache-{os.getuid()}"
