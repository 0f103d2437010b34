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
