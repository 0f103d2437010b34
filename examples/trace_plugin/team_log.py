"""A trace format of one's own, as a plug-in: a team's job log.

Its files have the columns ``id, arrival_min, gpus, model, batch, steps`` (arrival in
minutes). Installed, ``apportion traces`` lists it, ``simulate --trace FILE`` detects a
file of it by those columns and replays it on the analytic model's rates (catalog models)
or, with ``--tables``, on the team's own measurements.
"""

from pathlib import Path

from apportion.experiments.traces import (
    ITERATIONS,
    POSITIVE_COUNT,
    SECONDS,
    SimJob,
    Trace,
    TraceFormat,
    read_trace_csv,
    sorted_jobs,
)

COLUMNS = ("id", "arrival_min", "gpus", "model", "batch", "steps")


def load(path: Path) -> Trace:
    _, rows = read_trace_csv(path, COLUMNS, "id", {"arrival_min": SECONDS,
                             "gpus": POSITIVE_COUNT, "batch": POSITIVE_COUNT, "steps": ITERATIONS})
    jobs = [SimJob(r["id"], 60.0 * rows.number(i, "arrival_min"), int(rows.number(i, "gpus")),
                   float(rows.number(i, "steps")), r["model"], model=r["model"],
                   batch=int(rows.number(i, "batch"))) for i, r in rows.iter()]
    return Trace(path.stem, sorted_jobs(jobs), str(path))


def example(folder: Path) -> str:
    (folder / "team.log.csv").write_text("id,arrival_min,gpus,model,batch,steps\n"
                                         "a,0,2,bert-0.76b,64,500\nb,5,4,wresnet-0.5b,256,300\n")
    return str(folder / "team.log.csv")


team_log = TraceFormat(name="team-log", doc="a team's job log (arrival in minutes)", load=load,
                       columns=COLUMNS, truth="analytic", coverage="every", example=example)
