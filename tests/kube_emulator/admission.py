"""Admission (pure): what the server checks and sets on every write before storing an object.

Custom objects get their CRD schema's defaults, pruning and validation; CustomResourceDefinitions
are checked (their schemas as the server checks them, :mod:`.crd_schema`) and get their status
(names accepted, established) and cleanup finalizer; namespaces get their ``Active`` phase and
``kubernetes`` finalizer. Built-in kinds get the part of the
server's own validation the operator depends on (:mod:`.builtin`), not a schema check.
CEL rules run (see :mod:`.cel` for the subset) only when the OpenAPI validation passed.
"""

from __future__ import annotations

import copy
import datetime as dt
import re

from . import builtin, cel, crd_schema
from . import schema as oas
from .errors import invalid
from .resources import CRDError, ResourceType, types_from_crd

CRD_KEY = ("apiextensions.k8s.io", "customresourcedefinitions")
NS_KEY = ("", "namespaces")
CRD_FINALIZER = "customresourcecleanup.apiextensions.k8s.io"
# The few built-in defaults tests can observe: replicas come back as 1 when nobody sets them.
_BUILTIN_DEFAULTS = {
    ("apps", "deployments"): {"replicas": 1},
    ("apps", "statefulsets"): {"replicas": 1},
    ("batch", "jobs"): {
        "parallelism": 1,
        "backoffLimit": 6,
        "completionMode": "NonIndexed",
        "suspend": False,
    },
}
# Fields the server refuses to change after creation (a subset of the real rules).
_IMMUTABLE = {
    ("batch", "jobs"): [("spec", "template"), ("spec", "selector"), ("spec", "completionMode")],
    ("apps", "deployments"): [("spec", "selector")],
    ("apps", "statefulsets"): [("spec", "selector"), ("spec", "serviceName"),
                               ("spec", "volumeClaimTemplates")],
    ("", "persistentvolumeclaims"): [("spec", "accessModes"), ("spec", "storageClassName")],
    ("rbac.authorization.k8s.io", "rolebindings"): [("roleRef",)],
    ("rbac.authorization.k8s.io", "clusterrolebindings"): [("roleRef",)],
}  # fmt: skip
_MISSING = object()
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_name(rt: ResourceType, name: str) -> None:
    if not name or len(name) > 253 or not _NAME_RE.match(name):
        reason = (
            f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain must "
            "consist of lower case alphanumeric characters, '-' or '.'"
        )
        raise invalid(rt.kind, name, [reason], rt.group)


def admit(
    rt: ResourceType,
    obj: dict,
    old: dict | None,
    strict: bool,
    warnings: list[str],
    openapi: bool = False,
) -> tuple[dict, list[ResourceType]]:
    """Return the object to store and, for a CRD, the kinds it serves; pruned fields are
    appended to ``warnings`` (or rejected when ``strict``)."""
    obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
    served: list[ResourceType] = []
    if rt.custom and rt.schema is not None:
        obj = validate_custom(rt, obj, strict, warnings, old)
    defaults = _BUILTIN_DEFAULTS.get(rt.storage_key)
    if defaults and not rt.custom:
        obj["spec"] = {**defaults, **(obj.get("spec") or {})}
    if rt.storage_key == ("batch", "jobs") and old is None:
        obj = _job_labels(obj)
    if old is not None and not rt.custom:
        _check_immutable(rt, obj, old)
    if not rt.custom:
        errors = builtin.object_errors(rt.storage_key, obj)
        if openapi and not errors:
            errors = builtin.openapi_errors(obj)
        if errors:
            raise invalid(rt.kind, obj["metadata"]["name"], errors, rt.group)
    if rt.storage_key == CRD_KEY:
        try:
            served = types_from_crd(obj)
        except CRDError as e:
            raise invalid(rt.kind, obj["metadata"]["name"], [str(e)], rt.group) from e
        errors = crd_schema.crd_errors(obj)
        if errors:
            raise invalid(rt.kind, obj["metadata"]["name"], errors, rt.group)
        obj["status"] = crd_status(obj, old)
        if old is None:
            obj["metadata"].setdefault("finalizers", []).append(CRD_FINALIZER)
    if rt.storage_key == NS_KEY and old is None:
        obj["status"] = {"phase": "Active"}
        obj.setdefault("spec", {"finalizers": ["kubernetes"]})
    return obj, served


def _get(obj: dict, path: tuple[str, ...]) -> object:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return _MISSING
        obj = obj[key]
    return obj


