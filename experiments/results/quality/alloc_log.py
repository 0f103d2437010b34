"""One replay with every round's allocations logged, and a job's allocation history.

Why: the quality tables give averages; finding why a baseline wins needs the jobs that
differ and what each round gave them (session 16: a two-day job moved between A100 and
V100 every round or two for short arrivals). Writes ``OUT.jobs.csv`` (the replay's
per-job table) and ``OUT.alloc.pkl`` (per round: time, job -> (GPU type, GPUs), active
jobs); then prints the allocation history of the jobs named, or of the most moved ones.

    python experiments/results/quality/alloc_log.py TRACE CLUSTER POLICY SEED OUT \\
        [--information oracle] [--options '{"round_excess": 0.0}'] [--deterministic]
        [--jobs ID ...]
    python experiments/results/quality/alloc_log.py --history OUT [--jobs ID ...]
"""

from __future__ import annotations

import argparse
import json
import pickle
from collections import Counter
from dataclasses import replace
from typing import Any

Log = list[tuple[float, dict[str, tuple[str, int]], int]]


def replay(trace: str, cluster: str, policy: str, seed: int, out: str, information: str,
           options: dict[str, Any], deterministic: bool = False) -> dict[str, float]:
    """Run one replay, logging each round's allocations; returns the replay's summary."""
    from apportion.experiments import harness as h
    from apportion.policies import make_policy
    from apportion.experiments.simulator import Simulator

    cl = h.cluster_from_arg(cluster)
    jobs, truth = h.resolve(trace, cl, seed)
    cfg = replace(h.PROFILES["default"], seed=seed, information=information,
                  deterministic=deterministic)
    log: Log = []

    class Logged(Simulator):
        def _apply(self, decision: Any, active: Any, states: Any, now: float) -> Any:
            log.append((now, {a.job: (a.gpu_type, a.gpus) for a in decision.allocations},
                        len(active)))
            return super()._apply(decision, active, states, now)

    res = Logged(cl, jobs, make_policy(policy, **options), truth, cfg).run()
    res.jobs.to_csv(out + ".jobs.csv", index=False)
    with open(out + ".alloc.pkl", "wb") as f:
        pickle.dump(log, f)
    return {k: res.summary[k] for k in ("avg_jct_s", "p99_jct_s")}


def history(log: Log, jobs: list[str] | None = None, top: int = 8
            ) -> dict[str, list[tuple[int, tuple[str, int] | None]]]:
    """Each job's (time, allocation) at every change; without ``jobs``, the most moved."""
    if not jobs:
        moves: Counter[str] = Counter()
        last: dict[str, tuple[str, int] | None] = {}
        for _, alloc, _ in log:
            for j, v in alloc.items():
                if last.get(j) is not None and v != last[j]:
                    moves[j] += 1
            last = {**{j: None for j in last}, **alloc}
        jobs = [j for j, _ in moves.most_common(top)]
    out: dict[str, list[tuple[int, tuple[str, int] | None]]] = {}
    for j in jobs:
        seq: list[tuple[int, tuple[str, int] | None]] = []
        prev: tuple[str, int] | None = None
        for t, alloc, _ in log:
            v = alloc.get(j)
            if v != prev:
                seq.append((int(t), v))
                prev = v
        out[j] = seq
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("args", nargs="*", help="TRACE CLUSTER POLICY SEED OUT")
    ap.add_argument("--information", default="estimated", choices=["estimated", "oracle"])
    ap.add_argument("--options", default="{}", help="policy options, JSON")
    ap.add_argument("--deterministic", action="store_true",
                    help="the solver's budget in work, not seconds (a replay repeats)")
    ap.add_argument("--history", metavar="OUT", help="print the histories of OUT.alloc.pkl")
    ap.add_argument("--jobs", nargs="*", default=None)
    a = ap.parse_args()
    if a.history:
        out = a.history
    else:
        if len(a.args) != 5:
            ap.error("TRACE CLUSTER POLICY SEED OUT are needed without --history")
        trace, cluster, policy, seed, out = a.args
        print(replay(trace, cluster, policy, int(seed), out, a.information,
                     json.loads(a.options), a.deterministic))
    with open(out + ".alloc.pkl", "rb") as f:
        log: Log = pickle.load(f)
    for j, seq in history(log, a.jobs).items():
        print(j, seq)


if __name__ == "__main__":
    main()
