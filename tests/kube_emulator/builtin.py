"""Built-in validation (pure): the part of kube-apiserver's Go validation of built-in kinds that
the operator's objects depend on.

Checked: label keys (qualified names, prefix at most 253) and values (at most 63, alphanumeric
ends); pod templates of Pods, Deployments, StatefulSets, ReplicaSets, DaemonSets, Jobs and
JobSets: unique container names (containers and initContainers together), ``restartPolicy`` of
an init container ``Always`` only, probes and lifecycle hooks on sidecars only (not on an init
container without ``restartPolicy: Always``), unique volume names, mounts (of containers and
init containers) that name a volume (``Not found: "x"``), mount paths given and unique per
container, ``subPath``/``subPathExpr`` relative without ``..`` and not both, unique ports, resource
quantities (``cpu: banana`` is refused, as are limits below requests); a workload's ``selector``
must match its template's labels; a Service's name a DNS-1035 label (``1bad`` is refused).
Messages have the server's ``field: reason`` shape. Quota admission's one check on a pod's shape
(``quota_refusal``): with a ResourceQuota on cpu or memory, every container must request them.

Not checked: the rest of Go validation (probes' contents, security contexts, volume sources, node
affinity, ...); the OpenAPI shape is what ``kubernetes-validate`` checks in the tests.
"""

from __future__ import annotations

import json
import re
from typing import Any

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_QUANTITY = re.compile(
    r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?$"
)
_SUFFIX = {"": 1, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
           "P": 1e15, "E": 1e18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
           "Pi": 2**50, "Ei": 2**60}  # fmt: skip
# (group, plural) -> where the pod template sits
WORKLOADS = {
    ("apps", "deployments"): ("spec", "template"),
    ("apps", "statefulsets"): ("spec", "template"),
    ("apps", "replicasets"): ("spec", "template"),
    ("apps", "daemonsets"): ("spec", "template"),
    ("batch", "jobs"): ("spec", "template"),
}


def label_errors(labels: dict[str, Any], path: str) -> list[str]:
    errors = []
    for key, value in (labels or {}).items():
        prefix, _, name = key.rpartition("/")
        if (
            len(name) > 63
            or not _LABEL_NAME.match(name)
            or (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)))
        ):
            errors.append(f"{path}: Invalid value: {key!r}: name part must be a qualified name")
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            errors.append(
                f"{path}: Invalid value: {value!r}: a valid label must be an empty string or "
                "consist of alphanumeric characters, '-', '_' or '.', and must start and end with "
                "an alphanumeric character, at most 63 characters"
            )
    return errors


def parse_quantity(text: Any) -> float | None:
    """A quantity's value, or None when the server would refuse it."""
    m = _QUANTITY.match(str(text)) if isinstance(text, (str, int, float)) else None
    if m is None:
        return None
    number, _, exponent, suffix = m.group(1), None, m.group(3) or "", ""
    if exponent and exponent[0] in "eE":
        return float(number) * 10 ** int(exponent[1:])
    suffix = exponent
    return float(number) * _SUFFIX[suffix]


def _resources(res: dict[str, Any], path: str) -> list[str]:
    errors, parsed = [], {}
    for part in ("requests", "limits"):
        for name, value in (res.get(part) or {}).items():
            q = parse_quantity(value)
            if q is None:
                errors.append(
                    f"{path}.{part}[{name}]: Invalid value: {value!r}: quantities must match the "
                    "regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
                )
            parsed[(part, name)] = q
    for (part, name), q in parsed.items():
        limit = parsed.get(("limits", name))
        if part == "requests" and q is not None and limit is not None and q > limit:
            errors.append(f"{path}.requests[{name}]: Invalid value: must be less than or equal to {name} limit")  # fmt: skip
    return errors


def _duplicates(values: list[Any]) -> list[int]:
    return [i for i, v in enumerate(values) if v in values[:i]]


