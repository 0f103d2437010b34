"""Validate Kubernetes objects as an API server would, without one.

* Custom resources (TrainJob, TrainingRuntime, JobSet, PyTorchJob, Kueue) against
  the ``openAPIV3Schema`` of the CRDs in this folder (see SOURCES.md), turned
  into JSON Schema the way the API server reads it: ``nullable``,
  ``x-kubernetes-int-or-string``, ``x-kubernetes-embedded-resource``, and
  unknown fields refused wherever the schema does not preserve them (server-side
  field validation ``Strict``, kubectl's default). Their CEL rules
  (``x-kubernetes-validations``) are evaluated with cel-python, transition rules
  (``oldSelf``) when an old object is given.
* Core objects, and every pod template found inside a custom resource, against
  the official Kubernetes OpenAPI schemas shipped by ``kubernetes-validate``
  (strict variants: unknown fields refused).
* The checks the API server makes beyond schemas for what apportion writes:
  object names, label and annotation syntax, resource quantities (parsed by the
  official client's parser), extended resources with requests equal to limits,
  volumes referenced by mounts, and JobSet's 63-character pod host names.

* Volcano's ``PodGroup`` (``scheduling.volcano.sh/v1beta1``), whose CRD is not
  shipped here, against :data:`VOLCANO_PODGROUP`: a schema written for these
  tests from Volcano's API types (``PodGroupSpec``: ``minMember`` int32 >= 0,
  ``minTaskMember``, ``queue``, ``priorityClassName``, ``minResources`` as
  quantities), unknown fields refused.

``validate(obj, old=None)`` returns a list of problems (empty: valid).
"""

from __future__ import annotations

import copy
import gzip
import re
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).parent
K8S_VERSION = "1.33"  # core schemas: a current release that JobSet, Kueue and Trainer support

CRD_FILES = {
    ("trainer.kubeflow.org", "TrainJob"): "trainer.kubeflow.org_trainjobs.yaml.gz",
    ("trainer.kubeflow.org", "TrainingRuntime"): "trainer.kubeflow.org_trainingruntimes.yaml.gz",
    ("jobset.x-k8s.io", "JobSet"): "jobset.x-k8s.io_jobsets.yaml.gz",
    ("kubeflow.org", "PyTorchJob"): "kubeflow.org_pytorchjobs.yaml.gz",
    ("kueue.x-k8s.io", "ClusterQueue"): "kueue.x-k8s.io_clusterqueues.yaml.gz",
    ("kueue.x-k8s.io", "LocalQueue"): "kueue.x-k8s.io_localqueues.yaml.gz",
    ("kueue.x-k8s.io", "ResourceFlavor"): "kueue.x-k8s.io_resourceflavors.yaml.gz",
    ("kueue.x-k8s.io", "Topology"): "kueue.x-k8s.io_topologies.yaml.gz",
    ("kueue.x-k8s.io", "Cohort"): "kueue.x-k8s.io_cohorts.yaml.gz",
    ("monitoring.coreos.com", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml.gz",
    ("monitoring.coreos.com", "PrometheusRule"): "monitoring.coreos.com_prometheusrules.yaml.gz",
}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
STANDARD_RESOURCES = {"cpu", "memory", "ephemeral-storage", "storage"}
QUANTITY = {"anyOf": [{"type": "integer"}, {"type": "string"}]}
VOLCANO_PODGROUP = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "scheduling.volcano.sh/v1beta1"},
        "kind": {"const": "PodGroup"}, "metadata": {"type": "object"},
        "spec": {"type": "object", "additionalProperties": False, "properties": {
            "minMember": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
            "minTaskMember": {"type": "object",
                              "additionalProperties": {"type": "integer", "minimum": 0}},
            "queue": {"type": "string"},
            "priorityClassName": {"type": "string"},
            "minResources": {"type": "object", "additionalProperties": QUANTITY}}}}}


@cache
def crd(group: str, kind: str) -> dict[str, Any]:
    with gzip.open(HERE / CRD_FILES[(group, kind)], "rt", encoding="utf-8") as fh:
        return yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def crd_scope(group: str, kind: str) -> str:
    return crd(group, kind)["spec"]["scope"]


