"""deploy/'s monitoring reads only metrics that exist: the PrometheusRule's alerts and the
Grafana dashboard's panels and variables are parsed as PromQL (promql-parser, the Rust
parser of GreptimeDB, as Prometheus' grammar) and every metric they name is found in the
/metrics of a real `apportion serve` that has run rounds with tenants, quotas and waiting
jobs. The ServiceMonitor and PrometheusRule are validated against prometheus-operator's
CRDs (tests/k8s_schemas), the NetworkPolicy against Kubernetes' own schema."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
promql = pytest.importorskip("promql_parser")
from k8s_schemas import validate  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from serve_server import Served, job_state, wait_for  # noqa: E402

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
#: Grafana's own variables, as a query sees them once Grafana has filled them in
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def _selectors(node: Any) -> Iterator[str]:
    """The metric names of every vector selector in a parsed PromQL expression."""
    kind = type(node).__name__
    if kind == "VectorSelector":
        if node.name:
            yield node.name
        return
    for attr in ("lhs", "rhs", "expr", "param", "vector_selector"):
        sub = getattr(node, attr, None)
        if sub is not None and not isinstance(sub, (str, int, float)):
            yield from _selectors(sub)
    for arg in getattr(node, "args", None) or []:
        yield from _selectors(arg)


def metric_names(expr: str) -> set[str]:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    m = re.fullmatch(r"\s*label_values\((\w+),\s*\w+\)\s*", expr)
    if m:  # a Grafana variable's query: label_values(metric, label)
        return {m.group(1)}
    names = set(_selectors(promql.parse(expr)))
    assert names, f"no metric in {expr!r}"
    return names


def rule_exprs() -> list[str]:
    docs = list(yaml.safe_load_all((DEPLOY / "monitoring.yaml").read_text()))
    rules = next(d for d in docs if d["kind"] == "PrometheusRule")
    return [r["expr"] for g in rules["spec"]["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[str]:
    dash = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    out = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    out += [v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            for v in dash["templating"]["list"] if v["type"] == "query"]
    return out


def test_objects_validate_against_their_schemas() -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "monitoring.yaml").read_text()))
    assert {d["kind"] for d in docs} == {"ServiceMonitor", "PrometheusRule"}
    docs += list(yaml.safe_load_all((DEPLOY / "networkpolicy.yaml").read_text()))
    for d in docs:
        assert validate(d) == [], d["kind"]
    monitor = next(d for d in docs if d["kind"] == "ServiceMonitor")
    service = next(d for d in yaml.safe_load_all((DEPLOY / "scheduler.yaml").read_text())
                   if d["kind"] == "Service")
    # it selects the scheduler's Service, by a label and a port name the Service has
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in
                                                       service["spec"]["ports"]}
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    assert policy["metadata"]["namespace"] == service["metadata"]["namespace"]
    alerts = {r["alert"] for g in next(d for d in docs if d["kind"] == "PrometheusRule")
              ["spec"]["groups"] for r in g["rules"]}
    assert {"ApportionNoRound", "ApportionFallbackShareHigh",
            "ApportionJobPendingTooLong"} <= alerts


def test_dashboard_is_well_formed() -> None:
    dash = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dash["templating"]["list"]}
    for p in dash["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}" and "datasource" in variables
        assert p["targets"], p["title"]
        for t in p["targets"]:
            for var in re.findall(r"\$(\w+)", t["expr"]):
                assert var in variables or f"${var}" in GRAFANA_VARS, (var, p["title"])


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The sample names of a real server's /metrics after rounds with tenants (one with a
    quota), running and waiting jobs."""
    cwd = tmp_path_factory.mktemp("monitoring")
    (cwd / "tenants.yaml").write_text("tenants:\n  - {name: vision, quota_gpus: 4}\n"
                                      "  - {name: nlp, quota_gpus: 2}\n")
    with Served(cwd, "--tenants", "tenants.yaml") as s:
        jobs = {"jobs": [{"id": f"big{i}", "model": "gpt-tiny", "global_batch_size": 32,
                          "iterations": 10000, "requested_gpus": 4,
                          "tenant": "vision" if i else "nlp"} for i in range(3)]}
        with s.client() as c:
            assert c.post("/api/v1/jobs", json=jobs).status_code == 201
        wait_for("a job placed", lambda: any(job_state(s, f"big{i}") == "running"
                                             for i in range(3)))

        def ready() -> set[str] | None:
            text = httpx.get(f"{s.url}/metrics", timeout=30).text
            names = {x.name for f in text_string_to_metric_families(text) for x in f.samples}
            return names if "apportion_pending_jobs" in names else None

        names = wait_for("waiting jobs with a reason in /metrics", ready)
        text = httpx.get(f"{s.url}/metrics", timeout=30).text
        assert s.stop() == 0, s.stderr()[-3000:]
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert not [n for n in names if n.endswith("_created")]  # no stray series
    build = next(f for f in fams.values() if f.name.startswith("apportion_build")).samples[0]
    assert build.name == "apportion_build_info" and build.labels["version"]
    tenants = {x.labels["tenant"] for x in fams["apportion_tenant_jobs"].samples}
    assert {"vision", "nlp"} <= tenants
    quota = {x.labels["tenant"]: x.value for x in fams["apportion_tenant_quota_gpus"].samples}
    assert quota == {"vision": 4.0, "nlp": 2.0}
    reasons = {x.labels["reason"]: x.value for x in fams["apportion_pending_jobs"].samples}
    assert sum(reasons.values()) >= 1
    waits = {x.name for x in fams["apportion_admission_wait_seconds"].samples}
    assert "apportion_admission_wait_seconds_bucket" in waits
    assert [x.value for x in fams["apportion_admission_wait_seconds"].samples
            if x.name.endswith("_count")] >= [1.0]
    assert fams["apportion_round_interval_seconds"].samples[0].value == 1.0
    return names


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_metric_named_exists(scraped: set[str], source: str) -> None:
    exprs = rule_exprs() if source == "rules" else dashboard_exprs()
    named = {n for e in exprs for n in metric_names(e)}
    assert named and named <= scraped, sorted(named - scraped)
