"""``apportion serve``: the round loop of ``apportion run`` with an HTTP server beside it.

One process: the loop holds the store's round lock and schedules exactly as ``run``
does (:func:`apportion.runtime.session.run_rounds`); the server answers from the
store (the single source of truth) through its own connections, and writes only through
the store's own transactional calls (``submit``, ``cancel``), as the commands do.

Modules: :mod:`.command` (the command, its flags and its wiring), :mod:`.app` (the
routes), :mod:`.views` (what the routes read from the store), :mod:`.summaries` (the dashboard's
bounded reads: the queue, the tenants, the cluster per type and node group),
:mod:`.job_history` (one job's decisions, launches and restarts), :mod:`.decision_cache`
(the last rounds' decisions, parsed once), :mod:`.schemas` (the
response shapes the OpenAPI document publishes), :mod:`.body` (a submitted body as
jobs, its content types and its budget), :mod:`.auth` (the bearer token: given, generated
or waived), :mod:`.origins` (the ``Host`` and ``Origin`` checks), :mod:`.metrics`
(Prometheus), :mod:`.observer` (what the loop tells the server), :mod:`.server` (uvicorn
on a thread), :mod:`.connections` (its read deadlines and connection cap), and
``static/`` (the dashboard). The web framework is an optional extra (``apportion[serve]``); only
:mod:`.command` may be imported without it.
"""
