"""The HTTP API, the probes, ``/metrics`` and the dashboard: one FastAPI application.

Every handler opens its own store connection for its request and closes it (SQLite in
WAL mode: readers never block the loop, and the loop's connection is never shared
between threads). Writes go through the store's own transactions (``submit`` all or
nothing, ``cancel``), exactly as the ``submit`` and ``cancel`` commands write; a body is
parsed and validated before the store is opened, so a bad one writes nothing.

Errors are one JSON shape, :class:`~apportion.serve.schemas.Problem` (``detail`` and
``field``): 401 a write without the token, 403 a request from another site's page
(``Origin``), 404 no such job, 408 a body that did not arrive in time, 409 a job id the
store already holds with another spec, or a move the job's lifecycle forbids, 413 too
large, 415 neither YAML nor JSON (or a type a browser sends cross-site unasked), 421 a
``Host`` this server does not answer for, 422 a bad body or parameter (naming the field,
as ``submit`` exits 2 naming it), 503 the store cannot be read or is busy (with
``Retry-After``).

**Lists** (``/api/v1/jobs``, ``/api/v1/rounds``) carry an ``ETag`` made of the store's
generation (every write bumps it) and this server's start: a client that sends it back
in ``If-None-Match`` gets 304 and no body until something changed, which costs one read
of one row. ``limit`` and ``cursor`` page them, with ``next`` (a link) and
``next_cursor``.

**A retried submission** (its answer lost, say, to a crash after the store had committed
it) is answered 200 with the stored ids when every job of the body is already stored with
the same spec; 201 says they were stored now, and any other clash with a stored id is 409.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import math
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

import anyio
from fastapi import Depends, FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from apportion import __version__
from apportion.admission import admit
from apportion.cluster import Cluster
from apportion.config import JobsSpec
from apportion.console import printable
from apportion.decision import Reason
from apportion.errors import HostError, InputError
from apportion.jobs import JobSpec
from apportion.lifecycle import IllegalTransition, JobState
from apportion.serve import schemas, summaries, views
from apportion.serve.access import AccessLog
from apportion.serve.auth import authorized
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
from apportion.serve.observer import LoopObserver
from apportion.serve.origins import HostOriginGuard, HostPolicy
from apportion.store import (
    StateStore,
    StoreBusy,
    StoreDamaged,
    UnknownJob,
    open_store,
    store_error,
)

log = logging.getLogger(__name__)

STATIC = Path(__file__).with_name("static")
API = "/api/v1"
# module level: FastAPI resolves the (postponed) annotations of routes in this module's names
BEARER = HTTPBearer(auto_error=False, description="the token of --token-file")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]


@dataclass
class ServeState:
    """What the routes need: where the store is, the loop's cluster and observer."""

    state: Path
    cluster: Cluster
    executor: str
    interval_s: float
    observer: LoopObserver
    registry: CollectorRegistry
    token: str | None = None
    #: with ``--read-token-file``: reads need this token (or the write token)
    read_token: str | None = None
    #: how long a request body may take to arrive (``--read-timeout``)
    read_timeout_s: float = 30.0
    #: where a generated token was written (named in a 401's detail)
    token_hint: Path | None = None
    #: tenants' GPU quotas for guaranteed jobs (``--tenants``), for the tenants' panel
    quotas: dict[str, int] = field(default_factory=dict)
    #: this server's start, in every ETag: a store replaced between two starts never
    #: answers 304 to a tag of the old one
    instance: str = field(default_factory=lambda: secrets.token_hex(4))


