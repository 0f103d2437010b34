"""Run a solver backend in a child process, so its crash or hang cannot take the round down.

A backend is native code (HiGHS, OR-Tools). An ``abort()``, a segfault, an
``os._exit`` or a hang inside it would kill or freeze the whole ``solve-round``
process if it ran in-process; the ``try/except`` in the chain only catches
Python exceptions. :func:`solve_isolated` runs the backend in a child process
and always comes back with a :class:`SolveResult`: the child's answer, or
``Status.ERROR`` with the reason (``crashed: killed by SIGABRT``, ``timed out``,
``raised ...``).

Choices, and why:

* **A fresh interpreter** (``python -c ...`` through :mod:`subprocess`), not
  :mod:`multiprocessing`: a ``fork`` of the round's process would copy solver
  thread pools with their locks held, and multiprocessing's spawn and
  forkserver re-run the caller's ``__main__`` in the child, which breaks any
  user script without an ``if __name__ == "__main__"`` guard. The price is the
  child's start-up (about 0.3-0.6 s on a 2-core machine to import numpy and
  the backend), paid out of the grace period, not the solver's budget.
* **The model crosses a pipe without its decoder** (a closure over the
  candidate graph): the child only needs the arrays; the caller decodes
  ``x`` in-process as before. The child's ``sys.path`` is the parent's, so a
  backend class defined anywhere the parent can import can run isolated.
* **Budget**: the child gets ``time_limit_s``; the parent waits that plus a
  grace period and then kills it (SIGKILL). The child also arms ``alarm()``
  with the default action, so it dies on its own even if the parent was
  killed first and a native hang holds the GIL.
* **stdout is the answer channel**: the child moves file descriptor 1 to
  stderr before the backend runs, so a backend that prints cannot corrupt it.

To use it in the chain, wrap each backend: ``IsolatedBackend("highs")``
implements the same ``Backend`` protocol.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import math
import os
import pickle
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any

import numpy as np
from apportion.blas_threads import one_blas_thread
from apportion.formulations.model import LinearModel
from apportion.solvers.base import BACKEND_CLASSES, Backend, SolveResult, Status, proven_gap
from apportion.solvers.chain_rules import better, for_chain, skipped, tighter, time_share

log = logging.getLogger(__name__)

_REGISTRY = BACKEND_CLASSES
_CHILD = "from apportion.solvers.isolation import child_main; child_main()"


def resolve_backend(spec: str | Backend) -> Backend:
    """``"highs"``, ``"cp-sat"``, ``"package.module:Class"`` or a backend instance."""
    if not isinstance(spec, str):
        return spec
    target = _REGISTRY.get(spec, spec)
    if ":" not in target:
        raise ValueError(f"unknown backend {spec!r}; choose {', '.join(_REGISTRY)} or "
                         "'module:Class'")
    mod, attr = target.split(":", 1)
    backend = getattr(importlib.import_module(mod), attr)()
    if not isinstance(backend, Backend):
        raise TypeError(f"{target}: not a solver backend (derive it from "
                        "apportion.solvers.base.Backend)")
    return backend


def _backend_name(spec: str | Backend) -> str:
    return spec if isinstance(spec, str) else spec.name


def child_main() -> None:
    """The child: read (sys.path), then (backend, model, limit, hard limit); answer on stdout."""
    answer = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything the backend prints goes to stderr, never into the answer
    sys.stdout = sys.stderr
    stdin = sys.stdin.buffer
    sys.path[:] = pickle.load(stdin)
    try:
        spec, model, limit, hard = pickle.load(stdin)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(max(1, math.ceil(hard)))
        with one_blas_thread():  # a solver-only process: its vectors are too short to share
            msg: tuple[Any, ...] = ("ok", resolve_backend(spec).solve(model, limit))
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent as data
        msg = ("raised", repr(exc), traceback.format_exc(limit=8))
    try:
        data = pickle.dumps(msg)
    except Exception as exc:  # noqa: BLE001 - an answer that does not pickle
        data = pickle.dumps(("raised", f"answer does not pickle: {exc!r}", ""))
    answer.write(data)
    answer.flush()


def _signal_name(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def solve_isolated(backend: str | Backend, model: LinearModel, time_limit_s: float,
                   grace_s: float | None = None) -> SolveResult:
    """Solve ``model`` with ``backend`` in a child process; never raises, never hangs.

    Returns the child's :class:`SolveResult` (``extra["isolated"]`` set, and
    ``extra["process_wall_s"]`` the parent's view of the time) or
    ``Status.ERROR`` whose message says what went wrong.
    """
    name = _backend_name(backend)
    start = time.perf_counter()
    grace = max(2.0, 0.25 * time_limit_s) if grace_s is None else grace_s
    wait = time_limit_s + grace

    def error(msg: str) -> SolveResult:
        log.warning("isolated backend %s: %s", name, msg)
        wall = time.perf_counter() - start
        return SolveResult(name, Status.ERROR, wall_s=wall, message=msg,
                           extra={"isolated": True, "process_wall_s": wall})

    try:
        payload = pickle.dumps(list(sys.path)) + pickle.dumps(
            (backend, dataclasses.replace(model, decode=None), float(time_limit_s), wait + 5.0))
    except Exception as exc:  # noqa: BLE001
        return error(f"cannot send to a child process: {exc!r}")
    try:
        proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        return error(f"could not start a child process: {exc!r}")
    try:
        out, errtext = proc.communicate(payload, timeout=wait)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return error(f"timed out: no answer within {wait:.2f} s (budget {time_limit_s:.2f} s "
                     f"+ grace {grace:.2f} s); child killed")
    tail = errtext.decode("utf-8", "replace").strip().splitlines()[-3:]
    if proc.returncode != 0 or not out:
        return error(f"crashed: child {_signal_name(proc.returncode)} without an answer"
                     + (f"; stderr: {' | '.join(tail)}" if tail else ""))
    try:
        msg = pickle.loads(out)
    except Exception as exc:  # noqa: BLE001
        return error(f"answer could not be read: {exc!r}")
    if msg[0] == "raised":
        return error(f"raised {msg[1]}")
    res: SolveResult = msg[1]
    res.extra = {**res.extra, "isolated": True, "process_wall_s": time.perf_counter() - start}
    trouble = numerical_trouble(res, model)
    if trouble:
        return error(f"numerical trouble: {trouble} (claimed {res.status.value})")
    return res


def numerical_trouble(res: SolveResult, model: LinearModel, tol: float = 1e-5) -> str:
    """Why a claimed answer cannot be trusted ('' when it can): checked against the model itself.

    A backend fed NaN or infinite coefficients may still report ``optimal``
    (HiGHS does, with a NaN objective); such an answer must not reach the
    decoder, so the chain moves on and the attempt records why.
    """
    if res.x is None:
        return ""
    x = np.asarray(res.x, float)
    if x.shape != (model.num_vars,):
        return f"answer has {x.size} values for {model.num_vars} variables"
    if not np.all(np.isfinite(x)):
        return "non-finite values in the answer"
    if res.objective is not None and not math.isfinite(res.objective):
        return f"non-finite objective {res.objective}"
    if model.rows and not np.all(np.isfinite(model.activity(x))):
        return "non-finite row activity (NaN or infinite coefficients)"
    if not model.is_feasible(x, tol):
        return f"the answer violates the model's bounds or rows (tolerance {tol:g})"
    return ""


# -- one child for a whole chain, streaming its answers ---------------------------------
_CHAIN_CHILD = "from apportion.solvers.isolation import chain_child_main; chain_child_main()"
_WARM = ("highspy", "apportion.solvers.highs", "apportion.solvers.lpround")


def _send(out: Any, msg: tuple[Any, ...]) -> None:
    try:
        data = pickle.dumps(msg)
    except Exception as exc:  # noqa: BLE001 - an answer that does not pickle
        data = pickle.dumps(("raised", msg[1] if len(msg) > 1 else "?",
                             f"answer does not pickle: {exc!r}", ""))
    out.write(len(data).to_bytes(8, "big") + data)
    out.flush()


def chain_child_main() -> None:
    """The chain's child: warm up, then run the backends in order, streaming each answer.

    Reads (sys.path), imports the likely backends while the parent builds its round, then
    reads (backends, model, budget, gap, hard limit). Before each backend it sends
    ``("start", name)``; after it ``("result", SolveResult, final)``, where final means
    optimal or within ``gap`` of the best bound so far: then it waits for the parent's
    verdict (``c``: the validator refused it, go on; anything else: stop).
    """
    answer = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    stdin = sys.stdin.buffer
    sys.path[:] = pickle.load(stdin)
    for mod in _WARM:
        try:
            importlib.import_module(mod)
        except Exception:  # noqa: BLE001, S110 - a backend that cannot import fails when run
            pass

    try:
        specs, model, budget, gap, hard = pickle.load(stdin)
    except EOFError:  # the parent did not need us
        return
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(max(1, math.ceil(hard)))
    start = time.perf_counter()
    best: SolveResult | None = None
    bound: float | None = None
    names = [_backend_name(spec) for spec in specs]
    answered: set[str] = set()
    rounding_final = bool(model.meta.get("lp_rounding_final"))
    for i, spec in enumerate(specs):
        name = names[i]
        left = budget - (time.perf_counter() - start)
        why = "no budget left" if left <= 0.01 else skipped(names, i, answered, gap,
                                                                 rounding_final)
        if why:
            _send(answer, ("result", SolveResult(name, Status.SKIPPED, message=why), False))
            continue
        _send(answer, ("start", name))
        try:
            with one_blas_thread():
                res = for_chain(resolve_backend(spec), gap).solve(model,
                                                                  time_share(names, i, left))
        except BaseException as exc:  # noqa: BLE001 - back to the parent as data
            _send(answer, ("raised", name, repr(exc), traceback.format_exc(limit=8)))
            continue
        sound = res.x is not None and res.status.has_solution and not numerical_trouble(res, model)
        if sound:
            answered.add(name)
            bound = tighter(bound, res, model.sense)
            if better(res, best, model.sense):
                best = res
                model.set_hint(np.asarray(res.x, float))  # the next backend starts from the best
        g = proven_gap(best, bound, model.sense)
        final = sound and (res.status is Status.OPTIMAL or (g is not None and g <= gap))
        _send(answer, ("result", res, final))
        if final and stdin.read(1) != b"c":
            break
    _send(answer, ("done",))


class ChainChild:
    """A child process that runs a chain's isolated backends (see :func:`chain_child_main`).

    ``start()`` spawns it and lets it import its solvers (call it early: the start-up then
    overlaps the round's own work); :meth:`run` streams the answers until the deadline,
    when the child is killed. A child that dies mid-chain costs the answer of the backend
    it was running; the rest of the chain goes on in a fresh child.
    """

    def __init__(self, grace_s: float | None = None) -> None:
        self.grace_s = 0.1 if grace_s is None else grace_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_s = 0.0
        self._buf = b""

    def start(self) -> ChainChild:
        if self.proc is None:
            self.started_s = time.perf_counter()
            self._buf = b""
            self.proc = subprocess.Popen([sys.executable, "-c", _CHAIN_CHILD],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL)  # never read: never full
            assert self.proc.stdin is not None
            self.proc.stdin.write(pickle.dumps(list(sys.path)))
            self.proc.stdin.flush()
        return self

    def close(self) -> None:
        p, self.proc = self.proc, None
        if p is None:
            return
        if p.poll() is None:
            p.kill()
        try:
            p.communicate(timeout=5)
        except Exception:  # noqa: BLE001, S110 - a child that will not go is left to the OS
            pass

    def _read(self, until: float) -> tuple[Any, ...] | None:
        """The next message, or None when the deadline passed or the child died."""
        import select

        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            if len(self._buf) >= 8:
                n = int.from_bytes(self._buf[:8], "big")
                if len(self._buf) >= 8 + n:
                    data, self._buf = self._buf[8:8 + n], self._buf[8 + n:]
                    try:
                        return tuple(pickle.loads(data))
                    except Exception as exc:  # noqa: BLE001
                        return ("raised", "?", f"answer could not be read: {exc!r}", "")
            wait = max(0.0, until - time.perf_counter())  # past it: only what is there
            ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return None
            self._buf += chunk

    def _verdict(self, go_on: bool) -> None:
        try:
            assert self.proc is not None and self.proc.stdin is not None
            self.proc.stdin.write(b"c" if go_on else b"s")
            self.proc.stdin.flush()
        except (OSError, AssertionError):
            pass

    def run(self, model: LinearModel, specs: list[str | Backend], deadline: float,
            gap: float) -> Iterator[SolveResult]:
        """Send the chain to the child now and return an iterator over every backend's
        result in order (``Status.ERROR`` with the reason for one that crashed, raised,
        lied or ran past the deadline); asking for the next result after a final one means
        the caller refused it. The child works while the caller does something else."""
        todo = list(specs)
        return self._stream(model, todo, deadline, gap, self._submit(model, todo, deadline, gap))

    def _submit(self, model: LinearModel, todo: list[Any], deadline: float, gap: float) -> str:
        """Start the child if needed and send it the chain; '' or why it could not."""
        try:
            self.start()
            assert self.proc is not None and self.proc.stdin is not None
            left = deadline - time.perf_counter()
            self.proc.stdin.write(pickle.dumps((todo, dataclasses.replace(model, decode=None),
                                                left, gap, left + self.grace_s + 5.0)))
            self.proc.stdin.flush()
        except OSError as exc:
            self.close()
            return f"could not start a child: {exc!r}"
        return ""

    def _stream(self, model: LinearModel, todo: list[Any], deadline: float, gap: float,
                failed: str) -> Iterator[SolveResult]:
        first = True
        while todo:
            if not first:
                failed = self._submit(model, todo, deadline, gap)
            first = False
            if failed:
                for spec in todo:
                    yield self._error(_backend_name(spec), failed)
                return
            running: str | None = None
            since = time.perf_counter()
            while True:
                msg = self._read(deadline + self.grace_s)
                if msg is None:  # the deadline passed, or the child died
                    assert self.proc is not None
                    if time.perf_counter() < deadline + self.grace_s:  # its output closed
                        try:  # before the deadline: it is exiting (reap it, or poll races)
                            self.proc.wait(timeout=5.0)
                        except subprocess.TimeoutExpired:
                            pass
                    alive = self.proc.poll() is None
                    code = self.proc.returncode
                    self.close()
                    if running is not None:
                        why = (f"timed out: killed at the deadline ({time.perf_counter() - since:.2f} s "
                               "after it started)") if alive else \
                            f"crashed: child {_signal_name(code)} without an answer"
                        yield self._error(running, why)
                        todo.pop(0)
                    if alive or not todo or running is None:  # past the deadline, or a
                        for spec in todo:  # child that dies before it starts: nothing runs
                            yield self._error(_backend_name(spec), "no budget left" if alive
                                              else f"child {_signal_name(code)} before it ran")
                        return
                    break  # crashed: the rest of the chain in a fresh child
                kind = msg[0]
                if kind == "done":
                    self.close()
                    return
                if kind == "start":
                    running, since = str(msg[1]), time.perf_counter()
                    continue
                todo.pop(0)
                running = None
                if kind == "raised":
                    yield self._error(str(msg[1]), f"raised {msg[2]}")
                    continue
                res: SolveResult = msg[1]
                res.extra = {**res.extra, "isolated": True,
                             "process_wall_s": time.perf_counter() - self.started_s}
                trouble = numerical_trouble(res, model)
                if trouble:
                    res = self._error(res.backend, f"numerical trouble: {trouble} "
                                                   f"(claimed {res.status.value})")
                yield res
                if msg[2]:  # final: the caller asked for more, so it refused this one
                    self._verdict(True)

    def _error(self, name: str, msg: str) -> SolveResult:
        log.warning("isolated backend %s: %s", name, msg)
        return SolveResult(name, Status.ERROR, message=msg, extra={"isolated": True})


# -- a pool of child processes (the partitioned solve's local engine) --------------------
_POOL_CHILD = "from apportion.solvers.isolation import pool_child_main; pool_child_main()"


def resolve_ref(ref: str) -> Any:
    """``"package.module:attr"`` -> the object."""
    mod, attr = ref.split(":", 1)
    return getattr(importlib.import_module(mod), attr)


def _recv(stream: Any) -> Any:
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError
    return pickle.loads(stream.read(int.from_bytes(head, "big")))


def pool_child_main() -> None:
    """A pool worker: read (sys.path, modules to warm up), then tasks
    ``(task id, "module:function", args)`` until ``None``; answer each with
    ``(task id, "ok", value)`` or ``(task id, "raised", repr, traceback)``."""
    answer = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    stdin = sys.stdin.buffer
    path, warm = _recv(stdin)
    sys.path[:] = path
    for mod in warm:
        try:
            importlib.import_module(mod)
        except Exception:  # noqa: BLE001, S110 - the task that needs it will say so
            pass
    while True:
        try:
            task = _recv(stdin)
        except EOFError:
            return
        if task is None:
            return
        tid, ref, args = task
        try:
            msg: tuple[Any, ...] = (tid, "ok", resolve_ref(ref)(*args))
        except BaseException as exc:  # noqa: BLE001 - back to the parent as data
            msg = (tid, "raised", repr(exc), traceback.format_exc(limit=8))
        _send(answer, msg)


class WorkerPool:
    """``workers`` child processes, each importing its modules once and then running tasks
    one at a time; :meth:`run` hands out tasks as workers free up and kills every worker
    still busy at the deadline (a crashed worker costs its task, and is replaced)."""

    def __init__(self, workers: int, warm: tuple[str, ...] = ()) -> None:
        self.size = max(1, workers)
        self.warm = warm
        self.procs: list[subprocess.Popen[bytes]] = []
        self.bufs: dict[int, bytes] = {}

    def _spawn(self) -> subprocess.Popen[bytes]:
        p = subprocess.Popen([sys.executable, "-c", _POOL_CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self._write(p, (list(sys.path), self.warm))
        self.bufs[p.pid] = b""
        return p

    @staticmethod
    def _write(p: subprocess.Popen[bytes], msg: Any) -> bool:
        try:
            assert p.stdin is not None
            data = pickle.dumps(msg)
            p.stdin.write(len(data).to_bytes(8, "big") + data)
            p.stdin.flush()
            return True
        except (OSError, AssertionError):
            return False

    def start(self) -> WorkerPool:
        while len(self.procs) < self.size:
            self.procs.append(self._spawn())
        return self

    def run(self, tasks: list[tuple[str, tuple[Any, ...]]], until: float) -> list[tuple[bool, Any]]:
        """[(True, value) or (False, why)] for every task, in order; never past ``until``."""
        import select

        self.start()
        out: list[tuple[bool, Any] | None] = [None] * len(tasks)
        todo = list(range(len(tasks)))
        busy: dict[int, int] = {}  # pid -> task index
        idle = list(self.procs)
        by_pid = {p.pid: p for p in self.procs}
        while todo or busy:
            while todo and idle:
                p = idle.pop(0)
                i = todo.pop(0)
                if self._write(p, (i, *tasks[i])):
                    busy[p.pid] = i
                else:
                    out[i] = (False, "could not reach a worker")
            if not busy:
                break
            wait = until - time.perf_counter()
            fds = {by_pid[pid].stdout.fileno(): pid for pid in busy}  # type: ignore[union-attr]
            ready = select.select(list(fds), [], [], max(0.0, wait))[0] if wait > 0 else []
            if not ready:  # the deadline: every busy worker is killed, its task has no answer
                for pid, i in busy.items():
                    by_pid[pid].kill()
                    out[i] = (False, "timed out: killed at the deadline")
                self.procs = [p for p in self.procs if p.pid not in busy]
                busy.clear()
                break
            for fd in ready:
                pid = fds[fd]
                p = by_pid[pid]
                chunk = os.read(fd, 1 << 20)
                if not chunk:  # died: its task is lost, a fresh worker takes its place
                    p.wait()
                    out[busy.pop(pid)] = (False, f"crashed: worker {_signal_name(p.returncode)}")
                    self.procs.remove(p)
                    q = self._spawn()
                    self.procs.append(q)
                    by_pid[q.pid] = q
                    idle.append(q)
                    continue
                self.bufs[pid] += chunk
                buf = self.bufs[pid]
                if len(buf) >= 8 and len(buf) >= 8 + int.from_bytes(buf[:8], "big"):
                    n = int.from_bytes(buf[:8], "big")
                    msg, self.bufs[pid] = pickle.loads(buf[8:8 + n]), buf[8 + n:]
                    i = busy.pop(pid)
                    out[i] = (True, msg[2]) if msg[1] == "ok" else (False, f"raised {msg[2]}")
                    idle.append(p)
        for i in todo:
            out[i] = (False, "no budget left")
        return [o if o is not None else (False, "no answer") for o in out]

    def close(self) -> None:
        """Stop every worker now (they hold nothing worth a clean exit)."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()
            for f in (p.stdin, p.stdout):
                if f is not None:
                    try:
                        f.close()
                    except OSError:
                        pass
        self.procs = []


class IsolatedBackend(Backend):
    """A :class:`Backend` around :func:`solve_isolated` (a drop-in for the chain): its child
    joins the chain itself (:func:`chain_rules.for_chain`), and it takes no work budget."""

    def __init__(self, inner: str | Backend, grace_s: float | None = None) -> None:
        self.inner = inner
        self.grace_s = grace_s
        self.name = _backend_name(inner)

    def available(self) -> bool:
        try:
            return bool(resolve_backend(self.inner).available())
        except Exception:  # noqa: BLE001 - an unknown or broken backend is not available
            return False

    def solve(self, model: LinearModel, time_limit_s: float) -> SolveResult:
        return solve_isolated(self.inner, model, time_limit_s, self.grace_s)
