"""``apportion bench decide``: how long a job submitted to a running ``serve`` waits for its
first decision, with a queue already in the store.

A real ``apportion serve`` (dry-run executor, ``--no-token`` on loopback, an interval of an
hour, so only the event-driven rounds decide) over a store holding ``queued`` jobs of the
synthetic family ``bench round`` uses, on its synthetic cluster. Once the first round has
decided the queue, ``probes`` jobs are submitted one at a time through ``POST
/api/v1/jobs``; each is polled (``GET /api/v1/jobs/{id}?history=true``, every
:data:`POLL_S`) until a round has decided it, placed or left out with a reason. Reported:
each probe's submit-to-decision seconds as the client saw them (from the POST's answer to
the first read that shows the decision: the poll adds up to :data:`POLL_S`), their median,
p99 and maximum, the rounds' own wall seconds over the same time (``/api/v1/rounds``), the
debounce and minimum gap the loop applies, and the server's own histogram
(``apportion_submit_to_decision_seconds``: count and sum from ``/metrics``). The target
(issue 62): p99 within the round's own solve time plus the debounce; ``excess_s`` is the
p99 minus (the rounds' largest wall plus the debounce and the minimum gap).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from apportion.experiments.bench.rounds import write_instance
from apportion.runtime.loop import DEBOUNCE_S, MIN_GAP_S

#: seconds between two reads of a probe's record
POLL_S = 0.05
#: how long the server may take to start, and a round to decide (only ends a hung run)
START_S = 300.0
DECIDE_S = 900.0
_URL = re.compile(r"apportion serve: (http://\S+?)/ \(dashboard\)")
_METRIC = re.compile(r"^apportion_submit_to_decision_seconds_(count|sum) (\S+)$", re.M)


def _cli(*args: str, cwd: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "apportion.cli", *args], cwd=cwd,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"apportion {' '.join(args)} failed: {r.stderr[-2000:]}")


def _wait(what: str, check: Any, limit: float) -> Any:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        time.sleep(POLL_S)
    raise RuntimeError(f"timed out waiting for {what}")


class _Client:
    """The few calls the probes make, over the standard library (no HTTP client extra)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def call(self, path: str, body: Any = None) -> tuple[int, str]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={
            "Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def json(self, path: str, body: Any = None) -> Any:
        code, text = self.call(path, body)
        if code >= 300:
            raise RuntimeError(f"{path}: HTTP {code}: {text[:500]}")
        return json.loads(text)


def _decided(client: _Client, job: str) -> bool:
    code, text = client.call(f"/api/v1/jobs/{job}?history=true")
    return code == 200 and bool(json.loads(text).get("decisions"))


def measure(queued: int = 1000, gpus: int = 1280, types: int = 3, probes: int = 20,
            time_budget_s: float = 5.0, seed: int = 1) -> dict[str, Any]:
    """One measurement (see the module's docstring)."""
    with tempfile.TemporaryDirectory(prefix="apportion-bench-decide-") as tmp:
        folder = Path(tmp)
        cluster, jobs = write_instance(queued, gpus, types, seed, folder)
        _cli("submit", str(jobs), "--state", "s.db", cwd=folder)
        log = folder / "serve.log"
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "apportion.cli", "serve", "--state", "s.db",
                 "--executor", "dry-run", "--cluster", str(cluster), "--interval", "3600",
                 "--port", "0", "--no-token", "--workdir", "runs",
                 "--time-budget", str(time_budget_s)],
                cwd=folder, stdout=subprocess.DEVNULL, stderr=err,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            url = _wait("the server's URL", lambda: (m := _URL.search(
                log.read_text(errors="replace"))) and m.group(1), START_S)
            c = _Client(url)
            first = json.loads(jobs.read_text().splitlines()[1])["id"] \
                if jobs.suffix == ".jsonl" else None
            _wait("the first round", lambda: c.json("/api/v1/rounds")["rounds"]
                  if first is None else _decided(c, first), DECIDE_S)
            t0 = time.time()
            waits = []
            for k in range(probes):
                job = {"id": f"probe-{k}", "model": "bert-0.76b", "global_batch_size": 64,
                       "iterations": 1000, "requested_gpus": 1}
                c.json("/api/v1/jobs", {"jobs": [job]})
                start = time.monotonic()
                _wait(f"a decision on probe-{k}", lambda: _decided(c, job["id"]), DECIDE_S)
                waits.append(time.monotonic() - start)
            rounds = [r for r in c.json("/api/v1/rounds?limit=500")["rounds"]
                      if r["committed_at"] >= t0]
            metrics = dict(_METRIC.findall(c.call("/metrics")[1]))
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
    w = np.array(waits)
    walls = np.array([r["wall_s"] for r in rounds]) if rounds else np.zeros(1)
    p99 = float(np.percentile(w, 99))
    return {"queued": queued, "gpus": gpus, "types": types, "probes": probes,
            "time_budget_s": time_budget_s, "debounce_s": DEBOUNCE_S,
            "min_gap_s": MIN_GAP_S,
            "wait_median_s": float(np.median(w)), "wait_p99_s": p99,
            "wait_max_s": float(w.max()), "rounds": len(rounds),
            "round_wall_median_s": float(np.median(walls)),
            "round_wall_max_s": float(walls.max()),
            "excess_s": p99 - (float(walls.max()) + DEBOUNCE_S + MIN_GAP_S),
            "server_count": float(metrics.get("count", "nan")),
            "server_sum_s": float(metrics.get("sum", "nan")),
            "load": os.getloadavg()[0], "cpus": os.cpu_count()}


def markdown(row: dict[str, Any]) -> str:
    """The measurement as a short markdown table."""
    keys = ["queued", "gpus", "probes", "time_budget_s", "wait_median_s", "wait_p99_s",
            "wait_max_s", "round_wall_median_s", "round_wall_max_s", "debounce_s",
            "min_gap_s", "excess_s", "load"]
    head = "| " + " | ".join(keys) + " |\n|" + "---:|" * len(keys) + "\n"
    cells = [f"{row[k]:.3g}" if isinstance(row[k], float) else str(row[k]) for k in keys]
    return head + "| " + " | ".join(cells) + " |\n"
