"""The nodes of a Slurm cluster as Slurm says they are now, for a cluster file.

**What is read.** ``scontrol show node --json`` where this Slurm has it (23.02 and later:
``data_parser`` v0.0.39+, where a node's ``state`` is a list of flags and
``specialized_memory`` is its ``MemSpecLimit``); otherwise ``scontrol -d show node -o``, the
text form (``-d`` adds ``GresUsed``). A saved file may be either text, the JSON of
``scontrol show node --json`` or the JSON of ``sinfo --json`` (21.08 / 22.05's
``openapi/v0.0.37-38``: ``state`` a word and ``state_flags`` a list, no ``MemSpecLimit``);
the content says which.

One dict per node in the shape every importer returns (see ``runtime.cluster_import``):
``name`` (the Slurm node name, which decisions and ``--nodelist`` use), ``gpu_type`` (the
raw GRES type, ``a40``), ``gpus``, ``cpus``, ``memory_gib`` and the extras
``slurm_partitions`` and ``slurm_features``, which the node group keeps as labels.

**What a node offers** is what a job could get on it now:

* nodes Slurm will not run new jobs on are left out: ``DOWN``, ``DRAIN`` (draining or
  drained), ``FAIL``, ``NOT_RESPONDING``, ``FUTURE``, ``INVAL``, powered or powering down,
  ``MAINT``, ``RESERVED`` (in an advance reservation), ``REBOOT_*``, ``UNKNOWN``;
* GPUs, CPUs and memory held by running jobs (``GresUsed``, ``CPUAlloc``, ``AllocMem``)
  are taken off: a ``MIXED`` node with ``GresUsed=gpu:a100:4`` of eight offers four, and a
  node whose GPUs (or CPUs, or memory) are all held is left out;
* ``MemSpecLimit`` (memory Slurm keeps for the node's own daemons) is never offered.

``include_unavailable`` keeps every GPU node whole, as configured (its state and running
jobs ignored; ``MemSpecLimit`` still taken off). Every node left out or cut down is noted
with why (:class:`~apportion.runtime.executors.imported.Imported`). Nodes without GPUs are
left out (login and CPU nodes). A node carrying two GPU types cannot be one node of the
cluster model (one GPU type per node), which is an error naming the node.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from apportion.runtime.executors.imported import Imported
from apportion.runtime.executors.slurm.commands import SlurmError, parse_gres, parse_records, run

from apportion.errors import InputError

log = logging.getLogger(__name__)

#: states and flags of nodes Slurm will not start a new job on, and what they mean
UNAVAILABLE = {
    "DOWN": "down", "DRAIN": "drained", "DRAINED": "drained", "DRAINING": "draining",
    "FAIL": "failed", "FAILING": "failing", "NOT_RESPONDING": "not responding",
    "FUTURE": "not yet in service (FUTURE)", "INVAL": "invalid configuration",
    "INVALID": "invalid configuration", "POWERED_DOWN": "powered down",
    "POWERING_DOWN": "powering down", "POWER_DOWN": "powering down",
    "POWERING_UP": "powering up", "MAINT": "in a maintenance reservation",
    "RESERVED": "in an advance reservation", "REBOOT_ISSUED": "rebooting",
    "REBOOT_REQUESTED": "to be rebooted", "UNKNOWN": "state unknown",
}
TEXT_SOURCE = "scontrol -d show node -o"
JSON_SOURCE = "scontrol show node --json"


@dataclass(frozen=True)
class SlurmNode:
    """One node as either interface reports it (None: not reported)."""

    name: str
    flags: frozenset[str]  # the base state and its flags, upper case
    state: str  # as Slurm printed it, for messages
    gres: str
    gres_used: str | None
    cpus: int | None  # CPUs jobs may use (CPUEfctv / effective_cpus), else all
    cpus_alloc: int | None
    memory_mib: int | None  # RealMemory
    mem_spec_mib: int | None  # MemSpecLimit
    memory_alloc_mib: int | None
    partitions: str
    features: str
    reason: str
    reservation: str


def scontrol_nodes(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The cluster's nodes as Slurm prints them, and which command printed them: the JSON
    interface where this Slurm has one, else the text form."""
    try:
        return run(["scontrol", "show", "node", "--json"], env=env), JSON_SOURCE
    except SlurmError as exc:
        log.info("scontrol has no JSON output here (%s); reading the text form", exc)
    return run(["scontrol", "-d", "show", "node", "-o"], env=env), TEXT_SOURCE