def _to_json_schema(node: Any) -> Any:
    """An openAPIV3Schema (structural) as JSON Schema, with the API server's strictness."""
    if isinstance(node, list):
        return [_to_json_schema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _to_json_schema(v) for k, v in node.items()
           if k not in ("x-kubernetes-validations", "description", "default", "format")}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("x-kubernetes-embedded-resource"):
        props = out.setdefault("properties", {})
        props.setdefault("apiVersion", {"type": "string"})
        props.setdefault("kind", {"type": "string"})
        props.setdefault("metadata", {"type": "object"})
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if ("properties" in out and "additionalProperties" not in out
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@cache
def _crd_validator(group: str, kind: str, version: str) -> Any:
    import jsonschema

    for v in crd(group, kind)["spec"]["versions"]:
        if v["name"] == version and v.get("served"):
            schema = copy.deepcopy(v["schema"]["openAPIV3Schema"])
            schema.setdefault("properties", {})["metadata"] = {"type": "object"}
            return jsonschema.Draft7Validator(_to_json_schema(schema))
    raise KeyError(f"{group}/{version} {kind}: version not served by the CRD")


def _crd_schema(group: str, kind: str, version: str) -> dict[str, Any]:
    for v in crd(group, kind)["spec"]["versions"]:
        if v["name"] == version:
            return v["schema"]["openAPIV3Schema"]
    raise KeyError(version)


# -- CEL rules ----------------------------------------------------------------------------------
@cache
def _cel_program(rule: str) -> Any:
    import celpy

    env = celpy.Environment()
    return env.program(env.compile(rule))


def _cel_rules(schema: dict[str, Any], value: Any, old: Any, path: str, out: list[str]) -> None:
    import celpy

    for r in schema.get("x-kubernetes-validations") or []:
        rule = r["rule"]
        if "oldSelf" in rule and old is None:
            continue  # transition rules apply to updates only
        act = {"self": celpy.json_to_cel(value)}
        if old is not None:
            act["oldSelf"] = celpy.json_to_cel(old)
        try:
            ok = _cel_program(rule).evaluate(act)
        except Exception as exc:  # noqa: BLE001 - an evaluation error is a rejection
            out.append(f"{path}: {r.get('message', 'CEL rule failed')} (rule {rule!r} "
                       f"did not evaluate to true: {exc})")
            continue
        if isinstance(ok, celpy.CELEvalError) or not bool(ok):
            out.append(f"{path}: {r.get('message', 'CEL rule failed')} ({rule})")
    if isinstance(value, dict):
        for k, sub in (schema.get("properties") or {}).items():
            if k in value:
                o = old.get(k) if isinstance(old, dict) else None
                _cel_rules(sub, value[k], o, f"{path}.{k}", out)
        ap = schema.get("additionalProperties")
        if isinstance(ap, dict):
            for k, v in value.items():
                o = old.get(k) if isinstance(old, dict) else None
                _cel_rules(ap, v, o, f"{path}.{k}", out)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(value):
            _cel_rules(schema["items"], v, None, f"{path}[{i}]", out)


# -- core objects ---------------------------------------------------------------------------------
@cache
def _core_validator(kind: str, api_version: str) -> Any:
    """kubernetes-validate's strict schema for a core kind, loaded once (its own validate()
    re-reads the multi-megabyte definitions on every call)."""
    import json

    import jsonschema
    import kubernetes_validate
    from referencing import Registry, Resource

    folder = (Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
              / f"v{K8S_VERSION}.0-local-strict")
    name = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)  # same mapping as the package
    schema = json.loads((folder / f"{kind.lower()}-{name}.json").read_text())
    defs = json.loads((folder / "_definitions.json").read_text())
    registry = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _core_errors(obj: dict[str, Any]) -> list[str]:
    who = f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"
    return [f"{who}: {'.'.join(str(p) for p in e.path)}: {e.message}"
            for e in _core_validator(obj["kind"], obj["apiVersion"]).iter_errors(obj)]


@lru_cache(maxsize=1)
def _pod_template_validator() -> Any:
    """The strict core schema of a PodTemplateSpec, from kubernetes-validate's definitions."""
    import json

    import jsonschema
    import kubernetes_validate

    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    defs = json.loads((root / f"v{K8S_VERSION}.0-local-strict" / "_definitions.json").read_text())
    return jsonschema.Draft202012Validator(
        {"$defs": defs["$defs"], "$ref": "#/$defs/io.k8s.api.core.v1.PodTemplateSpec"})


