"""Write Philly days N (raw traces) for ``apportion compare``: day N of the 14-day,
~13,000-job Philly window of ``apportion bench sim`` (the window whose first day is the
Crius 8.4 reproduction's "Philly day 1"), rebased to start at 0. ``compare`` adapts a raw
trace onto Crius's measured models with each run's seed (Crius 8.1), so seeds are
different workloads of the same arrivals.

    python experiments/results/quality/philly_days.py OUT_DIR 1 4 7
"""

from __future__ import annotations

import sys
from pathlib import Path

from apportion.experiments import trace_catalog as catalog
from apportion.experiments.bench.sim import window_with

DAY = 86400.0


def main(out: str, days: list[int]) -> None:
    raw = catalog.load_trace("philly")
    start, _ = window_with(raw, 14.0, 13000)
    Path(out).mkdir(parents=True, exist_ok=True)
    for d in days:
        t = raw.window(start + (d - 1) * DAY, start + d * DAY)
        rows = ["job_id,submit_time_s,num_gpus,duration_s,tenant"]
        rows += [f"{j.job_id},{j.submit_s:.0f},{j.gpus},{j.duration_s:.0f},{j.tenant}" for j in t.jobs]
        p = Path(out) / f"philly-d{d}.csv"
        p.write_text("\n".join(rows) + "\n")
        print(p, len(t.jobs), "jobs")


if __name__ == "__main__":
    main(sys.argv[1], [int(x) for x in sys.argv[2:]])
