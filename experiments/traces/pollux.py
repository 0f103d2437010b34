"""Pollux's workloads (OSDI'21): ``name,time,application,num_replicas,batch_size``.

Each row is a job as Pollux's evaluation submits it: its arrival second, the application
it trains (one of the six Pollux measured: bert, cifar10, deepspeech2, imagenet, ncf,
yolov3), and the GPUs and global batch a user would ask for (the "TunedJobs" request its
baselines run at). A file replays as given (``--trace <path to workload-N.csv>``, on the
bundled ``pollux-64`` cluster under ``--profile pollux``: a contract, docs/evaluation.md).

What the loader gives each job (:class:`~apportion.experiments.traces.base.SimJob`):

* ``gpus`` and ``batch``: the row's ``num_replicas`` and ``batch_size``;
* ``iterations``: its work in Pollux's units, samples of the application's smallest
  validated batch ``M0`` up to the end of its last epoch
  (:func:`~apportion.estimation.goodput.application_work`), the unit the ``pollux``
  truth's rates are in;
* ``batch_range``: ``(M0, the largest validated batch)``, the batches a scheduler may
  choose (Pollux's own does, each epoch); ncf's is none: Pollux's simulator fixes ncf at
  its workload batch (32,768) on one GPU, so a replay does too.

A policy that does not choose the batch runs the job at ``batch`` (the baselines'
setting). The truth is :class:`~apportion.experiments.pollux_truth.PolluxTruth`, read from
``$APPORTION_DATA/pollux``.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from apportion.experiments.pollux_truth import check_application, pollux_app
from apportion.experiments.traces.base import (
    POSITIVE_COUNT,
    SECONDS,
    SimJob,
    Trace,
    read_trace_csv,
    sorted_jobs,
)
from apportion.experiments.traces.registry import TraceFormat, register

from apportion.errors import InputError

COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
#: applications whose batch Pollux's simulator never moves (its ``ncf`` rule)
FIXED_BATCH = frozenset({"ncf"})


def load_pollux_workload(path: str | Path) -> Trace:
    """Read one of Pollux's workload files, refusing (line and column named) a row it
    cannot replay: an application Pollux did not measure, a batch outside its validated
    range."""
    p = Path(path)
    src = str(p)
    _, table = read_trace_csv(p, COLUMNS, "name",
                              {"time": SECONDS, "num_replicas": POSITIVE_COUNT,
                               "batch_size": POSITIVE_COUNT})
    jobs: list[SimJob] = []
    for i, r in table.iter():
        app = (r.get("application") or "").strip()
        check_application(src, table.where(i, "application"), app)
        a = pollux_app(app)
        batch = int(table.number(i, "batch_size"))
        if not a.init_batch <= batch <= a.max_batch:
            raise InputError(src, table.where(i, "batch_size"), f"{batch} is outside {app}'s "
                             f"validated batches ({a.init_batch}-{a.max_batch}): Pollux "
                             "measured no gradient statistics there")
        jobs.append(SimJob(job_id=r["name"], submit_s=float(table.number(i, "time")),
                           gpus=int(table.number(i, "num_replicas")), iterations=a.work,
                           job_type=app, model=app, batch=batch,
                           batch_range=None if app in FIXED_BATCH else
                           (a.init_batch, a.max_batch)))
    notes = []
    unordered = sum(1 for x, y in itertools.pairwise(jobs) if y.submit_s < x.submit_s)
    if unordered:
        notes.append(f"{unordered} arrival times out of order (sorted)")
    if any(j.job_type in FIXED_BATCH for j in jobs):
        notes.append("ncf jobs keep their workload batch (Pollux's simulator fixes it)")
    return Trace(p.stem, sorted_jobs(jobs), src, notes, "pollux")


def example(folder: Path) -> str:
    """Three jobs of Pollux's applications (the head of its workload 6)."""
    f = folder / "workload-example.csv"
    f.write_text("name,time,application,num_replicas,batch_size\n"
                 "cifar10-0,53,cifar10,6,2048\n"
                 "ncf-1,120,ncf,1,32768\n"
                 "yolov3-2,300,yolov3,4,64\n")
    return str(f)


POLLUX = register(TraceFormat(
    name="pollux", doc="Pollux's workloads (OSDI'21): its six applications, replayed on its "
    "measured step times and gradient statistics", load=load_pollux_workload,
    columns=COLUMNS, priority=50, truth="pollux", truths=("pollux",),
    why="its jobs are Pollux's applications, whose rates only Pollux's measurements give",
    coverage="every", example=example, example_cluster="pollux-64"))
