"""``Accept: application/json;as=Table;g=meta.k8s.io;v=v1`` (pure): what ``kubectl get`` asks for.

A custom resource's rows are its name and its CRD's ``additionalPrinterColumns`` (JSONPath of the
``.a.b``, ``.a[0]`` and ``.a[?(@.k=="v")].b`` forms; ``date`` columns as an age, as the server's
table convertor shows them). Namespaces, Pods, Services, Deployments and Jobs get the columns the
server prints for them (``kubectl get pods``: READY, STATUS, RESTARTS, AGE; wide columns left
out), Events (both groups) LAST SEEN, TYPE, REASON, OBJECT, MESSAGE (the name only wide); other built-in kinds the name and creation time (the server's default convertor). Rows
carry ``PartialObjectMetadata`` (``includeObject`` other than ``None``).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from typing import Any

from .resources import ResourceType

_STEP = re.compile(
    r"""\.([A-Za-z0-9_-]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_-]+)\s*==\s*["']([^"']*)["']\)\]"""
)


def wants_table(accept: str | None) -> bool:
    return bool(accept) and "as=Table" in str(accept)


def json_path(obj: Any, path: str) -> list[Any]:
    """Values of a printer column's JSONPath in ``obj`` (empty when absent)."""
    values, pos = [obj], 0
    for m in _STEP.finditer(path):
        if m.start() != pos:
            raise ValueError(f"unsupported JSONPath {path!r}")
        pos = m.end()
        field, index, key, want = m.groups()
        if field is not None:
            values = [v[field] for v in values if isinstance(v, dict) and field in v]
        elif index is not None:
            values = [v[int(index)] for v in values if isinstance(v, list) and len(v) > int(index)]
        else:
            values = [x for v in values if isinstance(v, list) for x in v
                      if isinstance(x, dict) and str(x.get(key)) == want]  # fmt: skip
    if pos != len(path):
        raise ValueError(f"unsupported JSONPath {path!r}")
    return values


def _age(stamp: str) -> str:
    then = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    seconds = max(0, int((dt.datetime.now(dt.UTC) - then).total_seconds()))
    for unit, size, below in (("s", 1, 120), ("m", 60, 7200), ("h", 3600, 172800)):
        if seconds < below:
            return f"{seconds // size}{unit}"
    return f"{seconds // 86400}d"


def _cell(values: list[Any], kind: str) -> Any:
    if not values:
        return None
    value = values[0]
    if kind == "date" and isinstance(value, str):
        return _age(value)
    return value


def _pod_ready(pod: dict) -> str:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    ready = sum(1 for c in statuses if c.get("ready"))
    return f"{ready}/{len((pod.get('spec') or {}).get('containers') or [])}"


def _pod_status(pod: dict) -> str:
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    return (pod.get("status") or {}).get("phase") or "Pending"


def _restarts(pod: dict) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return sum(int(c.get("restartCount") or 0) for c in statuses)


def _job_status(job: dict) -> str:
    conditions = (job.get("status") or {}).get("conditions") or []
    done = [c["type"] for c in conditions if c.get("status") == "True"]
    for kind in ("Complete", "Failed", "Suspended"):
        if kind in done:
            return kind
    return "Running"


def _ports(svc: dict) -> str:
    ports = (svc.get("spec") or {}).get("ports") or []
    return ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in ports) or "<none>"


def _status(obj: dict) -> dict:
    return obj.get("status") or {}


# a built-in kind's columns after NAME, as the server's printers name them, each with its cell
_Cell = Callable[[dict], Any]
BUILTIN: dict[tuple[str, str], list[tuple[str, str, _Cell]]] = {
    ("", "namespaces"): [("Status", "string", lambda o: _status(o).get("phase", ""))],
    ("", "pods"): [("Ready", "string", _pod_ready), ("Status", "string", _pod_status),
                   ("Restarts", "string", _restarts)],
    ("", "services"): [("Type", "string", lambda o: (o.get("spec") or {}).get("type", "ClusterIP")),
                       ("Cluster-IP", "string",
                        lambda o: (o.get("spec") or {}).get("clusterIP") or "<none>"),
                       ("External-IP", "string", lambda o: "<none>"),
                       ("Port(s)", "string", _ports)],
    ("apps", "deployments"): [
        ("Ready", "string", lambda o: f"{_status(o).get('readyReplicas', 0)}/"
                                      f"{(o.get('spec') or {}).get('replicas', 1)}"),
        ("Up-to-date", "integer", lambda o: _status(o).get("updatedReplicas", 0)),
        ("Available", "integer", lambda o: _status(o).get("availableReplicas", 0))],
    ("batch", "jobs"): [
        ("Status", "string", _job_status),
        ("Completions", "string", lambda o: f"{_status(o).get('succeeded', 0)}/"
                                            f"{(o.get('spec') or {}).get('completions', 1)}")],
}  # fmt: skip


