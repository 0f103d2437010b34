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
from typing import Any

import numpy as np
from apportion.formulations.model import LinearModel
from apportion.solvers.base import BACKEND_CLASSES, Backend, SolveResult, Status

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
    return getattr(importlib.import_module(mod), attr)()


def _backend_name(spec: str | Backend) -> str:
    return spec if isinstance(spec, str) else str(getattr(spec, "name", type(spec).__name__))


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
    if model.rows and not np.all(np.isfinite(model.matrix() @ x)):
        return "non-finite row activity (NaN or infinite coefficients)"
    if not model.is_feasible(x, tol):
        return f"the answer violates the model's bounds or rows (tolerance {tol:g})"
    return ""


class IsolatedBackend:
    """The ``Backend`` protocol around :func:`solve_isolated` (a drop-in for the chain)."""

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
