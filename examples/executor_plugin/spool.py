"""An executor of one's own, as a plug-in: a spool folder for a site's own launcher.

Each launch a round decides (a start, resize, migration or restart) is written into
``WORKDIR/spool`` as one JSON file, its launch spec (the command, environment and placement
of every rank: what the built-in executors would start), and each stop as another; the
site's launcher picks them up. Installed, ``apportion executors`` lists it, ``apportion run
--executor spool`` applies rounds through it, and ``apportion.testing.check_executor
("spool")`` checks it.
"""

import json
from pathlib import Path

from apportion.runtime.executors import Event, Executor, ExecutorType, Health, Progress, actions_for
from apportion.runtime.executors.launch import launch_spec


class Spool(Executor):
    name = "spool"

    def __init__(self, workdir: Path) -> None:
        self.folder = Path(workdir) / "spool"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.running = {}  # job id -> (its allocation, its JobSpec)

    def _spool(self, job: str, what: str, body: dict) -> None:
        n = len(list(self.folder.iterdir())) + 1
        (self.folder / f"{n:06d}-{job}-{what}.json").write_text(json.dumps(body, sort_keys=True))

    def apply(self, decision, state):
        jobs, events = {j.id: j for j in state}, []
        for step in actions_for(decision, self.running, self.running):
            a = step.allocation
            if a is None:  # preempted: the launcher checkpoints and stops it
                self.running.pop(step.job)
                self._spool(step.job, "stop", {"job": step.job, "checkpoint": True})
                events.append(Event(step.job, "preempt", detail="stop spooled"))
            elif step.action.value == "keep":
                events.append(Event(step.job, "keep", a.plan.gpus, a.gpu_type, "no change"))
            else:
                spec = launch_spec(jobs[step.job], a, step.action.value, self.folder.parent)
                self.running[step.job] = (a, jobs[step.job])
                self._spool(step.job, "launch", spec.as_dict())
                events.append(Event(step.job, step.action.value, a.plan.gpus, a.gpu_type,
                                    "launch spooled", spec=spec.as_dict()))
        return events

    def poll(self):
        return [Progress(j, job.iterations_done, job.iterations, Health.STARTING,
                         workers=a.plan.gpus, plan=a.plan.label())
                for j, (a, job) in sorted(self.running.items())]

    def shutdown(self, checkpoint=True):
        for j in sorted(self.running):
            self._spool(j, "stop", {"job": j, "checkpoint": checkpoint})
        events = [Event(j, "preempt", detail="stop spooled") for j in sorted(self.running)]
        self.running.clear()
        return events


spool = ExecutorType("spool", "each launch spec and stop as a JSON file in WORKDIR/spool, for "
                     "a site's own launcher", Spool)
