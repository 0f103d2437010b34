"""Executors: a round's decision becomes running worker groups, one room per engine.

Every executor subclasses :class:`Executor` (:mod:`.executor`: the three calls, and what a
run asks besides) and is registered by name (:mod:`.registry`): the built-ins from their
rooms — ``dry_run/``, ``local/``, ``slurm/``, ``ray/``, ``kubernetes/``, each importing its
engine only when one is built — and an installed package's through the
``apportion.executors`` entry-point group. What every engine shares: the launch spec
(:mod:`.launch`), confined job folders (:mod:`.confined`), processes (:mod:`.procs`) and
what an importer read of a cluster (:mod:`.imported`).

An executor of one's own, in a few lines (``examples/executor_plugin`` is one)::

    from apportion.runtime.executors import Executor, ExecutorType, actions_for

    class Mine(Executor):
        name = "mine"
        def apply(self, decision, state): ...
        def poll(self): ...
        def shutdown(self, checkpoint=True): ...

    mine = ExecutorType("mine", "what it does", lambda workdir: Mine())

declared in a package's ``[project.entry-points."apportion.executors"]`` as
``mine = "my_module:mine"``; ``apportion.testing.check_executor("mine")`` checks it.
"""

from __future__ import annotations

# each room registers its executor as it is imported, in the order they are listed
from apportion.runtime.executors import dry_run  # noqa: F401
from apportion.runtime.executors import local  # noqa: F401
from apportion.runtime.executors import slurm  # noqa: F401
from apportion.runtime.executors import ray  # noqa: F401
from apportion.runtime.executors import kubernetes  # noqa: F401
from apportion.runtime.executors.executor import (
    Event,
    Executor,
    Health,
    LaunchLog,
    Progress,
    Reconciled,
    actions_for,
    as_executor,
)
from apportion.runtime.executors.registry import (
    RUN_OPTIONS,
    ExecutorType,
    executor_names,
    executor_type,
    executors,
    make_executor,
    register,
    registered_now,
)

#: apportion's own executors (``--executor``), in the order ``apportion executors`` lists them
EXECUTORS: tuple[str, ...] = registered_now()

__all__ = ["EXECUTORS", "RUN_OPTIONS", "Event", "Executor", "ExecutorType", "Health",
           "LaunchLog", "Progress", "Reconciled", "actions_for", "as_executor",
           "executor_names", "executor_type", "executors", "make_executor", "register"]
