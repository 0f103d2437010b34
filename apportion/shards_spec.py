"""Hydra's shard-unit problem (SHARP), as a core type and as a networkx graph.

A model too large for one device is cut into shards; a *shard unit* is the
forward or backward pass of one shard on one mini-batch (DESIGN.md's
``ShardUnit``). Each model is a chain of units that run one after the other,
each on one device at a time; a device runs one unit at a time. This module
holds what every layer shares, beside the fine-tuning types
(:mod:`apportion.finetune_spec`):

* the problem types (:class:`ShardDevice`, :class:`ShardModel`,
  :class:`ShardProblem`) and the schedule type (:class:`Placement`), loaded from
  the JSON contract of ``apportion solve-shards`` with every bad field reported
  as an :class:`~apportion.errors.InputError`;
* the **shard-unit graph** (:func:`shard_graph`) and its schema — vertex keys and
  accessors — which the formulations and solvers read (DESIGN.md: problems are
  encoded as networkx graphs; "graphs to models by attribute names"):

  - a unit vertex ``unit_key(i, j) = ("unit", i, j)`` (unit ``j`` of model ``i``)
    with ``kind="unit"``, ``model`` (name), ``model_index``, ``index``,
    ``runtime`` (s on a speed-1 device) and ``memory`` (bytes);
  - a device vertex ``device_key(p) = ("device", p)`` with ``kind="device"``,
    ``name``, ``index``, ``speed``, ``memory`` and ``budget`` (memory less the
    double-buffer reserve);
  - a precedence edge unit -> next unit of the same model (``kind="precedence"``);
  - a ``kind="runs-on"`` edge unit -> device wherever the unit fits the
    device's budget, with its ``duration`` there (runtime / speed);
  - graph attributes ``models`` and ``devices`` (names, in index order),
    ``buffer_fraction`` and ``source``.

  Placements keep indices (``model``, ``unit``, ``device``), the same numbers the
  vertex keys carry.

This is a core module: it imports nothing from the five areas.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from apportion.config import field_path
from apportion.inputs import read_json
from apportion.errors import InputError

#: Hydra reserves 15% of device memory as the double-buffer loading zone (section 5.2).
DEFAULT_BUFFER_FRACTION = 0.15


@dataclass(frozen=True)
class ShardDevice:
    """One device: a unit of base runtime ``r`` takes ``r / speed`` seconds on it."""

    name: str
    speed: float = 1.0
    memory: float = math.inf  # bytes; inf when the input gives none


@dataclass(frozen=True)
class ShardModel:
    """One model's chain of units: base runtimes (s) and memory needs (bytes)."""

    name: str
    runtimes: tuple[float, ...]
    memory: tuple[float, ...] = ()

    def unit_memory(self, j: int) -> float:
        return self.memory[j] if self.memory else 0.0


@dataclass(frozen=True)
class Placement:
    """One scheduled unit: model index, unit index, device index, start and end (s)."""

    model: int
    unit: int
    device: int
    start: float
    end: float


@dataclass
class ShardProblem:
    """Devices, model chains and the double-buffer reserve of one SHARP instance."""

    devices: list[ShardDevice]
    models: list[ShardModel]
    buffer_fraction: float = DEFAULT_BUFFER_FRACTION
    source: str = "<memory>"
    _eligible: dict[tuple[int, int], list[int]] = field(default_factory=dict, repr=False)

    # -- sizes and durations ------------------------------------------------------
    @property
    def num_units(self) -> int:
        return sum(len(m.runtimes) for m in self.models)

    def duration(self, i: int, j: int, p: int) -> float:
        return self.models[i].runtimes[j] / self.devices[p].speed

    def budget(self, p: int) -> float:
        """Memory a unit may use on device ``p``: all of it less the double-buffer reserve."""
        return self.devices[p].memory * (1.0 - self.buffer_fraction)

    def eligible(self, i: int, j: int) -> list[int]:
        """Devices whose budget holds unit (i, j); cached because greedy loops ask often."""
        key = (i, j)
        got = self._eligible.get(key)
        if got is None:
            need = self.models[i].unit_memory(j)
            got = [p for p in range(len(self.devices)) if need <= self.budget(p)]
            self._eligible[key] = got
        return got

    def units(self) -> list[tuple[int, int]]:
        return [(i, j) for i, m in enumerate(self.models) for j in range(len(m.runtimes))]

    # -- bounds -------------------------------------------------------------------
    def work_bound(self) -> float:
        """Fluid bound: all base work spread over the summed speed of all devices."""
        total = sum(sum(m.runtimes) for m in self.models)
        return total / sum(d.speed for d in self.devices)

    def chain_bound(self) -> float:
        """Longest chain, each unit on its fastest eligible device."""
        best = 0.0
        for i, m in enumerate(self.models):
            length = sum(
                r / max(self.devices[p].speed for p in self.eligible(i, j))
                for j, r in enumerate(m.runtimes)
            )
            best = max(best, length)
        return best

    def lower_bound(self) -> float:
        """max(work bound, chain bound): every schedule's makespan is at least this."""
        return max(self.work_bound(), self.chain_bound())

    def trivial_horizon(self) -> float:
        """Makespan of running every unit back to back on its slowest eligible device."""
        return sum(
            r / min(self.devices[p].speed for p in self.eligible(i, j))
            for i, m in enumerate(self.models)
            for j, r in enumerate(m.runtimes)
        )


