"""The dashboard's reads through a real ``apportion serve`` (a subprocess, as a user starts
it): the queue, the tenants with their quotas (``--tenants``), the cluster per type and
node group and a group's nodes page by page, the rounds' summary, the jobs filtered by
state and tenant, one job's history; each with an ETag (304 when unchanged), behind the
read token, and bad parameters refused naming them. And the submit-to-decision histogram:
a job submitted to a running server is counted once a round has decided it.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
from prometheus_client.parser import text_string_to_metric_families
from serve_server import Served, cli, wait_for

CLUSTER = """name: two-groups
node_groups:
  - {prefix: big, count: 3, gpu_type: A100-80GB, gpus_per_node: 4}
  - {prefix: small, count: 5, gpu_type: A10, gpus_per_node: 2}
"""
TENANTS = "tenants:\n  - {name: vision, quota_gpus: 4}\n  - {name: idle, quota_gpus: 2}\n"
READ = {"Authorization": "Bearer r-0123456789abcdef"}


def _job(i: str, gpus: int, tenant: str, guaranteed: bool = False) -> dict:
    return {"id": i, "model": "gpt-tiny", "global_batch_size": 8, "iterations": 100_000,
            "requested_gpus": gpus, "tenant": tenant, "guaranteed": guaranteed}


def _decided(c: httpx.Client, *ids: str) -> bool:
    return all(c.get(f"/api/v1/jobs/{i}").json()["state"] != "submitted" for i in ids)


def _same_again(c: httpx.Client, path: str) -> httpx.Response:
    """GET ``path`` twice, the second time with the first's ETag: a 304 without a body."""
    first = c.get(path)
    assert first.status_code == 200, (path, first.text)
    tag = first.headers["etag"]
    again = c.get(path, headers={"If-None-Match": tag})
    assert again.status_code == 304 and again.content == b"", path
    assert again.headers["etag"] == tag
    return first


def test_the_dashboards_reads(tmp_path: Path) -> None:
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "tenants.yaml").write_text(TENANTS)
    (tmp_path / "read.token").write_text(READ["Authorization"].split()[1] + "\n")
    with Served(tmp_path, "--cluster", "cluster.yaml", "--tenants", "tenants.yaml",
                "--interval", "3600", "--read-token-file", "read.token") as s, \
            s.client() as w, httpx.Client(base_url=s.url, timeout=30, headers=READ) as c:
        paths = ("/api/v1/queue", "/api/v1/tenants", "/api/v1/cluster/summary",
                 "/api/v1/cluster/groups/big", "/api/v1/rounds/summary",
                 "/api/v1/jobs?state=waiting", "/api/v1/jobs/none?history=true")
        for path in paths:  # behind the read token, as every read of data
            assert httpx.get(s.url + path, timeout=30).status_code == 401, path
        nlp = [f"n{i:02d}" for i in range(25)]  # more jobs than the 22 GPUs: some wait
        doc = {"jobs": [_job("v1", 2, "vision", True), _job("v2", 2, "vision", True),
                        *(_job(i, 1, "nlp") for i in nlp)]}
        assert w.post("/api/v1/jobs", json=doc).status_code == 201
        wait_for("a round decided them", lambda: _decided(c, "v1", "v2", *nlp))

        q = _same_again(c, "/api/v1/queue?top=2").json()
        jobs = c.get("/api/v1/jobs").json()["jobs"]
        waiting = [j for j in jobs if j["state"] in ("submitted", "queued", "checkpointed")]
        assert q["waiting"] == len(waiting) >= 1
        assert q["counts"] == c.get("/api/v1/jobs").json()["counts"]
        assert sum(r["jobs"] for r in q["reasons"]) == len(waiting)
        assert {r["reason"] for r in q["reasons"]} == {j["pending_reason"] for j in waiting}
        assert len(q["longest"]) == min(2, len(waiting))
        assert q["longest"][0]["submitted_at_rfc3339"].endswith("Z")
        one = c.get("/api/v1/queue", params={"reason": q["reasons"][0]["reason"]}).json()
        assert one["matching"] == q["reasons"][0]["jobs"]
        assert c.get("/api/v1/queue?top=100000").status_code == 422

        t = {r["tenant"]: r for r in _same_again(c, "/api/v1/tenants").json()["tenants"]}
        assert set(t) == {"vision", "nlp", "idle"}
        assert t["vision"]["quota_gpus"] == 4 and t["idle"]["jobs"] == {}
        assert t["vision"]["guaranteed_gpus"] <= t["vision"]["gpus_held"]
        held = sum(r["gpus_held"] for r in t.values())

        summary = _same_again(c, "/api/v1/cluster/summary").json()
        assert summary["nodes"] == 8 and summary["gpus"] == 22
        assert summary["reads_need_token"] is True
        assert sum(g["allocated"] for g in summary["gpu_types"]) == held
        groups = {g["group"]: g for ty in summary["gpu_types"] for g in ty["groups"]}
        assert set(groups) == {"big", "small"} and groups["small"]["nodes"] == 5

        page = _same_again(c, "/api/v1/cluster/groups/small?limit=2").json()
        names = [n["name"] for n in page["nodes"]]
        while page["next"]:
            page = c.get(page["next"]).json()
            names += [n["name"] for n in page["nodes"]]
        assert names == [f"small-{i}" for i in range(5)]
        gone = c.get("/api/v1/cluster/groups/nowhere")
        assert gone.status_code == 404 and gone.json()["field"] == "group"
        assert c.get("/api/v1/cluster/groups/big?limit=0").status_code == 422

        rounds = _same_again(c, "/api/v1/rounds/summary?limit=5").json()["rounds"]
        full = c.get("/api/v1/rounds?limit=5").json()["rounds"]
        assert [r["id"] for r in rounds] == [r["id"] for r in full]
        for brief, whole in zip(rounds, full, strict=True):
            assert "actions" not in brief and "solver" not in brief
            assert brief == {k: v for k, v in whole.items() if k not in ("actions", "solver")}

        page = _same_again(c, "/api/v1/jobs?state=waiting,running&tenant=nlp&limit=1").json()
        ids = [j["id"] for j in page["jobs"]]
        while page["next"]:
            page = c.get(page["next"]).json()
            ids += [j["id"] for j in page["jobs"]]
        assert ids == nlp
        bad = c.get("/api/v1/jobs?state=waiting,sleeping")
        assert bad.status_code == 422 and bad.json()["field"] == "state"
        assert "sleeping" in bad.json()["detail"]

        h = _same_again(c, "/api/v1/jobs/v1?history=true").json()
        assert h["id"] == "v1" and h["decisions"] and h["decisions_truncated"] is False
        assert h["decisions"][-1]["first_round"] == min(e["round_id"] for e in h["events"]
                                                        if e["round_id"] is not None)
        assert {"launches", "starts", "restarts", "preemptions", "interruptions"} <= set(h)
        plain = c.get("/api/v1/jobs/v1").json()
        assert "decisions" not in plain and plain["events"] == h["events"]
        for path in ("/api/v1/jobs/none?history=true", "/api/v1/jobs/none"):
            r = c.get(path, headers={"If-None-Match": "*"})
            assert r.status_code == 404 and r.json()["field"] == "id", path

        # a write changes the store: the queue's tag moves and the new answer counts it
        tag = c.get("/api/v1/queue?top=2").headers["etag"]
        assert w.post("/api/v1/jobs", json={"jobs": [_job("late", 1, "nlp")]}).status_code == 201
        r = c.get("/api/v1/queue?top=2", headers={"If-None-Match": tag})
        assert r.status_code == 200 and r.json()["counts"] != q["counts"]
        doc = c.get("/openapi.json").json()
        params = {p["name"] for p in doc["paths"]["/api/v1/jobs"]["get"]["parameters"]}
        assert {"state", "tenant", "limit", "cursor"} <= params
        assert "history" in {p["name"] for p in
                             doc["paths"]["/api/v1/jobs/{id}"]["get"]["parameters"]}
        assert s.stop() == 0, s.stderr()[-3000:]