def _q(value: Any) -> str:
    """A value as the server quotes it in a message (Go's ``%q`` for strings)."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _descending(value: str, path: str) -> list[str]:
    """``validateLocalDescendingPath``; the server's path has no index (``volumeMounts.subPath``)."""
    errors = []
    if value.startswith("/"):
        errors.append(f"{path}: Invalid value: {_q(value)}: must be a relative path")
    if ".." in value.split("/"):
        errors.append(f"{path}: Invalid value: {_q(value)}: must not contain '..'")
    return errors


def _mount_errors(mounts: list[dict[str, Any]], path: str, volumes: set[str]) -> list[str]:
    """``ValidateVolumeMounts``: the name a volume of the pod, mountPath given and unique,
    subPath and subPathExpr relative without '..', not both."""
    errors, seen = [], set()
    for i, m in enumerate(mounts):
        name, mount_path = m.get("name") or "", m.get("mountPath") or ""
        sub, expr = m.get("subPath") or "", m.get("subPathExpr") or ""
        if not name:
            errors.append(f"{path}[{i}].name: Required value")
        if name not in volumes:
            errors.append(f"{path}[{i}].name: Not found: {_q(name)}")
        if not mount_path:
            errors.append(f"{path}[{i}].mountPath: Required value")
        if mount_path in seen:
            errors.append(f"{path}[{i}].mountPath: Invalid value: {_q(mount_path)}: must be unique")
        seen.add(mount_path)
        errors += _descending(sub, f"{path}.subPath") if sub else []
        if sub and expr:
            errors.append(f"{path}[{i}].subPathExpr: Invalid value: {_q(expr)}: subPathExpr and subPath are mutually exclusive")  # fmt: skip
        errors += _descending(expr, f"{path}.subPathExpr") if expr else []
    return errors


def _container_errors(c: dict[str, Any], path: str, volumes: set[str], init: bool) -> list[str]:
    errors = []
    if init and c.get("restartPolicy") not in (None, "Always"):
        errors.append(f"{path}.restartPolicy: Unsupported value: {c['restartPolicy']!r}")
    if not init and "restartPolicy" in c:
        errors.append(f"{path}.restartPolicy: Forbidden: may not be set for non-init containers")
    if init and c.get("restartPolicy") != "Always":  # a plain init container runs to completion
        errors += [f"{path}.{k}: Forbidden: may not be set for init containers without restartPolicy=Always"
                   for k in ("lifecycle", "livenessProbe", "readinessProbe", "startupProbe") if k in c]  # fmt: skip
    errors += _mount_errors(c.get("volumeMounts") or [], f"{path}.volumeMounts", volumes)
    ports = c.get("ports") or []
    for i in _duplicates([(p.get("containerPort"), p.get("protocol", "TCP")) for p in ports]):
        errors.append(f"{path}.ports[{i}]: Duplicate value: {ports[i]!r}")
    return errors + _resources(c.get("resources") or {}, f"{path}.resources")


def service_name_errors(name: str) -> list[str]:
    """A Service is named by a DNS-1035 label (it becomes a DNS name: a letter first)."""
    if _DNS_1035.fullmatch(name) and len(name) <= 63:
        return []
    return [
        f'metadata.name: Invalid value: "{name}": a DNS-1035 label must consist of lower case '
        "alphanumeric characters or '-', start with an alphabetic character, and end with an "
        "alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is "
        "'[a-z]([-a-z0-9]*[a-z0-9])?')"
    ]


