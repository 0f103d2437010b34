"""The jobs' routes: list, submit (all or nothing, a retry answered 200), one job (with
its history) and cancel, as the ``submit`` and ``cancel`` commands write.

A body is parsed and validated before the store is opened, so a bad one writes nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import anyio
from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from apportion.admission import admit
from apportion.config import JobsSpec
from apportion.decision import Reason
from apportion.errors import InputError
from apportion.jobs import JobSpec
from apportion.lifecycle import IllegalTransition, JobState
from apportion.serve import schemas, views
from apportion.serve.answers import (
    API,
    NOT_MODIFIED,
    ApiError,
    errors,
    listing,
    query,
    request_store,
    tagged,
)
from apportion.serve.body import (
    JSON_TYPES,
    MAX_BODY_BYTES,
    YAML_TYPES,
    Submission,
    UnsupportedMediaType,
    check_media_type,
    submission_from_body,
)
from apportion.serve.job_history import job_history
from apportion.serve.state import Guard, ServeState
from apportion.store import StateStore, StoreDamaged, UnknownJob

# the service's one logger name, as before the routes left ``app`` (operators filter on it)
log = logging.getLogger("apportion.serve.app")

_BODY_DOC = {
    "requestBody": {
        "required": True,
        "description": "the `apportion submit` jobs-YAML format, as YAML or JSON; all or "
                       "nothing. text/plain, form types and a body without a content type "
                       "are refused (415): a browser sends those from other sites unasked",
        "content": {
            **{t: {"schema": JobsSpec.model_json_schema(
                ref_template="#/components/schemas/{model}")} for t in JSON_TYPES},
            **{t: {"schema": {"type": "string"}} for t in YAML_TYPES},
        },
    }
}


#: ``state=waiting`` in a jobs list: every state of a job waiting for GPUs
WAITING_STATES = frozenset({JobState.SUBMITTED, JobState.QUEUED, JobState.CHECKPOINTED})


def _states(given: str | None) -> frozenset[JobState] | None:
    """The ``state`` parameter: states by name, comma-separated, ``waiting`` for the
    three of a waiting job; an unknown name is a 422 naming ``state``."""
    if given is None:
        return None
    out: set[JobState] = set()
    for name in (p.strip() for p in given.split(",")):
        if name == "waiting":
            out |= WAITING_STATES
            continue
        try:
            out.add(JobState(name))
        except ValueError:
            names = ", ".join(["waiting", *(s.value for s in JobState)])
            raise ApiError(422, f"state: {name!r} is not a job state ({names})",
                           "state") from None
    return frozenset(out)


def _same_job(stored: JobSpec, new: JobSpec, timed: bool) -> bool:
    """Whether a stored job is the one ``new`` submits again: every field but the progress
    the store advances, and the submission time where the body left it to the server."""
    again = dataclasses.replace(stored, iterations_done=new.iterations_done, running=None)
    if not timed:
        again = dataclasses.replace(again, submit_time_s=new.submit_time_s)
    return again == new


def jobs_router(s: ServeState, reader: Guard, writer: Guard) -> APIRouter:
    """The jobs' routes in the API's order: list, submit, one job, cancel."""
    router = APIRouter()
    _list_route(router, s, reader)
    _submit_route(router, s, writer)
    _job_routes(router, s, reader, writer)
    return router


def _list_route(router: APIRouter, s: ServeState, reader: Guard) -> None:
    """``GET /api/v1/jobs``: the jobs, paged and filtered, with an ETag."""
    @router.get(f"{API}/jobs", response_model=schemas.JobList, tags=["jobs"],
                responses={**NOT_MODIFIED, **errors(401, 422, 503)},
                dependencies=[Depends(reader)])
    def list_jobs(request: Request,
                  limit: int | None = Query(None, ge=1, le=10000, description="at most N "
                                            "jobs (a page); without it, every job"),
                  cursor: str | None = Query(None, pattern=r"^[0-9]{1,18}$",
                                             description="the page after this one: a "
                                             "`next_cursor` of the page before"),
                  state: str | None = Query(None, max_length=200, description="only jobs in "
                                            "these states, comma-separated (`waiting`: "
                                            "submitted, queued and checkpointed)"),
                  tenant: str | None = Query(None, max_length=256, description="only this "
                                             "tenant's jobs")) -> Response:
        """The jobs in submission order, a waiting one with its typed reason, and the count
        per state of every job. Without `limit` every job, as before paging came; with it
        one page, and `next` the link to the following one (null on the last). `state` and
        `tenant` keep only those jobs (`counts` still counts every job). The ETag changes
        with every write to the store: send it back in If-None-Match for a 304."""
        after = int(cursor) if cursor is not None else 0
        states = _states(state)
        with request_store(s.state, readonly=True) as store:
            params = query(limit=limit, cursor=cursor, state=state, tenant=tenant)
            tag = f'"{s.instance}.{store.generation()}.jobs.{params}"'
            return listing(request, tag,
                           lambda: views.jobs_view(store, after, limit, states, tenant),
                           lambda c: None if c is None else f"{request.url.path}?"
                           + query(limit=limit, cursor=c, state=state, tenant=tenant))


def _submit_route(router: APIRouter, s: ServeState, writer: Guard) -> None:
    """``POST /api/v1/jobs``: the body read within ``--read-timeout`` and its size limit,
    then parsed and stored off the event loop (:func:`_submit`)."""
    @router.post(f"{API}/jobs", response_model=schemas.Submitted, status_code=201,
                 tags=["jobs"], openapi_extra=_BODY_DOC,
                 responses={200: {"model": schemas.Submitted, "description":
                                  "a retry: every job of the body was already stored with the "
                                  "same spec; nothing was written"},
                            **errors(401, 408, 409, 413, 415, 422, 503)},
                 dependencies=[Depends(writer)])
    async def submit_jobs(request: Request) -> Any:
        """Submit the jobs of a jobs document (YAML or JSON), all or nothing."""
        content_type = request.headers.get("content-type", "")
        try:
            check_media_type(content_type)
        except UnsupportedMediaType as exc:
            raise ApiError(415, str(exc), "Content-Type") from None
        raw = bytearray()
        try:
            with anyio.fail_after(s.read_timeout_s):
                async for chunk in request.stream():
                    raw += chunk
                    if len(raw) > MAX_BODY_BYTES:
                        raise ApiError(413, f"bodies are limited to {MAX_BODY_BYTES} bytes",
                                       "(body)", {"Connection": "close"})
        except TimeoutError:
            raise ApiError(408, f"the body did not arrive within {s.read_timeout_s:g} s",
                           "(body)", {"Connection": "close"}) from None
        except ClientDisconnect:
            raise ApiError(400, "the client went away before its body arrived",
                           "(body)") from None
        status, answer = await run_in_threadpool(_submit, s, bytes(raw), content_type)
        return JSONResponse(answer, status)


def _too_large(s: ServeState, sub: Submission) -> None:
    """A job no round could ever place on this cluster is refused now, by the rule the
    rounds' admission would refuse it with (never queued for ever)."""
    refused = {p.job: p for p in admit(s.cluster, sub.jobs, catalog=False).refused
               if p.reason is Reason.TOO_LARGE}
    for i, j in enumerate(sub.jobs):
        if j.id in refused:
            raise ApiError(422, f"jobs[{i}].requested_gpus: {refused[j.id].detail}: it "
                           "could never run here", f"jobs[{i}].requested_gpus")


