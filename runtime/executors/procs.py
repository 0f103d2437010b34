"""Worker processes on this host: identity, signals, and the job folder's lock.

A worker group outlives the ``apportion run`` that started it when that run is
SIGKILLed, so processes are named by what survives a restart: the pid *and*
its start time (``/proc/<pid>/stat`` field 22; a recycled pid has another),
and every rank runs in its own session so its whole process tree is signalled
at once (a user command may fork).

The **job folder lock** is what makes "never two groups in one job folder" a
guarantee rather than a hope: the launcher takes an exclusive ``flock`` on
``<jobdir>/.lock`` and hands the *same open file* to every rank (inherited
descriptor), then closes its own copy. The kernel holds the lock exactly as
long as any rank (or anything a rank started) is alive, whoever its parent is
now; a launcher that cannot take it knows a group is still there and finds
its processes by scanning ``/proc/*/fd`` for the lock file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from apportion.runtime.executors.confined import open_in

from apportion.procinfo import alive, start_ticks

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
EXIT_UNKNOWN = 255  # an adopted process exited; its status went to its new parent


def host() -> str:
    return socket.gethostname()


def signal_group(pid: int, sig: int) -> None:
    """``sig`` to the rank's whole session (its process group), or to the pid alone."""
    try:
        os.killpg(pid, sig)
        return
    except (ProcessLookupError, PermissionError):
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


class Proc:
    """One rank's process: a child we started (``Popen`` or a forkserver child) or a
    survivor of an earlier run we adopted (known by pid and start time only)."""

    def __init__(self, handle: Any = None, pid: int | None = None,
                 ticks: int | None = None) -> None:
        self.handle = handle
        self._pid = pid if handle is None else handle.pid
        self.ticks = ticks if ticks is not None else (start_ticks(self._pid)
                                                      if self._pid else None)
        self._code: int | None = None

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def adopted(self) -> bool:
        return self.handle is None

    def poll(self) -> int | None:
        if self._code is not None:
            return self._code
        h = self.handle
        if h is None:
            code = None if self._pid and alive(self._pid, self.ticks) else EXIT_UNKNOWN
        elif isinstance(h, subprocess.Popen):
            code = h.poll()
        else:
            code = None if h.is_alive() else h.exitcode
        self._code = code
        return code

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            code = self.poll()
            if code is not None:
                return code
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired("worker", timeout or 0.0)
            time.sleep(0.05)

    def signal(self, sig: int) -> None:
        if self._pid and self.poll() is None:
            signal_group(self._pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.signal(signal.SIGTERM)

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def describe(self, rank: int) -> dict[str, Any]:
        return {"rank": rank, "pid": self._pid, "start_ticks": self.ticks, "host": host()}


def wait_all(procs: Iterable[Proc], timeout_s: float) -> bool:
    """Wait for every process; SIGKILL what is left after ``timeout_s``. True when none had
    to be killed."""
    procs = list(procs)
    deadline = time.monotonic() + timeout_s
    clean = True
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            clean = False
    if not clean:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10.0)
    return clean


# -- the job folder lock ---------------------------------------------------------------------
def try_lock(jobdir: Path) -> int | None:
    """An fd holding the exclusive lock on ``jobdir/.lock``, or None when a group holds it."""
    fd = open_in(jobdir, LOCK_FILE, os.O_RDWR)  # the folder made and checked, no links
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


def folder_free(jobdir: Path) -> bool:
    """No process holds the job folder's lock (checked by taking and releasing it)."""
    fd = try_lock(jobdir)
    if fd is None:
        return False
    os.close(fd)
    return True


def lock_holders(jobdir: Path) -> list[int]:
    """Pids of processes that have ``jobdir/.lock`` open (a scan of ``/proc/*/fd``)."""
    target = os.path.realpath(jobdir / LOCK_FILE)
    me = os.getpid()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            for fd in (d / "fd").iterdir():
                try:
                    if os.readlink(fd) == target:
                        out.append(int(d.name))
                        break
                except OSError:
                    continue
        except OSError:
            continue
    return sorted(out)


def stop_holders(jobdir: Path, grace_s: float, sig: int = signal.SIGTERM) -> list[int]:
    """Stop every process holding the folder's lock: ``sig`` (checkpoint and exit), then
    SIGKILL after ``grace_s``. Returns the pids found."""
    pids = lock_holders(jobdir)
    procs = [Proc(pid=p) for p in pids]
    for p in procs:
        p.signal(sig)
    wait_all(procs, grace_s)
    deadline = time.monotonic() + 10.0
    while not folder_free(jobdir) and time.monotonic() < deadline:  # stragglers
        for pid in lock_holders(jobdir):
            signal_group(pid, signal.SIGKILL)
        time.sleep(0.1)
    return pids