def _number(value: Any) -> int | None:
    """An integer of either interface: ``5``, ``"5"``, or data_parser's
    ``{"set": true, "infinite": false, "number": 5}``."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return int(value)
    text = str(value).strip()
    if text in ("", "N/A", "(null)"):
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _words(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value if v)
    return "" if value in (None, "(null)") else str(value)


def _from_text(rec: Mapping[str, str], source: str) -> SlurmNode:
    name = rec["NodeName"]
    state = rec.get("State", "")
    flags = frozenset(f for f in state.upper().replace("*", "+NOT_RESPONDING")
                      .replace("~", "+POWERED_DOWN").replace("#", "+POWERING_UP")
                      .replace("%", "+POWERING_DOWN").replace("!", "+POWERING_DOWN")
                      .split("+") if f)

    def num(key: str) -> int | None:
        text = rec.get(key)
        value = _number(text)
        if value is None and text not in (None, "", "N/A", "(null)"):
            raise InputError(source, f"{name}.{key}", f"not an integer: {text!r}")
        return value

    return SlurmNode(name, flags, state, rec.get("Gres", ""), rec.get("GresUsed"),
                     num("CPUEfctv") or num("CPUTot"), num("CPUAlloc"), num("RealMemory"),
                     num("MemSpecLimit"), num("AllocMem"), _words(rec.get("Partitions")),
                     _words(rec.get("ActiveFeatures")), rec.get("Reason", "").strip(),
                     rec.get("ReservationName", rec.get("Reservation", "")).strip())


def _from_json(rec: Mapping[str, Any], source: str, at: str) -> SlurmNode:
    name = rec.get("name")
    if not isinstance(name, str) or not name:
        raise InputError(source, f"{at}.name", "every node needs a name")
    raw = rec.get("state")
    if isinstance(raw, list):  # data_parser v0.0.39+: ["IDLE", "DRAIN"]
        words = [str(s) for s in raw]
    else:  # openapi v0.0.37-38 (sinfo --json of 21.08 / 22.05): "idle" and its flags
        words = [str(raw or "")] + [str(s) for s in rec.get("state_flags") or []]
    flags = frozenset(w.upper() for w in words if w)
    return SlurmNode(
        name, flags, "+".join(w.upper() for w in words if w), _words(rec.get("gres")),
        None if rec.get("gres_used") is None else _words(rec.get("gres_used")),
        _number(rec.get("effective_cpus")) or _number(rec.get("cpus")),
        _number(rec.get("alloc_cpus")), _number(rec.get("real_memory")),
        _number(rec.get("specialized_memory")), _number(rec.get("alloc_memory")),
        _words(rec.get("partitions")), _words(rec.get("active_features")),
        str(rec.get("reason") or "").strip(), _words(rec.get("reservation")).strip())


def read_nodes(text: str, source: str) -> list[SlurmNode]:
    """Every node record of ``text``: JSON of ``scontrol show node --json`` or ``sinfo
    --json``, or ``scontrol show node`` text (one-line or indented)."""
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(source, f"line {exc.lineno}", f"malformed JSON: {exc.msg} "
                             "(expected `scontrol show node --json` or `sinfo --json`)") from None
        if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
            raise InputError(source, "nodes", "missing: expected the JSON of `scontrol show "
                             "node --json` or `sinfo --json` (an object with a nodes list)")
        errors = [e for e in data.get("errors") or [] if e]
        if errors:
            raise InputError(source, "errors", "Slurm reported errors: " + "; ".join(
                str(e.get("description") or e.get("error") or e) if isinstance(e, dict)
                else str(e) for e in errors)[:500])
        out = []
        for i, rec in enumerate(data["nodes"]):
            if not isinstance(rec, dict):
                raise InputError(source, f"nodes[{i}]", "is not an object")
            out.append(_from_json(rec, source, f"nodes[{i}]"))
        return out
    return [_from_text(r, source) for r in parse_records(text) if r.get("NodeName")]


def _gpus(text: str | None, source: str, field: str) -> list[Any]:
    try:
        return [g for g in parse_gres(text or "") if g.name == "gpu"]
    except ValueError as exc:
        raise InputError(source, field, str(exc)) from None


def offer(nodes: Iterable[SlurmNode], source: str, include_unavailable: bool = False
          ) -> Imported:
    """What each node offers now (see the module doc), with a note for each node left out or
    cut down."""
    out = Imported()
    for n in nodes:
        gpus = _gpus(n.gres, source, f"{n.name}.Gres")
        total = sum(g.count for g in gpus)
        if not gpus or total == 0:
            out.leave_out(n.name, "no GPUs")
            continue
        types = sorted({g.type or "gpu" for g in gpus})
        if len(types) > 1:
            raise InputError(source, f"{n.name}.Gres", f"node carries GPUs of several types "
                             f"({', '.join(types)}); apportion models one GPU type per node, "
                             "so split it in Slurm or leave it out of the cluster file")
        down = sorted(f for f in n.flags if f in UNAVAILABLE)
        if down and not include_unavailable:
            why = " and ".join(dict.fromkeys(UNAVAILABLE[f] for f in down))
            detail = "; ".join(x for x in (f"reservation {n.reservation}"
                                           if n.reservation else "", n.reason) if x)
            out.leave_out(n.name, f"{why} (State={n.state}{'; ' + detail if detail else ''})")
            continue
        cuts: list[str] = []  # noted only for a node kept
        memory = n.memory_mib
        if memory is not None and n.mem_spec_mib:
            memory -= n.mem_spec_mib
            if memory <= 0:
                out.leave_out(n.name, f"MemSpecLimit {n.mem_spec_mib} MiB leaves no memory "
                              f"of RealMemory {n.memory_mib}")
                continue
            cuts.append(f"MemSpecLimit: {n.mem_spec_mib} MiB of {n.memory_mib} kept "
                       "for the node's own daemons")
        gpus_free, cpus, mem = total, n.cpus, memory
        if not include_unavailable:
            used = sum(g.count for g in _gpus(n.gres_used, source, f"{n.name}.GresUsed"))
            if used >= total:
                out.leave_out(n.name, f"all {total} GPUs in use by running jobs")
                continue
            if used:
                gpus_free = total - used
                cuts.append(f"{used} of {total} GPUs in use by running jobs")
            if cpus is not None and n.cpus_alloc:
                cpus -= n.cpus_alloc
                if cpus <= 0:
                    out.leave_out(n.name, f"all {n.cpus} CPUs allocated to running jobs")
                    continue
                cuts.append(f"{n.cpus_alloc} of {n.cpus} CPUs allocated to running "
                           "jobs")
            if mem is not None and n.memory_alloc_mib:
                mem -= n.memory_alloc_mib
                if mem <= 0:
                    out.leave_out(n.name, "all its memory allocated to running jobs")
                    continue
                cuts.append(f"{n.memory_alloc_mib} MiB of memory allocated to "
                           "running jobs")
        node: dict[str, Any] = {"name": n.name, "gpu_type": types[0], "gpus": gpus_free,
                                "cpus": cpus, "memory_gib": round(mem / 1024, 3) if mem
                                else None}
        if n.partitions:
            node["slurm_partitions"] = n.partitions
        if n.features:
            node["slurm_features"] = n.features
        out.nodes.append(node)
        for why in cuts:
            out.reduce(n.name, why)
    return out


def nodes_from_scontrol(text: str, source: str = TEXT_SOURCE,
                        include_unavailable: bool = False) -> Imported:
    """Slurm's node records (any form :func:`read_nodes` reads) as importer node dicts."""
    return offer(read_nodes(text, source), source, include_unavailable)


def import_slurm(text: str | None = None, env: Mapping[str, str] | None = None,
                 include_unavailable: bool = False, source: str | None = None) -> Imported:
    """The nodes of the Slurm cluster ``scontrol`` reaches (or of saved ``text``)."""
    if text is None:
        try:
            text, source = scontrol_nodes(env)
        except SlurmError as exc:
            raise InputError("--from slurm", "scontrol", str(exc)) from None
    return nodes_from_scontrol(text, source or TEXT_SOURCE, include_unavailable)
