"""The shapes of the API's answers: the contract the OpenAPI document publishes.

Open models (``extra="allow"``): a field the store adds later reaches clients without a
release of this file, while every field named here is always there.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Health(BaseModel):
    status: str = Field(description="always 'ok': the process answers")


class Ready(BaseModel):
    ready: bool
    store: str = Field(description="'ok', or why the store cannot be read")
    last_round_age_s: float | None = Field(
        description="seconds since the loop last finished a pass (null: none yet)")
    last_round_at: float | None = Field(default=None, description="when the loop last "
                                        "finished a pass, Unix seconds (null: none yet)")
    last_round_at_rfc3339: str | None = Field(default=None, description="the same in RFC "
                                              "3339 (UTC)")
    limit_s: float = Field(description="the age beyond which the loop counts as stuck")


class Problem(BaseModel):
    detail: str = Field(description="one line naming what is wrong")
    field: str | None = Field(default=None, description="the field or flag at fault")


class Progress(BaseModel):
    iterations_done: int
    iterations: int
    checkpoint_iterations: int
    fraction: float


class JobRow(_Open):
    id: str
    state: str
    model: Any
    iterations: int
    iterations_done: int
    checkpoint_iterations: int
    requested_gpus: int | None
    requested_gpu_type: str | None
    tenant: str | None
    running: dict[str, Any] | None
    reason: str
    last_round: int | None
    submitted_at: float = Field(description="Unix seconds")
    updated_at: float = Field(description="Unix seconds")
    submitted_at_rfc3339: str = Field(description="submitted_at in RFC 3339 (UTC)")
    updated_at_rfc3339: str = Field(description="updated_at in RFC 3339 (UTC)")
    jct_s: float | None = Field(description="finished jobs: finish minus submission time")
    pending_reason: str | None = Field(default=None, description="the typed reason a waiting "
                                       "job was left out by its last round")
    pending_detail: str | None = None
    pending_stage: str | None = Field(default=None, description="the stage that held it "
                                      "(admit, solve, ...)")
    can_ever_fit: bool | None = Field(default=None, description="whether it can ever fit "
                                      "this cluster")
    estimator: str | None = Field(default=None, description="running jobs: the estimator "
                                  "its allocation's figures came from (auto:<choice> under "
                                  "auto)")
    estimate_source: dict[str, Any] | None = Field(
        default=None, description="running jobs: where its estimate came from: kind "
        "(measured, fitted, profiled, analytic), detail, and where known samples, age_s, "
        "device, backend, heldout_error, refused")


class DecisionRun(_Open):
    first_round: int
    last_round: int
    rounds: int = Field(description="how many rounds decided this, one after another")
    first_at: float = Field(description="the first of them committed, Unix seconds")
    last_at: float
    first_at_rfc3339: str
    last_at_rfc3339: str
    action: str = Field(description="start, keep, resize, migrate, preempt, drop or pending")
    gpu_type: str | None
    gpus: int | None
    placement: dict[str, int] | None
    reason: str | None = Field(description="the typed reason it was left out (pending, "
                               "preempt, drop)")
    applied: bool = Field(description="false: the job changed while the round solved, and "
                          "the decision was not applied")


class JobList(BaseModel):
    jobs: list[JobRow]
    counts: dict[str, int] = Field(description="jobs per state, of every job (not only "
                                   "this page's)")
    next: str | None = Field(default=None, description="the link to the next page (with "
                             "`limit`); null on the last page and without `limit`")
    next_cursor: str | None = Field(default=None, description="the `cursor` of the "
                                          "next page (null on the last)")


class JobDetail(JobRow):
    allocation: dict[str, Any] | None = Field(description="GPU type, count, stages and "
                                              "placement while running")
    plan: dict[str, Any] | None = Field(description="the execution plan its last round "
                                        "chose while running")
    progress: Progress
    events: list[dict[str, Any]]
    decisions: list[DecisionRun] | None = Field(
        default=None, description="with `history=true`: what the rounds decided about the "
        "job, consecutive identical decisions as one run, newest first")
    decisions_truncated: bool | None = Field(
        default=None, description="with `history=true`: older rounds decided about it too "
        "(only the newest 2,000 rounds are folded)")
    launches: list[dict[str, Any]] | None = Field(
        default=None, description="with `history=true`: the worker groups executors "
        "launched for it (id, executor, action, state, outcome, detail, checkpoints, "
        "created_at, updated_at and their RFC 3339 twins)")
    starts: int | None = Field(default=None, description="with `history=true`: moves into "
                               "running from waiting")
    restarts: int | None = Field(default=None, description="with `history=true`: starts "
                                 "after the first, and resizes and migrations (each "
                                 "relaunches its workers)")
    preemptions: int | None = Field(default=None, description="with `history=true`: times "
                                    "a round preempted it")
    interruptions: int | None = Field(default=None, description="with `history=true`: times "
                                      "it stopped running for another cause (a fault, a "
                                      "lost worker, a failed launch)")


class Submitted(BaseModel):
    submitted: list[str]


class Cancelled(BaseModel):
    id: str
    state: str


class RoundRow(_Open):
    id: int
    round_key: str
    committed_at: float = Field(description="Unix seconds")
    committed_at_rfc3339: str = Field(description="committed_at in RFC 3339 (UTC)")
    backend: str
    status: str
    objective: float | None
    bound: float | None
    gap: float | None
    wall_s: float
    fallback: bool
    fallback_reason: str | None
    placed: int
    pending: int
    solver: dict[str, Any]
    actions: list[dict[str, Any]]


class Rounds(BaseModel):
    rounds: list[RoundRow]
    next: str | None = Field(default=None, description="the link to the page of the "
                             "rounds before these (null when there are none)")
    next_cursor: str | None = Field(default=None, description="the `cursor` of that "
                                          "page")


class NodeView(BaseModel):
    name: str
    gpu_type: str
    gpus: int
    state: str = Field(description="up, down or quarantined")
    reason: str
    slots: list[str | None] = Field(description="one entry per GPU: the job holding it")


class GpuTypeView(BaseModel):
    gpu_type: str
    capacity: int
    allocated: int
    free: int
    nodes: list[NodeView]


class ClusterView(BaseModel):
    name: str
    executor: str
    interval_s: float
    writes_need_token: bool
    reads_need_token: bool = False
    gpu_types: list[GpuTypeView]


class RoundsSummary(BaseModel):
    rounds: list[dict[str, Any]] = Field(description="each round's row as in "
                                         "/api/v1/rounds, without `solver` and `actions`")
    next: str | None = None
    next_cursor: str | None = None


class ReasonCount(BaseModel):
    reason: str = Field(description="a typed reason, or not-yet-considered")
    jobs: int
    gpus: int = Field(description="the GPUs its jobs ask for")
    oldest_submitted_at: float
    oldest_submitted_at_rfc3339: str
    longest_wait_s: float


class WaitingRow(_Open):
    id: str
    state: str
    tenant: str
    requested_gpus: int | None
    requested_gpu_type: str | None
    guaranteed: bool
    submitted_at: float
    submitted_at_rfc3339: str
    since: float = Field(description="when it entered its state")
    since_rfc3339: str
    wait_s: float = Field(description="seconds since its submission, as of `now`")
    pending_reason: str | None
    pending_detail: str | None
    pending_stage: str | None
    can_ever_fit: bool | None


class FinishedRow(BaseModel):
    id: str
    finished_at: float
    finished_at_rfc3339: str
    jct_s: float


class QueueView(BaseModel):
    now: float = Field(description="the server's clock when it answered, Unix seconds")
    now_rfc3339: str
    waiting: int = Field(description="jobs waiting for GPUs (submitted, queued, "
                         "checkpointed)")
    waiting_gpus: int = Field(description="the GPUs they ask for")
    counts: dict[str, int] = Field(description="jobs per state, of every job")
    reasons: list[ReasonCount] = Field(description="most jobs first")
    reason: str | None = Field(description="the `reason` asked for, if any")
    matching: int = Field(description="waiting jobs of that reason (all without one)")
    longest: list[WaitingRow] = Field(description="the `top` longest-waiting of them, "
                                      "earliest submitted first")
    finished: list[FinishedRow] = Field(description="the last 200 finished jobs, the "
                                        "latest last")


class TenantRow(_Open):
    tenant: str
    jobs: dict[str, int] = Field(description="its jobs per state")
    waiting: int
    running: int
    gpus: dict[str, int] = Field(description="GPUs its running jobs hold, per type")
    gpus_held: int
    guaranteed_gpus: int = Field(description="of them, those its guaranteed jobs hold "
                                 "(what its quota bounds)")
    quota_gpus: int | None = Field(description="its quota (--tenants); null: none")
    quota_used: float | None = Field(description="guaranteed_gpus / quota_gpus")
    oldest_waiting_since: float | None
    oldest_waiting_since_rfc3339: str | None
    longest_wait_s: float | None


class TenantsView(BaseModel):
    now: float
    now_rfc3339: str
    quotas: bool = Field(description="whether the server was given --tenants")
    tenants: list[TenantRow]


class GroupSummary(BaseModel):
    group: str = Field(description="the node group (its prefix in the cluster file)")
    gpu_type: str
    nodes: int
    gpus: int = Field(description="GPUs installed, every node counted")
    gpus_per_node: int
    capacity: int = Field(description="GPUs of the nodes that are up")
    allocated: int
    free: int
    nodes_up: int
    nodes_down: int
    nodes_quarantined: int
    nodes_full: int = Field(description="up nodes every GPU of which is held")
    nodes_partly_used: int
    nodes_idle: int = Field(description="up nodes no GPU of which is held")


class TypeSummary(BaseModel):
    gpu_type: str
    capacity: int = Field(description="GPUs of the nodes that are up")
    allocated: int
    free: int
    gpus: int = Field(description="GPUs installed, every node counted")
    nodes: int
    nodes_up: int
    nodes_down: int
    nodes_quarantined: int
    groups: list[GroupSummary]


class ClusterSummary(BaseModel):
    name: str
    nodes: int
    gpus: int
    executor: str
    interval_s: float
    writes_need_token: bool
    reads_need_token: bool
    gpu_types: list[TypeSummary]


class GroupPage(BaseModel):
    group: str
    gpu_types: list[str]
    nodes_total: int
    offset: int
    nodes: list[NodeView]
    next: str | None
    next_cursor: str | None
