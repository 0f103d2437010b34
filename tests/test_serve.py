"""``apportion serve`` against a real server (a subprocess started as a user starts it):
probes, the REST API and its OpenAPI document, metrics, the bearer token, bad input."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from serve_server import Served, cli, job_state, status, wait_for  # noqa: E402

JOBS_YAML = """jobs:
  - {id: y1, model: gpt-tiny, global_batch_size: 8, iterations: 1000, requested_gpus: 2}
"""
JOBS_JSON = {"jobs": [{"id": "j1", "model": "bert-tiny", "global_batch_size": 8,
                       "iterations": 1000, "requested_gpus": 1}]}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server for the tests that only add jobs of their own."""
    with Served(tmp_path_factory.mktemp("serve")) as s:
        yield s
        assert s.stop() == 0, s.stderr()[-3000:]  # SIGTERM: every job checkpointed, exit 0


def test_health_and_readiness(served: Served) -> None:
    with served.client() as c:
        assert c.get("/healthz").json() == {"status": "ok"}
        ready = wait_for("ready", lambda: (r := c.get("/readyz")).status_code == 200 and r)
        body = ready.json()
        assert body["ready"] is True and body["store"] == "ok"
        assert 0 <= body["last_round_age_s"] <= body["limit_s"]


def test_openapi_lists_every_route(served: Served) -> None:
    doc = httpx.get(f"{served.url}/openapi.json", timeout=30).json()
    assert doc["openapi"].startswith("3.") and doc["info"]["title"] == "apportion"
    routes = {p: set(ops) for p, ops in doc["paths"].items()}
    assert routes == {
        "/": {"get"}, "/healthz": {"get"}, "/readyz": {"get"}, "/metrics": {"get"},
        "/api/v1/jobs": {"get", "post"}, "/api/v1/jobs/{id}": {"get", "delete"},
        "/api/v1/rounds": {"get"}, "/api/v1/cluster": {"get"},
        # the dashboard's bounded reads
        "/api/v1/queue": {"get"}, "/api/v1/tenants": {"get"},
        "/api/v1/rounds/summary": {"get"}, "/api/v1/cluster/summary": {"get"},
        "/api/v1/cluster/groups/{group}": {"get"}}
    post = doc["paths"]["/api/v1/jobs"]["post"]
    assert {"application/json", "application/yaml"} <= set(post["requestBody"]["content"])
    # none a browser may send cross-site without a preflight
    assert not {"text/plain", "application/x-www-form-urlencoded",
                "multipart/form-data"} & set(post["requestBody"]["content"])
    assert {"200", "201", "401", "403", "408", "409", "415", "421", "422"} <= set(
        post["responses"])
    for path, ops in doc["paths"].items():  # the Host and Origin checks answer everywhere
        for op in ops.values():
            assert {"403", "421"} <= set(op["responses"]), path
    for path in ("/api/v1/jobs", "/api/v1/rounds"):
        get = doc["paths"][path]["get"]
        assert "304" in get["responses"] and {"limit", "cursor"} <= {
            p["name"] for p in get["parameters"]}, path
    detail = doc["components"]["schemas"]["JobDetail"]["properties"]
    assert {"state", "allocation", "plan", "progress", "pending_reason",
            "pending_detail"} <= set(detail)
    # every $ref resolves inside the document (the jobs format's own definitions included)
    refs = set()

    def walk(x: object) -> None:
        if isinstance(x, dict):
            if isinstance(x.get("$ref"), str):
                refs.add(x["$ref"].rsplit("/", 1)[-1])
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(doc)
    assert refs <= set(doc["components"]["schemas"]), refs - set(doc["components"]["schemas"])


