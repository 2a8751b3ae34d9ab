"""Server-side apply and field ownership (pure), a documented subset of the real algorithm.

What is emulated:

* Ownership is tracked per ``(manager, operation, subresource)`` entry, stored in the object's
  ``metadata.managedFields`` as ``FieldsV1`` (``{"f:spec": {"f:replicas": {}}}``), like the server.
* Owned fields are *leaf paths* through nested maps. Lists and scalars are atomic leaves: a list
  is owned and replaced as a whole (the real server merges lists with merge keys, e.g. containers
  by name, granularly; here the last applier of a list owns all of it).
* Apply (``application/apply-patch+yaml``): creates the object if absent; merges the applied
  configuration into the object; a field the manager applied before but omits now is removed
  unless another manager also owns it; a field owned by another manager whose current value
  differs from the applied one is a 409 conflict listing the fields, unless ``force=true``, which
  takes ownership away from the other managers. Equal values become shared ownership.
* Update operations (PUT, merge/JSON/strategic patch) give the writing manager ownership of the
  leaf paths whose value changed and take those paths away from every other manager, so an
  applier that wants a field back later conflicts (the "one writer per field" rule).

Not emulated: ``x-kubernetes-list-type``/map keys, unions, the ``.`` self entries, version
conversion of field sets, and ``managedFields`` resets by sending an empty list.
"""

from __future__ import annotations

import copy
import datetime as dt
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


def leaf_paths(obj: Any, prefix: Path = ()) -> set[Path]:
    """Paths of the leaves of nested maps (lists, scalars and empty maps are leaves)."""
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
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return _MISSING
        obj = obj[key]
    return obj


def _delete_path(obj: dict, path: Path) -> None:
    parents = [obj]
    for key in path[:-1]:
        nxt = parents[-1].get(key)
        if not isinstance(nxt, dict):
            return
        parents.append(nxt)
    parents[-1].pop(path[-1], None)
    for depth in range(len(path) - 1, 0, -1):  # drop maps emptied by the removal
        if parents[depth]:
            break
        parents[depth - 1].pop(path[depth - 1], None)


def _overlaps(a: Path, b: Path) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def deep_merge(base: Any, overlay: Any) -> Any:
    if not isinstance(base, dict) or not isinstance(overlay, dict):
        return copy.deepcopy(overlay)
    out = dict(base)
    for key, value in overlay.items():
        out[key] = deep_merge(base.get(key), value)
    return out


def fields_v1(paths: set[Path]) -> dict:
    tree: dict = {}
    for path in sorted(paths):
        node = tree
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return tree


def paths_from_fields_v1(tree: dict, prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for key, sub in tree.items():
        if not key.startswith("f:"):
            continue
        path = (*prefix, key[2:])
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
    if force:
        _disown(entries, new_paths, keep=mine)
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
