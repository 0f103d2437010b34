"""Shell completion of option values, and the environment's defaults for ``--state`` and
``--cluster``.

Completion goes through Typer's (Click's) completion machinery: ``apportion
--install-completion`` installs it for bash, zsh, fish or PowerShell, and each function
here is an option's ``autocompletion`` callback, returning the values that start with
what is typed (with a line of help where there is one). For ``--cluster`` and
``--trace``, which may also be files, a word that names no bundled value returns
nothing, and the shell completes paths instead (bash's ``-o default``, zsh's ``_files``).

``APPORTION_STATE`` and ``APPORTION_CLUSTER`` stand for ``--state`` and ``--cluster``
where a command is not given them; a flag on the command line always wins.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import typer

log = logging.getLogger("apportion.cli")

ENV_STATE = "APPORTION_STATE"
ENV_CLUSTER = "APPORTION_CLUSTER"
SIM_ESTIMATORS = ("analytic", "crius", "morphling", "tables")


def _matching(names: Any, incomplete: str, helps: dict[str, str] | None = None
              ) -> list[tuple[str, str]]:
    return [(n, (helps or {}).get(n, "")) for n in sorted(set(names)) if n.startswith(incomplete)]


def policies(incomplete: str) -> list[tuple[str, str]]:
    """Every registered policy (installed plug-ins' too), with what it does."""
    from apportion.policies import POLICIES, load_plugins

    load_plugins()
    return _matching(POLICIES, incomplete,
                     {k: str(v).split(". ")[0][:70] for k, v in POLICIES.items()})


def policy_list(incomplete: str) -> list[tuple[str, str]]:
    """``--policies a,b,...``: the name being typed after the last comma."""
    head, _, last = incomplete.rpartition(",")
    done = set(head.split(",")) if head else set()
    prefix = f"{head}," if head else ""
    return [(prefix + name, why) for name, why in policies(last) if name not in done]


def executors(incomplete: str) -> list[tuple[str, str]]:
    """``--executor``: every registered executor (installed plug-ins' too)."""
    from apportion.runtime.executors.registry import executors as registered

    found = registered()
    return _matching(found, incomplete, {k: v.doc[:70] for k, v in found.items()})


def objective_presets(incomplete: str) -> list[tuple[str, str]]:
    """``--objective-preset``: the named objectives."""
    from apportion.formulations.objectives import PRESETS

    return _matching(PRESETS, incomplete)


def backends(incomplete: str) -> list[tuple[str, str]]:
    from apportion.policies.config import BACKENDS

    return _matching(BACKENDS, incomplete)


def estimators(incomplete: str) -> list[tuple[str, str]]:
    from apportion.estimation.registry import ESTIMATORS

    return _matching(ESTIMATORS, incomplete)


def sim_estimators(incomplete: str) -> list[tuple[str, str]]:
    return _matching(SIM_ESTIMATORS, incomplete)


def traces(incomplete: str) -> list[tuple[str, str]]:
    """Bundled trace names and the generated families (a path: the shell's own)."""
    from apportion.experiments.trace_catalog import BUNDLED

    return _matching([*BUNDLED, "synthetic", "fm-generated"], incomplete,
                     {"synthetic": "synthetic[:N] jobs", "fm-generated": "fm-generated[:N]"})


def clusters(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """Bundled cluster names and aliases (``local`` where the command runs here; a path:
    the shell's own)."""
    from apportion.config import CLUSTER_ALIASES, bundled_clusters

    names = {n: "bundled" for n in bundled_clusters()}
    names.update({a: f"alias of {c}" for a, c in CLUSTER_ALIASES.items()})
    if ctx.command.name in ("run", "serve"):
        names["local"] = "this machine's GPUs (or CPU)"
    return _matching(names, incomplete, names)


def from_environment(ctx: typer.Context, param: Any, value: Any) -> Any:
    """An option's callback: say (at INFO) when its value came from the environment."""
    source = ctx.get_parameter_source(param.name or "")
    if value is not None and getattr(source, "name", "") == "ENVIRONMENT":
        log.info("%s %s from $%s", param.opts[0], value, param.envvar)
    return value


def env_state() -> str | None:
    """``$APPORTION_STATE``, or None when unset or empty."""
    return os.environ.get(ENV_STATE) or None