def test_submit_yaml_and_json_reach_the_store(served: Served) -> None:
    with served.client() as c:
        r = c.post("/api/v1/jobs", content=JOBS_YAML,
                   headers={"Content-Type": "application/yaml"})
        assert r.status_code == 201, r.text
        assert r.json() == {"submitted": ["y1"]}
        r = c.post("/api/v1/jobs", json=JOBS_JSON)
        assert r.status_code == 201, r.text
        assert r.json() == {"submitted": ["j1"]}
    by_id = {j["id"]: j for j in status(served.cwd)["jobs"]}
    assert {"y1", "j1"} <= set(by_id)
    r = httpx.get(f"{served.url}/api/v1/jobs", timeout=30)
    assert r.status_code == 200, r.text
    listed = {j["id"] for j in r.json()["jobs"]}
    assert {"y1", "j1"} <= listed
    # a round places one of them (dry-run "runs" it): allocation, plan and progress are shown
    job = wait_for("y1 running", lambda: (
        j := httpx.get(f"{served.url}/api/v1/jobs/y1", timeout=30).json())["state"] == "running"
        and j)
    assert job["allocation"]["gpus"] >= 1 and job["allocation"]["placement"]
    assert job["plan"] and {"dp", "pp", "tp"} <= set(job["plan"])
    assert job["progress"] == {"iterations_done": 0, "iterations": 1000,
                               "checkpoint_iterations": 0, "fraction": 0.0}
    assert job["pending_reason"] is None and "pending_detail" in job
    assert [e["dst"] for e in job["events"]][:3] == ["submitted", "queued", "running"]
    rounds = httpx.get(f"{served.url}/api/v1/rounds", timeout=30).json()["rounds"]
    assert rounds and {"backend", "objective", "bound", "gap", "wall_s",
                       "fallback"} <= set(rounds[-1]["solver"])
    cluster = httpx.get(f"{served.url}/api/v1/cluster", timeout=30).json()
    slots = [s for t in cluster["gpu_types"] for n in t["nodes"] for s in n["slots"]]
    assert "y1" in slots
    # the local cluster has a few GPUs: the API refuses a job asking for more, naming the
    # field; one stored by `submit` (which knows no cluster) waits with a typed reason
    with served.client() as c:
        big = {"jobs": [{"id": "huge", "model": "gpt-tiny", "global_batch_size": 8,
                         "iterations": 10, "requested_gpus": 4096}]}
        r = c.post("/api/v1/jobs", json=big)
        assert r.status_code == 422 and r.json()["field"] == "jobs[0].requested_gpus", r.text
        assert "4096" in r.json()["detail"]
    (served.cwd / "big.json").write_text(json.dumps(big))
    assert cli("submit", "big.json", "--state", "s.db", cwd=served.cwd).returncode == 0
    waiting = wait_for("huge's reason", lambda: (
        j := httpx.get(f"{served.url}/api/v1/jobs/huge", timeout=30).json())["pending_reason"]
        and j)
    assert waiting["state"] in ("submitted", "queued") and waiting["pending_detail"]
    assert waiting["allocation"] is None and waiting["plan"] is None


def test_cancel_through_delete(served: Served) -> None:
    with served.client() as c:
        doc = {"jobs": [{"id": "gone/1", "model": "gpt-tiny", "global_batch_size": 8,
                         "iterations": 500, "requested_gpus": 1}]}
        assert c.post("/api/v1/jobs", json=doc).status_code == 201
        path = "/api/v1/jobs/gone%2F1"  # an id with a slash, encoded as clients do
        assert c.get(path).json()["id"] == "gone/1"
        r = c.delete(path)
        assert r.status_code == 200, r.text
        assert r.json() == {"id": "gone/1", "state": "dropped"}
        assert c.delete(path).status_code == 200  # twice: still dropped, nothing written
        r = c.delete("/api/v1/jobs/no-such-job")
        assert r.status_code == 404 and r.json()["field"] == "id"
    assert {j["id"]: j["state"] for j in status(served.cwd)["jobs"]}["gone/1"] == "dropped"


