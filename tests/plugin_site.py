"""A plug-in example installed as a user installs it (``pip install`` into a folder of its
own, entry points and all) and apportion run beside it: the one install the plug-in tests
(policies, executors, trace formats) share."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def install_example(name: str, target: Path) -> Path:
    """``examples/<name>`` pip-installed into ``target`` (no dependencies, no isolation:
    this environment's setuptools builds it); ``target``."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(target), str(EXAMPLES / name)],
                   check=True, capture_output=True, text=True, timeout=300)
    return target


def run_in(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python ARGS`` with the installed plug-in on the path."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
