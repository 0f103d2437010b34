"""deploy/scheduler.yaml runs ``apportion serve``: its Service, probes and scrape
annotations point at what the server answers (tests/test_k8s_deploy.py validates every
object against the real schemas), and a real server started with the manifest's own
``Host`` and token flags answers what the kubelet's probes, Prometheus' scrape, the
Service's DNS names and ``kubectl port-forward`` send."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _objects() -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "scheduler.yaml").read_text()) if d]
    return {d["kind"]: d for d in docs}


def _flags(cmd: list[str]) -> dict[str, str]:
    return dict(c.split("=", 1) for c in cmd[2:] if "=" in c)


def _all(cmd: list[str], flag: str) -> list[str]:
    return [c.split("=", 1)[1] for c in cmd[2:] if c.startswith(flag + "=")]


def test_the_service_probes_and_scrape_annotations_reach_the_server() -> None:
    objs = _objects()
    dep, svc = objs["Deployment"], objs["Service"]
    pod = dep["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    flags = _flags(c["command"])
    assert c["command"][:2] == ["apportion", "serve"]
    assert flags["--host"] == "0.0.0.0"  # reachable from the Service, not loopback only
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["http"] == int(flags["--port"])
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    ann = pod["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/path"] == "/metrics"
    assert int(ann["prometheus.io/port"]) == ports["http"]
    assert svc["metadata"]["namespace"] == dep["metadata"]["namespace"]
    labels = pod["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    assert {p["targetPort"] for p in svc["spec"]["ports"]} == {"http"}


def test_the_token_file_comes_from_a_mounted_secret() -> None:
    dep = _objects()["Deployment"]
    spec = dep["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    token = Path(_flags(c["command"])["--token-file"])
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    (name,) = [n for n, m in mounts.items() if token.parent == Path(m["mountPath"])]
    assert mounts[name].get("readOnly") is True
    assert volumes[name]["secret"]["secretName"] == "apportion-api-token"


def test_what_the_cluster_sends_reaches_a_server_with_the_manifests_flags(
        tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from serve_server import Served, wait_for

    dep, svc = _objects()["Deployment"], _objects()["Service"]
    pod = dep["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    cmd = c["command"]
    names = _all(cmd, "--allowed-host")
    name, namespace = svc["metadata"]["name"], svc["metadata"]["namespace"]
    # every name a client in the cluster reaches the Service by is allowed
    assert {name, f"{name}.{namespace}", f"{name}.{namespace}.svc",
            f"{name}.{namespace}.svc.cluster.local"} <= set(names)
    (tmp_path / "token").write_text("k8s-secret-token\n")  # what the Secret mounts
    flags = [f"--allowed-host={n}" for n in names] + [
        f"--allowed-origin={o}" for o in _all(cmd, "--allowed-origin")]
    port = int(_flags(cmd)["--port"])
    pod_ip = "10.244.3.17"
    with Served(tmp_path, *flags, "--token-file", "token") as s, \
            httpx.Client(base_url=s.url, timeout=30) as client:
        # the kubelet's probes: Host is the pod's IP and the container port
        kubelet = {"Host": f"{pod_ip}:{port}", "User-Agent": "kube-probe/1.30",
                   "Accept": "*/*", "Connection": "close"}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            path = c[probe]["httpGet"]["path"]
            wait_for(f"{probe} {path}", lambda path=path: client.get(
                path, headers=kubelet).status_code == 200)
        # Prometheus' scrape of the pod (kubernetes_sd, pod role): the annotated port and path
        ann = pod["metadata"]["annotations"]
        r = client.get(ann["prometheus.io/path"], headers={
            "Host": f"{pod_ip}:{ann['prometheus.io/port']}",
            "User-Agent": "Prometheus/2.53.0",
            "Accept": "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;"
                      "version=0.0.4;q=0.3,*/*;q=0.2",
            "X-Prometheus-Scrape-Timeout-Seconds": "10"})
        assert r.status_code == 200 and "apportion_store_up" in r.text
        # clients through the Service (port 80: no port in Host) and through port-forward
        for host in [*names, f"{name}.{namespace}.svc:80", f"127.0.0.1:{port}",
                     f"localhost:{port}"]:
            assert client.get("/api/v1/jobs", headers={"Host": host}).status_code == 200, host
            assert client.get("/", headers={"Host": host}).status_code == 200, host
        doc = {"jobs": [{"id": "via-service", "model": "gpt-tiny", "global_batch_size": 8,
                         "iterations": 10, "requested_gpus": 1}]}
        r = client.post("/api/v1/jobs", json=doc, headers={
            "Host": f"{name}.{namespace}.svc", "Authorization": "Bearer k8s-secret-token"})
        assert r.status_code == 201, r.text
        # anything else is refused
        for host in ("evil.example", f"{name}.evil.example", f"{name}.other.svc"):
            assert client.get("/metrics", headers={"Host": host}).status_code == 421, host
