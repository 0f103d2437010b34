"""The HTTP API, the probes, ``/metrics`` and the dashboard: one FastAPI application.

Every handler opens its own store connection for its request and closes it (SQLite in
WAL mode: readers never block the loop, and the loop's connection is never shared
between threads). Writes go through the store's own transactions (``submit`` all or
nothing, ``cancel``), exactly as the ``submit`` and ``cancel`` commands write; a body is
parsed and validated before the store is opened, so a bad one writes nothing.

Errors are one JSON shape, :class:`~apportion.serve.schemas.Problem` (``detail`` and
``field``): 401 a write without the token, 404 no such job, 409 a move the job's
lifecycle forbids, 413 too large, 415 neither YAML nor JSON, 422 a bad body or
parameter (naming the field, as ``submit`` exits 2 naming it), 503 the store cannot be
read or is busy (with ``Retry-After``).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from apportion import __version__
from apportion.cluster import Cluster
from apportion.config import JobsSpec
from apportion.console import printable
from apportion.errors import HostError, InputError
from apportion.lifecycle import IllegalTransition
from apportion.serve import schemas, views
from apportion.serve.auth import authorized
from apportion.serve.body import MAX_BODY_BYTES, UnsupportedMediaType, jobs_from_body
from apportion.serve.observer import LoopObserver
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
                       "nothing",
        "content": {
            "application/json": {"schema": JobsSpec.model_json_schema(
                ref_template="#/components/schemas/{model}")},
            "application/yaml": {"schema": {"type": "string"}},
        },
    }
}
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": schemas.Problem, "description": what}
    for code, what in ((401, "a write without the bearer token (with --token-file)"),
                       (404, "no such job"), (409, "the job's lifecycle forbids it"),
                       (413, "body too large"), (415, "neither YAML nor JSON"),
                       (422, "a bad body or parameter, naming the field"),
                       (503, "the state store cannot be read, or is busy"))}


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {c: _ERRORS[c] for c in codes}


def create_app(s: ServeState) -> FastAPI:
    """The application over one store and one loop."""
    app = FastAPI(title="apportion", version=__version__, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json",
                  description="apportion's scheduler as a service: jobs, rounds and the "
                              "cluster from its state store. Writes need `Authorization: "
                              "Bearer <token>` when the server was started with "
                              "--token-file; reads are open.")
    # the definitions the JSON body's schema refers to
    defs = JobsSpec.model_json_schema(ref_template="#/components/schemas/{model}").get(
        "$defs", {})

    def writer(request: Request, _: Credentials) -> None:
        if not authorized(s.token, request.headers.get("authorization")):
            raise ApiError(401, "this server needs 'Authorization: Bearer <token>' for writes",
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

    @app.get("/healthz", response_model=schemas.Health, tags=["probes"])
    def healthz() -> dict[str, str]:
        """The process is alive and answers."""
        return {"status": "ok"}

    @app.get("/readyz", response_model=schemas.Ready, tags=["probes"],
             responses={503: {"model": schemas.Ready, "description": "not ready"}})
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
        body = {"ready": ready, "store": store_ok, "last_round_age_s": age,
                "limit_s": s.observer.limit_s}
        return JSONResponse(body, 200 if ready else 503)

    @app.get("/metrics", response_class=PlainTextResponse, tags=["probes"])
    def metrics() -> PlainTextResponse:
        """Prometheus' text exposition format."""
        return PlainTextResponse(generate_latest(s.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get(f"{API}/jobs", response_model=schemas.JobList, tags=["jobs"],
             responses=_errors(503))
    def list_jobs() -> dict[str, Any]:
        """Every job, in submission order, a waiting one with its typed reason."""
        with _store(s.state, readonly=True) as store:
            return views.jobs_view(store)

    @app.post(f"{API}/jobs", response_model=schemas.Submitted, status_code=201,
              tags=["jobs"], openapi_extra=_BODY_DOC,
              responses=_errors(401, 413, 415, 422, 503), dependencies=[Depends(writer)])
    async def submit_jobs(request: Request) -> dict[str, Any]:
        """Submit the jobs of a jobs document (YAML or JSON), all or nothing."""
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_BODY_BYTES:
                raise ApiError(413, f"bodies are limited to {MAX_BODY_BYTES} bytes", "(body)")
        return await run_in_threadpool(_submit, bytes(raw),
                                       request.headers.get("content-type", ""))

    def _submit(raw: bytes, content_type: str) -> dict[str, Any]:
        now = time.time()
        try:
            jobs = jobs_from_body(raw, content_type, now)
        except UnsupportedMediaType as exc:
            raise ApiError(415, str(exc), "Content-Type") from None
        except InputError as exc:
            raise ApiError(422, str(exc), exc.field) from None
        with _store(s.state, readonly=False) as store:
            try:
                ids = store.submit(jobs, source="request body", at=now)
            except StoreDamaged:
                raise
            except InputError as exc:  # an id the store already holds
                raise ApiError(422, str(exc), exc.field) from None
        log.info("submitted %d jobs through the API: %s", len(ids), ", ".join(ids))
        return {"submitted": ids}

    @app.get(API + "/jobs/{id:path}", response_model=schemas.JobDetail, tags=["jobs"],
             responses=_errors(404, 503))
    def get_job(id: str) -> dict[str, Any]:  # the contract's name
        """One job: state, allocation, plan, progress and why it waits."""
        with _store(s.state, readonly=True) as store:
            try:
                return views.job_view(store, id)
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
             responses=_errors(422, 503))
    def list_rounds(limit: int = Query(100, ge=1, le=10000,
                                       description="the last N rounds")) -> dict[str, Any]:
        """The last rounds, oldest first, each with its solver report and actions."""
        with _store(s.state, readonly=True) as store:
            return views.rounds_view(store, limit)

    @app.get(f"{API}/cluster", response_model=schemas.ClusterView, tags=["cluster"],
             responses=_errors(503))
    def cluster() -> dict[str, Any]:
        """The cluster node by node and GPU by GPU, and who holds each GPU."""
        with _store(s.state, readonly=True) as store:
            view = views.cluster_view(store, s.cluster)
        return {**view, "executor": s.executor, "interval_s": s.interval_s,
                "writes_need_token": s.token is not None}

    @app.get("/", response_class=HTMLResponse, tags=["dashboard"])
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