class ApiError(Exception):
    """An answer other than 2xx, as a :class:`~apportion.serve.schemas.Problem`."""

    def __init__(self, status: int, detail: str, field: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.field, self.headers = status, detail, field, headers


def _problem(status: int, detail: str, field: str | None = None,
             headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": printable(detail, False), "field": field}, status,
                        headers=headers)


def _unavailable(exc: BaseException, state: Path) -> ApiError:
    if isinstance(exc, sqlite3.Error):
        exc = store_error(exc, state)
    if isinstance(exc, StoreBusy):
        return ApiError(503, str(exc), None, {"Retry-After": "1"})
    return ApiError(503, f"the state store cannot be used: {exc}", "--state",
                    {"Retry-After": "5"})


@contextlib.contextmanager
def _store(state: Path, readonly: bool) -> Iterator[StateStore]:
    """A connection for one request; a store that cannot be opened is a 503."""
    try:
        store = open_store(state, readonly=readonly)
    except (InputError, HostError, sqlite3.Error, OSError) as exc:
        raise _unavailable(exc, state) from None
    try:
        yield store
    except (StoreBusy, StoreDamaged, sqlite3.Error, HostError, OSError) as exc:
        raise _unavailable(exc, state) from None
    finally:
        store.close()


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
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": schemas.Problem, "description": what}
    for code, what in ((401, "a write without the bearer token (a read, with "
                             "--read-token-file)"),
                       (403, "a request from another site's page (Origin)"),
                       (404, "no such job"),
                       (408, "the body did not arrive within --read-timeout"),
                       (409, ("a job id the store already holds with another spec, or a "
                              "move the job's lifecycle forbids")),
                       (413, "body too large"),
                       (415, ("neither YAML nor JSON, or a type a browser sends "
                              "cross-site without a preflight (text/plain, forms, none)")),
                       (421, "a Host this server does not answer for (DNS rebinding)"),
                       (422, "a bad body or parameter, naming the field"),
                       (503, "the state store cannot be read, or is busy"))}
#: every route answers these before it runs (origins.HostOriginGuard)
_GUARDED = (403, 421)
_NOT_MODIFIED: dict[int | str, dict[str, Any]] = {304: {"description": "the list is unchanged since the ETag given in "
                       "If-None-Match"}}


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {c: _ERRORS[c] for c in (*codes, *_GUARDED)}


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinity as None (JSON has neither), as the response
    models' serialisation writes them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


