"""deploy/scheduler.yaml runs ``apportion serve``: its Service, probes and scrape
annotations point at what the server answers (tests/test_k8s_deploy.py validates every
object against the real schemas)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _objects() -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "scheduler.yaml").read_text()) if d]
    return {d["kind"]: d for d in docs}


def _flags(cmd: list[str]) -> dict[str, str]:
    return dict(c.split("=", 1) for c in cmd[2:] if "=" in c)


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
