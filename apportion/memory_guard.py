"""Refuse, before the work starts, an input this machine cannot hold.

Why: a round's memory grows with its jobs and a replay's with its trace. Past what the
machine has, a command does not fail: it swaps for hours (or the kernel's OOM killer ends
it, and a store is left mid-write), and the operator sees a hung command. An estimate made
from the input's size before anything is built costs nothing, and an input over it is
refused like any other bad input: exit 2, the file, the field and what is wrong, nothing
written.

The estimates are measured peaks with room to spare (experiments/results/bench/memory.md):

* a trace file: its loaded jobs take about 35 bytes of memory per byte of CSV (a
  1,000,000-job normalised CSV of 32 MB peaked at 1.1 GB while loaded);
* one round: about 70 MiB and 20 KiB per job in the scheduling process (1,000 jobs on
  1,280 GPUs 89 MiB, 10,000 jobs on 20,480 GPUs 267 MiB), and an isolated solver's child
  holds the model again;
* a queue file, while it is read: YAML's composed nodes and the validated jobs, about
  QUEUE_BYTES_PER_FILE_BYTE bytes a byte of file (a JSON-lines queue streams, so it holds
  less; the same estimate keeps one rule for both).

What the machine has is the smallest of the kernel's ``MemAvailable``, the cgroup's limit
less its usage (a container's or a Slurm job's), and ``APPORTION_MEMORY_LIMIT`` (an
operator's share of a machine it shares, and how a test sets the limit).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from apportion.errors import InputError

#: the environment variable that caps the memory apportion plans to use ("8GiB", "512MiB",
#: "2e9": bytes unless a unit is given)
MEMORY_ENV = "APPORTION_MEMORY_LIMIT"

MIB = 2**20
GIB = 2**30

#: resident bytes per byte of a trace file while it is loaded (measured 35: see above)
TRACE_BYTES_PER_FILE_BYTE = 40
#: resident bytes per byte of a queue file while it is read and validated
QUEUE_BYTES_PER_FILE_BYTE = 40
#: one round: the interpreter and its imports, then per job and per GPU (the measured
#: 20 KiB a job, doubled for an isolated solver's copy of the model)
ROUND_BASE_BYTES = 128 * MIB
ROUND_BYTES_PER_JOB = 40 * 1024
ROUND_BYTES_PER_GPU = 2 * 1024

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
          "mib": MIB, "g": 1000**3, "gb": 1000**3, "gib": GIB, "t": 1000**4, "tb": 1000**4,
          "tib": 2**40}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str, source: str = MEMORY_ENV, field: str = MEMORY_ENV) -> int:
    """A size in bytes from ``"8GiB"``, ``"512 MiB"``, ``"2e9"`` or ``"3G"`` (decimal
    units, binary with ``i``); an :class:`InputError` naming ``source`` and ``field``
    otherwise (the environment variable, or an option such as ``--max-input-bytes``)."""
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise InputError(source, field, f"{text!r} is not a size: a number of bytes, "
                         "optionally with a unit (KiB, MiB, GiB, TiB; kB, MB, GB, TB)")
    value = float(m.group(1)) * _UNITS[unit]
    if not 0 < value < 2**63:
        raise InputError(source, field, f"{text!r}: the size must be above 0")
    return int(value)


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_available() -> int | None:
    """The cgroup v2 limit less its usage, where this process has a limit."""
    try:
        rel = next(line.split(":", 2)[2] for line in
                   Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::"))
        base = Path("/sys/fs/cgroup") / rel.lstrip("/")
        limit = (base / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((base / "memory.current").read_text().strip()))
    except (OSError, ValueError, StopIteration):
        return None


def available_bytes() -> tuple[int, str] | None:
    """The memory this machine has for apportion and where that figure comes from (the
    smallest of MemAvailable, the cgroup's room and ``APPORTION_MEMORY_LIMIT``); None where
    the OS says nothing and no limit is set."""
    found: list[tuple[int, str]] = []
    if (env := os.environ.get(MEMORY_ENV)) is not None:
        found.append((parse_size(env), MEMORY_ENV))
    if (mem := _meminfo_available()) is not None:
        found.append((mem, "MemAvailable"))
    if (room := _cgroup_available()) is not None:
        found.append((room, "the cgroup's memory.max less its usage"))
    return min(found) if found else None


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB / 10 else f"{n / MIB:.0f} MiB"


def check_fits(need: int, source: str, field: str, what: str, hint: str) -> None:
    """Refuse (:class:`InputError` naming ``source`` and ``field``) what needs more than the
    machine has; nothing where it fits or the machine says nothing."""
    have = available_bytes()
    if have is None or need <= have[0]:
        return
    raise InputError(source, field, f"{what} needs about {_gib(need)} of memory; this "
                     f"machine has {_gib(have[0])} ({have[1]}): {hint}, or set "
                     f"{MEMORY_ENV} if the estimate is wrong for this machine")


def round_bytes(jobs: int, gpus: int) -> int:
    """The estimated peak memory of one round of ``jobs`` jobs on ``gpus`` GPUs."""
    return ROUND_BASE_BYTES + jobs * ROUND_BYTES_PER_JOB + gpus * ROUND_BYTES_PER_GPU


def trace_bytes(path: str | Path) -> int:
    """The estimated memory a trace file takes once loaded (0 where it cannot be read:
    the reader then refuses it by name)."""
    try:
        return os.stat(path).st_size * TRACE_BYTES_PER_FILE_BYTE
    except OSError:
        return 0


def check_round_fits(jobs: int, gpus: int, source: str, field: str = "jobs") -> None:
    """Refuse a round of ``jobs`` jobs on ``gpus`` GPUs this machine cannot hold."""
    check_fits(round_bytes(jobs, gpus), source, field,
               f"a round of {jobs:,} jobs on {gpus:,} GPUs",
               "split the jobs over several rounds or partitions")


def check_input_fits(path: str | Path, field: str = "jobs") -> None:
    """Refuse a queue file this machine cannot hold once read (checked before reading:
    ``--max-input-bytes`` lifts the reader's size limit, never this one)."""
    try:
        size = os.stat(path).st_size
    except OSError:
        return  # the reader refuses it by name
    check_fits(size * QUEUE_BYTES_PER_FILE_BYTE, str(path), field,
               f"reading this queue ({size / 1e6:.1f} MB of file)",
               "split the queue into several files (several submits)")


def check_trace_fits(path: str | Path, source: str, field: str = "--trace") -> None:
    """Refuse a trace file this machine cannot load."""
    need = trace_bytes(path)
    check_fits(need, source, field,
               f"loading this trace ({need / TRACE_BYTES_PER_FILE_BYTE / 1e6:.1f} MB of file)",
               "cut the file to the jobs to replay")
