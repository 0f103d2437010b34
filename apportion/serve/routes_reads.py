"""The read views' routes: rounds (full and summarised), the queue, the tenants and the
cluster (summary, a node group's page, node by node), each with an ETag so a polling
dashboard is answered 304 until something changed."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request, Response

from apportion.serve import schemas, summaries, views
from apportion.serve.answers import (
    API,
    NOT_MODIFIED,
    ApiError,
    errors,
    hashed,
    listing,
    query,
    request_store,
    tagged,
)
from apportion.serve.state import Guard, ServeState


def reads_router(s: ServeState, reader: Guard) -> APIRouter:
    """The read views' routes in the API's order: rounds, queue and tenants, cluster."""
    router = APIRouter()
    _round_routes(router, s, reader)
    _queue_routes(router, s, reader)
    _cluster_routes(router, s, reader)
    return router


def _round_routes(router: APIRouter, s: ServeState, reader: Guard) -> None:
    """``/api/v1/rounds`` and ``/api/v1/rounds/summary``: the last rounds, paged."""
    @router.get(f"{API}/rounds", response_model=schemas.Rounds, tags=["rounds"],
                responses={**NOT_MODIFIED, **errors(401, 422, 503)},
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
        with request_store(s.state, readonly=True) as store:
            params = urlencode({k: v for k, v in (("limit", limit), ("cursor", cursor))
                                if v is not None})
            tag = f'"{s.instance}.{store.generation()}.rounds.{params}"'
            return listing(request, tag, lambda: views.rounds_view(store, limit, before),
                           lambda c: None if c is None else
                           f"{request.url.path}?{urlencode({'limit': limit, 'cursor': c})}")

    @router.get(f"{API}/rounds/summary", response_model=schemas.RoundsSummary, tags=["rounds"],
                responses={**NOT_MODIFIED, **errors(401, 422, 503)},
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
        with request_store(s.state, readonly=True) as store:
            tag = (f'"{s.instance}.{store.generation()}.rounds-summary.'
                   f'{query(limit=limit, cursor=cursor)}"')
            return listing(request, tag,
                           lambda: summaries.rounds_summary(store, limit, before),
                           lambda c: None if c is None else
                           f"{request.url.path}?{query(limit=limit, cursor=c)}")


def _queue_routes(router: APIRouter, s: ServeState, reader: Guard) -> None:
    """``/api/v1/queue`` and ``/api/v1/tenants``: who waits and why, and per tenant."""
    @router.get(f"{API}/queue", response_model=schemas.QueueView, tags=["jobs"],
                responses={**NOT_MODIFIED, **errors(401, 422, 503)},
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
        with request_store(s.state, readonly=True) as store:
            tag = (f'"{s.instance}.{store.generation()}.queue.'
                   f'{query(top=top, reason=reason)}"')
            return tagged(request, tag, lambda: summaries.queue_view(store, top, reason))

    @router.get(f"{API}/tenants", response_model=schemas.TenantsView, tags=["jobs"],
                responses={**NOT_MODIFIED, **errors(401, 503)},
                dependencies=[Depends(reader)])
    def tenants(request: Request) -> Response:
        """Every tenant with a job or a quota (`--tenants`): its jobs per state, the GPUs
        its running jobs hold per type, its guaranteed jobs' GPUs against its quota, and
        its longest wait; most GPUs held first. The ETag changes with every write."""
        with request_store(s.state, readonly=True) as store:
            tag = f'"{s.instance}.{store.generation()}.tenants"'
            return tagged(request, tag, lambda: summaries.tenants_view(store, s.quotas))


def _cluster_routes(router: APIRouter, s: ServeState, reader: Guard) -> None:
    """``/api/v1/cluster/summary``, ``/api/v1/cluster/groups/{group}`` and
    ``/api/v1/cluster``: the cluster summarised, a node group's page, every node."""
    #: the last cluster summary and what it was computed from (summaries.cluster_key)
    summary_cache: list[tuple[Any, dict[str, Any]] | None] = [None]

    @router.get(f"{API}/cluster/summary", response_model=schemas.ClusterSummary,
                tags=["cluster"], responses={**NOT_MODIFIED, **errors(401, 503)},
                dependencies=[Depends(reader)])
    def cluster_summary(request: Request) -> Response:
        """The cluster per GPU type and per node group (the cluster file's `node_groups`):
        capacity, allocated and free GPUs, nodes by health and by use; no node listed, so
        its size does not grow with the cluster. The ETag follows its content (a node's
        quarantine ends by itself, without a write)."""
        with request_store(s.state, readonly=True) as store:
            key = summaries.cluster_key(store, time.time())
            last = summary_cache[0]
            if last is None or last[0] != key:  # else the same as the last answer's
                last = (key, summaries.cluster_summary(store, s.cluster))
                summary_cache[0] = last  # one assignment: threads see old or new, whole
        return hashed(request, s.instance, {
            **last[1], "executor": s.executor, "interval_s": s.interval_s,
            "writes_need_token": s.token is not None,
            "reads_need_token": s.read_token is not None})

    @router.get(API + "/cluster/groups/{group}", response_model=schemas.GroupPage,
                tags=["cluster"], responses={**NOT_MODIFIED, **errors(401, 404, 422, 503)},
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
                            f"{request.url.path}?{query(limit=limit, cursor=nxt)}")
            return body

        with request_store(s.state, readonly=True) as store:
            tag = (f'"{s.instance}.{store.generation()}.group.{group}.'
                   f'{query(limit=limit, cursor=cursor)}"')
            return tagged(request, tag, page)

    @router.get(f"{API}/cluster", response_model=schemas.ClusterView, tags=["cluster"],
                responses=errors(401, 503), dependencies=[Depends(reader)])
    def cluster() -> dict[str, Any]:
        """The cluster node by node and GPU by GPU, and who holds each GPU."""
        with request_store(s.state, readonly=True) as store:
            view = views.cluster_view(store, s.cluster)
        return {**view, "executor": s.executor, "interval_s": s.interval_s,
                "writes_need_token": s.token is not None,
                "reads_need_token": s.read_token is not None}