def _last_seen(event: dict) -> str:
    stamp = event.get("lastTimestamp") or event.get("eventTime")
    stamp = stamp or event["metadata"].get("creationTimestamp")
    return _age(stamp.split(".")[0].rstrip("Z") + "Z") if stamp else "<unknown>"


def _involved(event: dict) -> str:
    ref = event.get("involvedObject") or event.get("regarding") or {}
    return f"{str(ref.get('kind', '')).lower()}/{ref.get('name', '')}"


# an Event's row leads with when and what (`kubectl get events`); its name only in `-o wide`
EVENTS: list[tuple[str, str, _Cell]] = [
    ("Last Seen", "string", _last_seen), ("Type", "string", lambda e: e.get("type", "")),
    ("Reason", "string", lambda e: e.get("reason", "")), ("Object", "string", _involved),
    ("Message", "string", lambda e: e.get("message") or e.get("note") or ""),
]  # fmt: skip


def _own(rt: ResourceType) -> list[tuple[str, str, _Cell]] | None:
    if rt.custom:
        return None
    return EVENTS if rt.plural == "events" else BUILTIN.get(rt.storage_key)


def _columns(rt: ResourceType) -> list[dict]:
    name = {"name": "Name", "type": "string", "format": "name", "priority": 0,
            "description": "Name must be unique within a namespace."}  # fmt: skip
    if _own(rt) is EVENTS:
        own = [{"name": n, "type": t, "format": "", "priority": 0, "description": n}
               for n, t, _ in EVENTS]  # fmt: skip
        return [{**name, "priority": 1}, *own]
    if not rt.custom and rt.storage_key in BUILTIN:
        own = [{"name": n, "type": t, "format": "", "priority": 0, "description": n}
               for n, t, _ in BUILTIN[rt.storage_key]]  # fmt: skip
        age = {"name": "Age", "type": "string", "format": "", "priority": 0,
               "description": "CreationTimestamp of the object."}  # fmt: skip
        return [name, *own, age]
    if not rt.custom:
        created = {"name": "Created At", "type": "date", "format": "", "priority": 0,
                   "description": "CreationTimestamp of the object.", "jsonPath": ".metadata.creationTimestamp"}  # fmt: skip
        return [name, created]
    extra = [{"name": c["name"], "type": c.get("type", "string"), "format": c.get("format", ""),
              "priority": c.get("priority", 0), "description": c.get("description", ""),
              "jsonPath": c["jsonPath"]} for c in rt.columns]  # fmt: skip
    return [name, *extra]


def table(rt: ResourceType, items: list[dict], meta: dict, include: str | None) -> dict:
    columns = _columns(rt)
    rows = []
    for obj in items:
        cells = [obj["metadata"]["name"]]
        if _own(rt) is EVENTS:
            cells += [cell(obj) for _, _, cell in EVENTS]
        elif not rt.custom and rt.storage_key in BUILTIN:
            cells += [cell(obj) for _, _, cell in BUILTIN[rt.storage_key]]
            stamp = obj["metadata"].get("creationTimestamp")
            cells.append(_age(stamp) if stamp else "<unknown>")
        else:
            cells += [_cell(json_path(obj, c["jsonPath"]), c["type"]) for c in columns[1:]]
        row: dict[str, Any] = {"cells": cells}
        if include != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": obj["metadata"]}  # fmt: skip
        rows.append(row)
    definitions = [{k: v for k, v in c.items() if k != "jsonPath"} for c in columns]
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta,
            "columnDefinitions": definitions, "rows": rows}  # fmt: skip
