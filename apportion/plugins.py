"""What installed packages offer apportion through entry points, read once per group.

The installed packages' metadata is read once for the five groups: each pass opens every
package's ``entry_points.txt`` (10 ms in an environment of 150 packages, and a round
asks for two groups).

Five groups, each a name -> object: ``apportion.policies`` (a policy factory or class),
``apportion.formulations`` (a recipe), ``apportion.estimators`` (an estimator class or
factory), ``apportion.executors`` (an executor factory) and ``apportion.trace_formats``
(a trace format, :class:`apportion.experiments.traces.TraceFormat`, or a factory of one). A plug-in that fails to load is
logged, named, and left out: a broken package never breaks a command.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

log = logging.getLogger(__name__)

GROUPS = ("apportion.policies", "apportion.formulations", "apportion.estimators",
          "apportion.executors", "apportion.trace_formats")
_LOADED: dict[str, dict[str, Any]] = {}
_DECLARED: dict[str, list[Any]] = {}


def _declared(group: str) -> list[Any]:
    """The entry points of ``group``, from one pass over the metadata for all of
    :data:`GROUPS` (another group: a pass of its own)."""
    if group not in GROUPS:
        return list(entry_points(group=group))
    if not _DECLARED:
        every = entry_points()
        _DECLARED.update({g: list(every.select(group=g)) for g in GROUPS})
    return _DECLARED[group]


def plugins(group: str) -> dict[str, Any]:
    """The objects the installed packages register under ``group`` (loaded once)."""
    if group not in _LOADED:
        found: dict[str, Any] = {}
        for ep in _declared(group):
            try:
                found[ep.name] = ep.load()
            except Exception as exc:  # noqa: BLE001 - a broken plug-in must not break the CLI
                log.warning("plug-in %s (%s) of %s not loaded: %s", ep.name, ep.value, group,
                            exc)
        _LOADED[group] = found
    return _LOADED[group]


def call_with(factory: Callable[..., Any], **available: Any) -> Any:
    """Call a plug-in's factory with the keyword arguments it declares of ``available`` (a
    factory taking ``**kwargs`` gets them all)."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or C callable: no arguments
        return factory()
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return factory(**available)
    return factory(**{k: v for k, v in available.items() if k in params})


def takes(factory: Callable[..., Any], name: str) -> bool:
    """Whether ``factory`` takes a keyword argument ``name`` (by name or ``**kwargs``)."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