def test_metrics_after_a_round(served: Served) -> None:
    with served.client() as c:
        doc = {"jobs": [{"id": "m1", "model": "gpt-tiny", "global_batch_size": 8,
                         "iterations": 500, "requested_gpus": 1}]}
        assert c.post("/api/v1/jobs", json=doc).status_code == 201
    wait_for("m1 placed", lambda: job_state(served, "m1") == "running")

    def scraped() -> dict | None:
        r = httpx.get(f"{served.url}/metrics", timeout=30)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        fams = {f.name: f for f in text_string_to_metric_families(r.text)}
        launches = [s.value for s in fams["apportion_launches"].samples
                    if s.name == "apportion_launches_total"]
        return fams if launches and launches[0] >= 1 else None

    fams = wait_for("a launch in /metrics", scraped)
    assert all(n.startswith("apportion_") for n in fams), sorted(fams)
    kinds = {"apportion_round_duration_seconds": "histogram",
             "apportion_solver_wall_seconds": "histogram",
             "apportion_solver_gap_ratio": "gauge", "apportion_solver_fallbacks": "counter",
             "apportion_rounds": "counter", "apportion_jobs": "gauge",
             "apportion_queue_length": "gauge", "apportion_gpus_allocated": "gauge",
             "apportion_gpus_free": "gauge", "apportion_launches": "counter",
             "apportion_launch_failures": "counter", "apportion_estimator_refits": "counter",
             "apportion_store_up": "gauge"}
    for name, kind in kinds.items():
        assert name in fams and fams[name].type == kind, name

    def value(fam: str, sample: str, **labels: str) -> float:
        return next(s.value for s in fams[fam].samples
                    if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))

    assert value("apportion_rounds", "apportion_rounds_total") >= 1
    assert value("apportion_round_duration_seconds", "apportion_round_duration_seconds_count") >= 1
    assert value("apportion_jobs", "apportion_jobs", state="running") >= 1
    assert value("apportion_launches", "apportion_launches_total", executor="dry-run") >= 1
    assert value("apportion_launch_failures", "apportion_launch_failures_total",
                 executor="dry-run") == 0
    assert value("apportion_store_up", "apportion_store_up") == 1
    cluster = httpx.get(f"{served.url}/api/v1/cluster", timeout=30).json()
    for t in cluster["gpu_types"]:
        alloc = value("apportion_gpus_allocated", "apportion_gpus_allocated",
                      gpu_type=t["gpu_type"])
        free = value("apportion_gpus_free", "apportion_gpus_free", gpu_type=t["gpu_type"])
        assert alloc >= 1 and alloc + free == t["capacity"]


def test_rounds_page_back_in_time(served: Served) -> None:
    """`next` of /api/v1/rounds links to the rounds before the page."""
    with served.client() as c:
        doc = {"jobs": [{"id": "rounds", "model": "gpt-tiny", "global_batch_size": 8,
                         "iterations": 100, "requested_gpus": 1}]}
        assert c.post("/api/v1/jobs", json=doc).status_code == 201  # a round every second
        wait_for("three rounds", lambda: len(c.get("/api/v1/rounds").json()["rounds"]) >= 3)
        every = c.get("/api/v1/rounds?limit=10000").json()["rounds"]
        newest = c.get("/api/v1/rounds?limit=2").json()
        assert [r["id"] for r in newest["rounds"]] == [r["id"] for r in every[-2:]]
        older = c.get(newest["next"]).json()
        assert older["rounds"] and older["rounds"][-1]["id"] < newest["rounds"][0]["id"]
        assert [r["id"] for r in older["rounds"]] == sorted(r["id"] for r in older["rounds"])
        first = c.get(f"/api/v1/rounds?limit=1&cursor={every[0]['id']}").json()
        assert first["rounds"] == [] and first["next"] is None


def _generation(cwd: Path) -> int:
    return int(status(cwd)["generation"])


def test_bad_bodies_are_422_naming_the_field_and_write_nothing(tmp_path: Path) -> None:
    with Served(tmp_path) as s, s.client() as c:
        wait_for("ready", lambda: c.get("/readyz").status_code == 200)
        before = _generation(tmp_path)
        good = {"id": "ok", "model": "gpt-tiny", "global_batch_size": 8, "iterations": 10,
                "requested_gpus": 1}
        bad = [
            ({**good, "model": "no-such-model"}, "jobs[1].model"),
            ({k: v for k, v in good.items() if k != "iterations"}, "jobs[1].iterations"),
            ({**good, "requested_gpus": 0}, "jobs[1].requested_gpus"),
            ({**good, "colour": "red"}, "jobs[1].colour"),
            ({**good, "id": "first"}, "jobs[1].id"),  # a duplicate id in the body
        ]
        for entry, field in bad:  # the good first job must not be written either
            r = c.post("/api/v1/jobs", json={"jobs": [{**good, "id": "first"}, entry]})
            assert r.status_code == 422, (field, r.text)
            assert r.json()["field"] == field and field in r.json()["detail"], r.json()
        raw = [(b'{"jobs": [', "application/json", "line 1, column 11"),
               (b'{"jobs": [], "jobs": []}', "application/json", "(body)"),
               (b"jobs: [\n  - {id: a\n", "application/yaml", "line 2, column 3"),
               (b"- just a list\n", "application/yaml", "(top level)"),
               (b"", "application/yaml", "(top level)"),
               (b"\xff\xfe", "application/json", "(body)")]
        for body, kind, field in raw:
            r = c.post("/api/v1/jobs", content=body, headers={"Content-Type": kind})
            assert r.status_code == 422 and r.json()["field"] == field, (body, r.text)
        r = c.post("/api/v1/jobs", content=b"jobs: []", headers={"Content-Type": "image/png"})
        assert r.status_code == 415 and r.json()["field"] == "Content-Type"
        r = c.post("/api/v1/jobs", content=b"#" * (4 * 2**20 + 1),
                   headers={"Content-Type": "application/yaml"})
        assert r.status_code == 413
        assert c.get("/api/v1/rounds", params={"limit": "x"}).json()["field"] == "limit"
        assert _generation(tmp_path) == before  # not one transaction was written
        assert status(tmp_path)["jobs"] == []
        # all or nothing against the store: an id it already holds refuses the whole body
        assert c.post("/api/v1/jobs", json={"jobs": [good]}).status_code == 201
        r = c.post("/api/v1/jobs", json={"jobs": [{**good, "id": "new"}, good]})
        assert r.status_code == 409 and r.json()["field"] == "jobs[1].id", r.text
        assert [j["id"] for j in status(tmp_path)["jobs"]] == ["ok"]
        assert c.get("/healthz").status_code == 200  # the server is unharmed