# -- building chains ------------------------------------------------------------------
def chain_runtimes(
    forward: Sequence[float], backward: Sequence[float], minibatches: int = 1, epochs: int = 1
) -> list[float]:
    """Unit runtimes of one model: forward shards in order then backward shards in
    reverse, repeated per mini-batch and epoch (``backward[k]`` is shard k's pass)."""
    if len(forward) != len(backward):
        raise ValueError("forward and backward need one runtime per shard each")
    one = list(forward) + list(reversed(backward))
    return one * (minibatches * epochs)


# -- loading and validation ---------------------------------------------------------------
#: Largest unit runtime and device time (s) accepted: ~31 years. Beyond it the solvers'
#: integer time scaling overflows (a speed of 1e-300 made a unit take 1e300 s).
MAX_SECONDS = 1e9
#: Speeds and memories are bounded so that runtime / speed and the budgets stay finite.
MAX_SPEED = 1e9
MIN_SPEED = 1e-9
MAX_BYTES = 1e18

Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS)]
Bytes = Annotated[float, Field(ge=0, le=MAX_BYTES)]


class _Strict(BaseModel):
    # strict: a JSON true or "fast" is not a number; extra fields are typos, not options
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class DeviceSpec(_Strict):
    name: str = Field(min_length=1, max_length=256)
    speed: float = Field(default=1.0, gt=0, ge=MIN_SPEED, le=MAX_SPEED)
    memory: float | None = Field(default=None, gt=0, le=MAX_BYTES)


class ModelSpec(_Strict):
    name: str = Field(min_length=1, max_length=256)
    units: list[Seconds] = Field(min_length=1, max_length=1_000_000)
    memory: list[Bytes] | Bytes | None = None


class UnitsFile(_Strict):
    """The ``solve-shards`` input contract (README): devices, models, buffer_fraction."""

    devices: list[DeviceSpec] = Field(min_length=1, max_length=100_000)
    models: list[ModelSpec] = Field(min_length=1, max_length=100_000)
    buffer_fraction: float = Field(default=DEFAULT_BUFFER_FRACTION, ge=0, lt=1)


def _unique(names: list[str], source: str, what: str) -> None:
    seen: set[str] = set()
    for k, n in enumerate(names):
        if n in seen:
            raise InputError(source, f"{what}[{k}].name", f"duplicate name {n!r}")
        seen.add(n)


