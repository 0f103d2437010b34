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

import logging
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from apportion import __version__
from apportion.config import JobsSpec
from apportion.serve.access import AccessLog
from apportion.serve.answers import ApiError, errors, problem
from apportion.serve.origins import HostOriginGuard, HostPolicy
from apportion.serve.routes_jobs import jobs_router
from apportion.serve.routes_probes import probe_routes
from apportion.serve.routes_reads import reads_router
from apportion.serve.state import ServeState, guards

log = logging.getLogger(__name__)

STATIC = Path(__file__).with_name("static")


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
    _answer_errors(app)
    writer, reader = guards(s)
    # the routes in the API's order (the OpenAPI document lists them so)
    app.include_router(probe_routes(s, reader))
    app.include_router(jobs_router(s, reader, writer))
    app.include_router(reads_router(s, reader))

    @app.get("/", response_class=HTMLResponse, tags=["dashboard"], responses=errors())
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


def _answer_errors(app: FastAPI) -> None:
    """Every error as one :class:`~apportion.serve.schemas.Problem` (``detail`` and
    ``field``), a bug included: a client never gets a traceback or HTML."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return problem(exc.status, exc.detail, exc.field, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _bad_param(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ())[1:]) or "(request)"
        return problem(422, f"{loc}: {err.get('msg', 'invalid')}", loc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem(exc.status_code, str(exc.detail), None,
                       dict(exc.headers) if exc.headers else None)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return problem(500, f"internal error ({type(exc).__name__}); the server's log has "
                       "the traceback", None)

