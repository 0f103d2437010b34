"""The files apportion writes, as pydantic models: their keys are a contract.

Every model here is *open* (``extra="allow"``): fields are only ever added, so a reader
written against one release keeps working with the next, while every field named here
is always written (``required`` in the JSON Schema). The inputs are the strict models
the loaders use (:mod:`apportion.config`, :mod:`apportion.decision_file`, ...);
``apportion schema`` prints both, as JSON Schema.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from apportion.decision import Reason


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


# -- solve-round --json ----------------------------------------------------------------------------
class PlanOut(_Open):
    dp: int = Field(ge=1)
    tp: int = Field(ge=1)
    pp: int = Field(ge=1)
    micro_batches: int = Field(ge=1)
    zero_stage: int = Field(ge=0, le=3)
    offload: bool
    accumulation: int = Field(ge=1)
    checkpointing: bool


class SolverOut(_Open):
    backend: str
    status: str = Field(description="canonical: optimal | feasible (time-limited, still an "
                        "answer) | infeasible | fallback (the greedy answered) | error")
    objective: float | None
    bound: float | None
    gap: float | None
    wall_s: float = Field(ge=0)
    fallback: bool
    fallback_reason: str | None
    attempts: list[Any]
    model_size: dict[str, Any] | None


class AllocationOut(_Open):
    job: str
    gpu_type: str = Field(description="a catalog name (apportion gpus)")
    gpus: int = Field(gt=0)
    stages: int = Field(gt=0)
    plan: PlanOut
    placement: dict[str, int] = Field(description="node -> GPUs of the job there")
    est_throughput: float = Field(description="samples/s")
    action: Literal["start", "keep", "resize", "migrate"]
    iter_time_s: float | None
    normalized_throughput: float | None
    mem_per_gpu_gib: float | None
    cpus: int = Field(ge=0)
    host_memory_gib: float = Field(ge=0)
    estimator: str | None = Field(description="the estimator that rated this allocation")


class PendingOut(_Open):
    job: str
    reason: Reason
    detail: str
    stage: str = Field(description="admit | candidates | solve: the stage that left it out")
    can_ever_fit: bool | None
    action: Literal["preempt", "drop"] | None = Field(default=None, description="present "
                                                      "when a running job lost its place")


class DecisionOut(_Open):
    """What a round decided; export k8s and export slurm read it back."""

    formulation: str
    solver: SolverOut
    allocations: list[AllocationOut]
    pending: list[PendingOut]
    meta: dict[str, Any]


# -- solve-round --dump-problem ------------------------------------------------------------------------
class CandidateOut(_Open):
    gpu_type: str
    gpus: int
    stages: int
    plan: dict[str, Any]
    est_throughput: float
    iter_time_s: float | None
    mem_per_gpu_gib: float | None
    normalized: float
    value: float
    current: bool
    nodes: dict[str, int] = Field(description="node -> most GPUs the cell may take there")


class ProblemJobOut(_Open):
    job: str
    requested_gpus: int
    requested_gpu_type: str | None
    normalization: dict[str, Any]
    queue_bonus: float
    running: dict[str, Any] | None
    reason: str | None
    candidates: list[CandidateOut]


class ProblemOut(_Open):
    """The round as a problem: enough to re-solve it independently."""

    now_s: float
    objective_weights: dict[str, Any]
    nodes: list[dict[str, Any]]
    jobs: list[ProblemJobOut]
    formulation: str
    gpu_types: dict[str, Any] = Field(description="per GPU type, the memory a job may use on "
                                      "each GPU ({memory_gib, from: node group | catalog}): "
                                      "the limit the round's plans kept")


# -- simulate --json (and every run's summary.json under compare) -------------------------------------
class SimulateSummary(_Open):
    """One replay's summary (definitions: apportion.experiments.metrics)."""

    policy: str
    trace: str
    cluster: str
    seed: int
    information: Literal["oracle", "estimated"]
    estimator: str
    jobs: int
    finished: int
    avg_jct_s: float | None = Field(description="over finished jobs, seconds")
    median_jct_s: float | None
    p95_jct_s: float | None
    p99_jct_s: float | None
    avg_jct_all_s: float | None = Field(description="over every job, an unfinished one "
                                        "until the replay's end")
    p99_jct_all_s: float | None
    avg_queue_s: float | None
    makespan_s: float | None
    utilization: float | None = Field(description="GPU-seconds held / (GPUs x makespan)")
    utilization_by_type: dict[str, float]
    avg_throughput_samples_s: float | None
    peak_throughput_samples_s: float | None
    avg_restarts: float | None
    deadline_ratio: float | None
    ftf_rho_mean: float | None
    sla_kept: float | None
    sla_jobs: int | None
    solver_s_mean: float | None
    fallbacks: int
    trace_format: str | None = Field(default=None, description="the registered trace format "
                                     "the file was detected as (apportion traces)")
    substitutions: list[dict[str, Any]] = Field(
        default_factory=list, description="what the replay uses that the trace file did not "
        "say, each {field, from, to, why, jobs (how many of the replayed jobs), first_jobs}: "
        "a model mapped, a GPU type renamed or assigned, iterations derived, jobs drawn by a "
        "paper's adaptation")


