"""The public names of the bundled traces, for what a reader of a figure or a table sees.

A trace keeps its file's name inside apportion (``simulate_trace_venus``, ``workload-bp``:
what the summaries, the CSVs and ``--trace`` use); a plot's title names the data set as
its paper does, so a figure goes into a report without editing. A slice keeps its range
(``philly[:100]`` is "Microsoft Philly, first 100 jobs"); a name without a public one (a
generated family, a user's file) is shown as it is.
"""

from __future__ import annotations

import re

#: trace name (its file's stem) -> the data set's public name
PUBLIC_NAMES = {
    "philly": "Microsoft Philly (Jeon et al., ATC'19)",
    "itp": "Microsoft ITP (ElasticFlow's release)",
    "gavel_msr_seed0": "Gavel's Philly-derived workload",
    "elasticflow_philly_103959": "ElasticFlow's Philly cluster 103959",
    "max_min_fairness": "Gavel's max-min fairness trace",
    "minimize_makespan": "Gavel's makespan trace",
    "small_test": "Gavel's small trace",
    "medium_test": "Gavel's medium trace",
    "artifact_evaluation": "Gavel's artifact trace",
    "simulate_trace_philly": "Crius's Philly trace",
    "simulate_trace_venus": "Crius's Venus trace (SenseTime Helios)",
    "simulate_trace_pai": "Crius's PAI trace (Alibaba)",
    "runtime_trace": "Crius's testbed trace",
    "workload-base": "Morphling's base workload",
    "workload-bp": "Morphling's batch-parallel workload",
    "workload-mt": "Morphling's multi-tenant workload",
    **{f"FM-{load}-roberta-{size}": f"YMIR's FM-{load} (RoBERTa-{size})"
       for load in ("1", "1.5", "2") for size in ("base", "large")},
}

_SLICE = re.compile(r"^(?P<name>[^\[]+)(?P<slices>(\[[^\]]*\])*)$")
_HEAD = re.compile(r"^\[:(\d+)\]$")


def public_name(trace: str) -> str:
    """``trace``'s public name with its slices said in words; ``trace`` itself where it has
    none."""
    m = _SLICE.match(trace)
    if m is None or m["name"] not in PUBLIC_NAMES:
        return trace
    words = [PUBLIC_NAMES[m["name"]]]
    for part in re.findall(r"\[[^\]]*\]", m["slices"]):
        head = _HEAD.match(part)
        words.append(f"first {head[1]} jobs" if head else f"window {part[1:-1]} s")
    return ", ".join(words)