def _decision_histogram(text: str) -> dict[str, float]:
    """``apportion_submit_to_decision_seconds``: its count, sum and cumulative buckets."""
    fam = next(f for f in text_string_to_metric_families(text)
               if f.name == "apportion_submit_to_decision_seconds")
    assert fam.type == "histogram"
    out = {}
    for smp in fam.samples:
        key = smp.name.removeprefix("apportion_submit_to_decision_seconds_")
        out[key if key != "bucket" else f"le={smp.labels['le']}"] = smp.value
    return out


def test_submit_to_decision_counts_a_job_once_a_round_decided_it(tmp_path: Path) -> None:
    """A one-hour interval: the job is decided by the round its submission brings forward.
    It is counted once decided (placed, or left out with a typed reason: the too-large job
    ``submit`` stored unchecked), with the time from its submission to that round."""
    with Served(tmp_path, "--interval", "3600") as s, s.client() as c:
        before = _decision_histogram(c.get("/metrics").text)
        job = {"jobs": [_job("d1", 1, "default")]}
        assert c.post("/api/v1/jobs", json=job).status_code == 201
        wait_for("a round decided d1", lambda: _decided(c, "d1"))
        after = _decision_histogram(c.get("/metrics").text)
        assert after["count"] == before["count"] + 1
        h = c.get("/api/v1/jobs/d1?history=true").json()
        first = h["decisions"][-1]  # newest first: the last run is the first decision
        waited = first["first_at"] - h["submitted_at"]
        assert waited >= 0 and math.isclose(after["sum"] - before["sum"], waited,
                                            rel_tol=1e-9, abs_tol=1e-6)
        for le in (k for k in after if k.startswith("le=")):
            bound = float(le[3:])
            assert after[le] - before[le] == (1 if waited <= bound else 0), le
        # a job no round can place is decided too, with its typed reason
        big = tmp_path / "big.yaml"
        big.write_text("jobs:\n  - {id: huge, model: gpt-tiny, global_batch_size: 8, "
                       "iterations: 10, requested_gpus: 4096}\n")
        assert cli("submit", "big.yaml", "--state", "s.db", cwd=tmp_path).returncode == 0
        wait_for("a round decided huge", lambda: _decided(c, "huge"))
        assert c.get("/api/v1/jobs/huge").json()["pending_reason"] == "too-large"
        assert _decision_histogram(c.get("/metrics").text)["count"] == before["count"] + 2
        assert s.stop() == 0, s.stderr()[-3000:]