# -- status --json, history --json ----------------------------------------------------------------------
class JobStatusOut(_Open):
    id: str
    state: str = Field(description="queued | running | finished | failed | dropped ...")
    iterations: int
    iterations_done: int
    pending_reason: str | None = Field(default=None, description="a waiting job's typed reason "
                                       "from its last round")
    pending_detail: str | None = None
    pending_stage: str | None = Field(default=None, description="the stage that held a "
                                      "waiting job (admit, solve, ...)")
    can_ever_fit: bool | None = Field(default=None, description="whether a waiting job can "
                                      "ever fit this cluster")


class StatusOut(_Open):
    """Every job with its state (a waiting one with its typed reason), and the cluster's use."""

    state_db: str
    schema_version: int
    generation: int
    jobs: list[JobStatusOut]
    counts: dict[str, int]
    cluster_use: dict[str, dict[str, int | None]]
    nodes: Any
    last_round: dict[str, Any] | None


class HistoryOut(_Open):
    """The last rounds, each with its solver report and actions."""

    rounds: list[dict[str, Any]]


# -- export k8s / export slurm index.json -----------------------------------------------------------------
class K8sIndexJob(_Open):
    file: str
    name: str
    kind: Literal["TrainJob", "JobSet", "PyTorchJob"]
    objects: list[str] = Field(description="Kind/name of each object in the file, in apply "
                               "order")


class K8sIndex(_Open):
    """Per exported job: its file and objects; per refused job: why."""

    api: Literal["trainjob", "jobset", "pytorchjob"]
    namespace: str
    jobs: dict[str, K8sIndexJob]
    refused: dict[str, str] = Field(description="job -> why it was not exported "
                                    "(--skip-unsupported)")


class SlurmIndexJob(_Open):
    script: str = Field(description="the batch script, beside index.json")
    jobdir: str
    nodes: list[str]
    components: int = Field(ge=1, description="1, or the components of a heterogeneous job")
    time: str | None = Field(description="--time (None: the partition's default)")
    time_source: str


class SlurmIndex(_Open):
    """Per job: its batch script, folder, nodes and time limit."""

    workdir: str
    jobs: dict[str, SlurmIndexJob]
    refused: dict[str, str] = Field(description="job -> why it was not exported "
                                    "(--skip-unsupported)")


# -- compare's plots.json ----------------------------------------------------------------------------------
class PlotSeries(_Open):
    x: list[float]
    mean: list[float]
    lo: list[float] | None = Field(description="the band's lower edge (None: one seed)")
    hi: list[float] | None
    seeds: int = Field(ge=1)


class ComparePlots(_Open):
    """The numbers behind each plot: grids, means over seeds, band edges."""

    title: str
    trace: str
    cluster: str
    information: str
    estimator: str
    seeds: int
    band: str
    units: dict[str, Any]
    jct_cdf: dict[str, PlotSeries]
    throughput: dict[str, PlotSeries]
    queue: dict[str, PlotSeries]
    utilization: dict[str, PlotSeries]
