"""A full round offers no job more GPUs than it asked for (formulations.candidates.trim_scale_up):
random clusters and queues, the rule checked cell by cell, the answer validated."""

from __future__ import annotations

from apportion.formulations.candidates import build_candidates, trim_scale_up
from apportion.formulations.schema import cells_of, job_node, jobs_in, node_vertices
from apportion.validator import validate
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.cluster import Cluster, NodeGroup
from apportion.jobs import JobSpec, RunningState
from apportion.policies import RoundConfig, run_round

MODELS = ["bert-336m", "wresnet-0.5b", "vit-86m", "roberta-355m"]
TYPES = ["A100-40GB", "A40", "V100-32GB"]


@st.composite
def rounds(draw: st.DrawFn) -> tuple[Cluster, list[JobSpec]]:
    types = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True))
    cluster = Cluster("rand", [NodeGroup(f"g{i}", draw(st.integers(1, 3)), t,
                                         draw(st.sampled_from([2, 4, 8])))
                               for i, t in enumerate(types)])
    jobs = []
    for i in range(draw(st.integers(1, 10))):
        n = draw(st.sampled_from([1, 2, 4]))
        running = None
        if draw(st.booleans()):  # running on twice its request where the type has room
            t = draw(st.sampled_from(types))
            grp = next(g for g in cluster.groups if g.gpu_type == t)
            if 2 * n <= grp.gpus_per_node:
                running = RunningState(t, 2 * n, 1, {f"{grp.prefix}-0": 2 * n})
        jobs.append(JobSpec(id=f"j{i}", model=draw(st.sampled_from(MODELS)),
                            global_batch_size=64, iterations=1000, requested_gpus=n,
                            submit_time_s=float(i), running=running))
    return cluster, jobs


@settings(max_examples=40, deadline=None)
@given(inst=rounds())
def test_a_full_round_offers_no_more_than_asked(inst: tuple[Cluster, list[JobSpec]]) -> None:
    cluster, jobs = inst
    g = build_candidates(cluster, jobs, 30.0)
    before = {j: set(cells_of(g, j)) for j in jobs_in(g)}
    running = {j: {c for c in before[j] if g.nodes[c].get("current")} for j in before}
    placed = [j for j in jobs_in(g) if before[j]]
    asked = sum(int(g.nodes[job_node(j)]["requested_gpus"]) for j in placed)
    full = asked > sum(int(g.nodes[n]["capacity"]) for n in node_vertices(g))
    dropped = trim_scale_up(g)
    for j in jobs_in(g):
        want = int(g.nodes[job_node(j)]["requested_gpus"])
        after = set(cells_of(g, j))
        assert after <= before[j] and (after or not before[j])  # no job loses every cell
        gone = before[j] - after
        if not full:
            assert not gone
            continue
        assert all(int(g.nodes[c]["gpus"]) <= want or g.nodes[c].get("current")
                   for c in after) or all(int(g.nodes[c]["gpus"]) > want for c in after)
        assert running[j] <= after  # a running cell is never dropped
    assert dropped == sum(len(before[j] - set(cells_of(g, j))) for j in jobs_in(g))


@settings(max_examples=10, deadline=None)
@given(inst=rounds())
def test_the_trimmed_round_validates(inst: tuple[Cluster, list[JobSpec]]) -> None:
    cluster, jobs = inst
    res = run_round(cluster, jobs, 30.0, RoundConfig(time_budget_s=5.0))
    assert validate(res.decision, cluster, jobs).ok


def test_a_full_round_drops_the_doubled_cells_and_one_with_room_keeps_them() -> None:
    cluster = Cluster("one", [NodeGroup("a", 1, "A100-40GB", 4)])
    jobs = [JobSpec(id=f"j{i}", model="bert-336m", global_batch_size=64, iterations=1000,
                    requested_gpus=2, submit_time_s=float(i)) for i in range(3)]
    g = build_candidates(cluster, jobs, 30.0)
    assert any(int(g.nodes[c]["gpus"]) == 4 for c in cells_of(g, "j0"))
    assert trim_scale_up(g) > 0
    assert all(int(g.nodes[c]["gpus"]) <= 2 for j in jobs_in(g) for c in cells_of(g, j))
    roomy = build_candidates(cluster, jobs[:1], 30.0)
    assert trim_scale_up(roomy) == 0
    assert any(int(roomy.nodes[c]["gpus"]) == 4 for c in cells_of(roomy, "j0"))


def test_crius_greedy_keeps_crius_candidates() -> None:
    """The crius-greedy baseline is Crius's algorithm: N/2, N and 2N in every round."""
    from apportion.policies import make_policy

    assert make_policy("crius-greedy").cfg.candidates.scale_up_when_full is True
    assert make_policy("apportion").cfg.candidates.scale_up_when_full is False


def test_a_job_only_larger_cells_hold_keeps_its_reach_or_the_fewest_gpus_beyond() -> None:
    """wresnet-6.8b asking for 2 GPUs fits 4 A100s (its 2N) but no fewer than 8 A40s (its
    elastic scale-up): a full round keeps it the A100 cells of 4 and the A40 cells of 8, not
    the ladder above either (the 1,000-job round offered 181 such jobs up to 256 GPUs each:
    8,476 columns where 4,989 were before elasticity)."""
    cluster = Cluster("two", [NodeGroup("a", 4, "A100-40GB", 8),
                              NodeGroup("b", 16, "A40", 2, intra_node_link="pcie")])
    big = JobSpec(id="w", model="wresnet-6.8b", global_batch_size=1024, iterations=1000,
                  requested_gpus=2)
    g = build_candidates(cluster, [big], 30.0)
    counts = {(g.nodes[c]["gpu_type"], int(g.nodes[c]["gpus"])) for c in cells_of(g, "w")}
    assert ("A100-40GB", 4) in counts and ("A40", 8) in counts
    assert all(n > 2 for _, n in counts) and max(n for _, n in counts) > 8  # the ladder
    queue = [big] + [JobSpec(id=f"q{i}", model="bert-336m", global_batch_size=64,
                             iterations=1000, requested_gpus=8) for i in range(8)]
    full = build_candidates(cluster, queue, 30.0)
    assert trim_scale_up(full) > 0
    kept = {(full.nodes[c]["gpu_type"], int(full.nodes[c]["gpus"])) for c in cells_of(full, "w")}
    assert kept == {("A100-40GB", 4), ("A40", 8)}
