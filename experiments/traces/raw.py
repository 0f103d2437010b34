"""Raw cluster traces (Microsoft Philly, ITP): the normalised CSV's ``job_id,
submit_time_s, num_gpus, duration_s`` and no ``model`` column.

Such a trace says when jobs came, how many GPUs they asked for and how long they ran,
but not what they trained: a replay needs the papers' adaptation, which draws a model,
batch, GPU count and type for every job (:func:`~apportion.experiments.traces.crius.
adapt_crius`, Crius section 8.1) from Crius's measured models — so its one ground truth
is Crius's, and the adaptation is recorded as a substitution of every job it keeps. A
CSV whose jobs carry a ``model`` column is never this format: its models are the file's
(:mod:`.workload`, or a paper's format).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from apportion.experiments.traces.base import Trace, busiest_window
from apportion.experiments.traces.crius import adapt_crius
from apportion.experiments.traces.normalised import REQUIRED, load_normalised_csv
from apportion.experiments.traces.registry import Preparation, TraceFormat, register


def adapt(trace: Trace, prep: Preparation) -> Trace:
    """The busiest ``--window-days`` (when given), then Crius's adaptation."""
    t = trace
    if prep.window_days:
        s, e = busiest_window(t, prep.window_days * 24)
        t = t.window(s, e)
    return adapt_crius(t, prep.truth, seed=prep.seed)


def example(folder: Path) -> str:
    """Four jobs of a cluster trace: arrival, GPUs, duration, no model."""
    f = folder / "cluster-trace.csv"
    f.write_text("job_id,submit_time_s,num_gpus,duration_s,tenant\n"
                 "j0,0,8,7200,t1\nj1,100,1,3600,t2\nj2,400,2,1800,t1\nj3,900,4,600,t3\n")
    return str(f)


RAW = register(TraceFormat(
    name="raw", doc="a raw cluster trace (Philly, ITP): no models; Crius's adaptation draws "
    "them", load=partial(load_normalised_csv, fmt="raw"), columns=REQUIRED,
    without=("model",), priority=10, truth="crius", truths=("crius",),
    why="a raw cluster trace carries no models, batches or GPU types: Crius's adaptation "
    "draws them from Crius's measured models, so only Crius's truth rates what it draws",
    prepare=adapt, coverage="none", example=example))
