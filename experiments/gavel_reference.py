"""Gavel's own simulator's figures on its ``max_min_fairness.trace``, 8:8:8, seed 0.

The reference the ``gavel`` profile is held to (``experiments/GAVEL_FIDELITY.md``;
``python -m apportion.experiments.reproduce gavel`` divides by these). Measured by
running Gavel's simulator unmodified, stanford-futuredata/gavel @ c4fa400, from its
``scheduler/`` folder, on Python 3.11.7, cvxpy 1.9.3, numpy 2.4.6, ECOS 2.0.14 (CPU)::

    python scripts/drivers/simulate_scheduler_with_trace.py \\
        -t traces/physical_cluster/max_min_fairness.trace -c 8:8:8 --seed 0 -p POLICY

(defaults otherwise: ``--solver ECOS``, ``--time_per_iteration 360``,
``--num_gpus_per_server 1:1:1``). Two modules its simulation path never calls were
stubbed so it imports without them: ``matrix_completion`` (throughput estimation) and
``runtime.rpc`` (gRPC, the physical cluster). Each run takes about 5 s.

``VARIANTS`` are the same runs with one of Gavel's mechanisms changed at load time,
to measure what a deviation accounts for: ``fifo-drawn-type`` makes Gavel's base FIFO
use the type it draws (its code assigns the last available type in name order, v100
first, even where the job's GPUs do not fit: the drawn index only picks which type
leaves the free list), ``gandiva-no-packing`` makes Gavel's Gandiva never co-locate
(its equal share over single jobs, as apportion's ``gandiva``).
"""

from __future__ import annotations

#: apportion policy -> Gavel policy (``-p``)
GAVEL_POLICY = {"fifo": "fifo", "gavel-max-min-fairness": "max_min_fairness_perf",
                "gavel-max-sum-throughput": "max_sum_throughput_perf", "gandiva": "gandiva"}

#: Gavel's average JCT (s), makespan (s) and cluster utilisation, as it prints them
GAVEL = {
    "fifo": {"avg_jct_s": 47735.107, "makespan_s": 212506.982, "utilization": 0.516},
    "gavel-max-min-fairness": {"avg_jct_s": 30405.755, "makespan_s": 84351.567,
                               "utilization": 0.952},
    "gavel-max-sum-throughput": {"avg_jct_s": 33639.413, "makespan_s": 90522.327,
                                 "utilization": 0.937},
    "gandiva": {"avg_jct_s": 28944.939, "makespan_s": 89753.374, "utilization": 0.935},
}

#: the measurement variants (see the module docstring), seed 0
VARIANTS = {
    "fifo-drawn-type": {"policy": "fifo", "avg_jct_s": 41676.092, "makespan_s": 190077.513,
                        "utilization": 0.579},
    "gandiva-no-packing": {"policy": "gandiva", "avg_jct_s": 27004.149,
                           "makespan_s": 93862.648, "utilization": 0.936},
}

#: FIFO's average JCT (s) over seeds 0-4: Gavel as it is, and with the drawn type
FIFO_SEEDS = {
    "gavel": [47735.107, 47735.107, 47735.107, 47735.107, 42018.353],
    "gavel-fifo-drawn-type": [41676.092, 43503.380, 43822.182, 39972.522, 44398.718],
}
