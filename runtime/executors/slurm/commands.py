"""Slurm's command-line tools, called and parsed in one place (no Slurm Python bindings).

apportion talks to Slurm the way an operator does: ``sbatch``, ``squeue``,
``scontrol``, ``sacct`` and ``scancel``. Which cluster they reach is Slurm's
own business (``SLURM_CONF``, the site's ``/etc/slurm``); the executor only
passes an environment through. The parsers here read the stable,
machine-oriented forms: ``scontrol show ... -o`` (one record a line of
``Key=Value`` pairs), ``squeue -o`` and ``sacct -P`` with explicit formats.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

# a key starts a word and is followed by '='; values may hold spaces (OS=Linux 6.1 #1 SMP ...)
_KEY = re.compile(r"(?:(?<=\s)|^)([A-Za-z][A-Za-z0-9_:./]*)=")
_SUFFIX = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}

# Slurm job states (squeue %T, sacct State) that mean the job still holds or waits for resources
ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED",
                           "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SIGNALING",
                           "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT"})


class SlurmError(RuntimeError):
    """A Slurm command failed (or is missing); the message carries its own error text."""


def run(args: list[str], env: Mapping[str, str] | None = None, timeout_s: float = 60.0) -> str:
    """Run one Slurm command and return its stdout; any failure is a :class:`SlurmError`."""
    try:
        r = subprocess.run(args, env=dict(env) if env is not None else None, capture_output=True,
                           text=True, timeout=timeout_s, stdin=subprocess.DEVNULL, check=False)
    except FileNotFoundError:
        raise SlurmError(f"{args[0]}: not found; is Slurm installed here (apt-get install "
                         "slurm-client, or the site's Slurm module) and on PATH?") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(args[:3])}: no answer within {timeout_s:g}s "
                         "(is slurmctld up?)") from None
    if r.returncode != 0:
        msg = (r.stderr or r.stdout).strip().splitlines()
        raise SlurmError(f"{' '.join(args[:2])}: exit {r.returncode}: "
                         f"{' / '.join(msg[-3:]) or 'no message'}")
    return r.stdout


def parse_key_values(line: str) -> dict[str, str]:
    """One ``scontrol -o`` record: ``NodeName=a40-0 CPUTot=4 OS=Linux 6.1 #1 ...`` -> dict."""
    line = line.strip()
    keys = list(_KEY.finditer(line))
    out: dict[str, str] = {}
    for i, m in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
        out[m.group(1)] = line[m.end():end].strip()
    return out


def parse_records(text: str) -> list[dict[str, str]]:
    """Records of ``scontrol show node|job`` output, one-line (``-o``) or the indented form."""
    records: list[dict[str, str]] = []
    block: list[str] = []

    def flush() -> None:
        if block:
            rec = parse_key_values(" ".join(s.strip() for s in block))
            if rec:
                records.append(rec)
            block.clear()

    for raw in text.splitlines():
        if not raw.strip():
            flush()
        elif raw[:1].isspace():
            block.append(raw)
        else:  # an unindented line starts a record (every line of -o output does)
            flush()
            block.append(raw)
    flush()
    return records


@dataclass(frozen=True)
class Gres:
    name: str  # gpu, mps, shard, ...
    type: str | None  # a40, a100_80g, ... (None: untyped)
    count: int


def _count(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KMGT]?)", text.strip().upper())
    if not m:
        raise ValueError(f"not a GRES count: {text!r}")
    return int(m.group(1)) * _SUFFIX[m.group(2)]


def parse_gres(text: str) -> list[Gres]:
    """``gpu:a40:2(S:0),gpu:a10:no_consume:1,mps:200`` -> typed counts; ``(null)`` -> []."""
    text = (text or "").strip()
    if not text or text in ("(null)", "N/A"):
        return []
    items, depth, cur = [], 0, ""
    for ch in text:  # split on commas outside parentheses
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    out = []
    for item in items:
        item = re.sub(r"\(.*\)$", "", item.strip())
        parts = [p for p in item.split(":") if p and p != "no_consume"]
        if not parts:
            continue
        name, rest = parts[0], parts[1:]
        if not rest:
            out.append(Gres(name, None, 1))
        elif len(rest) == 1:
            try:
                out.append(Gres(name, None, _count(rest[0])))
            except ValueError:
                out.append(Gres(name, rest[0], 1))
        else:
            out.append(Gres(name, ":".join(rest[:-1]), _count(rest[-1])))
    return out


def squeue_states(text: str) -> dict[str, tuple[str, str]]:
    """``squeue -h -o '%i|%T|%r'`` lines -> job id -> (state, reason).

    A heterogeneous job shows one line per component (``12+0``, ``12+1``) and
    is reported under its leader's id with the most active component state.
    """
    rank = {"RUNNING": 0, "COMPLETING": 1, "CONFIGURING": 2, "PENDING": 3}
    out: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 2 or not parts[0]:
            continue
        jid = parts[0].split("+", 1)[0].split("_", 1)[0]
        state = parts[1].strip().upper()
        reason = parts[2].strip() if len(parts) > 2 else ""
        old = out.get(jid)
        if old is None or rank.get(state, 9) < rank.get(old[0], 9) or \
                (old[0] == "COMPLETED" and state not in rank):  # an ended component that failed
            out[jid] = (state, reason)
    return out


def sacct_states(text: str) -> dict[str, tuple[str, str]]:
    """``sacct -n -P -X -o JobID,State,ExitCode`` lines -> job id -> (state, exit code).

    ``CANCELLED by 0`` is reported as ``CANCELLED``; a heterogeneous job's
    components (``12+0``) are folded into the leader's id, a failed component
    winning over a completed one.
    """
    out: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 2 or not parts[0] or "." in parts[0]:  # job steps: 12.batch, 12.0
            continue
        jid = parts[0].split("+", 1)[0]
        state = parts[1].split()[0].upper() if parts[1].strip() else "UNKNOWN"
        code = parts[2].strip() if len(parts) > 2 else ""
        old = out.get(jid)
        if old is None or (old[0] == "COMPLETED" and state != "COMPLETED"):
            out[jid] = (state, code)
    return out
