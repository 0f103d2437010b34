"""The probes: ``/healthz`` (alive), ``/readyz`` (store readable, loop passing) and
``/metrics`` (Prometheus), for the orchestrator and the monitoring in front of the
service (docs/service.md)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from apportion.serve import schemas, views
from apportion.serve.answers import ApiError, errors, request_store
from apportion.serve.state import Guard, ServeState


def probe_routes(s: ServeState, reader: Guard) -> APIRouter:
    """The probes' routes: open to all but ``/metrics``, which is a read."""
    router = APIRouter()

    @router.get("/healthz", response_model=schemas.Health, tags=["probes"],
                responses=errors())
    def healthz() -> dict[str, str]:
        """The process is alive and answers."""
        return {"status": "ok"}

    @router.get("/readyz", response_model=schemas.Ready, tags=["probes"],
                responses={**errors(),
                           503: {"model": schemas.Ready, "description": "not ready"}})
    def readyz() -> JSONResponse:
        """Ready: the store can be read and the loop finished a pass lately."""
        store_ok = "ok"
        try:
            with request_store(s.state, readonly=True) as store:
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

    @router.get("/metrics", response_class=PlainTextResponse, tags=["probes"],
                responses=errors(401), dependencies=[Depends(reader)])
    def metrics() -> PlainTextResponse:
        """Prometheus' text exposition format."""
        return PlainTextResponse(generate_latest(s.registry), media_type=CONTENT_TYPE_LATEST)
    return router