def pod_spec_errors(spec: dict[str, Any], path: str) -> list[str]:
    """The server's refusals of a pod spec, as far as modelled (see the module docstring)."""
    errors = []
    volumes = spec.get("volumes") or []
    names = [v.get("name") for v in volumes]
    for i in _duplicates(names):
        errors.append(f"{path}.volumes[{i}].name: Duplicate value: {names[i]!r}")
    containers = [("containers", c, False) for c in spec.get("containers") or []]
    containers += [("initContainers", c, True) for c in spec.get("initContainers") or []]
    seen: list[str] = []
    counts: dict[str, int] = {}
    for field, c, init in containers:
        i = counts[field] = counts.get(field, -1) + 1
        where = f"{path}.{field}[{i}]"
        name = c.get("name", "")
        if not _DNS_LABEL.match(name) or len(name) > 63:
            errors.append(f"{where}.name: Invalid value: {name!r}: a lowercase RFC 1123 label")
        if name in seen:
            errors.append(f"{where}.name: Duplicate value: {name!r}")
        seen.append(name)
        errors += _container_errors(c, where, set(names), init)
    return errors


def _selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


K8S_VERSION = "1.32.0"


def openapi_errors(obj: dict[str, Any]) -> list[str]:
    """``obj`` against Kubernetes' OpenAPI schema of its kind (kubernetes-validate, strict)."""
    import kubernetes_validate  # only where asked for: it loads the schemas on first use

    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        where = ".".join(map(str, e.path)) or "<root>"
        return [f"{where}: Invalid value: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError:
        return []  # a kind this Kubernetes version's schemas lack
    return []


def object_errors(storage_key: tuple[str, str], obj: dict[str, Any]) -> list[str]:
    """Built-in validation of ``obj`` (a built-in kind), as far as modelled."""
    meta = obj.get("metadata") or {}
    errors = label_errors(meta.get("labels") or {}, "metadata.labels")
    if storage_key == ("", "services"):
        errors += service_name_errors(meta.get("name", ""))
    if storage_key == ("", "pods"):
        return errors + pod_spec_errors(obj.get("spec") or {}, "spec")
    where = WORKLOADS.get(storage_key)
    if where is None:
        return errors
    template = obj.get(where[0], {}).get(where[1]) or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    errors += label_errors(labels, "spec.template.metadata.labels")
    errors += pod_spec_errors(template.get("spec") or {}, "spec.template.spec")
    selector = (obj.get("spec") or {}).get("selector")
    if selector is not None and not _selector_matches(selector, labels):
        errors.append("spec.template.metadata.labels: Invalid value: `selector` does not match template `labels`")  # fmt: skip
    return errors


# A ResourceQuota on cpu or memory makes quota admission require the resource of every container
# of a new pod, init containers and sidecars included (pkg/quota/v1/evaluator/core/pods.go,
# ``Constraints``: "a mistake" kept for compatibility); a limit alone counts as the request (the
# server defaults the request from it before admission).
_QUOTA_NEEDS = {
    "cpu": ("requests", "cpu"),
    "requests.cpu": ("requests", "cpu"),
    "limits.cpu": ("limits", "cpu"),
    "memory": ("requests", "memory"),
    "requests.memory": ("requests", "memory"),
    "limits.memory": ("limits", "memory"),
}


def quota_refusal(pod: dict[str, Any], quotas: list[dict[str, Any]]) -> str | None:
    """Why quota admission refuses to create ``pod`` in a namespace with ``quotas``, if it does
    (the server's ``failed quota: <name>: must specify <resources>``)."""
    spec = pod.get("spec") or {}
    containers = [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    for quota in sorted(quotas, key=lambda q: q["metadata"]["name"]):
        hard = (quota.get("spec") or {}).get("hard") or {}
        missing = set()
        for c in containers:
            res = c.get("resources") or {}
            limits = res.get("limits") or {}
            have = {"requests": {**limits, **(res.get("requests") or {})}, "limits": limits}
            missing |= {r for r in hard if r in _QUOTA_NEEDS
                        and _QUOTA_NEEDS[r][1] not in have[_QUOTA_NEEDS[r][0]]}  # fmt: skip
        if missing:
            return f"failed quota: {quota['metadata']['name']}: must specify {','.join(sorted(missing))}"
    return None
