"""A real ``apportion serve`` for the tests, started as a user starts it.

``python -m apportion.cli serve ... --port 0`` in a subprocess; the URL is read from the
line it prints on stderr. Everything waits on conditions with generous deadlines (the
machines running the suite are shared and slow), never on fixed sleeps.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

T = TypeVar("T")
START_S = 180.0
DEADLINE_S = 120.0
URL = re.compile(r"apportion serve: (http://\S+?)/ \(dashboard\)")


def cli(*args: str, cwd: Path, timeout: float = 300.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apportion.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def status(cwd: Path, state: str = "s.db") -> dict[str, Any]:
    """``apportion status --state DB --json``, as a user reads the store."""
    r = cli("status", "--state", state, "--json", cwd=cwd)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def wait_for(what: str, check: Callable[[], T | None], deadline_s: float = DEADLINE_S,
             every_s: float = 0.25) -> T:
    """Poll ``check`` until it returns something truthy; fail naming ``what``."""
    end = time.monotonic() + deadline_s
    last: Any = None
    while time.monotonic() < end:
        try:
            last = check()
        except (httpx.HTTPError, OSError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


class Served:
    """``apportion serve`` on a free port over ``cwd/s.db`` (dry-run on this host's cluster
    unless told otherwise). Without ``--token-file`` or ``--no-token`` the server generates
    its token into ``s.db.token``, as it does for a user; :attr:`auth` is its header and
    :meth:`client` sends it."""

    def __init__(self, cwd: Path, *extra: str, executor: str = "dry-run",
                 env: dict[str, str] | None = None) -> None:
        self.cwd = cwd
        self.log = cwd / "serve.log"
        self.args = ["serve", "--state", "s.db", "--executor", executor, "--cluster", "local",
                     "--interval", "1", "--port", "0", "--workdir", "runs", *extra]
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.token: str | None = None

    def __enter__(self) -> Served:
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "apportion.cli", *self.args],
                                         cwd=self.cwd, stdout=subprocess.DEVNULL, stderr=err,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1",
                                              **self.env})

        def started() -> str | None:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited {self.proc.returncode}: {self.stderr()}")
            m = URL.search(self.stderr())
            return m.group(1) if m else None

        self.url = wait_for("the server's URL", started, START_S)
        generated = self.cwd / "s.db.token"
        if "--no-token" not in self.args and not any(a.startswith("--token-file")
                                                     for a in self.args):
            self.token = generated.read_text().strip()
        return self

    @property
    def auth(self) -> dict[str, str]:
        """The header a write needs (none with --no-token or --token-file)."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def client(self, **kw: Any) -> httpx.Client:
        """A client of the server, sending the generated token (``headers`` adds to it)."""
        headers = {**self.auth, **kw.pop("headers", {})}
        return httpx.Client(base_url=self.url, timeout=30.0, headers=headers, **kw)

    def stop(self) -> int:
        """SIGTERM, as Kubernetes stops a pod; the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(DEADLINE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
                raise AssertionError(f"serve ignored SIGTERM: {self.stderr()[-2000:]}") from None
        return int(self.proc.returncode)

    def __exit__(self, *exc: object) -> None:
        self.stop()


def job_state(served: Served, job: str) -> str | None:
    r = httpx.get(f"{served.url}/api/v1/jobs/{job}", timeout=30.0)
    return r.json()["state"] if r.status_code == 200 else None
