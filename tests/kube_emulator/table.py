"""``Accept: application/json;as=Table;g=meta.k8s.io;v=v1`` (pure): what ``kubectl get`` asks for.

A custom resource's rows are its name and its CRD's ``additionalPrinterColumns`` (JSONPath of the
``.a.b``, ``.a[0]`` and ``.a[?(@.k=="v")].b`` forms; ``date`` columns as an age, as the server's
table convertor shows them); a built-in kind's the name and creation time (the server's default
convertor, not the kind's own columns). Rows carry ``PartialObjectMetadata`` (``includeObject``
other than ``None``).
"""

from __future__ import annotations

import datetime as dt
import re
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


def _columns(rt: ResourceType) -> list[dict]:
    name = {"name": "Name", "type": "string", "format": "name", "priority": 0,
            "description": "Name must be unique within a namespace."}  # fmt: skip
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
        cells += [_cell(json_path(obj, c["jsonPath"]), c["type"]) for c in columns[1:]]
        row: dict[str, Any] = {"cells": cells}
        if include != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": obj["metadata"]}  # fmt: skip
        rows.append(row)
    definitions = [{k: v for k, v in c.items() if k != "jsonPath"} for c in columns]
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta,
            "columnDefinitions": definitions, "rows": rows}  # fmt: skip