def _pod_templates(obj: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every pod template (``template`` holding a ``spec.containers``) inside an object."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(obj, dict):
        t = obj.get("template")
        if isinstance(t, dict) and isinstance(t.get("spec"), dict) and "containers" in t["spec"]:
            found.append((f"{path}.template", t))
        for k, v in obj.items():
            found += _pod_templates(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found += _pod_templates(v, f"{path}[{i}]")
    return found


def _quantity(q: Any) -> Any:
    from kubernetes.utils import parse_quantity

    return parse_quantity(q)


def _pod_errors(path: str, tmpl: dict[str, Any]) -> list[str]:
    out = [f"{path}: {'.'.join(str(p) for p in e.path)}: {e.message}"
           for e in _pod_template_validator().iter_errors(tmpl)]
    spec = tmpl.get("spec", {})
    volumes = [v["name"] for v in spec.get("volumes", [])]
    if len(set(volumes)) != len(volumes):
        out.append(f"{path}: duplicate volume names {volumes}")
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        cp = f"{path}.containers[{c.get('name')}]"
        if not DNS_LABEL.match(c.get("name", "")):
            out.append(f"{cp}: container name is not a DNS label")
        for m in c.get("volumeMounts", []):
            if m["name"] not in volumes:
                out.append(f"{cp}: volumeMount {m['name']!r} names no volume")
        for e in c.get("env", []):
            if not ENV_NAME.match(e["name"]):
                out.append(f"{cp}: env name {e['name']!r} is not a valid variable name")
        res = c.get("resources", {})
        req, lim = res.get("requests", {}), res.get("limits", {})
        for kind, d in (("requests", req), ("limits", lim)):
            for r, q in d.items():
                try:
                    if _quantity(q) < 0:
                        out.append(f"{cp}: {kind}.{r} is negative")
                except (ValueError, TypeError) as exc:
                    out.append(f"{cp}: {kind}.{r} = {q!r} is not a quantity ({exc})")
        for r in set(req) | set(lim):
            if r in STANDARD_RESOURCES or r.startswith("hugepages-"):
                if r in req and r in lim and _quantity(req[r]) > _quantity(lim[r]):
                    out.append(f"{cp}: {r} request above its limit")
                continue
            if r not in lim:  # extended resources: a limit is required, equal to the request
                out.append(f"{cp}: extended resource {r} without a limit")
            elif r in req and _quantity(req[r]) != _quantity(lim[r]):
                out.append(f"{cp}: extended resource {r}: request must equal limit")
            elif _quantity(lim[r]) != int(_quantity(lim[r])):
                out.append(f"{cp}: extended resource {r} must be a whole number")
    return out


def _metadata_errors(obj: dict[str, Any], dns_label_name: bool) -> list[str]:
    meta = obj.get("metadata") or {}
    kind = obj.get("kind")
    name = meta.get("name", "")
    out: list[str] = []
    if dns_label_name:
        if not (DNS_LABEL.match(name) and len(name) <= 63):
            out.append(f"{kind}: name {name!r} is not a DNS-1123 label")
    elif not (DNS_SUBDOMAIN.match(name) and len(name) <= 253):
        out.append(f"{kind}: name {name!r} is not a DNS-1123 subdomain")
    for section in ("labels", "annotations"):
        for k, v in (meta.get(section) or {}).items():
            prefix, _, short = k.rpartition("/")
            if (prefix and not DNS_SUBDOMAIN.match(prefix)) or not LABEL_NAME.match(short) \
                    or len(short) > 63:
                out.append(f"{kind}/{name}: {section} key {k!r} is invalid")
            if section == "labels" and not (isinstance(v, str) and LABEL_VALUE.match(v)
                                            and len(v) <= 63):
                out.append(f"{kind}/{name}: label {k}={v!r} has an invalid value")
    size = sum(len(k) + len(v) for k, v in (meta.get("annotations") or {}).items())
    if size > 256 * 1024:
        out.append(f"{kind}/{name}: annotations exceed 256 KiB")
    return out


def _jobset_hostnames(name: str, spec: dict[str, Any]) -> list[str]:
    out = []
    for rj in spec.get("replicatedJobs", []):
        jspec = rj["template"]["spec"]
        host = f"{name}-{rj['name']}-{rj.get('replicas', 1) - 1}-{jspec.get('parallelism', 1) - 1}"
        if len(host) > 63:
            out.append(f"JobSet {name}: pod host name {host!r} exceeds 63 characters")
    return out


def validate(obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """Every problem an API server (with the CRDs and their webhooks' basic checks) would see."""
    api = obj.get("apiVersion", "")
    kind = obj.get("kind", "")
    group, _, version = api.rpartition("/")
    if group == "scheduling.volcano.sh":
        import jsonschema

        errors = [f"PodGroup: {'.'.join(str(p) for p in e.path)}: {e.message}"
                  for e in jsonschema.Draft7Validator(VOLCANO_PODGROUP).iter_errors(obj)]
        for r, q in ((obj.get("spec") or {}).get("minResources") or {}).items():
            try:
                _quantity(q)
            except (ValueError, TypeError) as exc:
                errors.append(f"PodGroup: minResources.{r} = {q!r} is not a quantity ({exc})")
        return errors + _metadata_errors(obj, False)
    if (group, kind) not in CRD_FILES:
        errors = _core_errors(obj)
        return errors + _metadata_errors(obj, False) + [
            e for p, t in _pod_templates(obj.get("spec", {}), "spec") for e in _pod_errors(p, t)]
    errors = [f"{kind}/{(obj.get('metadata') or {}).get('name')}: "
              f"{'.'.join(str(p) for p in e.path)}: {e.message}"
              for e in _crd_validator(group, kind, version).iter_errors(obj)]
    _cel_rules(_crd_schema(group, kind, version), obj, old, kind, errors)
    # JobSet and TrainJob names become pod host names; others DNS subdomains
    errors += _metadata_errors(obj, kind in ("JobSet", "TrainJob", "PyTorchJob"))
    for path, tmpl in _pod_templates(obj.get("spec", {}), "spec"):
        errors += _pod_errors(path, tmpl)
    if kind == "JobSet":
        errors += _jobset_hostnames(obj["metadata"]["name"], obj["spec"])
    if kind == "TrainingRuntime":
        errors += _jobset_hostnames(obj["metadata"]["name"], obj["spec"]["template"]["spec"])
    return errors