def problem_from_dict(data: Any, source: str = "<memory>") -> ShardProblem:
    """Validate the solve-shards JSON contract (:class:`UnitsFile`, pydantic) and build a
    :class:`ShardProblem`; every problem is an :class:`InputError` naming the field.

    Required: ``devices[].name``, ``devices[].speed`` (default 1.0),
    ``models[].name``, ``models[].units`` (runtimes in seconds). Optional:
    ``devices[].memory`` (bytes), ``models[].memory`` (bytes, one per unit or a
    single number) and ``buffer_fraction`` (double-buffer reserve, default 0.15).
    Magnitudes are bounded (:data:`MAX_SECONDS`, :data:`MIN_SPEED`) so that no unit
    takes longer than :data:`MAX_SECONDS` on any device.
    """
    if not isinstance(data, dict):
        raise InputError(source, "<root>", "must be a JSON object with devices and models")
    try:
        spec = UnitsFile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InputError(source, field_path(tuple(err["loc"])),
                         err["msg"].removeprefix("Value error, ")
                         + (f", got {err['input']!r}" if err["type"] != "missing"
                            and not isinstance(err.get("input"), (dict, list)) else "")) from None
    _unique([d.name for d in spec.devices], source, "devices")
    _unique([m.name for m in spec.models], source, "models")
    devices = [ShardDevice(d.name, d.speed, math.inf if d.memory is None else d.memory)
               for d in spec.devices]
    models = []
    for k, m in enumerate(spec.models):
        runtimes = tuple(float(u) for u in m.units)
        memory: tuple[float, ...] = ()
        if isinstance(m.memory, list):
            if len(m.memory) != len(runtimes):
                raise InputError(source, f"models[{k}].memory",
                                 f"has {len(m.memory)} entries for {len(runtimes)} units")
            memory = tuple(float(v) for v in m.memory)
        elif m.memory is not None:
            memory = (float(m.memory),) * len(runtimes)
        models.append(ShardModel(m.name, runtimes, memory))
    slowest = min(range(len(devices)), key=lambda p: devices[p].speed)
    longest = max(((i, j) for i, m in enumerate(models) for j in range(len(m.runtimes))),
                  key=lambda u: models[u[0]].runtimes[u[1]])
    worst = models[longest[0]].runtimes[longest[1]] / devices[slowest].speed
    if worst > MAX_SECONDS:
        raise InputError(source, f"devices[{slowest}].speed",
                         f"{devices[slowest].speed:g} is too slow: unit "
                         f"models[{longest[0]}].units[{longest[1]}] would take {worst:.3g} s "
                         f"on it (at most {MAX_SECONDS:g} s)")
    buffer = spec.buffer_fraction
    problem = ShardProblem(devices, models, buffer, source)
    for i, m in enumerate(models):
        for j in range(len(m.runtimes)):
            if not problem.eligible(i, j):
                where = f"models[{i}].memory[{j}]" if isinstance(spec.models[i].memory, list) \
                    else f"models[{i}].memory"
                raise InputError(source, where, f"unit {j} needs {m.unit_memory(j):g} bytes; no "
                                 f"device holds it after the {buffer:.0%} double-buffer reserve")
    return problem


def load_problem(path: str | Path) -> ShardProblem:
    """Read and validate a units JSON file; unreadable or malformed files raise InputError."""
    source = str(path)
    return problem_from_dict(read_json(path, "units JSON"), source)


def problem_to_dict(problem: ShardProblem) -> dict[str, Any]:
    """The JSON contract form of a problem (inverse of :func:`problem_from_dict`)."""
    out: dict[str, Any] = {"devices": [], "models": [], "buffer_fraction": problem.buffer_fraction}
    for d in problem.devices:
        dev: dict[str, Any] = {"name": d.name, "speed": d.speed}
        if math.isfinite(d.memory):
            dev["memory"] = d.memory
        out["devices"].append(dev)
    for m in problem.models:
        mod: dict[str, Any] = {"name": m.name, "units": list(m.runtimes)}
        if m.memory:
            mod["memory"] = list(m.memory)
        out["models"].append(mod)
    return out



# -- the shard-unit graph: schema -------------------------------------------------------------
UNIT, DEVICE = "unit", "device"
PRECEDENCE, RUNS_ON = "precedence", "runs-on"
UnitKey = tuple[str, int, int]
DeviceKey = tuple[str, int]


def unit_key(model: int, unit: int) -> UnitKey:
    return (UNIT, model, unit)


def device_key(device: int) -> DeviceKey:
    return (DEVICE, device)


