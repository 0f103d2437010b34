"""An API server double for the executor's tests: real HTTP, real schemas, no cluster.

No Kubernetes API server can run on the project's machines, so the executor is
tested with the official Python client talking HTTP to this double, which
behaves as the API server does for what apportion uses:

* REST paths of ConfigMaps and of the custom resources (TrainJob,
  TrainingRuntime, JobSet, PyTorchJob, Kueue Workload in v1beta2 and v1beta1,
  Volcano PodGroup); create (201), get,
  list with label selectors, replace (PUT, ``resourceVersion`` checked: 409
  Conflict when stale), JSON merge patch, delete; errors as ``Status`` objects;
* every object written is validated against the CRD and core schemas
  (:func:`k8s_schemas.validate`, CEL transition rules included) and refused
  with 422 Invalid otherwise; JobSet's webhook rule that replicated jobs are
  immutable (but for pod labels, annotations, node selectors, tolerations and
  scheduling gates while suspended) is enforced;
* a deleted object stays *terminating* for ``terminate_s`` (its name is taken:
  a create gets 409 AlreadyExists), then disappears with what it owns; so that
  tests do not depend on the machine's speed, it outlives ``terminate_s`` until
  one create has met it (or 5 s more have passed);
* ``conflicts=N`` answers the next N writes with 409 Conflict, as a concurrent
  writer would cause;
* a minimal controller: suspended jobs get ``Suspended=True``, running ones
  ``Suspended=False``; with ``kueue=True``, a job with a queue label gets a
  Workload, is unsuspended while its Workload is active (admitted) and
  suspended when it is deactivated. Tests finish or fail jobs with
  :meth:`ApiServerDouble.set_condition`, as a controller would;
* validating admission webhooks (a policy engine, a quota controller):
  :meth:`ApiServerDouble.deny` refuses the writes a predicate picks, after
  the schema check, with the webhook's code (403 by default) and the API
  server's ``admission webhook "<name>" denied the request: <message>``.
"""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qs, urlparse

from . import crd, validate

KINDS = {"configmaps": ("", "v1", "ConfigMap"),
         "trainjobs": ("trainer.kubeflow.org", "v1alpha1", "TrainJob"),
         "trainingruntimes": ("trainer.kubeflow.org", "v1alpha1", "TrainingRuntime"),
         "jobsets": ("jobset.x-k8s.io", "v1alpha2", "JobSet"),
         "pytorchjobs": ("kubeflow.org", "v1", "PyTorchJob"),
         "workloads": ("kueue.x-k8s.io", "v1beta2", "Workload"),
         "podgroups": ("scheduling.volcano.sh", "v1beta1", "PodGroup")}
