"""Kubernetes objects for decisions: real schemas, the placement expressed, requests within allocatable.

No API server runs here: every object is validated against the CRDs the
project ships in tests/k8s_schemas (TrainJob, TrainingRuntime, JobSet,
PyTorchJob, Kueue) and the official core schemas (kubernetes-validate), see
k8s_schemas/__init__.py.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
from apportion.runtime.executors.kubernetes.config import K8sConfig, allocatable, load_k8s_config
from apportion.runtime.executors.kubernetes.manifests import (
    HOSTNAME,
    PlacementNotExpressible,
    Target,
    job_objects,
    object_name,
    plan_supported,
)
from apportion.validator import validate as validate_decision
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from k8s_schemas import validate

from apportion.cluster import Cluster
from apportion.config import cluster_from_data, default_jobs, jobs_from_data, resolve_cluster
from apportion.decision import Action, Allocation, Decision, SolveReport
from apportion.errors import InputError
from apportion.jobs import JobSpec
from apportion.plans import ExecutionPlan

APIS = ("trainjob", "jobset", "pytorchjob")
README_CLUSTER = {"name": "my-cluster", "node_groups": [{
    "prefix": "a100", "count": 4, "gpu_type": "A100-40GB", "gpus_per_node": 8,
    "cpus_per_node": 96, "host_memory_gib": 1024, "intra_node_link": "nvlink",
    "intra_node_bandwidth_GBps": 300, "inter_node_bandwidth_GBps": 25}]}
REPORT = SolveReport("test", "optimal", 0.0, 0.0, 0.0, 0.0, False)


def _job(jid: str, gpus: int, **kw: object) -> JobSpec:
    return JobSpec(jid, "gpt-tiny", 64, 100, gpus, **kw)  # type: ignore[arg-type]


def pods(docs: list[dict]) -> list[tuple[dict, int]]:
    """(pod template, replica count) of an allocation's job object."""
    obj = docs[-1]
    if obj["kind"] == "PyTorchJob":
        return [(r["template"], r["replicas"]) for r in obj["spec"]["pytorchReplicaSpecs"].values()]
    spec = docs[1]["spec"]["template"]["spec"] if obj["kind"] == "TrainJob" else obj["spec"]
    return [(rj["template"]["spec"]["template"], rj["template"]["spec"]["parallelism"])
            for rj in spec["replicatedJobs"]]


