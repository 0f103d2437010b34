"""The dry-run executor: every launch spec of a round printed as a JSON line, nothing run.

What ``--executor dry-run`` prints is what the other executors would start
(:func:`~apportion.runtime.executors.launch.launch_spec` is every engine's), so an operator
can read a round's launches before giving it a cluster.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from apportion.runtime.executors.executor import Event, Executor, Health, Progress, actions_for
from apportion.runtime.executors.launch import LaunchSpec, launch_spec

from apportion.decision import Allocation, Decision
from apportion.jobs import JobSpec


class DryRunExecutor(Executor):
    """Prints and returns the launch specs of every action; runs nothing.

    It keeps its own notion of what runs (so a second round's actions are
    reconciled against the first) and reports jobs as never progressing.
    """

    name = "dry-run"

    def __init__(self, workdir: str | Path = "apportion-runs", out: IO[str] | None = None) -> None:
        self.workdir = Path(workdir)
        self.out = out if out is not None else sys.stdout
        self.running: dict[str, Allocation] = {}
        self.jobs: dict[str, JobSpec] = {}
        self.specs: list[LaunchSpec] = []

    def apply(self, decision: Decision, state: Sequence[JobSpec]) -> list[Event]:
        by_id = {j.id: j for j in state}
        self.jobs.update(by_id)
        events: list[Event] = []
        for step in actions_for(decision, self.running, self.running):
            if step.allocation is None:
                self.running.pop(step.job, None)
                ev = Event(step.job, step.action.value, detail="stop with checkpoint")
            else:
                a = step.allocation
                spec = launch_spec(by_id[step.job], a, step.action.value, self.workdir)
                self.specs.append(spec)
                self.running[step.job] = a
                ev = Event(step.job, step.action.value, spec.workers, a.gpu_type,
                           "no change" if step.action.value == "keep" else "launch",
                           spec=spec.as_dict())
            self.out.write(json.dumps(ev.as_dict(), sort_keys=True) + "\n")
            events.append(ev)
        self.out.flush()
        return events

    def poll(self) -> list[Progress]:
        return [Progress(j, self.jobs[j].iterations_done, self.jobs[j].iterations, Health.STARTING,
                         workers=a.plan.gpus, plan=a.plan.label())
                for j, a in sorted(self.running.items())]

    def shutdown(self, checkpoint: bool = True) -> list[Event]:
        events = [Event(j, "preempt", detail="dry-run shutdown") for j in sorted(self.running)]
        self.running.clear()
        return events


__all__ = ["DryRunExecutor"]
