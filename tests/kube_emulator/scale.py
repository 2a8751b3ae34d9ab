"""The scale subresource: an ``autoscaling/v1`` Scale view over a Deployment or custom object.

Reading builds the Scale from the paths the kind declares (``specReplicasPath``,
``statusReplicasPath``, ``labelSelectorPath`` for CRDs; ``spec.replicas``, ``status.replicas`` and
``spec.selector`` for Deployments). Writing applies the client's change to that view and stores
only the new ``spec`` replicas, so a write through ``/scale`` bumps ``generation`` like any spec
change, and a stale ``resourceVersion`` in the Scale is a 409.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .errors import ApiError, conflict
from .resources import ResourceType
from .store import Store, WriteOptions


def _path(expr: str) -> list[str]:
    return [p for p in expr.lstrip(".").split(".") if p]


def _get(obj: Any, expr: str) -> Any:
    for key in _path(expr):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _set(obj: dict, expr: str, value: Any) -> dict:
    keys = _path(expr)
    out = dict(obj)
    node = out
    for key in keys[:-1]:
        node[key] = dict(node.get(key) or {})
        node = node[key]
    node[keys[-1]] = value
    return out


def _selector(rt: ResourceType, obj: dict) -> str | None:
    if not rt.custom:
        labels = _get(obj, ".spec.selector.matchLabels") or {}
        return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or None
    return _get(obj, rt.scale.label_selector) if rt.scale and rt.scale.label_selector else None


def read_scale(rt: ResourceType, obj: dict) -> dict:
    assert rt.scale is not None
    meta = obj["metadata"]
    status: dict = {"replicas": _get(obj, rt.scale.status_replicas) or 0}
    selector = _selector(rt, obj)
    if selector:
        status["selector"] = selector
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if k in meta
        },
        "spec": {"replicas": _get(obj, rt.scale.spec_replicas) or 0},
        "status": status,
    }


def write_scale(store: Store, t: Any, change: Callable[[dict], dict], manager: str) -> dict:
    rt: ResourceType = t.rt
    with store.lock:
        current = store.get(rt, t.namespace, t.name)
        scale = change(read_scale(rt, current))
        expected = (scale.get("metadata") or {}).get("resourceVersion")
        if expected and expected != current["metadata"]["resourceVersion"]:
            raise conflict(rt.plural, t.name, rt.group)
        replicas = (scale.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise ApiError(
                422,
                f'Scale.autoscaling "{t.name}" is invalid: spec.replicas: Invalid value: {replicas!r}: must be greater than or equal to 0',
            )
        assert rt.scale is not None
        spec_path = rt.scale.spec_replicas
        updated = store.write(
            rt,
            t.namespace,
            t.name,
            lambda o: _set(o, spec_path, replicas),
            WriteOptions(manager, check_rv=False),
        )
        return read_scale(rt, updated)
