"""Ray as a partitioned solve's engine, held at arm's length so it cannot outlast a budget.

A driver's Ray connection lives in C++ that Python cannot interrupt: when Ray's workers
cannot start (a broken environment on a node, a full machine), ``ray.init`` itself blocks
for minutes, and abandoning the connection makes Ray abort the whole process once its GCS
goes away. So :class:`RayProcessEngine` holds the connection in a child process of its own
and talks to it over a pipe: every wait is a pipe poll with a deadline, and a child that
does not answer in time is killed, its Ray instance removed with it. The parent then
solves on the local engine within what is left of its budget, and the round's report
says why.

:class:`RayEngine` is the connection itself (the child's; and the comparison harness's,
which waits on its runs for as long as they take). A Ray instance of its own lives in a
folder apportion owns (:func:`apportion.ray_home.owned_temp_dir`), watched by a process
that removes it if its owner is killed: a SIGKILL leaves no Ray behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import time
from multiprocessing.connection import Connection
from typing import Any

from apportion.ray_home import owned_temp_dir, probe, remove

#: how long past a run's deadline the child may take to answer (cancelling Ray tasks and
#: pickling their results back) before it is taken for hung and killed
ANSWER_GRACE_S = 5.0


class EngineUnavailable(RuntimeError):
    """The engine could not take tasks within its allowance (Ray's workers never started,
    or its process died or stopped answering)."""


def _ray_call(ref: str, args: tuple[Any, ...]) -> Any:
    from apportion.solvers.isolation import resolve_ref

    return resolve_ref(ref)(*args)


def _warm_up() -> bool:
    import apportion.formulations.cells  # noqa: F401
    import highspy  # noqa: F401
    return True


class RayEngine:
    """Tasks as Ray tasks (``num_cpus=1``) on the cluster at ``address``, or on a local
    Ray instance started here (its own temporary directory, ports Ray picks free, no
    dashboard; never another engineer's cluster) and shut down by :meth:`close`; tasks
    still running at the deadline are cancelled. In this process: a caller that must keep
    a budget uses :class:`RayProcessEngine`."""

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        import ray

        self.ray = ray
        self.owned = False
        self.folder: str | None = None
        if not ray.is_initialized():
            if address:
                probe(address)  # a dead address: refused now, not retried past the budget
                ray.init(address=address, log_to_driver=False)
            else:
                # removed by close, by its watcher if this process is killed, or the next start
                self.folder = owned_temp_dir("engine-")
                ray.init(address="local", _temp_dir=self.folder, include_dashboard=False,
                         log_to_driver=False, num_cpus=num_cpus or os.cpu_count() or 1)
                self.owned = True
        self._task = ray.remote(num_cpus=1, max_retries=0)(_ray_call)
        # warm the workers: each imports the solvers once, while the round is being built
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.warm = [self._task.remote(f"{_warm_up.__module__}:_warm_up", ())
                     for _ in range(max(1, cpus))]

    def start(self) -> RayEngine:
        return self

    def run(self, tasks: list[tuple[str, tuple[Any, ...]]], until: float
            ) -> list[tuple[bool, Any]]:
        refs = [self._task.remote(ref, args) for ref, args in tasks]
        done: set[Any] = set()
        pending = list(refs)
        while pending:
            wait = until - time.perf_counter()
            if wait <= 0:
                break
            ready, pending = self.ray.wait(pending, num_returns=1, timeout=wait)
            done.update(ready)
        out: list[tuple[bool, Any]] = []
        for r in refs:
            if r not in done:
                self.ray.cancel(r, force=True)
                out.append((False, "timed out: cancelled at the deadline"))
                continue
            try:
                out.append((True, self.ray.get(r)))
            except Exception as exc:  # noqa: BLE001 - a failed task is an answer missing
                out.append((False, f"raised {exc!r}"[:500]))
        return out

    def close(self) -> None:
        if self.owned:
            self.ray.shutdown()
            self.owned = False
        if self.folder:  # and any of its processes that outlived the shutdown
            remove(self.folder)
            self.folder = None


def _die_with_parent() -> None:
    """Linux's parent-death signal: this child is killed the moment its parent dies (its
    folder's watcher then removes the Ray it started)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _serve(conn: Connection, address: str | None, num_cpus: int | None) -> None:
    """The child: start or join Ray, say where its folder is and when a task has run, then
    run the parent's task lists until the pipe closes."""
    _die_with_parent()
    eng: RayEngine | None = None
    try:
        eng = RayEngine(address, num_cpus)
        conn.send(("folder", eng.folder))
        eng.ray.wait(eng.warm, num_returns=1)  # a worker took a task: the engine works
        conn.send(("ready", None))
        while True:
            try:
                msg = conn.recv()
            except EOFError:
                return
            if msg[0] == "close":
                return
            _, tasks, seconds = msg
            conn.send(("done", eng.run(tasks, time.perf_counter() + seconds)))
    except Exception as exc:  # noqa: BLE001 - the parent reports it and solves locally
        with contextlib.suppress(OSError, ValueError):
            conn.send(("error", f"{type(exc).__name__}: {exc}"[:1000]))
    finally:
        if eng is not None:
            eng.close()


class RayProcessEngine:
    """Ray's tasks through a child process that holds the connection (see the module).

    ``ready_timeout_s``: how long Ray may take to start (or join ``address``) and run its
    first task; past it, or when the child dies, :class:`EngineUnavailable` is raised and
    nothing of the child's Ray is left. ``run`` returns every task as failed when the child
    does not answer by the deadline plus :data:`ANSWER_GRACE_S` (and kills it)."""

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None,
                 ready_timeout_s: float | None = None) -> None:
        if address:
            probe(address)  # a dead address is the user's mistake, named: InputError
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, address, num_cpus),
                                 name="apportion-ray-engine", daemon=True)
        self._proc.start()
        child.close()
        self.folder: str | None = None
        deadline = None if ready_timeout_s is None else time.perf_counter() + ready_timeout_s
        while True:
            kind, value = self._receive(deadline, "Ray's workers did not start" + (
                f" within {ready_timeout_s:.1f} s" if ready_timeout_s is not None else ""))
            if kind == "folder":
                self.folder = value
            elif kind == "ready":
                return
            else:
                self._kill()
                raise EngineUnavailable(f"Ray did not start: {value}")

    def _receive(self, deadline: float | None, late: str) -> tuple[str, Any]:
        """The child's next message by ``deadline``; past it, the child is killed and
        :class:`EngineUnavailable` says ``late`` (what did not happen in time)."""
        wait = None if deadline is None else max(0.0, deadline - time.perf_counter())
        try:
            if not self._conn.poll(wait):
                self._kill()
                raise EngineUnavailable(late)
            return self._conn.recv()
        except (EOFError, OSError):
            self._kill()
            raise EngineUnavailable("Ray's process ended before it answered") from None

    def start(self) -> RayProcessEngine:
        return self

    def run(self, tasks: list[tuple[str, tuple[Any, ...]]], until: float
            ) -> list[tuple[bool, Any]]:
        if self._proc is None:
            return [(False, "the Ray engine was stopped")] * len(tasks)
        try:
            self._conn.send(("run", tasks, max(0.0, until - time.perf_counter())))
            kind, value = self._receive(until + ANSWER_GRACE_S, "its tasks were not done "
                                        f"{ANSWER_GRACE_S:g} s after the parts' deadline")
        except (EngineUnavailable, OSError) as exc:
            self._kill()
            return [(False, f"the Ray engine did not answer: {exc}")] * len(tasks)
        if kind != "done":
            self._kill()
            return [(False, f"the Ray engine failed: {value}")] * len(tasks)
        return value

    def _kill(self) -> None:
        if self._proc is None:
            return
        with contextlib.suppress(OSError):
            self._conn.close()
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join()
        self._proc = None
        if self.folder:  # its watcher would too, once it sees the child gone
            remove(self.folder)
            self.folder = None

    def close(self) -> None:
        if self._proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            self._conn.send(("close",))
        self._proc.join(ANSWER_GRACE_S + 10.0)  # it shuts its Ray down; hung: killed
        self._kill()