def _submit(s: ServeState, raw: bytes, content_type: str) -> tuple[int, dict[str, Any]]:
    """Parse, check and store one body (in a worker thread: SQLite blocks): 201 and the
    ids stored now, 200 and the stored ids for a retry of a stored body."""
    now = time.time()
    try:
        sub = submission_from_body(raw, content_type, now)
    except UnsupportedMediaType as exc:
        raise ApiError(415, str(exc), "Content-Type") from None
    except InputError as exc:
        raise ApiError(422, str(exc), exc.field) from None
    _too_large(s, sub)
    jobs = sub.jobs
    with request_store(s.state, readonly=False) as store:
        retry = _stored_already(store, sub)
        if retry is not None:
            log.info("a retried submission of %d stored jobs through the API", len(retry))
            return 200, {"submitted": retry}
        try:
            ids = store.submit(jobs, source="request body", at=now)
        except StoreDamaged:
            raise
        except InputError as exc:
            clash = _clash(store, sub, exc)
            if clash is not None:
                raise clash from None
            raise ApiError(422, str(exc), exc.field) from None
    log.info("submitted %d jobs through the API: %s", len(ids), ", ".join(ids))
    return 201, {"submitted": ids}


def _stored_already(store: StateStore, sub: Submission) -> list[str] | None:
    """The ids, when every job of ``sub`` is stored with the same spec (a retry)."""
    if not sub.jobs:
        return None
    for i, j in enumerate(sub.jobs):
        try:
            rec = store.job(j.id)
        except UnknownJob:
            return None
        if not _same_job(rec.to_jobspec(), j, i in sub.timed):
            return None
    return [j.id for j in sub.jobs]