def placement_of(docs: list[dict], cfg: K8sConfig) -> dict[str, int]:
    """The node -> GPUs the pods can land on (each pod pinned to its group's nodes)."""
    out: dict[str, int] = {}
    for tmpl, n in pods(docs):
        spec = tmpl["spec"]
        (term,) = spec["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        (expr,) = term["matchExpressions"]
        assert expr["key"] == HOSTNAME and expr["operator"] == "In"
        assert len(expr["values"]) == n  # one pod per listed node (anti-affinity below)
        anti = spec["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert anti["topologyKey"] == HOSTNAME
        gpus = int(spec["containers"][0]["resources"]["limits"][cfg.gpu_resource])
        for node in expr["values"]:
            assert node not in out
            out[node] = gpus
    return out


def check_requests(cluster: Cluster, all_docs: list[list[dict]], cfg: K8sConfig) -> None:
    """Per node, the pods of every allocation together fit its allocatable CPUs and memory."""
    cpu: Counter[str] = Counter()
    mem: Counter[str] = Counter()
    gpu: Counter[str] = Counter()
    for docs in all_docs:
        for tmpl, _ in pods(docs):
            req = tmpl["spec"]["containers"][0]["resources"]["requests"]
            nodes = tmpl["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
                "matchExpressions"][0]["values"]
            for node in nodes:
                assert req["cpu"].endswith("m") and req["memory"].endswith("Mi")
                cpu[node] += int(req["cpu"][:-1])
                mem[node] += int(req["memory"][:-2])
                gpu[node] += int(req[cfg.gpu_resource])
    r = cfg.reserve
    for node, m in cpu.items():
        n = cluster.nodes[node]
        assert m <= allocatable(n.cpus, r.cpus, r.cpu_fraction) * 1000 + 1e-6, node
        assert mem[node] <= allocatable(n.host_memory_gib, r.memory_gib,
                                        r.memory_fraction) * 1024 + 1e-6, node
        assert gpu[node] <= n.gpus
        assert m < n.cpus * 1000  # never the whole node


def export_all(cluster: Cluster, decision: Decision, jobs: list[JobSpec], cfg: K8sConfig,
               api: str) -> list[list[dict]]:
    by_id = {j.id: j for j in jobs}
    out = []
    for a in decision.allocations:
        try:
            docs = job_objects(by_id[a.job], a, Target(cluster, cfg, api))
        except PlacementNotExpressible:
            assert api == "pytorchjob"
            sizes = Counter(k for k in a.placement.values())
            assert len(sizes) > 2 or (len(sizes) == 2 and 1 not in sizes.values())
            continue
        for d in docs:
            errors = validate(d)
            assert not errors, errors
        assert placement_of(docs, cfg) == {n: k for n, k in a.placement.items() if k}
        out.append(docs)
    check_requests(cluster, out, cfg)
    return out


def _alloc(job: str, gpu_type: str, placement: dict[str, int], plan: ExecutionPlan | None = None,
           **kw: object) -> Allocation:
    g = sum(placement.values())
    return Allocation(job, gpu_type, g, (plan.pp if plan else 1), plan or ExecutionPlan(dp=g),
                      placement, 1.0, **kw)  # type: ignore[arg-type]


# -- fixed clusters ------------------------------------------------------------------------------
@pytest.mark.parametrize("api", APIS)
def test_readme_cluster_uneven_placement_every_api(api: str) -> None:
    """The issue's crash: {a100-1: 4, a100-2: 8, a100-3: 4} is two pod groups, not an error."""
    cluster = cluster_from_data(README_CLUSTER, "readme")
    jobs = [_job("j1", 16), _job("j2", 4, tenant="vision", guaranteed=True),
            _job("j3", 12)]
    d = Decision([_alloc("j1", "A100-40GB", {"a100-1": 4, "a100-2": 8, "a100-3": 4}),
                  _alloc("j2", "A100-40GB", {"a100-1": 4}, ExecutionPlan(dp=2, tp=2)),
                  _alloc("j3", "A100-40GB", {"a100-0": 8, "a100-3": 4})], [], REPORT)
    assert validate_decision(d, cluster, jobs).ok
    cfg = load_k8s_config(None, queue="team-a", api=api)
    docs = export_all(cluster, d, jobs, cfg, api)
    assert len(docs) == 3
    j1 = docs[0][-1]
    assert j1["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    suspend = (j1["spec"]["runPolicy"]["suspend"] if api == "pytorchjob"
               else j1["spec"]["suspend"])
    assert suspend is True  # Kueue admits the gang, then unsuspends it
    sizes = sorted(n for _, n in pods(docs[0]))
    assert sizes == [1, 2]  # one pod of 8 GPUs, two of 4
    priorities = {x[-1]["metadata"]["annotations"]["apportion/job-id"]:
                  pods(x)[0][0]["spec"]["priorityClassName"] for x in docs}
    assert priorities == {"j1": "apportion-best-effort", "j2": "apportion-guaranteed",
                          "j3": "apportion-best-effort"}


def test_trainjob_pods_every_rank_contract() -> None:
    """Each pod runs torchrun with its own size, a shared rendezvous and the contract's env."""
    cluster = cluster_from_data(README_CLUSTER, "readme")
    job = _job("team/exp 1", 16)
    a = _alloc(job.id, "A100-40GB", {"a100-1": 4, "a100-2": 8, "a100-3": 4})
    cfg = K8sConfig(image="registry.example/apportion-worker:1-cuda", namespace="training")
    cm, runtime, tj = job_objects(job, a, Target(cluster, cfg, "trainjob"))
    name = object_name(job.id)
    assert tj["spec"]["runtimeRef"] == {"name": name, "kind": "TrainingRuntime",
                                        "apiGroup": "trainer.kubeflow.org"}
    rjobs = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    # Kubeflow Trainer v2: the trainer's pods are the replicated job "node" (the group on the
    # most nodes), marked by the ancestor label; numNodes counts them, as Trainer sets it
    assert [rj["name"] for rj in rjobs] == ["node", "node-8"]
    assert rjobs[0]["template"]["metadata"]["labels"] == {
        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    assert "metadata" not in rjobs[1]["template"]
    assert tj["spec"]["trainer"]["numNodes"] == runtime["spec"]["mlPolicy"]["numNodes"] == 2
    assert tj["spec"]["trainer"]["numProcPerNode"] == 4
    assert runtime["spec"]["mlPolicy"]["torch"] == {"numProcPerNode": 4}
    assert tj["metadata"]["annotations"]["apportion/nodes"] == "3"
    master = f"{name}-node-0-0.{name}:29500"  # Trainer's PET_MASTER_ADDR and port
    for rj in rjobs:
        c = rj["template"]["spec"]["template"]["spec"]["containers"][0]
        assert c["image"] == cfg.image
        assert "--nnodes=3" in c["command"] and f"--rdzv-endpoint={master}" in c["command"]
        k = int(c["resources"]["limits"]["nvidia.com/gpu"])
        assert f"--nproc-per-node={k}" in c["command"]
        env = {e["name"]: e for e in c["env"]}
        assert env["APPORTION_PLAN"]["valueFrom"]["configMapKeyRef"]["name"] == f"{name}-config"
        assert env["APPORTION_CHECKPOINT_DIR"]["value"].startswith("/checkpoints/team_exp_1-")
        assert "RANK" not in env and "WORLD_SIZE" not in env  # torchrun sets those
    assert '"dp": 16' in cm["data"]["plan.json"]


def test_user_workload_command_image_env() -> None:
    from apportion.jobs import Workload

    cluster = cluster_from_data(README_CLUSTER, "readme")
    wl = Workload("torchrun", ("python", "train.py", "--lr", "3e-4"), "/work", {"HF_HOME": "/hf"},
                  "ghcr.io/me/trainer:2")
    job = _job("u1", 8, workload=wl)
    a = _alloc("u1", "A100-40GB", {"a100-0": 8}, ExecutionPlan(dp=2, tp=4))
    assert plan_supported("torchrun", a.plan, "cuda") is None
    staged = _alloc("u1", "A100-40GB", {"a100-0": 8}, ExecutionPlan(dp=2, tp=2, pp=2))
    with pytest.raises(InputError, match="one pipeline stage"):  # a user command runs one
        job_objects(job, staged, Target(cluster, K8sConfig(), "jobset"))
    docs = job_objects(job, a, Target(cluster, K8sConfig(), "jobset"))
    assert not any(validate(d) for d in docs)
    c = docs[-1]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "ghcr.io/me/trainer:2" and c["workingDir"] == "/work"
    assert c["command"][-5:] == ["--no-python", "python", "train.py", "--lr", "3e-4"]
    assert "--standalone" in c["command"]
    assert {"name": "HF_HOME", "value": "/hf"} in c["env"]


def test_unsupported_plan_and_inexpressible_placement_are_refused() -> None:
    cluster = cluster_from_data(README_CLUSTER, "readme")
    a = _alloc("b", "A100-40GB", {"a100-0": 8}, ExecutionPlan(dp=2, tp=2, pp=2))
    with pytest.raises(InputError, match="pipeline and tensor"):
        job_objects(_job("b", 8), a, Target(cluster, K8sConfig(), "trainjob"))
    three = _alloc("c", "A100-40GB", {"a100-0": 8, "a100-1": 4, "a100-2": 2, "a100-3": 2})
    with pytest.raises(PlacementNotExpressible, match="trainjob or jobset"):
        job_objects(_job("c", 16), three, Target(cluster, K8sConfig(), "pytorchjob"))
    for api in ("trainjob", "jobset"):
        docs = job_objects(_job("c", 16), three, Target(cluster, K8sConfig(), api))
        assert placement_of(docs, K8sConfig()) == three.placement


def test_names_are_distinct_and_short() -> None:
    ids = ["A", "a", "a" * 300, "../../etc", "x y", "ünï", "-", "j1"]
    names = {object_name(i) for i in ids}
    assert len(names) == len(ids)
    assert all(len(n) <= 34 for n in names)


def test_product_label_from_node_group() -> None:
    data = {"name": "gke", "node_groups": [
        {"prefix": "p", "nodes": ["gke-pool-1-abc"], "gpu_type": "nvidia-tesla-t4",
         "gpus_per_node": 4, "gpu_product_label": "cloud.google.com/gke-accelerator=nvidia-tesla-t4"},
        {"prefix": "q", "count": 1, "gpu_type": "NVIDIA-A100-SXM4-80GB", "gpus_per_node": 8,
         "gpu_product_label": "NVIDIA-A100-SXM4-80GB"}]}
    cluster = cluster_from_data(data, "gke")
    assert cluster.nodes["gke-pool-1-abc"].gpu_type == "T4"
    assert cluster.nodes["q-0"].gpu_type == "A100-80GB"
    t4 = job_objects(_job("t", 4), _alloc("t", "T4", {"gke-pool-1-abc": 4}),
                     Target(cluster, K8sConfig(), "jobset"))[-1]
    sel = t4["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["nodeSelector"]
    assert sel == {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}
    a100 = job_objects(_job("u", 8), _alloc("u", "A100-80GB", {"q-0": 8}),
                       Target(cluster, K8sConfig(), "jobset"))[-1]
    sel = a100["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["nodeSelector"]
    assert sel == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}


def test_reserve_that_leaves_nothing_names_the_field() -> None:
    cluster = cluster_from_data({"node_groups": [{"prefix": "s", "count": 1, "gpu_type": "T4",
                                                  "gpus_per_node": 1, "cpus_per_node": 1}]}, "s")
    cfg = load_k8s_config(None)
    with pytest.raises(InputError, match="reserve.cpus"):
        job_objects(_job("s", 1), _alloc("s", "T4", {"s-0": 1}), Target(cluster, cfg, "jobset"))


def test_crius_testbed_round_through_every_api() -> None:
    """A real round on the default cluster; plans the built-in trainer refuses are refused."""
    from apportion.runtime.plan_filter import workload_plan_filter

    from apportion.policies import RoundConfig, run_round

    cluster = resolve_cluster("crius-testbed")
    jobs, now = default_jobs()
    res = run_round(cluster, jobs, now, RoundConfig(time_budget_s=5.0, isolate=False,
                                                    plan_filter=workload_plan_filter("cuda")))
    assert validate_decision(res.decision, cluster, jobs).ok and res.decision.allocations
    for api in APIS:
        export_all(cluster, res.decision, jobs, K8sConfig(queue="q"), api)


def test_crius_sim_1280_gpus_packed() -> None:
    """Crius's 1,280-GPU cluster filled by one job per node group plus a spread job."""
    cluster = resolve_cluster("crius-sim")
    assert cluster.total_gpus == 1280
    allocs, jobs = [], []
    for gi, g in enumerate(cluster.groups):
        nodes = g.node_names()
        half = len(nodes) // 2
        full = {n: g.gpus_per_node for n in nodes[:half]}
        uneven = {n: (g.gpus_per_node if i % 2 else max(1, g.gpus_per_node // 2))
                  for i, n in enumerate(nodes[half:])}
        for k, place in enumerate((full, uneven)):
            jid = f"g{gi}-{k}"
            jobs.append(_job(jid, sum(place.values())))
            allocs.append(_alloc(jid, g.gpu_type, place))
    d = Decision(allocs, [], REPORT)
    assert validate_decision(d, cluster, jobs).ok
    for api in ("trainjob", "jobset"):
        export_all(cluster, d, jobs, K8sConfig(), api)


# -- any valid decision --------------------------------------------------------------------------
@st.composite
def clusters_and_decisions(draw: st.DrawFn) -> tuple[Cluster, Decision, list[JobSpec]]:
    types = draw(st.lists(st.sampled_from(["A100-40GB", "H100-80GB", "A10", "T4", "V100-32GB"]),
                          min_size=1, max_size=3, unique=True))
    groups = []
    for i, t in enumerate(types):
        gpn = draw(st.sampled_from([1, 2, 4, 8]))
        groups.append({"prefix": f"g{i}", "count": draw(st.integers(1, 5)), "gpu_type": t,
                       "gpus_per_node": gpn,
                       "cpus_per_node": draw(st.integers(8, 256)),
                       "host_memory_gib": float(draw(st.integers(32, 2048)))})
    cluster = cluster_from_data({"name": "h", "node_groups": groups}, "hypothesis")
    free = {n: node.gpus for n, node in cluster.nodes.items()}
    allocs, jobs = [], []
    for j in range(draw(st.integers(1, 6))):
        g = draw(st.sampled_from(cluster.groups))
        names = [n for n in g.node_names() if free[n] > 0]
        if not names:
            continue
        chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names),
                               unique=True))
        place = {n: draw(st.integers(1, free[n])) for n in chosen}
        for n, k in place.items():
            free[n] -= k
        gpus = sum(place.values())
        jid = draw(st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1,
                           max_size=12)) + f"#{j}"
        frac = draw(st.sampled_from([0.0, 0.5, 1.0]))
        cpus = int(sum(cluster.nodes[n].cpus * k / cluster.nodes[n].gpus
                       for n, k in place.items()) * frac)
        allocs.append(_alloc(jid, g.gpu_type, place, cpus=cpus))
        jobs.append(_job(jid, gpus, guaranteed=draw(st.booleans())))
    d = Decision(allocs, [], REPORT)
    assert validate_decision(d, cluster, jobs).ok
    return cluster, d, jobs


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters_and_decisions(), st.sampled_from(APIS), st.booleans())
def test_any_valid_decision_exports_valid_objects(cd: tuple, api: str, queued: bool) -> None:
    cluster, d, jobs = cd
    cfg = K8sConfig(queue="q" if queued else None, reserve={"cpus": 0.5, "memory_gib": 1})
    export_all(cluster, d, jobs, cfg, api)


def test_per_tenant_priority_and_queue() -> None:
    cluster = cluster_from_data(README_CLUSTER, "readme")
    jobs, _ = jobs_from_data({"jobs": [{"id": "v", "model": "gpt-tiny", "global_batch_size": 8,
                                        "iterations": 5, "requested_gpus": 8,
                                        "tenant": "Vision Team"}]}, "j")
    cfg = load_k8s_config(None, queue_per_tenant=True)
    cfg = cfg.model_copy(update={"priority_classes": cfg.priority_classes.model_copy(
        update={"tenants": {"Vision Team": "vision-high"}})})
    docs = job_objects(jobs[0], _alloc("v", "A100-40GB", {"a100-0": 8}),
                       Target(cluster, cfg, "jobset"))
    assert not any(validate(x) for x in docs)
    q = docs[-1]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    assert q.startswith("apportion-vision-team-")
    assert pods(docs)[0][0]["spec"]["priorityClassName"] == "vision-high"


# -- the validator is not vacuous -----------------------------------------------------------------
def test_schema_validation_catches_what_the_api_server_refuses() -> None:
    import copy

    cluster = cluster_from_data(README_CLUSTER, "readme")
    cm, runtime, tj = job_objects(_job("z", 8), _alloc("z", "A100-40GB", {"a100-0": 8}),
                                  Target(cluster, K8sConfig(), "trainjob"))
    assert not validate(cm) and not validate(runtime) and not validate(tj)
    bad = copy.deepcopy(tj)
    bad["spec"]["trainer"]["numNodez"] = 1  # unknown field (strict field validation)
    assert validate(bad)
    bad = copy.deepcopy(runtime)
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    pod = bad["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "4"
    assert any("request must equal limit" in e for e in validate(bad))
    bad = copy.deepcopy(runtime)
    bad["spec"]["mlPolicy"]["torch"] = {"numProcPerNode": "many"}  # a CEL rule
    assert any("NumProcPerNode" in e for e in validate(bad))
    bad = copy.deepcopy(tj)
    bad["spec"]["runtimeRef"]["name"] = "other"  # immutable (CEL transition rule)
    assert any("immutable" in e for e in validate(bad, old=tj))
    bad = copy.deepcopy(cm)
    bad["data"]["x"] = 3  # core schema: data values are strings
    assert validate(bad)
    bad = copy.deepcopy(tj)
    bad["metadata"]["labels"]["apportion/job"] = "not a label value!"
    assert validate(bad)


def test_requests_scale_with_the_decision_and_stay_within_allocatable() -> None:
    cluster = cluster_from_data(README_CLUSTER, "readme")
    cfg = K8sConfig()
    a = _alloc("r", "A100-40GB", {"a100-0": 2}, cpus=40, host_memory_gib=100.0)
    docs = job_objects(_job("r", 2), a, Target(cluster, cfg, "jobset"))
    req = pods(docs)[0][0]["spec"]["containers"][0]["resources"]["requests"]
    # 40 CPUs of a 96-CPU node whose allocatable is 95, of which DaemonSets take 0.5
    assert req["cpu"] == f"{int(40 * 94.5 / 96 * 1000)}m"
    node_mem = 1024 - 2 - 0.05 * 1024 - 1
    assert req["memory"] == f"{int(100 * node_mem / 1024 * 1024)}Mi"
    by_node: dict[str, list[str]] = defaultdict(list)
    by_node["a100-0"].append(req["cpu"])
    assert all(int(c[:-1]) < 96_000 for c in by_node["a100-0"])


def test_action_does_not_change_objects() -> None:
    cluster = cluster_from_data(README_CLUSTER, "readme")
    a = _alloc("k", "A100-40GB", {"a100-0": 8})
    b = _alloc("k", "A100-40GB", {"a100-0": 8}, action=Action.KEEP)
    da = job_objects(_job("k", 8), a, Target(cluster, K8sConfig(), "jobset"))
    db = job_objects(_job("k", 8), b, Target(cluster, K8sConfig(), "jobset"))
    assert da[-1]["spec"] == db[-1]["spec"]
