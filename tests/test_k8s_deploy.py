"""deploy/ and the Dockerfile: valid Kubernetes objects, RBAC for what the executor touches."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from apportion.runtime.executors.kubernetes.config import K8sConfig, _validate
from apportion.runtime.executors.kubernetes.manifests import RESOURCES
from k8s_schemas import validate

from apportion.config import cluster_from_data, parse_yaml_text

ROOT = Path(__file__).resolve().parents[1]


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((ROOT / "deploy" / name).read_text()) if d]


def test_deploy_objects_pass_the_core_schemas() -> None:
    for f in ("scheduler.yaml", "cronjob-solve-round.yaml"):
        for d in docs(f):
            assert validate(d) == [], (f, d["kind"])


def test_role_covers_every_object_the_executor_manages() -> None:
    (role,) = [d for d in docs("scheduler.yaml") if d["kind"] == "Role"]
    allowed = {(g, r): set(rule["verbs"]) for rule in role["rules"]
               for g in rule["apiGroups"] for r in rule["resources"]}
    needed = {("", "configmaps"): {"get", "create", "update", "delete"},
              ("kueue.x-k8s.io", "workloads"): {"list", "patch"}}
    for group, _, plural in RESOURCES.values():
        needed[(group, plural)] = {"get", "list", "create", "patch", "delete"}
    for key, verbs in needed.items():
        assert verbs <= allowed.get(key, set()), key


def test_scheduler_settings_and_command_are_what_apportion_reads() -> None:
    from typer.main import get_command

    from apportion.cli import app
    from apportion.cli.commands import LazyCommand

    (cm,) = [d for d in docs("scheduler.yaml") if d["kind"] == "ConfigMap"]
    cluster = cluster_from_data(parse_yaml_text(cm["data"]["cluster.yaml"], "cm"), "cm")
    assert cluster.total_gpus == 32
    cfg: K8sConfig = _validate(K8sConfig, yaml.safe_load(cm["data"]["k8s.yaml"]), "cm")
    assert cfg.namespace == "training" and cfg.local_checkpoint_mount == cfg.checkpoint_mount
    (dep,) = [d for d in docs("scheduler.yaml") if d["kind"] == "Deployment"]
    cmd = dep["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[:2] == ["apportion", "serve"]
    listed = get_command(app).commands["serve"]  # type: ignore[attr-defined]
    assert isinstance(listed, LazyCommand)
    serve = listed.load()  # the command itself, its options
    flags = {o for p in serve.params for o in p.opts}
    assert {c.split("=")[0] for c in cmd[2:]} <= flags


def test_dockerfile_copies_every_package_and_pins_torch() -> None:
    text = (ROOT / "Dockerfile").read_text()
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for folder in set(meta["tool"]["setuptools"]["package-dir"].values()):
        top = folder.split("/")[0]
        assert re.search(rf"^COPY {top} \./{top}$", text, re.MULTILINE), top
    assert "ARG TORCH=2.13.0" in text and "VARIANT" in text
