"""Another apportion install to time against (``bench round`` and ``bench sim``'s
``--against PYTHON``): its interpreter, checked before anything is timed, and the
environment and folder its commands run in.

The issue's speed targets are measured side by side with the previous code, in the same
minutes, as ratios: the machine's load then weighs on both alike. The previous code is any
environment whose interpreter imports apportion (a release, or a commit installed into a
second virtual environment); it runs in a scratch folder, so a checkout in the caller's
folder never shadows its install (``python -m`` puts the working folder first on the
path), with bytecode allowed, as an operator's install runs.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from apportion.errors import InputError


def check_against(python: str | Path) -> str:
    """``--against``: an interpreter that runs ``apportion.cli`` (another install of it);
    its path, or :class:`InputError` naming the option."""
    path = Path(python).expanduser()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise InputError(str(python), "--against", "not an executable file: give the Python "
                         "interpreter of an environment where another apportion is installed")
    with tempfile.TemporaryDirectory(prefix="ap-against-") as tmp:  # no checkout shadows it
        probe = subprocess.run([str(path), "-c", "import apportion.cli.app; print('ok')"],
                               capture_output=True, text=True, check=False, timeout=300,
                               cwd=tmp)
    if probe.returncode != 0 or probe.stdout.strip() != "ok":
        last = (probe.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise InputError(str(python), "--against", f"this interpreter cannot import "
                         f"apportion's command line: {last}")
    return str(path)


def child_env() -> dict[str, str]:
    """The children's environment: this one, bytecode allowed (an install compiles it)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` rounded, or None where either is missing or ``b`` is not positive."""
    return round(a / b, 3) if a is not None and b else None


__all__ = ["check_against", "child_env", "ratio"]
