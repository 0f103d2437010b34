"""The Ray instances apportion starts for itself, and the clusters it joins.

A cluster named by address is reached only when something answers there: Ray retries a
dead address for minutes, far past a round's budget, so :func:`probe` fails fast with the
flag named. An instance of its own (a partitioned solve's engine, ``compare --engine
ray``, the Ray executor's embedded mode) lives in a folder apportion owns
(:func:`owned_temp_dir`, under ``<tmp>/apportion-ray-<uid>/``) with the owner's identity
beside it; closing removes it, and each new start removes what a killed owner left — its
Ray processes (the raylet, the GCS, the workers: found by the folder on their command
lines) and the folder itself (:func:`sweep`). A SIGKILL cannot be caught, so the next start
is where that cleanup happens.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from apportion.errors import InputError
from apportion.procinfo import alive, start_ticks

log = logging.getLogger(__name__)

OWNER_FILE = "apportion-owner"


def root() -> Path:
    """Where apportion's own Ray folders live (short: Ray's socket paths are bounded)."""
    base = "/tmp" if os.access("/tmp", os.W_OK) else tempfile.gettempdir()
    return Path(base) / f"apportion-ray-{os.getuid()}"


def probe(address: str, timeout_s: float = 3.0, flag: str = "--ray-address") -> None:
    """Fail fast (an :class:`InputError` naming ``flag``) when nothing answers at a
    ``HOST:PORT`` address; ``auto``, ``local`` and ``ray://`` client addresses are left to
    Ray."""
    if address in ("auto", "local") or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as exc:
        raise InputError(flag, flag.lstrip("-").replace("-", "_"),
                         f"nothing answers at {address!r} ({exc}): give the address of a "
                         "running Ray cluster (ray start --head prints it)") from None


#: where Ray looks for a cluster's token, in its order (docs: Ray's token authentication)
TOKEN_PLACES = ("RAY_AUTH_TOKEN", "a file named by RAY_AUTH_TOKEN_PATH", "~/.ray/auth_token")


def use_token_auth() -> bool:
    """Send this process's Ray token when it has one and ``RAY_AUTH_MODE`` is unset.

    ``ray start --head`` turns token authentication on by default (Ray 2.5x on), but a
    driver joining by address sends its token only under ``RAY_AUTH_MODE=token``; without
    it every RPC is refused ("InvalidAuthToken") and ``ray.init`` gives up after retrying
    with a bare "Failed to connect". This does what ``ray start`` does for itself (Ray's
    own ``maybe_enable_token_auth_if_token_available``): with a token in one of
    :data:`TOKEN_PLACES` and no mode set, token mode is set for this process and its
    children. An explicit ``RAY_AUTH_MODE`` is respected; a Ray without token
    authentication is left as it is. Returns whether token mode is on."""
    if os.environ.get("RAY_AUTH_MODE") is not None:
        return os.environ["RAY_AUTH_MODE"].strip().lower() == "token"
    try:
        from ray._private.authentication import authentication_token_setup as setup
    except ImportError:  # a Ray without token authentication
        return False
    quiet = logging.getLogger(setup.__name__)
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # its notice is for `ray start`'s console
    try:
        return bool(setup.maybe_enable_token_auth_if_token_available(warn_if_disabled=False))
    finally:
        quiet.setLevel(level)


def check_auth(address: str, flag: str = "--ray-address", timeout_s: float = 5.0) -> None:
    """An :class:`InputError` naming ``flag`` when the cluster at ``HOST:PORT`` refuses this
    process's credentials (one RPC to its GCS, answered at once), rather than ``ray.init``'s
    twenty seconds of retries ending in "Failed to connect". Other failures are left to
    ``ray.init``, which names them."""
    if address in ("auto", "local") or "://" in address or ":" not in address:
        return
    try:
        from ray._raylet import GcsClient  # type: ignore[attr-defined]
        from ray.exceptions import AuthenticationError
    except ImportError:
        return
    try:
        GcsClient(address=address).internal_kv_get(b"apportion-auth-check", None,
                                                   timeout=timeout_s)
    except AuthenticationError as exc:
        mode = os.environ.get("RAY_AUTH_MODE") or "unset"
        raise InputError(flag, flag.lstrip("-").replace("-", "_"),
                         f"the Ray cluster at {address!r} refused the connection: token "
                         f"authentication failed ({getattr(exc, 'message', exc)}; RAY_AUTH_MODE "
                         f"is {mode}). Give this machine the cluster's token "
                         f"({', '.join(TOKEN_PLACES)}; `ray get-auth-token` on the head "
                         "prints it), or start the "
                         "cluster with RAY_AUTH_MODE=disabled") from None
    except Exception as exc:  # noqa: BLE001 - ray.init reports what else is wrong
        log.debug("Ray's GCS at %s did not answer the check: %r", address, exc)


def owned_temp_dir(prefix: str = "", watched: bool = True) -> str:
    """A fresh folder for a Ray instance of this process, after removing what killed owners
    left (:func:`sweep`); with ``watched``, a watcher removes it (and stops its processes)
    once this process ends however it ends (:func:`watch`)."""
    top = root()
    top.mkdir(mode=0o700, exist_ok=True)
    sweep()
    d = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=top))
    (d / OWNER_FILE).write_text(f"{os.getpid()} {start_ticks(os.getpid())}\n")
    if watched:
        watch(str(d))
    return str(d)


def watch(folder: str) -> None:
    """Start a watcher of this process for ``folder``: a process of its own session (a kill
    of this process's group spares it) that waits for this process to end, then removes
    the folder and stops every process still naming it. A SIGKILL cannot be caught, so
    without it a killed owner's Ray (raylet, GCS, workers, agents) ran on until the next
    start's sweep. A normal close (:func:`remove`) stops the watcher with the rest: its
    command line names the folder too."""
    subprocess.Popen([sys.executable, "-m", "apportion.ray_home", "watch", str(os.getpid()),
                      str(start_ticks(os.getpid())), folder],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)


def _wait_for_end(pid: int, ticks: int | None) -> None:
    """Block until ``pid`` (started at ``ticks``) has ended: on its pidfd where the kernel
    has them (an event, no polling), else by looking once a second."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            if alive(pid, ticks):  # the pid is still the owner's, not a recycled one
                select.select([fd], [], [])
        finally:
            os.close(fd)
        return
    while alive(pid, ticks):
        time.sleep(1.0)


def _watch_main(argv: list[str]) -> int:
    pid, ticks, folder = int(argv[0]), None if argv[1] == "None" else int(argv[1]), argv[2]
    _wait_for_end(pid, ticks)
    if Path(folder).exists():
        remove(folder)
    return 0


def remove(folder: str | os.PathLike[str]) -> None:
    """Stop every process still using ``folder`` and delete it (a Ray instance's close)."""
    _stop_users(Path(folder))
    shutil.rmtree(folder, ignore_errors=True)


def sweep() -> list[str]:
    """Remove the folders (and stop the Ray processes) of owners that are gone."""
    top = root()
    gone = []
    try:
        entries = list(top.iterdir())
    except OSError:
        return gone
    for d in entries:
        try:
            pid, ticks = (d / OWNER_FILE).read_text().split()
            owner_alive = alive(int(pid), None if ticks == "None" else int(ticks))
        except (OSError, ValueError):
            # no owner file: a folder being created right now, or not ours; leave it unless
            # it is old enough that no start takes that long
            owner_alive = time.time() - _mtime(d) < 600
        if owner_alive:
            continue
        remove(d)
        gone.append(str(d))
        log.info("removed the Ray folder %s its killed owner left", d)
    return gone


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def _stop_users(folder: Path) -> None:
    """SIGTERM, then SIGKILL, every process whose command line names ``folder``."""
    needle = str(folder).encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 3.0
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if alive(p, None)]
            time.sleep(0.05)
        if not pids:
            return


if __name__ == "__main__":  # the watcher of :func:`watch`
    if len(sys.argv) == 5 and sys.argv[1] == "watch":
        raise SystemExit(_watch_main(sys.argv[2:]))
    raise SystemExit("usage: python -m apportion.ray_home watch PID TICKS FOLDER")