def shard_graph(problem: ShardProblem) -> nx.DiGraph:
    """The problem as the shard-unit graph (see the module docstring for the schema)."""
    g = nx.DiGraph(models=[m.name for m in problem.models],
                   devices=[d.name for d in problem.devices],
                   buffer_fraction=problem.buffer_fraction, source=problem.source)
    for p, d in enumerate(problem.devices):
        g.add_node(device_key(p), kind=DEVICE, name=d.name, index=p, speed=d.speed,
                   memory=d.memory, budget=problem.budget(p))
    for i, m in enumerate(problem.models):
        for j, r in enumerate(m.runtimes):
            u = unit_key(i, j)
            g.add_node(u, kind=UNIT, model=m.name, model_index=i, index=j, runtime=r,
                       memory=m.unit_memory(j))
            if j:
                g.add_edge(unit_key(i, j - 1), u, kind=PRECEDENCE)
            for p in problem.eligible(i, j):
                g.add_edge(u, device_key(p), kind=RUNS_ON, duration=problem.duration(i, j, p))
    return g


def as_graph(problem: ShardProblem | nx.DiGraph) -> nx.DiGraph:
    """A shard-unit graph, from a problem or as given."""
    return problem if isinstance(problem, nx.DiGraph) else shard_graph(problem)


def problem_from_graph(g: nx.DiGraph) -> ShardProblem:
    """The raw problem a shard-unit graph encodes (what the independent validator reads)."""
    devices = [ShardDevice(g.nodes[k]["name"], g.nodes[k]["speed"], g.nodes[k]["memory"])
               for k in devices_of(g)]
    models = []
    for i, chain in enumerate(chains(g)):
        mem = tuple(g.nodes[u]["memory"] for u in chain)
        models.append(ShardModel(g.graph["models"][i], tuple(g.nodes[u]["runtime"] for u in chain),
                                 mem if any(mem) else ()))
    return ShardProblem(devices, models, g.graph["buffer_fraction"],
                        g.graph.get("source", "<graph>"))


# -- the shard-unit graph: accessors ----------------------------------------------------------
def units_of(g: nx.DiGraph) -> list[UnitKey]:
    """Unit vertices, model by model, in chain order."""
    return [u for c in chains(g) for u in c]


def devices_of(g: nx.DiGraph) -> list[DeviceKey]:
    return [device_key(p) for p in range(len(g.graph["devices"]))]


def chains(g: nx.DiGraph) -> list[list[UnitKey]]:
    """Per model (index order), its units following the precedence edges."""
    heads: dict[int, UnitKey] = {}
    for n, d in g.nodes(data=True):
        if d.get("kind") == UNIT and not any(
                g.edges[q, n].get("kind") == PRECEDENCE for q in g.predecessors(n)):
            heads[d["model_index"]] = n
    out = []
    for i in range(len(g.graph["models"])):
        chain, u = [], heads.get(i)
        while u is not None:
            chain.append(u)
            u = next((v for v in g.successors(u) if g.edges[u, v].get("kind") == PRECEDENCE),
                     None)
        out.append(chain)
    return out


def placement_of(u: UnitKey, device: DeviceKey, start: float, end: float) -> Placement:
    return Placement(u[1], u[2], device[1], start, end)


def runs_on(g: nx.DiGraph, u: UnitKey) -> list[tuple[int, float]]:
    """(device index, duration) of every device ``u`` fits, by index."""
    return sorted((v[1], d["duration"]) for v, d in g.adj[u].items() if d.get("kind") == RUNS_ON)


def duration(g: nx.DiGraph, u: UnitKey, device: int) -> float:
    return float(g.edges[u, device_key(device)]["duration"])


def speed(g: nx.DiGraph, device: int) -> float:
    return float(g.nodes[device_key(device)]["speed"])


def work_bound(g: nx.DiGraph) -> float:
    """Fluid bound: all base work spread over the summed speed of all devices."""
    total = sum(d["runtime"] for _, d in g.nodes(data=True) if d.get("kind") == UNIT)
    return total / sum(speed(g, k[1]) for k in devices_of(g))


def chain_bound(g: nx.DiGraph) -> float:
    """Longest chain, each unit on its fastest eligible device."""
    return max((sum(min(t for _, t in runs_on(g, u)) for u in c) for c in chains(g)),
               default=0.0)


def lower_bound(g: nx.DiGraph) -> float:
    """max(work bound, chain bound): every schedule's makespan is at least this."""
    return max(work_bound(g), chain_bound(g))


def trivial_horizon(g: nx.DiGraph) -> float:
    """Makespan of running every unit back to back on its slowest eligible device."""
    return sum(max(t for _, t in runs_on(g, u)) for u in units_of(g))
