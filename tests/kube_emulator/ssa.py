"""Server-side apply and field ownership (pure), a documented subset of the real algorithm.

What is emulated:

* Ownership is tracked per ``(manager, operation, subresource)`` entry, stored in the object's
  ``metadata.managedFields`` as ``FieldsV1`` (``{"f:spec": {"f:replicas": {}}}``), like the server.
* Owned fields are *leaf paths* through nested maps and through the items of ``listType=map``
  lists, which are addressed by their keys as the server does (``k:{"name":"vllm"}``): the
  lists of the built-in kinds named in ``MAP_LISTS`` (containers and volumes by name, env by name,
  volumeMounts by mountPath, ...). An applier owns, merges and removes the items it applied, so
  another manager's container, env var or volume survives it. Other lists and scalars are atomic
  leaves: owned and replaced as a whole.
* Apply (``application/apply-patch+yaml``): creates the object if absent; merges the applied
  configuration into the object; a field the manager applied before but omits now is removed
  unless another manager also owns it; a field owned by another manager whose current value
  differs from the applied one is a 409 conflict listing the fields, unless ``force=true``, which
  takes ownership away from the other managers. Equal values become shared ownership.
* Update operations (PUT, merge/JSON/strategic patch) give the writing manager ownership of the
  leaf paths whose value changed and take those paths away from every other manager, so an
  applier that wants a field back later conflicts (the "one writer per field" rule).

Not emulated: map lists of custom resources (``x-kubernetes-list-map-keys`` in a CRD schema),
``listType=set``, unions, the ``.`` self entries, version conversion of field sets, and
``managedFields`` resets by sending an empty list.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

Path = tuple[str, ...]
EntryKey = tuple[str, str, str]  # (manager, operation, subresource)
_MISSING = object()
_IGNORED_ROOTS = {("apiVersion",), ("kind",)}
_IGNORED_META = {
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
}


@dataclass
class ApplyConflict(Exception):
    """The applied configuration touches fields another manager owns with a different value."""

    conflicts: list[tuple[Path, str]]

    def message(self) -> str:
        parts = [f'conflict with "{m}": .{".".join(p)}' for p, m in self.conflicts]
        return f"Apply failed with {len(parts)} conflict(s): " + "; ".join(parts)


# listType=map lists of the built-in kinds, by field name: their map keys (and key defaults).
MAP_LISTS: dict[str, dict[str, Any]] = {
    "containers": {"name": None},
    "initContainers": {"name": None},
    "ephemeralContainers": {"name": None},
    "env": {"name": None},
    "volumes": {"name": None},
    "volumeMounts": {"mountPath": None},
    "imagePullSecrets": {"name": None},
    "conditions": {"type": None},
}


def _item_key(field: str, item: Any) -> str | None:
    """``k:{...}`` of an item of a map list, or None when the list is atomic (or keyless)."""
    keys = MAP_LISTS.get(field)
    if keys is None or not isinstance(item, dict):
        return None
    values = {k: item.get(k, default) for k, default in keys.items()}
    if any(v is None for v in values.values()):
        return None
    return "k:" + json.dumps(values, separators=(",", ":"), sort_keys=True)


def duplicate_keys(obj: Any, path: str = "") -> list[str]:
    """Items of a built-in kind's map list that repeat a key: the server refuses such an applied
    configuration ("duplicate entries for key")."""
    errors: list[str] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            sub = f"{path}.{key}"
            if isinstance(value, list) and key in MAP_LISTS:
                keys = [_item_key(key, item) for item in value]
                errors += [f"{sub}: duplicate entries for key [{keys[i][2:]}]" for i in range(len(keys))
                           if keys[i] is not None and keys[i] in keys[:i]]  # fmt: skip
            errors += duplicate_keys(value, sub)
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            errors += duplicate_keys(item, f"{path}[{i}]")
    return errors


def _keyed(field: str, value: Any) -> dict[str, Any] | None:
    """A map list as {k:...: item} (in order), or None when ``value`` is not one."""
    if not isinstance(value, list) or not value:
        return None
    keys = [_item_key(field, item) for item in value]
    if None in keys or len(set(keys)) != len(keys):
        return None
    return dict(zip(keys, value, strict=True))  # type: ignore[arg-type]


def leaf_paths(obj: Any, prefix: Path = ()) -> set[Path]:
    """Paths of the leaves of nested maps and map lists (other lists, scalars and empty maps are
    leaves)."""
    keyed = _keyed(prefix[-1], obj) if prefix else None
    if keyed is not None:
        obj = keyed
    if not isinstance(obj, dict) or (not obj and prefix):
        return {prefix}
    out: set[Path] = set()
    for key, value in obj.items():
        out |= leaf_paths(value, (*prefix, key))
    return {p for p in out if _tracked(p)}


def _tracked(path: Path) -> bool:
    if path in _IGNORED_ROOTS or not path:
        return False
    return not (path[0] == "metadata" and (len(path) < 2 or path[1] in _IGNORED_META))


def get_path(obj: Any, path: Path) -> Any:
    field = ""
    for key in path:
        if isinstance(obj, list) and key.startswith("k:"):
            obj = (_keyed(field, obj) or {}).get(key, _MISSING)
            if obj is _MISSING:
                return _MISSING
        elif not isinstance(obj, dict) or key not in obj:
            return _MISSING
        else:
            obj = obj[key]
        field = key
    return obj


def _child(parent: Any, field: str, key: str) -> Any:
    if isinstance(parent, dict):
        return parent.get(key)
    if isinstance(parent, list):
        return next((i for i in parent if _item_key(field, i) == key), None)
    return None


def _remove(parent: Any, field: str, key: str) -> None:
    if isinstance(parent, dict):
        parent.pop(key, None)
    elif isinstance(parent, list):
        parent[:] = [i for i in parent if _item_key(field, i) != key]


def _delete_path(obj: dict, path: Path) -> None:
    """Remove a leaf (a map entry; a map list's item with its key field), then the maps and lists
    it emptied."""
    if len(path) >= 3 and path[-2].startswith("k:") and path[-1] in MAP_LISTS.get(path[-3], {}):
        path = path[:-1]  # an item without its key is no item: it goes as a whole
    parents: list[Any] = [obj]  # parents[d] holds path[d]
    for d, key in enumerate(path[:-1]):
        nxt = _child(parents[-1], path[d - 1] if d else "", key)
        if not isinstance(nxt, (dict, list)):
            return
        parents.append(nxt)
    for d in range(len(path) - 1, -1, -1):
        if d < len(path) - 1 and parents[d + 1]:
            break  # the container below still holds other fields
        _remove(parents[d], path[d - 1] if d else "", path[d])


def _overlaps(a: Path, b: Path) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def deep_merge(base: Any, overlay: Any, field: str = "") -> Any:
    """``overlay`` merged into ``base``: maps by key, map lists by item key (base's order, new
    items after), anything else replaced."""
    old, new = _keyed(field, base), _keyed(field, overlay)
    if old is not None and new is not None:
        merged = {k: deep_merge(old.get(k), v) for k, v in new.items()}
        return [merged.get(k, v) for k, v in old.items()] + [
            v for k, v in merged.items() if k not in old
        ]
    if not isinstance(base, dict) or not isinstance(overlay, dict):
        return copy.deepcopy(overlay)
    out = dict(base)
    for key, value in overlay.items():
        out[key] = deep_merge(base.get(key), value, key)
    return out


def fields_v1(paths: set[Path]) -> dict:
    tree: dict = {}
    for path in sorted(paths):
        node = tree
        for key in path:
            node = node.setdefault(key if key.startswith("k:") else f"f:{key}", {})
    return tree


def paths_from_fields_v1(tree: dict, prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for key, sub in tree.items():
        if not key.startswith(("f:", "k:")):
            continue
        path = (*prefix, key[2:] if key.startswith("f:") else key)
        out |= paths_from_fields_v1(sub, path) if sub else {path}
    return out


def read_entries(obj: dict) -> dict[EntryKey, set[Path]]:
    entries: dict[EntryKey, set[Path]] = {}
    for mf in (obj.get("metadata") or {}).get("managedFields") or []:
        key = (mf.get("manager", ""), mf.get("operation", "Update"), mf.get("subresource", ""))
        entries[key] = paths_from_fields_v1(mf.get("fieldsV1") or {})
    return entries


def write_entries(obj: dict, entries: dict[EntryKey, set[Path]], api_version: str) -> None:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    rendered = []
    for (manager, operation, sub), paths in sorted(entries.items()):
        if not paths:
            continue
        entry = {
            "manager": manager,
            "operation": operation,
            "apiVersion": api_version,
            "time": now,
            "fieldsType": "FieldsV1",
            "fieldsV1": fields_v1(paths),
        }
        if sub:
            entry["subresource"] = sub
        rendered.append(entry)
    obj.setdefault("metadata", {})["managedFields"] = rendered


def _find_conflicts(
    current: dict, applied: dict, mine: EntryKey, entries: dict[EntryKey, set[Path]]
) -> list[tuple[Path, str]]:
    conflicts = []
    for path in sorted(leaf_paths(applied)):
        for key, owned in entries.items():
            if key[0] == mine[0]:
                continue
            for q in owned:
                deeper = q if len(q) > len(path) else path
                if _overlaps(path, q) and get_path(current, deeper) != get_path(applied, deeper):
                    conflicts.append((path, key[0]))
                    break
    return conflicts


def apply(
    current: dict, applied: dict, mine: EntryKey, force: bool
) -> tuple[dict, dict[EntryKey, set[Path]]]:
    """Apply ``applied`` as manager ``mine``; return the new object and ownership entries."""
    entries = read_entries(current)
    conflicts = _find_conflicts(current, applied, mine, entries)
    if conflicts and not force:
        raise ApplyConflict(conflicts)
    new_paths = leaf_paths(applied)
    if force:  # the conflicting fields change hands; equal values stay shared
        _disown(entries, {p for p, _ in conflicts}, keep=mine)
    result = deep_merge(current, applied)
    for path in entries.get(mine, set()) - new_paths:
        still_owned = any(
            _overlaps(path, q) for k, owned in entries.items() if k != mine for q in owned
        )
        if not still_owned and not any(_overlaps(path, p) for p in new_paths):
            _delete_path(result, path)
    entries[mine] = new_paths
    return result, entries


def _disown(entries: dict[EntryKey, set[Path]], paths: set[Path], keep: EntryKey) -> None:
    for key, owned in entries.items():
        if key != keep:
            entries[key] = {q for q in owned if not any(_overlaps(q, p) for p in paths)}


def changed_paths(old: dict, new: dict) -> set[Path]:
    """Leaf paths whose value differs between two objects (added, changed or removed)."""
    paths = leaf_paths(old) | leaf_paths(new)
    return {p for p in paths if get_path(old, p) != get_path(new, p)}


def record_update(old: dict, new: dict, mine: EntryKey) -> dict[EntryKey, set[Path]]:
    """Ownership after a non-apply write by ``mine``: changed fields move to the writer."""
    entries = read_entries(old)
    changed = changed_paths(old, new)
    present = {p for p in changed if get_path(new, p) is not _MISSING}
    _disown(entries, changed, keep=mine)
    entries[mine] = (entries.get(mine, set()) | present) & leaf_paths(new)
    return entries