class ListJSON(JSONResponse):
    """A list's JSON, written without the response model's per-field validation (20,000
    job rows cost seconds there); a non-finite float is written as null, as the model
    would have written it."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except ValueError:  # NaN or infinity somewhere: rare, so only then walked
            return super().render(_finite(content))


def _etag_matches(header: str | None, tag: str) -> bool:
    """Whether ``If-None-Match`` names ``tag`` (weak or strong) or is ``*``."""
    if not header:
        return False
    for part in header.split(","):
        part = part.strip()
        if part == "*" or part.removeprefix("W/") == tag:
            return True
    return False


def _listing(request: Request, tag: str, build: Callable[[], dict[str, Any]],
             next_link: Callable[[Any], str | None]) -> Response:
    """A list answer with its ETag: 304 when the client has it, else the JSON of
    ``build()`` with ``next`` made from its ``next_cursor``."""
    headers = {"ETag": tag, "Cache-Control": "no-cache"}
    if _etag_matches(request.headers.get("if-none-match"), tag):
        return Response(status_code=304, headers=headers)
    body = build()
    link = next_link(body.get("next_cursor"))
    body["next"] = link
    if link is not None:
        headers["Link"] = f'<{link}>; rel="next"'
    return ListJSON(body, headers=headers)


def _tagged(request: Request, tag: str, build: Callable[[], dict[str, Any]]) -> Response:
    """An answer with its ETag: 304 when the client has it, else the JSON of ``build()``."""
    headers = {"ETag": tag, "Cache-Control": "no-cache"}
    if _etag_matches(request.headers.get("if-none-match"), tag):
        return Response(status_code=304, headers=headers)
    return ListJSON(build(), headers=headers)


def _hashed(request: Request, instance: str, body: dict[str, Any]) -> Response:
    """An answer tagged by its content: for views that change with the clock as well as
    with the store (a node's quarantine ends by itself), so the store's generation alone
    cannot say they are unchanged. The client is spared the body and its drawing."""
    raw = ListJSON(body).body
    tag = f'"{instance}.{hashlib.sha256(raw).hexdigest()[:24]}"'
    headers = {"ETag": tag, "Cache-Control": "no-cache"}
    if _etag_matches(request.headers.get("if-none-match"), tag):
        return Response(status_code=304, headers=headers)
    return Response(raw, media_type="application/json", headers=headers)


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


def _query(**params: Any) -> str:
    return urlencode({k: v for k, v in params.items() if v is not None})


def _same_job(stored: JobSpec, new: JobSpec, timed: bool) -> bool:
    """Whether a stored job is the one ``new`` submits again: every field but the progress
    the store advances, and the submission time where the body left it to the server."""
    again = dataclasses.replace(stored, iterations_done=new.iterations_done, running=None)
    if not timed:
        again = dataclasses.replace(again, submit_time_s=new.submit_time_s)
    return again == new


def create_app(s: ServeState, hosts: HostPolicy | None = None) -> FastAPI:
    """The application over one store and one loop; ``hosts`` says which ``Host`` and
    ``Origin`` headers it answers (by default those of a server on loopback)."""
    app = FastAPI(title="apportion", version=__version__, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json",
                  description="apportion's scheduler as a service: jobs, rounds and the "
                              "cluster from its state store. Writes need `Authorization: "
                              "Bearer <token>` (the token of --token-file, or the one the "
                              "server generated beside its store) unless it was started "
                              "with --no-token; reads are open unless it was started with "
                              "--read-token-file (then they need that token or the write "
                              "token; the probes and the dashboard's page stay open). "
                              "Every request's Host and Origin are checked (421, 403). "
                              "Times are Unix seconds (`*_at`) with an RFC 3339 twin "
                              "(`*_at_rfc3339`).")
    app.add_middleware(HostOriginGuard, policy=hosts or HostPolicy.for_listener("127.0.0.1"))
    app.add_middleware(AccessLog)  # outermost: refused requests are logged too
    # the definitions the JSON body's schema refers to
    defs = JobsSpec.model_json_schema(ref_template="#/components/schemas/{model}").get(
        "$defs", {})

    def writer(request: Request, _: Credentials) -> None:
        if not authorized(s.token, request.headers.get("authorization")):
            where = (f"; the token is in {s.token_hint} on the server's machine"
                     if s.token_hint is not None else "")
            raise ApiError(401, "this server needs 'Authorization: Bearer <token>' for writes"
                           + where, "Authorization", {"WWW-Authenticate": "Bearer"})

    def reader(request: Request, _: Credentials) -> None:
        """Reads need a token only with ``--read-token-file``: that one, or the write
        token (who may write may read)."""
        if s.read_token is None:
            return
        header = request.headers.get("authorization")
        if authorized(s.read_token, header) or (s.token is not None
                                                and authorized(s.token, header)):
            return
        raise ApiError(401, "this server needs 'Authorization: Bearer <token>' for reads "
                       "too (the token of --read-token-file, or the write token)",
                       "Authorization", {"WWW-Authenticate": "Bearer"})

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _problem(exc.status, exc.detail, exc.field, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _bad_param(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ())[1:]) or "(request)"
        return _problem(422, f"{loc}: {err.get('msg', 'invalid')}", loc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _problem(exc.status_code, str(exc.detail), None,
                        dict(exc.headers) if exc.headers else None)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return _problem(500, f"internal error ({type(exc).__name__}); the server's log has "
                        "the traceback", None)

    @app.get("/healthz", response_model=schemas.Health, tags=["probes"],
             responses=_errors())
    def healthz() -> dict[str, str]:
        """The process is alive and answers."""
        return {"status": "ok"}

    @app.get("/readyz", response_model=schemas.Ready, tags=["probes"],
             responses={**_errors(),
                        503: {"model": schemas.Ready, "description": "not ready"}})
    def readyz() -> JSONResponse:
        """Ready: the store can be read and the loop finished a pass lately."""
        store_ok = "ok"
        try:
            with _store(s.state, readonly=True) as store:
                store.generation()
        except ApiError as exc:
            store_ok = exc.detail
        age = s.observer.last_pass_age()
        ready = store_ok == "ok" and s.observer.loop_ready()
        at = s.observer.last_pass_at
        body = {"ready": ready, "store": store_ok, "last_round_age_s": age,
                "last_round_at": at, "last_round_at_rfc3339": views.rfc3339(at),
                "limit_s": s.observer.limit_s}
        return JSONResponse(body, 200 if ready else 503)

    @app.get("/metrics", response_class=PlainTextResponse, tags=["probes"],
             responses=_errors(401), dependencies=[Depends(reader)])
    def metrics() -> PlainTextResponse:
        """Prometheus' text exposition format."""
        return PlainTextResponse(generate_latest(s.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get(f"{API}/jobs", response_model=schemas.JobList, tags=["jobs"],
             responses={**_NOT_MODIFIED, **_errors(401, 422, 503)},
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
        with _store(s.state, readonly=True) as store:
            params = _query(limit=limit, cursor=cursor, state=state, tenant=tenant)
            tag = f'"{s.instance}.{store.generation()}.jobs.{params}"'
            return _listing(request, tag,
                            lambda: views.jobs_view(store, after, limit, states, tenant),
                            lambda c: None if c is None else f"{request.url.path}?"
                            + _query(limit=limit, cursor=c, state=state, tenant=tenant))

    @app.post(f"{API}/jobs", response_model=schemas.Submitted, status_code=201,
              tags=["jobs"], openapi_extra=_BODY_DOC,
              responses={200: {"model": schemas.Submitted, "description":
                               "a retry: every job of the body was already stored with the "
                               "same spec; nothing was written"},
                         **_errors(401, 408, 409, 413, 415, 422, 503)},
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
        status, answer = await run_in_threadpool(_submit, bytes(raw), content_type)
        return JSONResponse(answer, status)

    def _too_large(sub: Submission) -> None:
        """A job no round could ever place on this cluster is refused now, by the rule the
        rounds' admission would refuse it with (never queued for ever)."""
        refused = {p.job: p for p in admit(s.cluster, sub.jobs, catalog=False).refused
                   if p.reason is Reason.TOO_LARGE}
        for i, j in enumerate(sub.jobs):
            if j.id in refused:
                raise ApiError(422, f"jobs[{i}].requested_gpus: {refused[j.id].detail}: it "
                               "could never run here", f"jobs[{i}].requested_gpus")

    def _submit(raw: bytes, content_type: str) -> tuple[int, dict[str, Any]]:
        now = time.time()
        try:
            sub = submission_from_body(raw, content_type, now)
        except UnsupportedMediaType as exc:
            raise ApiError(415, str(exc), "Content-Type") from None
        except InputError as exc:
            raise ApiError(422, str(exc), exc.field) from None
        _too_large(sub)
        jobs = sub.jobs
        with _store(s.state, readonly=False) as store:
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

    @app.get(API + "/jobs/{id:path}", response_model=schemas.JobDetail, tags=["jobs"],
             responses={**_NOT_MODIFIED, **_errors(401, 404, 503)},
             dependencies=[Depends(reader)])
    def get_job(request: Request, id: str,  # the contract's name
                history: bool = Query(False, description="add the job's history: the "
                                      "rounds' decisions about it (runs of identical ones, "
                                      "newest first), its launches and its restart, "
                                      "preemption and interruption counts")) -> Response:
        """One job: state, allocation, plan, progress and why it waits; with
        `history=true` also what every round decided about it. The ETag changes with every
        write to the store."""
        with _store(s.state, readonly=True) as store:
            try:
                store.job(id)  # a job that does not exist is a 404, never a 304
                tag = f'"{s.instance}.{store.generation()}.job.{int(history)}"'
                return _tagged(request, tag, lambda: job_history(store, id) if history
                               else views.job_view(store, id))
            except UnknownJob:
                raise ApiError(404, f"no job {id!r} in the state store", "id") from None

    @app.delete(API + "/jobs/{id:path}", response_model=schemas.Cancelled, tags=["jobs"],
                responses=_errors(401, 404, 409, 503), dependencies=[Depends(writer)])
    def cancel_job(id: str) -> dict[str, str]:  # the contract's name
        """Cancel a job: it is dropped, and its GPUs go to the next round."""
        with _store(s.state, readonly=False) as store:
            try:
                rec = store.cancel(id)
            except UnknownJob:
                raise ApiError(404, f"no job {id!r} in the state store", "id") from None
            except IllegalTransition as exc:
                raise ApiError(409, str(exc), "id") from None
        log.info("job %s cancelled through the API", id)
        return {"id": rec.id, "state": rec.state.value}

    @app.get(f"{API}/rounds", response_model=schemas.Rounds, tags=["rounds"],
             responses={**_NOT_MODIFIED, **_errors(401, 422, 503)},
             dependencies=[Depends(reader)])
    def list_rounds(request: Request,
                    limit: int = Query(100, ge=1, le=10000, description="the last N rounds"),
                    cursor: str | None = Query(None, pattern=r"^[0-9]{1,18}$",
                                               description="rounds before this one: a "
                                               "`next_cursor` of the page after")) -> Response:
        """The last rounds, oldest first, each with its solver report and actions; `next`
        links to the page of the rounds before them (null when there are none). The ETag
        changes with every write to the store."""
        before = int(cursor) if cursor is not None else None
        with _store(s.state, readonly=True) as store:
            params = urlencode({k: v for k, v in (("limit", limit), ("cursor", cursor))
                                if v is not None})
            tag = f'"{s.instance}.{store.generation()}.rounds.{params}"'
            return _listing(request, tag, lambda: views.rounds_view(store, limit, before),
                            lambda c: None if c is None else
                            f"{request.url.path}?{urlencode({'limit': limit, 'cursor': c})}")

    @app.get(f"{API}/rounds/summary", response_model=schemas.RoundsSummary, tags=["rounds"],
             responses={**_NOT_MODIFIED, **_errors(401, 422, 503)},
             dependencies=[Depends(reader)])
    def rounds_summary(request: Request,
                       limit: int = Query(100, ge=1, le=10000,
                                          description="the last N rounds"),
                       cursor: str | None = Query(None, pattern=r"^[0-9]{1,18}$",
                                                  description="rounds before this one")
                       ) -> Response:
        """The last rounds as `/api/v1/rounds` gives them, without each round's `solver`
        report and `actions` (one row per job it decided: 20,000 at 20,000 jobs); for
        plots and tables of many rounds. Paged and tagged as `/api/v1/rounds`."""
        before = int(cursor) if cursor is not None else None
        with _store(s.state, readonly=True) as store:
            tag = (f'"{s.instance}.{store.generation()}.rounds-summary.'
                   f'{_query(limit=limit, cursor=cursor)}"')
            return _listing(request, tag,
                            lambda: summaries.rounds_summary(store, limit, before),
                            lambda c: None if c is None else
                            f"{request.url.path}?{_query(limit=limit, cursor=c)}")

    @app.get(f"{API}/queue", response_model=schemas.QueueView, tags=["jobs"],
             responses={**_NOT_MODIFIED, **_errors(401, 422, 503)},
             dependencies=[Depends(reader)])
    def queue(request: Request,
              top: int = Query(10, ge=0, le=summaries.MAX_TOP, description="how many of the "
                               "longest-waiting jobs to list"),
              reason: str | None = Query(None, max_length=100, description="list the longest "
                                         "waits of this reason only")) -> Response:
        """The queue: how many jobs wait and why (each typed reason with its count, the
        GPUs its jobs ask for and its longest wait), the `top` longest-waiting jobs with
        their reasons, every state's count and the last 200 finished jobs' JCTs; its size
        does not grow with the queue. Waits are as of `now`; the ETag changes with every
        write to the store."""
        with _store(s.state, readonly=True) as store:
            tag = (f'"{s.instance}.{store.generation()}.queue.'
                   f'{_query(top=top, reason=reason)}"')
            return _tagged(request, tag, lambda: summaries.queue_view(store, top, reason))

    @app.get(f"{API}/tenants", response_model=schemas.TenantsView, tags=["jobs"],
             responses={**_NOT_MODIFIED, **_errors(401, 503)},
             dependencies=[Depends(reader)])
    def tenants(request: Request) -> Response:
        """Every tenant with a job or a quota (`--tenants`): its jobs per state, the GPUs
        its running jobs hold per type, its guaranteed jobs' GPUs against its quota, and
        its longest wait; most GPUs held first. The ETag changes with every write."""
        with _store(s.state, readonly=True) as store:
            tag = f'"{s.instance}.{store.generation()}.tenants"'
            return _tagged(request, tag, lambda: summaries.tenants_view(store, s.quotas))

    #: the last cluster summary and what it was computed from (summaries.cluster_key)
    summary_cache: list[tuple[Any, dict[str, Any]] | None] = [None]

    @app.get(f"{API}/cluster/summary", response_model=schemas.ClusterSummary,
             tags=["cluster"], responses={**_NOT_MODIFIED, **_errors(401, 503)},
             dependencies=[Depends(reader)])
    def cluster_summary(request: Request) -> Response:
        """The cluster per GPU type and per node group (the cluster file's `node_groups`):
        capacity, allocated and free GPUs, nodes by health and by use; no node listed, so
        its size does not grow with the cluster. The ETag follows its content (a node's
        quarantine ends by itself, without a write)."""
        with _store(s.state, readonly=True) as store:
            key = summaries.cluster_key(store, time.time())
            last = summary_cache[0]
            if last is None or last[0] != key:  # else the same as the last answer's
                last = (key, summaries.cluster_summary(store, s.cluster))
                summary_cache[0] = last  # one assignment: threads see old or new, whole
        return _hashed(request, s.instance, {
            **last[1], "executor": s.executor, "interval_s": s.interval_s,
            "writes_need_token": s.token is not None,
            "reads_need_token": s.read_token is not None})

    @app.get(API + "/cluster/groups/{group}", response_model=schemas.GroupPage,
             tags=["cluster"], responses={**_NOT_MODIFIED, **_errors(401, 404, 422, 503)},
             dependencies=[Depends(reader)])
    def cluster_group(request: Request, group: str,
                      limit: int = Query(64, ge=1, le=10000, description="at most N nodes"),
                      cursor: str | None = Query(None, pattern=r"^[0-9]{1,18}$",
                                                 description="the page after this one: a "
                                                 "`next_cursor` of the page before")
                      ) -> Response:
        """One node group's nodes, a page at a time, each GPU naming the job that holds it
        (as `/api/v1/cluster`); `next` links the following page. The ETag changes with
        every write to the store."""
        if group not in summaries.group_names(s.cluster):
            raise ApiError(404, f"no node group {group!r} in cluster {s.cluster.name}",
                           "group")
        after = int(cursor) if cursor is not None else 0

        def page() -> dict[str, Any]:
            body = summaries.group_page(store, s.cluster, group, after, limit)
            nxt = body["next_cursor"]
            body["next"] = (None if nxt is None else
                            f"{request.url.path}?{_query(limit=limit, cursor=nxt)}")
            return body

        with _store(s.state, readonly=True) as store:
            tag = (f'"{s.instance}.{store.generation()}.group.{group}.'
                   f'{_query(limit=limit, cursor=cursor)}"')
            return _tagged(request, tag, page)

    @app.get(f"{API}/cluster", response_model=schemas.ClusterView, tags=["cluster"],
             responses=_errors(401, 503), dependencies=[Depends(reader)])
    def cluster() -> dict[str, Any]:
        """The cluster node by node and GPU by GPU, and who holds each GPU."""
        with _store(s.state, readonly=True) as store:
            view = views.cluster_view(store, s.cluster)
        return {**view, "executor": s.executor, "interval_s": s.interval_s,
                "writes_need_token": s.token is not None,
                "reads_need_token": s.read_token is not None}

    @app.get("/", response_class=HTMLResponse, tags=["dashboard"], responses=_errors())
    def dashboard() -> HTMLResponse:
        """The dashboard: cluster, queue, rounds, plots; it refreshes itself."""
        return HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"))

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = original()
            doc.setdefault("components", {}).setdefault("schemas", {}).update(defs)
            doc["components"]["schemas"].setdefault(
                "JobsSpec", {k: v for k, v in JobsSpec.model_json_schema(
                    ref_template="#/components/schemas/{model}").items() if k != "$defs"})
        return app.openapi_schema if app.openapi_schema is not None else doc

    app.openapi = openapi  # type: ignore[method-assign]
    return app
