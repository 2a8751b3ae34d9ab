"""A thin REST layer over ``kubernetes.client.ApiClient`` for the handful of kinds gagar manages.

Why not the typed clients: children span a dozen API groups (some CRDs), and server-side apply is
one uniform call (``PATCH`` with ``application/apply-patch+yaml``, one field manager, ``force``).
Why not the dynamic client: its discovery costs seconds at start; the paths here are static.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from gagar import API_GROUP, API_VERSION, KIND

FIELD_MANAGER = "gagar-operator"
# Takes over fields the operator stops writing but that must keep their value (replicas of a pool
# switched to an autoscaler), as Kubernetes documents for handing a field over to an HPA.
HANDOFF_MANAGER = "gagar-handoff"
# Owns the ``suspend: true`` a queued trainer is created with, so that the operator's own applies
# (which never send ``suspend`` for it) leave the field to Kueue.
KUEUE_HANDOFF_MANAGER = "gagar-kueue-handoff"
# Sets ``ttlSecondsAfterFinished`` on a finished trainer (a partial apply: the operator's own
# manager would drop every field it leaves out).
TTL_MANAGER = "gagar-ttl"

PLURALS = {
    "Secret": "secrets",
    "ConfigMap": "configmaps",
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
    "Service": "services",
    "Job": "jobs",
    "JobSet": "jobsets",
    "Deployment": "deployments",
    "HorizontalPodAutoscaler": "horizontalpodautoscalers",
    "ScaledObject": "scaledobjects",
    "NetworkPolicy": "networkpolicies",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "PodMonitor": "podmonitors",
    "ServiceMonitor": "servicemonitors",
    "SandboxTemplate": "sandboxtemplates",
    "SandboxWarmPool": "sandboxwarmpools",
    "Pod": "pods",
    "Workload": "workloads",
    "Event": "events",
    "Namespace": "namespaces",
    "ResourceQuota": "resourcequotas",  # tests: a namespace whose quota tracks requests
    "CustomResourceDefinition": "customresourcedefinitions",
    KIND: "gagarruns",
}
RUN_API = f"{API_GROUP}/{API_VERSION}"


@dataclass
class KubeError(Exception):
    """An API error with its HTTP status and the server's message."""

    status: int
    message: str

    def __str__(self) -> str:
        return f"{self.status}: {self.message}"

    @property
    def transient(self) -> bool:
        """Worth retrying: server errors, throttling, conflicts, timeouts."""
        return self.status >= 500 or self.status in (0, 408, 409, 429)


def path(api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    ns = f"/namespaces/{namespace}" if namespace else ""
    tail = f"/{name}" if name else ""
    return f"{base}{ns}/{PLURALS[kind]}{tail}"


def _message(body: Any, reason: Any) -> str:
    """The ``message`` of a Kubernetes ``Status`` body, else the HTTP reason."""
    try:
        return json.loads(body).get("message") or str(reason)
    except (TypeError, ValueError, AttributeError):
        return str(reason)


class Kube:
    """get / list / apply / delete / patch_status, raising ``KubeError``."""

    def __init__(
        self, client: ApiClient, observe: Callable[[str, int, float], None] | None = None
    ) -> None:
        self.client = client
        self.observe = observe  # (verb, HTTP status or 0, seconds) after every request: metrics

    def _call(
        self,
        method: str,
        url: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        started, status = time.monotonic(), 200
        try:
            return self._send(method, url, body, query, content_type)
        except KubeError as err:
            status = err.status
            raise
        finally:
            if self.observe is not None:
                self.observe(method, status, time.monotonic() - started)

    def _send(
        self,
        method: str,
        url: str,
        body: Any,
        query: list[tuple[str, str]] | None,
        content_type: str,
    ) -> Any:
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        try:
            _, full_url, headers, body, _ = self.client.param_serialize(
                method,
                url,
                query_params=query or [],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            resp = self.client.call_api(method, full_url, headers, body, _request_timeout=30)
            data = resp.read()
        except ApiException as err:
            raise KubeError(err.status or 0, _message(err.body, err.reason)) from None
        except (OSError, urllib3.exceptions.HTTPError) as err:
            # connection refused/reset, after urllib3's retries (MaxRetryError is no OSError)
            raise KubeError(0, str(err)) from None
        if not 200 <= resp.status <= 299:
            raise KubeError(resp.status, _message(data, resp.reason))
        return json.loads(data) if data else None

    def get(
        self, api_version: str, kind: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return self._call("GET", path(api_version, kind, namespace, name))
        except KubeError as err:
            if err.status == 404:
                return None
            raise

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        selector: str = "",
        fields: str = "",
    ) -> list[dict[str, Any]]:
        """Objects matching a label ``selector`` and a field selector (``fields``)."""
        query = [("labelSelector", selector)] if selector else []
        query += [("fieldSelector", fields)] if fields else []
        return self._call("GET", path(api_version, kind, namespace), query=query).get("items") or []

    def apply(
        self, obj: dict[str, Any], manager: str = FIELD_MANAGER, force: bool = True
    ) -> dict[str, Any]:
        """Server-side apply under the operator's field manager, taking over conflicting fields."""
        meta = obj["metadata"]
        url = path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        query = [("fieldManager", manager), ("force", "true" if force else "false")]
        return self._call(
            "PATCH", url, body=obj, query=query, content_type="application/apply-patch+yaml"
        )

    def delete(
        self, api_version: str, kind: str, namespace: str | None, name: str, uid: str = ""
    ) -> bool:
        """Delete with background propagation; False when it was already gone. With ``uid``
        only that object goes (a precondition the API server checks): when the name now belongs
        to a newer object, that one stays and the answer is False too."""
        body: dict[str, Any] = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "propagationPolicy": "Background",
        }
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self._call("DELETE", path(api_version, kind, namespace, name), body=body)
        except KubeError as err:
            if err.status == 404 or (uid and err.status == 409):
                return False
            raise
        return True

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        return self._call(
            "POST", path(obj["apiVersion"], obj["kind"], meta.get("namespace")), body=obj
        )

    def merge_patch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        body: dict[str, Any],
        subresource: str = "",
    ) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386) of an object or one of its subresources."""
        url = path(api_version, kind, namespace, name) + (f"/{subresource}" if subresource else "")
        return self._call("PATCH", url, body=body, content_type="application/merge-patch+json")

    def patch_status(self, namespace: str | None, name: str, status: dict[str, Any]) -> None:
        self.merge_patch(RUN_API, KIND, namespace, name, {"status": status}, "status")

    def api_groups(self) -> set[str]:
        """API groups the server serves (to know which optional CRDs are installed)."""
        return {g["name"] for g in (self._call("GET", "/apis") or {}).get("groups", [])}
