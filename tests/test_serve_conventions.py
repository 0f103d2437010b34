"""The API's conventions on a real server: every Unix-seconds time keeps its key and has an
RFC 3339 twin (`*_at_rfc3339`); with --read-token-file reads need a token (that one, or the
write token), while the probes and the dashboard's page stay open."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
from serve_server import Served, cli, wait_for  # noqa: E402

JOB = {"jobs": [{"id": "c1", "model": "gpt-tiny", "global_batch_size": 8, "iterations": 500,
                 "requested_gpus": 1}]}


def _same_instant(unix: float, text: str) -> None:
    assert text.endswith("Z") and "T" in text, text
    at = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    assert at.tzinfo is not None and abs(at.timestamp() - unix) < 0.001, (unix, text)


def test_read_token_and_rfc3339_times(tmp_path: Path) -> None:
    (tmp_path / "write.token").write_text("w-0123456789abcdef\n")
    (tmp_path / "read.token").write_text("r-0123456789abcdef\n")
    with Served(tmp_path, "--token-file", "write.token", "--read-token-file",
                "read.token") as s:
        assert "reads need a token" in s.stderr()
        read = {"Authorization": "Bearer r-0123456789abcdef"}
        write = {"Authorization": "Bearer w-0123456789abcdef"}
        with httpx.Client(base_url=s.url, timeout=30) as c:
            for path in ("/api/v1/jobs", "/api/v1/jobs/c1", "/api/v1/rounds",
                         "/api/v1/cluster", "/metrics"):
                r = c.get(path)
                assert r.status_code == 401, path
                assert r.headers["www-authenticate"] == "Bearer"
                assert "--read-token-file" in r.json()["detail"]
            for path in ("/healthz", "/", "/openapi.json"):
                assert c.get(path).status_code == 200, path
            assert c.post("/api/v1/jobs", json=JOB, headers=read).status_code == 401
            assert c.post("/api/v1/jobs", json=JOB, headers=write).status_code == 201
            assert c.get("/api/v1/jobs", headers=read).status_code == 200
            assert c.get("/api/v1/jobs", headers=write).status_code == 200  # who may write
            assert c.get("/metrics", headers=read).status_code == 200
            cluster = c.get("/api/v1/cluster", headers=read).json()
            assert cluster["reads_need_token"] is True and cluster["writes_need_token"] is True
            wait_for("c1 placed", lambda: c.get("/api/v1/jobs/c1", headers=read)
                     .json()["state"] == "running")
            job = c.get("/api/v1/jobs/c1", headers=read).json()
            rows = c.get("/api/v1/jobs", headers=read).json()["jobs"]
            rounds = c.get("/api/v1/rounds", headers=read).json()["rounds"]
            ready = c.get("/readyz").json()  # a probe: open
            schema = c.get("/openapi.json").json()["components"]["schemas"]
        assert s.stop() == 0, s.stderr()[-3000:]
    for row in (job, rows[0]):
        _same_instant(row["submitted_at"], row["submitted_at_rfc3339"])
        _same_instant(row["updated_at"], row["updated_at_rfc3339"])
    for e in job["events"]:
        _same_instant(e["at"], e["at_rfc3339"])
    _same_instant(rounds[-1]["committed_at"], rounds[-1]["committed_at_rfc3339"])
    _same_instant(ready["last_round_at"], ready["last_round_at_rfc3339"])
    for model, keys in (("JobRow", ("submitted_at_rfc3339", "updated_at_rfc3339")),
                        ("RoundRow", ("committed_at_rfc3339",)),
                        ("Ready", ("last_round_at_rfc3339",))):
        assert set(keys) <= set(schema[model]["properties"]), model


def test_a_bad_read_token_file_exits_2_naming_it(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("\n")
    r = cli("serve", "--state", "s.db", "--port", "0", "--read-token-file", "empty",
            cwd=tmp_path)
    assert r.returncode == 2 and "--read-token-file" in r.stderr and "empty" in r.stderr
    assert not (tmp_path / "s.db").exists()


def test_the_dashboard_sends_the_token_on_reads() -> None:
    """The dashboard's reads carry the token the user pasted (the browser test of the page
    is tests/test_serve_dashboard.py); a 401 shows the token box."""
    js = (Path(__file__).resolve().parent.parent / "apportion" / "serve" / "static"
          / "dashboard.js").read_text()
    get = js[js.index("async function getJSON"):js.index("function showError")]
    assert "Authorization" in get and "401" in get and "token-box" in get
    assert "reads_need_token" in js