# versions served beside the one above (Kueue serves v1beta1 and stores v1beta2)
ALSO_SERVED = {"workloads": {"v1beta1"}}
JOB_KINDS = ("TrainJob", "JobSet", "PyTorchJob")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID = "kueue.x-k8s.io/job-uid"


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _selector_matches(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _suspended(obj: dict[str, Any]) -> bool:
    spec = obj.get("spec") or {}
    if obj["kind"] == "PyTorchJob":
        return bool((spec.get("runPolicy") or {}).get("suspend"))
    return bool(spec.get("suspend"))


def _set_suspend(obj: dict[str, Any], value: bool) -> None:
    if obj["kind"] == "PyTorchJob":
        obj["spec"].setdefault("runPolicy", {})["suspend"] = value
    else:
        obj["spec"]["suspend"] = value


def _jobset_immutable(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """JobSet's webhook: replicatedJobs immutable, pod scheduling fields excepted when suspended."""
    def munged(spec: dict[str, Any], suspended: bool) -> Any:
        rjs = copy.deepcopy(spec.get("replicatedJobs", []))
        if suspended:
            for rj in rjs:
                pod = rj["template"]["spec"]["template"]
                pod.get("metadata", {}).pop("labels", None)
                pod.get("metadata", {}).pop("annotations", None)
                for f in ("nodeSelector", "tolerations", "schedulingGates"):
                    pod["spec"].pop(f, None)
        return rjs
    susp = bool(old["spec"].get("suspend")) or bool(new["spec"].get("suspend"))
    if munged(old["spec"], susp) != munged(new["spec"], susp):
        return "spec.replicatedJobs: field is immutable"
    return None


class ApiServerDouble:
    """See the module docstring. ``with ApiServerDouble() as srv: srv.url``."""

    def __init__(self, terminate_s: float = 0.3, kueue: bool = False, conflicts: int = 0) -> None:
        self.terminate_s = terminate_s
        self.kueue = kueue
        self.conflicts = conflicts
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (plural, ns, name)
        self.deleting: dict[tuple[str, str, str], float] = {}
        self.met: set[tuple[str, str, str]] = set()  # terminating objects a create has met
        self.log: list[tuple[str, str, int]] = []
        self.lock = threading.RLock()
        self._rv = 0
        self._server: ThreadingHTTPServer | None = None
        self.webhooks: list[tuple[str, Callable[[dict[str, Any]], bool], str, int]] = []

    def deny(self, predicate: Callable[[dict[str, Any]], bool], message: str, code: int = 403,
             webhook: str = "policy.example.com") -> None:
        """Refuse every create or update of an object ``predicate`` picks, as a validating
        admission webhook named ``webhook`` would."""
        self.webhooks.append((webhook, predicate, message, code))

    # -- life cycle -------------------------------------------------------------------------
    def __enter__(self) -> Self:
        handler = type("Handler", (_Handler,), {"double": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def api_client(self, retries: int | None = None) -> Any:
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.url
        if retries is not None:  # urllib3's own retries on connection errors
            cfg.retries = retries
        return client.ApiClient(cfg)

    # -- helpers for tests ----------------------------------------------------------------------
    def all(self, kind: str) -> list[dict[str, Any]]:
        with self.lock:
            self._expire()
            return [copy.deepcopy(o) for (p, _, _), o in sorted(self.objects.items())
                    if KINDS[p][2] == kind]

    def get(self, kind: str, name: str, ns: str = "default") -> dict[str, Any] | None:
        plural = next(p for p, k in KINDS.items() if k[2] == kind)
        with self.lock:
            self._expire()
            o = self.objects.get((plural, ns, name))
            return copy.deepcopy(o) if o is not None else None

    def set_condition(self, kind: str, name: str, ctype: str, message: str = "",
                      ns: str = "default") -> None:
        """What a controller does when a job completes or fails."""
        plural = next(p for p, k in KINDS.items() if k[2] == kind)
        with self.lock:
            obj = self.objects[(plural, ns, name)]
            conds = [c for c in obj.setdefault("status", {}).get("conditions", [])
                     if c["type"] != ctype]
            conds.append({"type": ctype, "status": "True", "reason": ctype, "message": message,
                          "lastTransitionTime": _now()})
            obj["status"]["conditions"] = conds
            self._bump(obj)

    # -- the API ----------------------------------------------------------------------------------
    def _bump(self, obj: dict[str, Any]) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)

    def _expire(self) -> None:
        now = time.monotonic()
        for key, at in list(self.deleting.items()):
            if (now >= at and key in self.met) or now >= at + 5.0:
                self.met.discard(key)
                del self.deleting[key]
                gone = self.objects.pop(key, None)
                uid = (gone or {}).get("metadata", {}).get("uid")
                for k2, o in list(self.objects.items()):  # garbage collection of owned objects
                    if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences", [])):
                        self.objects.pop(k2, None)

    def _check(self, obj: dict[str, Any], old: dict[str, Any] | None = None) -> None:
        if obj["kind"] == "Workload":
            return  # written by the double's own Kueue, not by apportion
        errors = validate(obj, old)
        if obj["kind"] == "JobSet" and old is not None:
            msg = _jobset_immutable(old, obj)
            if msg:
                errors.append(msg)
        if errors:
            raise ApiError(422, "Invalid", "; ".join(errors[:5]))
        for name, predicate, message, code in self.webhooks:
            if predicate(obj):
                raise ApiError(code, "Forbidden" if code == 403 else "Invalid",
                               f'admission webhook "{name}" denied the request: {message}')

    def _writing(self) -> None:
        if self.conflicts > 0:
            self.conflicts -= 1
            raise ApiError(409, "Conflict", "the object has been modified; please apply your "
                           "changes to the latest version and try again")

    def handle(self, method: str, path: str, query: dict[str, list[str]], body: Any,
               content_type: str) -> tuple[int, Any]:
        parts = [p for p in path.split("/") if p]
        try:
            if parts[:2] == ["api", "v1"]:
                group, version, rest = "", "v1", parts[2:]
            elif parts and parts[0] == "apis" and len(parts) >= 3:
                group, version, rest = parts[1], parts[2], parts[3:]
            else:
                raise ApiError(404, "NotFound", f"no route {path}")
            if len(rest) < 3 or rest[0] != "namespaces":
                raise ApiError(404, "NotFound", f"no route {path}")
            ns, plural, name = rest[1], rest[2], (rest[3] if len(rest) > 3 else None)
            if plural not in KINDS or (KINDS[plural][:2] != (group, version)
                                       and version not in ALSO_SERVED.get(plural, ())):
                raise ApiError(404, "NotFound", f"the server could not find the requested "
                               f"resource {group}/{version} {plural}")
            with self.lock:
                self._expire()
                out = self._dispatch(method, plural, ns, name, query, body, content_type)
                self._reconcile()
                return out
        except ApiError as exc:
            return exc.code, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                              "status": "Failure", "message": exc.message, "reason": exc.reason,
                              "code": exc.code}

    def _dispatch(self, method: str, plural: str, ns: str, name: str | None,
                  query: dict[str, list[str]], body: Any, content_type: str) -> tuple[int, Any]:
        group, version, kind = KINDS[plural]
        api_version = f"{group}/{version}" if group else version
        if name is None and method == "GET":
            sel = query.get("labelSelector", [""])[0]
            items = [copy.deepcopy(o) for (p, n, _), o in sorted(self.objects.items())
                     if p == plural and n == ns
                     and _selector_matches(sel, o["metadata"].get("labels") or {})]
            return 200, {"apiVersion": api_version, "kind": f"{kind}List", "items": items,
                         "metadata": {"resourceVersion": str(self._rv)}}
        if name is None and method == "POST":
            self._writing()
            obj = copy.deepcopy(body)
            meta = obj.setdefault("metadata", {})
            if obj.get("kind") != kind or obj.get("apiVersion") != api_version:
                raise ApiError(400, "BadRequest", f"body is {obj.get('apiVersion')} "
                               f"{obj.get('kind')}, the path {api_version} {kind}")
            if meta.get("namespace", ns) != ns:
                raise ApiError(400, "BadRequest", "the namespace of the object does not match "
                               "the namespace on the request")
            meta["namespace"] = ns
            key = (plural, ns, meta.get("name", ""))
            if key in self.objects:
                more = " (it is being deleted)" if key in self.deleting else ""
                if key in self.deleting:
                    self.met.add(key)
                raise ApiError(409, "AlreadyExists", f"{plural} \"{key[2]}\" already exists{more}")
            self._check(obj)
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
            self._bump(obj)
            self.objects[key] = obj
            return 201, copy.deepcopy(obj)
        key = (plural, ns, name or "")
        cur = self.objects.get(key)
        if cur is None:
            raise ApiError(404, "NotFound", f"{plural} \"{name}\" not found")
        if method == "GET":
            return 200, copy.deepcopy(cur)
        if method == "DELETE":
            if key not in self.deleting:
                cur["metadata"]["deletionTimestamp"] = _now()
                self.deleting[key] = time.monotonic() + self.terminate_s
                self._bump(cur)
            return 200, copy.deepcopy(cur)
        if key in self.deleting:
            raise ApiError(409, "Conflict", f"{plural} \"{name}\" is being deleted")
        self._writing()
        if method == "PUT":
            new = copy.deepcopy(body)
            rv = (new.get("metadata") or {}).get("resourceVersion")
            if rv != cur["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", "the object has been modified (resourceVersion "
                               f"{rv}, current {cur['metadata']['resourceVersion']})")
        elif method == "PATCH":
            if "merge-patch" not in content_type and "strategic-merge-patch" not in content_type:
                raise ApiError(415, "UnsupportedMediaType", f"{content_type} not supported")
            body = {k: v for k, v in body.items() if k != "status"}
            new = merge_patch(cur, body)
            rv = (body.get("metadata") or {}).get("resourceVersion")
            if rv is not None and rv != cur["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", "the object has been modified")
        else:
            raise ApiError(405, "MethodNotAllowed", method)
        for f in ("uid", "creationTimestamp", "namespace", "name"):
            new.setdefault("metadata", {})[f] = cur["metadata"].get(f)
        new.pop("status", None)  # the status subresource is the controllers', not the client's
        if "status" in cur:
            new["status"] = copy.deepcopy(cur["status"])
        self._check(new, cur)
        if new.get("spec") != cur.get("spec"):
            new["metadata"]["generation"] = cur["metadata"].get("generation", 1) + 1
        self._bump(new)
        self.objects[key] = new
        return 200, copy.deepcopy(new)

    # -- the controllers ----------------------------------------------------------------------------
    def _reconcile(self) -> None:
        for (plural, ns, name), obj in list(self.objects.items()):
            kind = KINDS[plural][2]
            if kind not in JOB_KINDS or (plural, ns, name) in self.deleting:
                continue
            queue = (obj["metadata"].get("labels") or {}).get(QUEUE_LABEL)
            if self.kueue and queue:
                uid = obj["metadata"]["uid"]
                wls = [o for (p, n, _), o in self.objects.items() if p == "workloads"
                       and n == ns and o["metadata"]["labels"].get(JOB_UID) == uid]
                if not wls:
                    wl = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                          "metadata": {"name": f"{kind.lower()}-{name}-{uid[:5]}",
                                       "namespace": ns, "uid": str(uuid.uuid4()),
                                       "labels": {JOB_UID: uid},
                                       "ownerReferences": [{"apiVersion": obj["apiVersion"],
                                                            "kind": kind, "name": name,
                                                            "uid": uid, "controller": True}]},
                          "spec": {"active": True, "queueName": queue}}
                    self._bump(wl)
                    self.objects[("workloads", ns, wl["metadata"]["name"])] = wl
                    wls = [wl]
                admitted = all(w["spec"].get("active", True) for w in wls)
                if admitted == _suspended(obj):  # admit (unsuspend) or evict (suspend)
                    _set_suspend(obj, not admitted)
                    self._bump(obj)
            want = "True" if _suspended(obj) else "False"
            conds = obj.setdefault("status", {}).setdefault("conditions", [])
            sus = next((c for c in conds if c["type"] == "Suspended"), None)
            if sus is None or sus["status"] != want:
                conds[:] = [c for c in conds if c["type"] != "Suspended"]
                conds.append({"type": "Suspended", "status": want,
                              "reason": "Suspended" if want == "True" else "Resumed",
                              "message": "", "lastTransitionTime": _now()})
                self._bump(obj)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class _Handler(BaseHTTPRequestHandler):
    double: ApiServerDouble

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _serve(self, method: str) -> None:
        url = urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        code, out = self.double.handle(method, url.path, parse_qs(url.query), body,
                                       self.headers.get("Content-Type", ""))
        self.double.log.append((method, url.path, code))
        data = json.dumps(out).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")


__all__ = ["ApiServerDouble", "crd", "merge_patch"]
