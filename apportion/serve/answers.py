"""How the API answers: its one error shape, a store per request, ETagged lists.

Shared by every route module (``routes_probes``, ``routes_jobs``, ``routes_reads``) so
that each answers errors, 304s and pages the same way; nothing here knows a route.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from apportion.console import printable
from apportion.errors import HostError, InputError
from apportion.serve import schemas
from apportion.store import StateStore, StoreBusy, StoreDamaged, open_store, store_error

API = "/api/v1"


class ApiError(Exception):
    """An answer other than 2xx, as a :class:`~apportion.serve.schemas.Problem`."""

    def __init__(self, status: int, detail: str, field: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.field, self.headers = status, detail, field, headers


def problem(status: int, detail: str, field: str | None = None,
            headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": printable(detail, False), "field": field}, status,
                        headers=headers)


def unavailable(exc: BaseException, state: Path) -> ApiError:
    if isinstance(exc, sqlite3.Error):
        exc = store_error(exc, state)
    if isinstance(exc, StoreBusy):
        return ApiError(503, str(exc), None, {"Retry-After": "1"})
    return ApiError(503, f"the state store cannot be used: {exc}", "--state",
                    {"Retry-After": "5"})


@contextlib.contextmanager
def request_store(state: Path, readonly: bool) -> Iterator[StateStore]:
    """A connection for one request; a store that cannot be opened is a 503."""
    try:
        store = open_store(state, readonly=readonly)
    except (InputError, HostError, sqlite3.Error, OSError) as exc:
        raise unavailable(exc, state) from None
    try:
        yield store
    except (StoreBusy, StoreDamaged, sqlite3.Error, HostError, OSError) as exc:
        raise unavailable(exc, state) from None
    finally:
        store.close()



ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": schemas.Problem, "description": what}
    for code, what in ((401, ("a write without the bearer token (a read, with "
                             "--read-token-file)")),
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
GUARDED = (403, 421)
NOT_MODIFIED: dict[int | str, dict[str, Any]] = {304: {"description": "the list is unchanged since the ETag given in "
                       "If-None-Match"}}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {c: ERRORS[c] for c in (*codes, *GUARDED)}


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinity as None (JSON has neither), as the response
    models' serialisation writes them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


class ListJSON(JSONResponse):
    """A list's JSON, written without the response model's per-field validation (20,000
    job rows cost seconds there); a non-finite float is written as null, as the model
    would have written it."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except ValueError:  # NaN or infinity somewhere: rare, so only then walked
            return super().render(finite(content))


def etag_matches(header: str | None, tag: str) -> bool:
    """Whether ``If-None-Match`` names ``tag`` (weak or strong) or is ``*``."""
    if not header:
        return False
    for part in header.split(","):
        part = part.strip()
        if part == "*" or part.removeprefix("W/") == tag:
            return True
    return False


def listing(request: Request, tag: str, build: Callable[[], dict[str, Any]],
            next_link: Callable[[Any], str | None]) -> Response:
    """A list answer with its ETag: 304 when the client has it, else the JSON of
    ``build()`` with ``next`` made from its ``next_cursor``."""
    headers = {"ETag": tag, "Cache-Control": "no-cache"}
    if etag_matches(request.headers.get("if-none-match"), tag):
        return Response(status_code=304, headers=headers)
    body = build()
    link = next_link(body.get("next_cursor"))
    body["next"] = link
    if link is not None:
        headers["Link"] = f'<{link}>; rel="next"'
    return ListJSON(body, headers=headers)


def tagged(request: Request, tag: str, build: Callable[[], dict[str, Any]]) -> Response:
    """An answer with its ETag: 304 when the client has it, else the JSON of ``build()``."""
    headers = {"ETag": tag, "Cache-Control": "no-cache"}
    if etag_matches(request.headers.get("if-none-match"), tag):
        return Response(status_code=304, headers=headers)
    return ListJSON(build(), headers=headers)


def hashed(request: Request, instance: str, body: dict[str, Any]) -> Response:
    """An answer tagged by its content: for views that change with the clock as well as
    with the store (a node's quarantine ends by itself), so the store's generation alone
    cannot say they are unchanged. The client is spared the body and its drawing."""
    raw = ListJSON(body).body
    tag = f'"{instance}.{hashlib.sha256(raw).hexdigest()[:24]}"'
    headers = {"ETag": tag, "Cache-Control": "no-cache"}
    if etag_matches(request.headers.get("if-none-match"), tag):
        return Response(status_code=304, headers=headers)
    return Response(raw, media_type="application/json", headers=headers)



def query(**params: Any) -> str:
    return urlencode({k: v for k, v in params.items() if v is not None})

