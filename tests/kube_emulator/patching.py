"""Patch algorithms (pure): JSON merge patch, JSON patch, and strategic merge patch.

Strategic merge patch (built-in kinds only; the server answers 415 for custom resources) merges
maps like a merge patch and merges lists of objects by the merge key of well-known fields
(``containers``/``volumes``/``env`` by ``name``, ``volumeMounts`` by ``mountPath``, ``ports`` by
``containerPort`` or ``port``, ``conditions`` by ``type``, ``ownerReferences`` by ``uid``, ...), with
the ``$patch: delete`` and ``$patch: replace`` directives on list items and maps. Any other list
is replaced as a whole; ``$setElementOrder``, ``$retainKeys`` and ``$deleteFromPrimitiveList``
are ignored (dropped).
"""

from __future__ import annotations

import copy
from typing import Any


class PatchError(ValueError):
    """A malformed patch (400) or a failed JSON-patch ``test`` operation (422)."""

    def __init__(self, message: str, code: int = 422) -> None:
        super().__init__(message)
        self.code = code


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: dicts merge recursively, ``None`` deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


MERGE_KEYS = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "volumes": ("name",),
    "env": ("name",),
    "volumeMounts": ("mountPath",),
    "volumeDevices": ("devicePath",),
    "ports": ("containerPort", "port"),
    "imagePullSecrets": ("name",),
    "conditions": ("type",),
    "ownerReferences": ("uid",),
    "hostAliases": ("ip",),
    "topologySpreadConstraints": ("topologyKey",),
}


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Merge like RFC 7386, but lists under well-known fields merge item by item by key."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return _drop_directives({k: v for k, v in patch.items() if k != "$patch"})
    if patch.get("$patch") == "delete":
        return None
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        elif key in MERGE_KEYS and isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(result[key], value, MERGE_KEYS[key])
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def _merge_list(current: list, patch: list, candidates: tuple[str, ...]) -> list:
    items = [*current, *patch]
    key = next((k for k in candidates if all(isinstance(i, dict) and k in i for i in items)), None)
    if key is None:
        return _drop_directives(patch)
    out = [copy.deepcopy(i) for i in current]
    for item in patch:
        index = next((n for n, o in enumerate(out) if o[key] == item[key]), None)
        if item.get("$patch") == "delete":
            if index is not None:
                out.pop(index)
        elif index is None:
            out.append(_drop_directives(item))
        else:
            out[index] = strategic_merge_patch(out[index], item)
    return out


def _drop_directives(patch: Any) -> Any:
    if isinstance(patch, dict):
        return {k: _drop_directives(v) for k, v in patch.items() if not k.startswith("$")}
    if isinstance(patch, list):
        return [_drop_directives(v) for v in patch]
    return patch


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer {path!r}", 400)
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _resolve(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            raise PatchError(f"path /{'/'.join(parts)} does not exist")
    return doc


def _add(doc: Any, parts: list[str], value: Any, replace: bool) -> Any:
    if not parts:
        return copy.deepcopy(value)
    parent = _resolve(doc, parts[:-1])
    key = parts[-1]
    if isinstance(parent, dict):
        if replace and key not in parent:
            raise PatchError(f"cannot replace missing key {key!r}")
        parent[key] = copy.deepcopy(value)
    elif isinstance(parent, list):
        index = len(parent) if key == "-" else _index(key, len(parent) + (not replace))
        if replace:
            parent[index] = copy.deepcopy(value)
        else:
            parent.insert(index, copy.deepcopy(value))
    else:
        raise PatchError(f"cannot add to a scalar at {key!r}")
    return doc


def _index(key: str, bound: int) -> int:
    if not key.isdigit() or int(key) >= bound:
        raise PatchError(f"invalid list index {key!r}")
    return int(key)


def _remove(doc: Any, parts: list[str]) -> Any:
    if not parts:
        raise PatchError("cannot remove the whole document")
    parent = _resolve(doc, parts[:-1])
    key = parts[-1]
    if isinstance(parent, dict) and key in parent:
        return parent.pop(key)
    if isinstance(parent, list):
        return parent.pop(_index(key, len(parent)))
    raise PatchError(f"path /{'/'.join(parts)} does not exist")


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902. A failed ``test`` raises a 422, as the API server does."""
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be a list of operations", 400)
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"malformed JSON patch operation: {op!r}", 400)
        doc = _apply_op(doc, op)
    return doc


def _apply_op(doc: Any, op: dict) -> Any:
    kind, parts = op["op"], _pointer(op["path"])
    if kind == "test":
        if _resolve(doc, parts) != op.get("value"):
            raise PatchError(f"testing value {op['path']} failed")
        return doc
    if kind in ("add", "replace"):
        return _add(doc, parts, op.get("value"), replace=kind == "replace")
    if kind == "remove":
        _remove(doc, parts)
        return doc
    if kind in ("move", "copy"):
        source = _pointer(op.get("from", ""))
        value = _remove(doc, source) if kind == "move" else copy.deepcopy(_resolve(doc, source))
        return _add(doc, parts, value, replace=False)
    raise PatchError(f"unknown JSON patch operation {kind!r}", 400)
