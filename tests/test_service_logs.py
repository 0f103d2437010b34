"""What `run` and `serve` write to their logs at the default level: one line per round
(backend, status, placed, pending, gap, wall) and, for `serve`, one per request; with
`--log-format json` each line is one JSON object a log collector reads as it is."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
from serve_server import Served, cli, wait_for  # noqa: E402

JOB = {"jobs": [{"id": "lj1", "model": "gpt-tiny", "global_batch_size": 8, "iterations": 500,
                 "requested_gpus": 1, "tenant": "vision"}]}


def _json_lines(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))  # every JSON-looking line is one whole object
    return out


def test_serve_json_logs_rounds_and_requests(tmp_path: Path) -> None:
    with Served(tmp_path, "--log-format", "json") as s:
        with s.client() as c:
            assert c.post("/api/v1/jobs", json=JOB).status_code == 201
            assert c.get("/api/v1/jobs?cursor=0&limit=5").status_code == 200
        # a request the HTTP server itself refuses: uvicorn's warning comes in JSON too
        host, port = s.url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as raw:
            raw.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            raw.recv(1024)

        def lines() -> list[dict[str, Any]] | None:
            got = _json_lines(s.stderr())
            rounds = [x for x in got if x.get("event") == "round" and x.get("placed")]
            return got if rounds else None

        got = wait_for("a round's JSON line", lines)
        assert s.stop() == 0, s.stderr()[-3000:]
    rnd = next(x for x in got if x.get("event") == "round" and x.get("placed"))
    for key in ("time", "level", "logger", "message", "backend", "status", "placed",
                "pending", "gap", "wall_s", "solver_wall_s", "round"):
        assert key in rnd, (key, rnd)
    assert rnd["logger"] == "apportion.rounds" and rnd["level"] == "info"
    assert rnd["time"].endswith("Z") and "T" in rnd["time"]
    assert rnd["status"] in ("optimal", "feasible", "fallback")
    reqs = [x for x in got if x.get("event") == "request"]
    post = next(x for x in reqs if x["method"] == "POST")
    assert post["path"] == "/api/v1/jobs" and post["status"] == 201
    assert post["duration_ms"] >= 0 and post["client"] == "127.0.0.1"
    listed = next(x for x in reqs if x["method"] == "GET" and x["path"] == "/api/v1/jobs")
    assert any(x["logger"].startswith("uvicorn") for x in got), got
    assert "cursor" not in json.dumps(listed)  # the query stays out of the log
    # the start line and the stop line are JSON too: nothing but JSON objects on stderr
    # after the server's own start line (printed for the user, not logged)
    assert all(line.startswith("{") for line in s.stderr().splitlines()
               if line.strip() and not line.startswith("apportion serve:"))


def test_run_logs_each_round_at_the_default_level(tmp_path: Path) -> None:
    (tmp_path / "j.yaml").write_text("jobs:\n  - {id: r1, model: gpt-tiny, global_batch_size: "
                                     "8, iterations: 200, requested_gpus: 1}\n")
    assert cli("submit", "j.yaml", "--state", "s.db", cwd=tmp_path).returncode == 0
    r = cli("run", "--state", "s.db", "--cluster", "local", "--executor", "dry-run",
            "--interval", "1", "--timeout", "2", "--workdir", "runs", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    first = next(line for line in r.stderr.splitlines() if "round 1:" in line)
    assert "INFO apportion.rounds" in first and "1 placed" in first and "gap" in first


def test_bad_log_format_exits_2(tmp_path: Path) -> None:
    r = cli("run", "--state", "s.db", "--log-format", "xml", cwd=tmp_path)
    assert r.returncode == 2 and "--log-format" in r.stderr and "text, json" in r.stderr
    assert not (tmp_path / "s.db").exists()


def test_json_formatter_fields_and_non_finite_numbers() -> None:
    from apportion.console import JsonFormatter

    rec = logging.LogRecord("apportion.rounds", logging.INFO, __file__, 1, "round %d", (3,),
                            None)
    rec.fields = {"gap": float("nan"), "placed": 2, "message": "not overwritten"}
    out = json.loads(JsonFormatter().format(rec))
    assert out["message"] == "round 3" and out["gap"] is None and out["placed"] == 2
