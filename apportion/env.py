"""The environment variables apportion reads, each with one rule used everywhere.

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

VARIABLES = ("APPORTION_DATA", "APPORTION_CACHE", "APPORTION_LOG", "APPORTION_PROGRESS_S")


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