def test_a_token_guards_writes_and_reads_stay_open(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("s3cret-token\n")
    with Served(tmp_path, "--token-file", "token") as s, s.client() as c:
        doc = {"jobs": [{"id": "t1", "model": "gpt-tiny", "global_batch_size": 8,
                         "iterations": 100, "requested_gpus": 1}]}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-token"},
                        {"Authorization": "Basic s3cret-token"}):
            r = c.post("/api/v1/jobs", json=doc, headers=headers)
            assert r.status_code == 401, (headers, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
            assert r.json()["field"] == "Authorization"
        assert status(tmp_path)["jobs"] == []
        for path in ("/api/v1/jobs", "/api/v1/rounds", "/api/v1/cluster", "/metrics", "/",
                     "/openapi.json", "/healthz"):
            assert c.get(path).status_code == 200, path
        assert c.get("/api/v1/cluster").json()["writes_need_token"] is True
        auth = {"Authorization": "Bearer s3cret-token"}
        assert c.post("/api/v1/jobs", json=doc, headers=auth).status_code == 201
        assert c.delete("/api/v1/jobs/t1").status_code == 401
        assert job_state(s, "t1") != "dropped"
        r = c.delete("/api/v1/jobs/t1", headers=auth)
        assert r.status_code == 200 and r.json()["state"] == "dropped"
    assert [(j["id"], j["state"]) for j in status(tmp_path)["jobs"]] == [("t1", "dropped")]


def test_bad_flags_exit_2_naming_the_flag(tmp_path: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = str(taken.getsockname()[1])
    (tmp_path / "empty").write_text("\n")
    base = ["serve", "--state", "s.db", "--executor", "dry-run", "--cluster", "local"]
    try:
        cases = [(["--port", port], "--port"), (["--port", "70000"], "--port"),
                 (["--port", "http"], "--port"), (["--token-file", "empty"], "--token-file"),
                 (["--token-file", "missing"], "--token-file"),
                 (["--interval", "0"], "--interval"), (["--executor", "warp"], "--executor"),
                 (["--host", "no.such.host.invalid"], "--host"),
                 (["--cluster", "nowhere.yaml"], "nowhere.yaml"),
                 # writes without a token only on loopback, and never with a token file
                 (["--no-token", "--host", "0.0.0.0"], "--no-token"),
                 (["--no-token", "--host", "10.0.0.1"], "--no-token"),
                 (["--no-token", "--token-file", "empty"], "--no-token"),
                 (["--allowed-host", "http://a.example"], "--allowed-host"),
                 (["--allowed-host", "a.example:80"], "--allowed-host"),
                 (["--allowed-origin", "a.example"], "--allowed-origin"),
                 (["--allowed-origin", "https://a.example/path"], "--allowed-origin"),
                 (["--read-timeout", "0"], "--read-timeout"),
                 (["--read-timeout", "nan"], "--read-timeout"),
                 (["--max-connections", "0"], "--max-connections"),
                 (["--max-connections", str(2**40)], "--max-connections")]
        for extra, flag in cases:
            r = cli(*base, *extra, cwd=tmp_path)
            assert r.returncode == 2 and flag in r.stderr, (extra, r.returncode, r.stderr)
            assert not (tmp_path / "s.db").exists(), extra  # nothing written
    finally:
        taken.close()


def test_without_the_serve_extra_it_exits_2_naming_it(tmp_path: Path) -> None:
    blocked = ("import sys; sys.modules['fastapi'] = None; sys.argv = ['apportion', 'serve', "
               "'--state', 's.db']; from apportion.cli import main; main()")
    r = subprocess.run([sys.executable, "-c", blocked], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and "apportion[serve]" in r.stderr, r.stderr
    assert not (tmp_path / "s.db").exists()


def test_a_second_scheduler_on_the_store_exits_75(served: Served) -> None:
    r = cli("serve", "--state", "s.db", "--executor", "dry-run", "--cluster", "local",
            "--port", "0", cwd=served.cwd)
    assert r.returncode == 75, r.stderr
    assert "serve" in r.stderr  # who holds the lock
    assert httpx.get(f"{served.url}/healthz", timeout=30).status_code == 200
    # the refused one never replaced the first's generated token
    assert (served.cwd / "s.db.token").read_text().strip() == served.token


def test_readiness_follows_the_loop() -> None:
    from prometheus_client import CollectorRegistry

    from apportion.serve.metrics import ServeMetrics
    from apportion.serve.observer import LoopObserver

    obs = LoopObserver(5.0, 10.0, ServeMetrics(CollectorRegistry(), "dry-run"))
    assert not obs.loop_ready()  # no pass yet
    now = time.time()
    obs.last_pass_at = now - 19.0
    assert obs.loop_ready(now)  # within 2 intervals plus the solver's budget
    obs.last_pass_at = now - 21.0
    assert not obs.loop_ready(now)


def test_status_json_is_unchanged_by_the_move(tmp_path: Path) -> None:
    """``status --json`` (now read through apportion.store_status) keeps its keys."""
    (tmp_path / "j.yaml").write_text(JOBS_YAML)
    assert cli("submit", "j.yaml", "--state", "s.db", cwd=tmp_path).returncode == 0
    data = status(tmp_path)
    assert set(data) == {"state_db", "schema_version", "generation", "jobs", "counts",
                         "cluster_use", "nodes", "last_round"}
    assert json.dumps(data["jobs"][0]["id"]) == '"y1"'


def test_a_store_that_cannot_be_read_is_503_never_a_traceback(tmp_path: Path) -> None:
    """In process (the app on its own server thread): readiness and every read say the
    store is unusable."""
    from prometheus_client import CollectorRegistry

    from apportion.cluster import Cluster, NodeGroup
    from apportion.serve.app import create_app
    from apportion.serve.metrics import ServeMetrics, StoreCollector
    from apportion.serve.observer import LoopObserver
    from apportion.serve.server import HttpServer, bind, url_of
    from apportion.serve.state import ServeState

    registry = CollectorRegistry()
    observer = LoopObserver(1.0, 1.0, ServeMetrics(registry, "dry-run"))
    observer.last_pass_at = time.time()  # the loop is fine; the store is not
    cluster = Cluster("c", [NodeGroup("n", 1, "A100", 2)])
    missing = tmp_path / "gone.db"
    registry.register(StoreCollector(missing, cluster, lambda: 0))
    app = create_app(ServeState(missing, cluster, "dry-run", 1.0, observer, registry))
    sock = bind("127.0.0.1", 0)
    with HttpServer(app, sock, observer), httpx.Client(base_url=url_of(sock), timeout=30) as c:
        r = c.get("/readyz")
        assert r.status_code == 503 and r.json()["ready"] is False
        assert "gone.db" in r.json()["store"]
        for path in ("/api/v1/jobs", "/api/v1/jobs/x", "/api/v1/rounds", "/api/v1/cluster"):
            r = c.get(path)
            assert r.status_code == 503 and r.headers["retry-after"], path
            assert r.json()["field"] == "--state"
        r = c.delete("/api/v1/jobs/x")
        assert r.status_code == 503
        metrics = c.get("/metrics").text
        assert "apportion_store_up 0.0" in metrics
        assert c.get("/healthz").status_code == 200
    sock.close()
    assert not observer.should_stop()  # stopped by its owner, not by itself
    assert not missing.exists()
