"""A small client for the objects apportion manages, with retries on conflicts.

Wraps the official ``kubernetes`` client (``CustomObjectsApi`` for TrainJob,
TrainingRuntime, JobSet, PyTorchJob and Kueue Workloads; ``CoreV1Api`` for
ConfigMaps). Every call is retried by tenacity on the answers that mean "try
again": 409 Conflict (an object still terminating under the name being
created, or a stale ``resourceVersion``), 429 and 5xx, with exponential
back-off up to ``retry_timeout_s``. ConfigMaps are replaced read-modify-write
with their ``resourceVersion``, so a concurrent writer causes a 409 and a fresh
read rather than a lost update.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from apportion.runtime.executors.kubernetes.manifests import RESOURCES

log = logging.getLogger(__name__)
T = TypeVar("T")
RETRY_STATUSES = frozenset({409, 429, 500, 502, 503, 504})
WORKLOAD = ("kueue.x-k8s.io", "v1beta2", "workloads")  # v1beta1 with kueue_api: v1beta1
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


def require_k8s(flag: str) -> None:
    """The ``kubernetes`` and ``tenacity`` packages (the ``[k8s]`` extra), or exit 2 saying so."""
    import importlib.util

    from apportion.errors import InputError

    missing = [m for m in ("kubernetes", "tenacity") if importlib.util.find_spec(m) is None]
    if missing:
        raise InputError(flag, flag.lstrip("-"), f"needs {' and '.join(missing)}: "
                         "pip install 'apportion[k8s]'")


def _status(exc: BaseException) -> int | None:
    """The HTTP status of an API error (``None`` for anything else)."""
    from kubernetes.client.exceptions import ApiException

    return exc.status if isinstance(exc, ApiException) else None


def _retryable(exc: BaseException) -> bool:
    return _status(exc) in RETRY_STATUSES


class K8sClient:
    """Create, get, patch, delete and list apportion's objects in one namespace."""

    def __init__(self, api_client: Any, namespace: str, retry_timeout_s: float = 60.0,
                 retry_wait_s: float = 0.5) -> None:
        require_k8s("--kubeconfig")
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.namespace = namespace
        self.retry_timeout_s, self.retry_wait_s = retry_timeout_s, retry_wait_s
        self.retries = 0  # calls that needed more than one attempt (for logs and tests)
        self.workload = WORKLOAD  # Kueue's Workloads, in the version the settings name

    def use_kueue_api(self, version: str) -> None:
        """Read and patch Kueue's Workloads in ``version`` (``kueue_api`` of the settings)."""
        self.workload = (WORKLOAD[0], version, WORKLOAD[2])

    @classmethod
    def from_kubeconfig(cls, path: str | None, namespace: str, **kw: Any) -> K8sClient:
        """A client from a kubeconfig file (``None``: in-cluster service account)."""
        require_k8s("--kubeconfig")
        from kubernetes import config

        if path is None:
            config.load_incluster_config()
            from kubernetes import client

            return cls(client.ApiClient(), namespace, **kw)
        return cls(config.new_client_from_config(config_file=path), namespace, **kw)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

        for attempt in Retrying(retry=retry_if_exception(_retryable), reraise=True,
                                stop=stop_after_delay(self.retry_timeout_s),
                                wait=wait_exponential(multiplier=self.retry_wait_s,
                                                      max=self.retry_wait_s * 16)):
            with attempt:
                if attempt.retry_state.attempt_number > 1:
                    self.retries += 1
                    log.info("%s: attempt %d", what, attempt.retry_state.attempt_number)
                return fn()
        raise AssertionError("unreachable")  # pragma: no cover - Retrying reraises

    # -- custom objects -------------------------------------------------------------------
    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create ``obj`` (ConfigMap or a custom resource); 409 while a namesake terminates
        is retried until it is gone."""
        kind, name = obj["kind"], obj["metadata"]["name"]
        if kind == "ConfigMap":
            return self._call(f"create {kind}/{name}", lambda: self.core.create_namespaced_config_map(
                self.namespace, obj).to_dict())
        g, v, p = RESOURCES[kind]
        return self._call(f"create {kind}/{name}", lambda: self.custom.create_namespaced_custom_object(
            g, v, self.namespace, p, obj))

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        try:
            if kind == "ConfigMap":
                return self._call(f"get {kind}/{name}", lambda: self.core.read_namespaced_config_map(
                    name, self.namespace).to_dict())
            g, v, p = RESOURCES[kind]
            return self._call(f"get {kind}/{name}", lambda: self.custom.get_namespaced_custom_object(
                g, v, self.namespace, p, name))
        except Exception as exc:
            if _status(exc) == 404:
                return None
            raise

    def patch(self, kind: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386) of a custom resource."""
        g, v, p = (self.workload if kind == "Workload" else RESOURCES[kind])
        return self._call(f"patch {kind}/{name}", lambda: self.custom.patch_namespaced_custom_object(
            g, v, self.namespace, p, name, body))

    def delete(self, kind: str, name: str) -> bool:
        """Delete (foreground: owned objects first); False when it was already gone."""
        try:
            if kind == "ConfigMap":
                self._call(f"delete {kind}/{name}", lambda: self.core.delete_namespaced_config_map(
                    name, self.namespace))
                return True
            g, v, p = RESOURCES[kind]
            self._call(f"delete {kind}/{name}", lambda: self.custom.delete_namespaced_custom_object(
                g, v, self.namespace, p, name, propagation_policy="Foreground"))
            return True
        except Exception as exc:
            if _status(exc) == 404:
                return False
            raise

    def list(self, kind: str, selector: str) -> list[dict[str, Any]]:
        g, v, p = (self.workload if kind == "Workload" else RESOURCES[kind])
        res = self._call(f"list {kind}", lambda: self.custom.list_namespaced_custom_object(
            g, v, self.namespace, p, label_selector=selector))
        return list(res.get("items", []))

    def put_config_map(self, obj: dict[str, Any]) -> None:
        """Create or replace a ConfigMap (read, then replace at that resourceVersion)."""
        name = obj["metadata"]["name"]

        def attempt() -> None:
            try:
                cur = self.core.read_namespaced_config_map(name, self.namespace)
            except Exception as exc:
                if _status(exc) != 404:
                    raise
                self.core.create_namespaced_config_map(self.namespace, obj)
                return
            body = {**obj, "metadata": {**obj["metadata"],
                                        "resourceVersion": cur.metadata.resource_version}}
            self.core.replace_namespaced_config_map(name, self.namespace, body)

        self._call(f"put ConfigMap/{name}", attempt)

    # -- Kueue ----------------------------------------------------------------------------
    def set_workloads_active(self, job_uid: str, active: bool) -> int:
        """Kueue's way to stop (evict) or resume a job: its Workloads' ``spec.active``."""
        n = 0
        for wl in self.list("Workload", f"{JOB_UID_LABEL}={job_uid}"):
            if (wl.get("spec") or {}).get("active", True) != active:
                self.patch("Workload", wl["metadata"]["name"], {"spec": {"active": active}})
                n += 1
        return n
