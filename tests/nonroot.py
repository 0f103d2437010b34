"""Running ``apportion`` as an unprivileged user from the tests (which run as root here).

``setpriv`` drops to ``nobody``; the interpreter must be one that user may execute (this
machine's venv links to a Python under /root, which is private), so an interpreter of the
same minor version that ``nobody`` can run is used with the venv's site-packages added:
the same apportion and the same dependencies, a different user. Tests skip, saying why,
when neither ``setpriv`` nor such an interpreter exists.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

NOBODY = 65534
_BOOT = ("import site, sys; site.addsitedir(sys.argv.pop(1)); sys.argv[0] = 'apportion'; "
         "from apportion.cli import main; main()")


def _drop() -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]


@functools.cache
def interpreter() -> str | None:
    """A Python of this minor version that ``nobody`` can execute, or None."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return None
    minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for cand in (os.path.realpath(sys.executable), shutil.which(minor, path="/usr/bin:/bin"),
                 shutil.which(minor)):
        if not cand:
            continue
        ok = subprocess.run([*_drop(), "sh", "-c", 'exec "$@"', "sh", cand, "-c",
                             f"import os; assert os.geteuid() == {NOBODY}"],
                            check=False, capture_output=True, timeout=30)
        if ok.returncode == 0:
            return cand
    return None


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "the tests do not run as root: cannot switch to another user"
    if shutil.which("setpriv") is None:
        return "setpriv is not installed"
    if interpreter() is None:
        return f"no python{sys.version_info.major}.{sys.version_info.minor} that nobody may run"
    closed = _closed_ancestor(Path(__file__).resolve().parent.parent)
    if closed is not None:  # e.g. a clone inside `mktemp -d` (mode 0700)
        return f"{closed} is closed to other users: nobody cannot import this checkout"
    return None


def _closed_ancestor(path: Path) -> Path | None:
    """The first folder on the way to ``path`` that other users may not enter."""
    for d in [*reversed(path.parents), path]:
        if not d.stat().st_mode & 0o001:
            return d
    return None


def run_as_nobody(args: list[str], cwd: Path, umask: str = "022",
                  env: dict[str, str] | None = None, timeout: float = 180,
                  through_pipe: bool = False) -> subprocess.CompletedProcess[str]:
    """``apportion ARGS`` as ``nobody`` in ``cwd`` with ``umask``; ``through_pipe``: its
    stdout is a pipe that ``nobody`` made (``| cat``), as a user's shell would make it."""
    py = interpreter()
    assert py is not None, skip_reason()
    base = {k: v for k, v in os.environ.items() if not k.startswith("APPORTION_")}
    base["HOME"] = str(cwd)
    base.update(env or {})
    site = sysconfig.get_paths()["purelib"]
    script = (f'umask {umask} && {{ "$@"; echo "exit=$?" >&2; }} | cat' if through_pipe
              else f'umask {umask} && exec "$@"')
    cmd = [*_drop(), "sh", "-c", script, "sh", py, "-c", _BOOT, site, *args]
    res = subprocess.run(cmd, check=False, cwd=cwd, env=base, capture_output=True, text=True,
                         timeout=timeout)
    if through_pipe:
        code = [ln for ln in res.stderr.splitlines() if ln.startswith("exit=")]
        res.returncode = int(code[-1][5:]) if code else 255
    return res