def _clash(store: StateStore, sub: Submission, exc: InputError) -> ApiError | None:
    """409 when ``exc`` is the store refusing an id it holds (the first such job)."""
    for i, j in enumerate(sub.jobs):
        if exc.field != f"jobs[{i}].id":
            continue
        try:
            rec = store.job(j.id)
        except UnknownJob:
            return None
        return ApiError(409, f"jobs[{i}].id: job id {j.id!r} is already in the state "
                        f"store (state {rec.state.value}) with another spec, or beside "
                        "jobs it does not hold; ids are never reused (the same body "
                        "sent again is answered 200)", f"jobs[{i}].id")
    return None


def _job_routes(router: APIRouter, s: ServeState, reader: Guard, writer: Guard) -> None:
    """``GET`` and ``DELETE /api/v1/jobs/{id}``: one job (its history on request) and its
    cancellation."""
    @router.get(API + "/jobs/{id:path}", response_model=schemas.JobDetail, tags=["jobs"],
                responses={**NOT_MODIFIED, **errors(401, 404, 503)},
                dependencies=[Depends(reader)])
    def get_job(request: Request, id: str,  # the contract's name
                history: bool = Query(False, description="add the job's history: the "
                                      "rounds' decisions about it (runs of identical ones, "
                                      "newest first), its launches and its restart, "
                                      "preemption and interruption counts")) -> Response:
        """One job: state, allocation, plan, progress and why it waits; with
        `history=true` also what every round decided about it. The ETag changes with every
        write to the store."""
        with request_store(s.state, readonly=True) as store:
            try:
                store.job(id)  # a job that does not exist is a 404, never a 304
                tag = f'"{s.instance}.{store.generation()}.job.{int(history)}"'
                return tagged(request, tag, lambda: job_history(store, id) if history
                              else views.job_view(store, id))
            except UnknownJob:
                raise ApiError(404, f"no job {id!r} in the state store", "id") from None

    @router.delete(API + "/jobs/{id:path}", response_model=schemas.Cancelled, tags=["jobs"],
                   responses=errors(401, 404, 409, 503), dependencies=[Depends(writer)])
    def cancel_job(id: str) -> dict[str, str]:  # the contract's name
        """Cancel a job: it is dropped, and its GPUs go to the next round."""
        with request_store(s.state, readonly=False) as store:
            try:
                rec = store.cancel(id)
            except UnknownJob:
                raise ApiError(404, f"no job {id!r} in the state store", "id") from None
            except IllegalTransition as exc:
                raise ApiError(409, str(exc), "id") from None
        log.info("job %s cancelled through the API", id)
        return {"id": rec.id, "state": rec.state.value}
