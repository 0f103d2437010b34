"""What the kernel says of a process: when it started and whether it still runs.

A pid alone is not an identity (pids are recycled): a process is known by its pid and its
start time in clock ticks since boot, read from ``/proc``. Written once for every part of
apportion that watches processes it did not start itself (adopted workers, Ray instances
a killed run left).
"""

from __future__ import annotations

from pathlib import Path


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (None: no such process)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rindex(b")") + 2:].split()  # after "pid (comm) "
    return int(fields[19])  # field 22 overall


def state(pid: int) -> str | None:
    """The process's state letter (R, S, Z, ...), None when there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw[raw.rindex(b")") + 2:].split()[0].decode()


def alive(pid: int, ticks: int | None) -> bool:
    """The process ``pid`` that started at ``ticks`` still runs (not recycled, not a zombie)."""
    if ticks is not None and start_ticks(pid) != ticks:
        return False
    st = state(pid)
    return st is not None and st not in ("Z", "X")
