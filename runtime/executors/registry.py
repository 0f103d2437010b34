"""The executor registry: every executor ``run`` and ``serve`` take as ``--executor``, by one
name.

An :class:`ExecutorType` says what an executor is, how one is **built** (a factory of the
arguments it takes of ``workdir``, ``cluster``, ``launch_log`` and ``options``), which of
the run's **options** it reads (:data:`RUN_OPTIONS`: ``--grace-period``,
``--checkpoint-every``, ``--ray-address``, ``--kubeconfig``, ...), how its settings are
**checked** before the run opens anything (exit 2, nothing written), and the device its
workers run on (the plans a round may offer). The run's setup asks the type, never a
string ladder.

Built-in executors register from their own rooms (``dry_run/``, ``local/``, ``slurm/``,
``ray/``, ``kubernetes/``: each room's ``__init__`` declares its type, and imports its
engine only when one is built, so a run pays only for the engine it drives). A plug-in
registers through the ``apportion.executors`` entry-point group: an :class:`ExecutorType`,
or (as before the registry) a factory of an executor, which becomes a type of the entry
point's name that reads no run option. Plug-ins are read on first use, so one is listed by
``apportion executors``, taken by ``--executor`` and checked by
:func:`apportion.testing.check_executor` like a built-in. A plug-in never replaces a
built-in (``--executor local`` is always apportion's): one that takes a name already
registered is logged and left out, as is one that fails to load.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apportion.runtime.executors.executor import Executor, as_executor

from apportion.cluster import Cluster
from apportion.errors import InputError
from apportion.plugins import call_with, plugins

log = logging.getLogger(__name__)

#: the entry-point group of executor plug-ins
ENTRY_POINT_GROUP = "apportion.executors"
#: the run's options an executor may read (``ExecutorType.reads``), by the flag that sets each
RUN_OPTIONS = {
    "stop_timeout_s": "--grace-period",
    "checkpoint_every": "--checkpoint-every",
    "checkpoint_interval_s": "--checkpoint-interval",
    "ray_address": "--ray-address",
    "kubeconfig": "--kubeconfig",
    "k8s_config": "--k8s-config",
    "drain": "--drain",
}


@dataclass(frozen=True)
class ExecutorType:
    """One executor: what it is, how it is built, what of the run it reads.

    * ``make``: a factory called with the arguments it declares of ``workdir`` (the run's
      ``--workdir``), ``cluster`` (the :class:`~apportion.cluster.Cluster` the rounds plan
      on), ``launch_log`` (where it records the worker groups it starts, intent first:
      :class:`~apportion.runtime.executors.executor.LaunchLog`) and ``options`` (the run's
      options it ``reads`` that were given: an option not given is left out, so the
      executor's own default holds); it returns an
      :class:`~apportion.runtime.executors.executor.Executor`.
    * ``reads``: names of :data:`RUN_OPTIONS`.
    * ``check``: called with the same ``options`` before the run locks its store; raises
      :class:`~apportion.errors.InputError` for a bad setting (a settings file, a
      variable), so a bad setting writes nothing.
    * ``device``: what its workers run on, for the plans a round may offer: ``cuda`` (a
      cluster's GPUs), or None for this host's own (CUDA where present, else the CPU).
    * ``needs``: what must be installed or reachable, in words (``apportion executors``).
    """

    name: str
    doc: str
    make: Callable[..., Any]
    reads: tuple[str, ...] = ()
    check: Callable[[dict[str, Any]], None] | None = None
    device: str | None = "cuda"
    needs: str = ""

    def given(self, options: dict[str, Any] | None) -> dict[str, Any]:
        """The run options it reads, of ``options`` (a value of None: not given)."""
        return {k: v for k, v in (options or {}).items() if k in self.reads and v is not None}

    def check_settings(self, options: dict[str, Any] | None) -> None:
        """Its own settings checked (``check``) with the run's ``options``: an
        :class:`~apportion.errors.InputError` (exit 2) before anything is opened."""
        if self.check is not None:
            self.check(self.given(options))


_TYPES: dict[str, ExecutorType] = {}
_FROM_PLUGINS: set[str] = set()  # names the entry points added
_PLUGINS = {"loaded": False}


def register(kind: ExecutorType) -> ExecutorType:
    """Add ``kind`` (a name already registered is replaced). Returns it, so a module can
    keep the object it registered."""
    if not isinstance(kind, ExecutorType):
        raise TypeError(f"{kind!r} is not an ExecutorType")
    unknown = [r for r in kind.reads if r not in RUN_OPTIONS]
    if unknown:
        raise ValueError(f"executor {kind.name}: reads {', '.join(unknown)}, not run options "
                         f"({', '.join(RUN_OPTIONS)})")
    if not callable(kind.make):
        raise TypeError(f"executor {kind.name}: make is not callable")
    _TYPES[kind.name] = kind
    return kind


def load_plugins() -> list[str]:
    """Register what installed packages offer under ``apportion.executors`` (once);
    returns the names added. A plug-in that fails to load, or takes a name already
    registered (a built-in's), is logged and left out."""
    if _PLUGINS["loaded"]:
        return []
    _PLUGINS["loaded"] = True
    added = []
    for name, obj in plugins(ENTRY_POINT_GROUP).items():
        try:
            kind = obj if isinstance(obj, ExecutorType) else ExecutorType(
                name, _first_line(obj, f"plug-in {name}"), obj)
            if kind.name in _TYPES:
                raise ValueError(f"{kind.name!r} is registered already")
            register(kind)
            _FROM_PLUGINS.add(kind.name)
            added.append(kind.name)
        except Exception as exc:  # noqa: BLE001 - a broken plug-in must not break the CLI
            log.warning("executor plug-in %s not registered: %s", name, exc)
    return added


def _first_line(obj: Any, default: str) -> str:
    return ((getattr(obj, "__doc__", None) or "").strip().splitlines() or [default])[0]


def executors() -> dict[str, ExecutorType]:
    """Every registered executor by name, plug-ins included (built-ins first)."""
    load_plugins()
    return dict(_TYPES)


def executor_names() -> list[str]:
    """Every executor ``--executor`` accepts."""
    return list(executors())


def from_plugin(name: str) -> bool:
    """Whether the executor ``name`` came from an installed package's entry point."""
    return name in _FROM_PLUGINS


def registered_now() -> tuple[str, ...]:
    """The executors registered so far, plug-ins not read: once the package is imported,
    apportion's own (:data:`apportion.runtime.executors.EXECUTORS`)."""
    return tuple(_TYPES)


def executor_type(name: str) -> ExecutorType:
    """The executor registered as ``name``; an :class:`InputError` naming ``--executor``
    and the known ones for any other."""
    found = executors().get(name)
    if found is None:
        raise InputError("--executor", "executor", f"{name!r} is not one of "
                         f"{', '.join(executor_names())}")
    return found


def reads(name: str, option: str) -> bool:
    """Whether the executor ``name`` reads the run option ``option`` (a name not
    registered reads none: the run refuses it by name)."""
    kind = executors().get(name)
    return kind is not None and option in kind.reads


def readers(option: str) -> list[str]:
    """The executors that read the run option ``option`` (a flag's refusal names them)."""
    return [k.name for k in executors().values() if option in k.reads]


def make_executor(name: str, workdir: Path, cluster: Cluster, launch_log: Any = None,
                  options: dict[str, Any] | None = None) -> Executor:
    """Build the executor registered as ``name`` for a run in ``workdir`` on ``cluster``;
    ``options``: the run's options (:data:`RUN_OPTIONS`; each executor is given those it
    reads)."""
    kind = executor_type(name)
    built = call_with(kind.make, workdir=workdir, cluster=cluster, launch_log=launch_log,
                      options=kind.given(options))
    return as_executor(built)


__all__ = ["ENTRY_POINT_GROUP", "RUN_OPTIONS", "ExecutorType", "executor_names",
           "executor_type", "executors", "from_plugin", "load_plugins", "make_executor",
           "readers", "reads", "register", "registered_now"]