def _check_immutable(rt: ResourceType, obj: dict, old: dict) -> None:
    before = _schedulable(obj, old) if rt.storage_key == ("batch", "jobs") else old
    causes = [
        f"{'.'.join(path)}: Invalid value: field is immutable"
        for path in _IMMUTABLE.get(rt.storage_key, [])
        if _get(before, path) is not _MISSING and _get(obj, path) != _get(before, path)
    ]
    if old.get("immutable") and (obj.get("data"), obj.get("binaryData")) != (
        old.get("data"),
        old.get("binaryData"),
    ):
        causes.append("data: Forbidden: field is immutable when `immutable` is set")
    if causes:
        raise invalid(rt.kind, obj["metadata"]["name"], causes, rt.group)


def _schedulable(job: dict, old: dict) -> dict:
    """The stored Job as the template's immutability check sees it: while it is suspended and
    has never started (no ``status.startTime``), its pod template's scheduling directives may
    change (how Kueue admits a Job to a flavor): node affinity, node selector, tolerations,
    scheduling gates, and the template's labels and annotations are taken from the new Job."""
    started = (old.get("status") or {}).get("startTime")
    if not (old.get("spec") or {}).get("suspend") or started:
        return old
    template = copy.deepcopy((old.get("spec") or {}).get("template") or {})
    new = (job.get("spec") or {}).get("template") or {}
    new_pod = new.get("spec") or {}
    pod = _taken(template.get("spec"), new_pod, ("nodeSelector", "tolerations", "schedulingGates"))
    if pod is not None:
        affinity = {
            k: v for k, v in (pod.pop("affinity", None) or {}).items() if k != "nodeAffinity"
        }
        if (new_pod.get("affinity") or {}).get("nodeAffinity") is not None:
            affinity["nodeAffinity"] = new_pod["affinity"]["nodeAffinity"]
        if affinity or "affinity" in new_pod:  # an affinity of node affinity only may go
            pod["affinity"] = affinity
        template["spec"] = pod
    meta = _taken(template.get("metadata"), new.get("metadata") or {}, ("labels", "annotations"))
    if meta is not None:
        template["metadata"] = meta
    return {**old, "spec": {**old["spec"], "template": template}}


def _taken(part: dict | None, source: dict, keys: tuple[str, ...]) -> dict | None:
    """``part`` with ``keys`` as ``source`` has them (None: neither has any part)."""
    if part is None and not any(k in source for k in keys):
        return None
    out = {k: v for k, v in (part or {}).items() if k not in keys}
    out.update({k: source[k] for k in keys if k in source})
    return out


def _job_labels(job: dict) -> dict:
    """The selector and pod labels the Job controller's defaulting adds (unless manualSelector)."""
    spec = dict(job.get("spec") or {})
    if spec.get("manualSelector"):
        return job
    uid, name = job["metadata"]["uid"], job["metadata"]["name"]
    labels = {"batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": name,
              "controller-uid": uid, "job-name": name}  # fmt: skip
    template = dict(spec.get("template") or {})
    meta = dict(template.get("metadata") or {})
    meta["labels"] = {**(meta.get("labels") or {}), **labels}
    template["metadata"] = meta
    spec.update(
        template=template, selector={"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    )
    return {**job, "spec": spec}


def validate_custom(
    rt: ResourceType, obj: dict, strict: bool, warnings: list[str], old: dict | None = None
) -> dict:
    """Defaults, pruning, the schema, then the CEL rules (transition rules against ``old``, the
    stored object, on an update)."""
    schema = rt.schema or {}
    obj = oas.apply_defaults(obj, schema)
    obj, dropped = oas.prune(obj, schema, root=True)
    name = obj["metadata"]["name"]
    if dropped and strict:
        raise invalid(rt.kind, name, [f'unknown field "{p}"' for p in dropped], rt.group)
    warnings.extend(f'unknown field "{p}"' for p in dropped)
    errors = oas.validate(obj, schema, root=True) or cel.check_rules(obj, schema, old=old)
    if errors:
        raise invalid(rt.kind, name, errors, rt.group)
    return obj


def crd_status(crd: dict, old: dict | None) -> dict:
    """Names accepted and established; conditions keep their times across later writes."""
    names = crd["spec"]["names"]
    keys = ("plural", "singular", "kind", "listKind", "shortNames", "categories")
    accepted = {k: v for k, v in names.items() if k in keys}
    accepted.setdefault("singular", names["kind"].lower())
    accepted.setdefault("listKind", names["kind"] + "List")
    previous = ((old or {}).get("status") or {}).get("conditions")
    conds = previous or [
        {"type": t, "status": "True", "reason": r, "message": m, "lastTransitionTime": now_iso()}
        for t, r, m in (
            ("NamesAccepted", "NoConflicts", "no conflicts found for CRD names"),
            ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        )
    ]
    return {
        "acceptedNames": accepted,
        "conditions": conds,
        "storedVersions": [v["name"] for v in crd["spec"]["versions"] if v.get("storage")],
    }
