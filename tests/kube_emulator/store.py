"""The object store: resourceVersion, generation, status separation, history and watchers.

All state sits behind one re-entrant lock, so the HTTP handlers (on the server's event loop) and
the Python API used by tests and simulated controllers (on any thread) see one consistent order
of changes. Objects handed out are copies; stored objects are never mutated in place, which lets
the bounded history keep references to them.
"""

from __future__ import annotations

import contextvars
import copy
import random
import threading
import uuid
from collections import deque
from collections.abc import Callable

from . import builtin, ssa
from .admission import CRD_KEY, NS_KEY, admit, check_name, now_iso
from .errors import ApiError, conflict, invalid, not_found
from .resources import BUILTINS, ResourceType
from .selectors import Predicate
from .watching import Change, Watcher

POD_KEY = ("", "pods")
QUOTA_KEY = ("", "resourcequotas")

_SERVER_META = ("uid", "creationTimestamp", "deletionTimestamp", "generation", "selfLink")


def _meta(obj: dict) -> dict:
    return obj.setdefault("metadata", {})


def _without_bookkeeping(obj: dict) -> dict:
    out = dict(obj)
    meta = dict(out.get("metadata") or {})
    meta.pop("resourceVersion", None)
    meta.pop("managedFields", None)
    out["metadata"] = meta
    return out


def _ownership(obj: dict) -> list:
    """managedFields without their timestamps: a write that only changes who owns what (a second
    applier sharing a field) is persisted, as the server does; a repeated one is a no-op."""
    entries = (obj.get("metadata") or {}).get("managedFields") or []
    return sorted(repr({k: v for k, v in e.items() if k != "time"}) for e in entries)


def _spec_part(obj: dict, status_is_separate: bool) -> dict:
    drop = {"metadata", "status"} if status_is_separate else {"metadata"}
    return {k: v for k, v in obj.items() if k not in drop}


_REQUEST: contextvars.ContextVar[dict | None] = contextvars.ContextVar("request", default=None)


def _dry_run() -> bool:
    return bool((_REQUEST.get() or {}).get("dry"))


class Store:
    def __init__(self, history_limit: int = 10_000) -> None:
        self.lock = threading.RLock()
        self.rv = 0
        self.compacted_rv = 0
        self.history: deque[Change] = deque(maxlen=history_limit)
        self.types: dict[tuple[str, str, str], ResourceType] = {}
        self.objects: dict[tuple[str, str], dict[tuple[str, str], dict]] = {}
        self.uids: dict[str, tuple[tuple[str, str], tuple[str, str]]] = {}
        self.watchers: list[Watcher] = []
        self.strict_fields = False
        self.openapi_validate = False
        for rt in BUILTINS:
            self._register(rt)
        for ns in ("default", "kube-system", "kube-public"):
            self.create(self.type_for("", "v1", "namespaces"), None, {"metadata": {"name": ns}})

    def begin_request(self, field_validation: str | None, dry_run: str | None = None) -> None:
        """Set the ``fieldValidation`` (Strict, Warn, Ignore) and ``dryRun`` of the current HTTP
        request. A dry run (``dryRun=All``) goes through admission and validation and answers
        what would be stored, but stores, deletes, emits and registers nothing.

        A context variable: each aiohttp request runs in its own task, so concurrent requests
        never see each other's mode or warnings; Python-side writes use the emulator default.
        """
        if field_validation not in (None, "", "Strict", "Warn", "Ignore"):
            raise ApiError(400, f"invalid fieldValidation {field_validation!r}")
        if dry_run not in (None, "", "All"):
            raise ApiError(400, f"Invalid dryRun value: {dry_run!r}: supported values: All")
        _REQUEST.set({"mode": field_validation or None, "warnings": [], "dry": bool(dry_run)})

    def take_warnings(self) -> list[str]:
        request = _REQUEST.get() or {}
        return list(request.get("warnings") or [])

    # ----- types -----------------------------------------------------------------------------

    def _register(self, rt: ResourceType) -> None:
        self.types[(rt.group, rt.version, rt.plural)] = rt
        self.objects.setdefault(rt.storage_key, {})

    def type_for(self, group: str, version: str, plural: str) -> ResourceType:
        rt = self.types.get((group, version, plural))
        if rt is None:
            raise ApiError(
                404,
                f"the server could not find the requested resource ({group}/{version} {plural})",
            )
        return rt

    def type_by_kind(self, api_version: str, kind: str) -> ResourceType:
        group, _, version = api_version.rpartition("/")
        with self.lock:
            for rt in self.types.values():
                if (rt.group, rt.version, rt.kind) == (group, version, kind):
                    return rt
        raise ApiError(404, f"no kind {kind!r} is registered for version {api_version!r}")

    # ----- reads -----------------------------------------------------------------------------

    def _view(self, rt: ResourceType, obj: dict) -> dict:
        out = copy.deepcopy(obj)
        out["apiVersion"], out["kind"] = rt.api_version, rt.kind
        return out

    def _current(self, rt: ResourceType, ns: str | None, name: str) -> dict:
        obj = self.objects[rt.storage_key].get((ns or "", name))
        if obj is None:
            raise not_found(rt.plural, name, rt.group)
        return obj

    def get(self, rt: ResourceType, ns: str | None, name: str) -> dict:
        with self.lock:
            return self._view(rt, self._current(rt, ns, name))

    def list(
        self, rt: ResourceType, ns: str | None, predicate: Predicate
    ) -> tuple[list[dict], int]:
        with self.lock:
            items = [
                self._view(rt, o)
                for (ons, _), o in sorted(self.objects[rt.storage_key].items())
                if (ns is None or ons == ns) and predicate(o)
            ]
            return items, self.rv

    def list_at(
        self, rt: ResourceType, ns: str | None, predicate: Predicate, rv: int
    ) -> tuple[list[dict], int]:
        """The list as it was at ``rv`` (``resourceVersionMatch=Exact``): the current objects
        with every retained change after ``rv`` undone. A version older than the history is
        410 Gone, as etcd's compaction makes it; one not yet written is 504, as the server
        answers after waiting for it."""
        with self.lock:
            if rv < self.compacted_rv:
                raise ApiError(
                    410, f"too old resource version: {rv} ({self.compacted_rv})", "Expired"
                )
            if rv > self.rv:
                raise ApiError(504, f"Too large resource version: {rv}, current: {self.rv}",
                               "Timeout")  # fmt: skip
            objects = dict(self.objects[rt.storage_key])
            for change in reversed(self.history):
                if change.rv <= rv:
                    break
                if change.storage_key != rt.storage_key:
                    continue
                meta = change.obj["metadata"]
                key = (meta.get("namespace") or "", meta["name"])
                if change.type == "ADDED":
                    objects.pop(key, None)
                else:  # MODIFIED: the old object; DELETED: the object as it was deleted
                    objects[key] = change.old if change.type == "MODIFIED" else change.obj
            items = [
                self._view(rt, o)
                for (ons, _), o in sorted(objects.items())
                if o is not None and (ns is None or ons == ns) and predicate(o)
            ]
            return items, rv

    # ----- writes ----------------------------------------------------------------------------

    def _emit(self, rt: ResourceType, kind: str, obj: dict, old: dict | None) -> None:
        if _dry_run():
            return
        if kind != "DELETED":
            self.rv += 1
            _meta(obj)["resourceVersion"] = str(self.rv)
        else:
            self.rv += 1
            obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.rv)}}
        change = Change(self.rv, rt.storage_key, kind, obj, old)
        if len(self.history) == self.history.maxlen:
            self.compacted_rv = self.history[0].rv
        self.history.append(change)
        for w in self.watchers:
            if w.storage_key == rt.storage_key:
                w.offer(change)

    def _store(self, rt: ResourceType, obj: dict) -> None:
        if _dry_run():
            return
        meta = obj["metadata"]
        self.objects[rt.storage_key][(meta.get("namespace", ""), meta["name"])] = obj
        self.uids[meta["uid"]] = (rt.storage_key, (meta.get("namespace", ""), meta["name"]))

    def _remove(self, rt: ResourceType, obj: dict) -> None:
        if _dry_run():
            return
        meta = obj["metadata"]
        self.objects[rt.storage_key].pop((meta.get("namespace", ""), meta["name"]), None)
        self.uids.pop(meta["uid"], None)
        self._emit(rt, "DELETED", obj, None)
        if rt.storage_key == CRD_KEY:
            for key in [
                k
                for k, t in self.types.items()
                if t.custom and f"{t.plural}.{t.group}" == meta["name"]
            ]:
                del self.types[key]

    def _check_namespace(self, rt: ResourceType, ns: str | None, body_ns: str | None) -> None:
        if not rt.namespaced:
            return
        if ns is None:
            raise ApiError(400, "the namespace must be given for a namespaced resource")
        if body_ns not in (None, ns):
            raise ApiError(
                400,
                "the namespace of the provided object does not match the namespace sent on the request",
            )
        nso = self.objects[NS_KEY].get(("", ns))
        if nso is None:
            raise not_found("namespaces", ns)
        if nso["metadata"].get("deletionTimestamp"):
            raise ApiError(
                403,
                f"unable to create new content in namespace {ns} because it is being terminated",
            )

    def _name(self, rt: ResourceType, meta: dict) -> str:
        if not meta.get("name") and meta.get("generateName"):
            suffix = "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
            meta["name"] = meta["generateName"] + suffix
        check_name(rt, meta.get("name") or "")
        return meta["name"]

    def create(
        self,
        rt: ResourceType,
        ns: str | None,
        body: dict,
        manager: str = "emulator",
        operation: str = "Update",
    ) -> dict:
        with self.lock:
            obj = copy.deepcopy(body)
            meta = _meta(obj)
            self._check_namespace(rt, ns, meta.get("namespace"))
            name = self._name(rt, meta)
            if rt.namespaced:
                meta["namespace"] = ns
            if (ns or "", name) in self.objects[rt.storage_key]:
                raise ApiError(
                    409,
                    f'{rt.plural}{"." + rt.group if rt.group else ""} "{name}" already exists',
                    "AlreadyExists",
                    {"name": name, "group": rt.group, "kind": rt.plural},
                )
            for key in (
                *_SERVER_META,
                "resourceVersion",
                "managedFields",
                "deletionGracePeriodSeconds",
            ):
                meta.pop(key, None)
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_iso(), generation=1)
            if rt.status:
                obj.pop("status", None)
            sent = ssa.leaf_paths(obj)  # what the client sent, before server defaulting
            obj = self._admit(rt, obj, None)
            if rt.storage_key == POD_KEY:
                self._check_quota(ns or "", obj)
            key = (manager, operation, "")
            # An applier owns only what it applied; an updater also owns what defaulting added.
            owned = sent & ssa.leaf_paths(obj) if operation == "Apply" else ssa.leaf_paths(obj)
            ssa.write_entries(obj, {key: owned}, rt.api_version)
            self._store(rt, obj)
            self._emit(rt, "ADDED", obj, None)
            return self._view(rt, obj)

    def _check_quota(self, ns: str, pod: dict) -> None:
        """Quota admission's refusal of a pod that lacks a request its namespace's quota tracks."""
        quotas = [q for (q_ns, _), q in self.objects.get(QUOTA_KEY, {}).items() if q_ns == ns]
        refusal = builtin.quota_refusal(pod, quotas)
        if refusal is not None:
            name = pod["metadata"]["name"]
            raise ApiError(403, f'pods "{name}" is forbidden: {refusal}', "Forbidden",
                           {"name": name, "kind": "pods"})  # fmt: skip

    def _admit(self, rt: ResourceType, obj: dict, old: dict | None) -> dict:
        request = _REQUEST.get() or {}
        mode = request.get("mode") or ("Strict" if self.strict_fields else "Warn")
        warnings: list[str] = []
        obj, served = admit(rt, obj, old, mode == "Strict", warnings, self.openapi_validate)
        if mode == "Warn" and "warnings" in request:
            request["warnings"].extend(warnings)
        for t in served if not _dry_run() else []:
            self._register(t)
        return obj

    def write(
        self,
        rt: ResourceType,
        ns: str | None,
        name: str,
        mutate: Callable[[dict], dict],
        how: WriteOptions,
    ) -> dict:
        """Read-modify-write one object: the single path of PUT, PATCH and apply."""
        with self.lock:
            old = self._current(rt, ns, name)
            candidate = mutate(copy.deepcopy(old))
            if not isinstance(candidate, dict):
                raise ApiError(400, "the patched object is not a JSON object")
            expected = (candidate.get("metadata") or {}).get("resourceVersion")
            if how.check_rv and expected and expected != old["metadata"]["resourceVersion"]:
                raise conflict(rt.plural, name, rt.group)
            new = self._merge_scopes(rt, old, candidate, how.subresource)
            return self._commit(rt, old, new, how)

    def _merge_scopes(self, rt: ResourceType, old: dict, candidate: dict, sub: str) -> dict:
        if sub == "status":
            new = copy.deepcopy(old)
            if "status" in candidate:
                new["status"] = candidate["status"]
            else:
                new.pop("status", None)
            return new
        new = candidate
        meta = _meta(new)
        for key in _SERVER_META:
            if key in old["metadata"]:
                meta[key] = old["metadata"][key]
            else:
                meta.pop(key, None)
        meta["name"] = old["metadata"]["name"]
        if rt.namespaced:
            meta["namespace"] = old["metadata"]["namespace"]
        if rt.status:
            new.pop("status", None)
            if "status" in old:
                new["status"] = old["status"]
        return new

    def _commit(self, rt: ResourceType, old: dict, new: dict, how: WriteOptions) -> dict:
        new = self._admit(rt, new, old)
        was_deleting = bool(old["metadata"].get("deletionTimestamp"))
        added = set(new["metadata"].get("finalizers") or []) - set(
            old["metadata"].get("finalizers") or []
        )
        if was_deleting and added:
            raise invalid(
                rt.kind,
                new["metadata"]["name"],
                [
                    "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted"
                ],
                rt.group,
            )
        if how.entries is not None:
            ssa.write_entries(new, how.entries, rt.api_version)
        else:
            entries = ssa.record_update(old, new, (how.manager, "Update", how.subresource))
            ssa.write_entries(new, entries, rt.api_version)
        if _without_bookkeeping(new) == _without_bookkeeping(old) and _ownership(new) == _ownership(
            old
        ):
            return self._view(rt, old)  # a no-op write: no new resourceVersion, no event
        if _spec_part(new, rt.status) != _spec_part(old, rt.status):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        if was_deleting and not _blocked(rt, new):
            self._remove(rt, new)
            return self._view(rt, new)
        self._store(rt, new)
        self._emit(rt, "MODIFIED", new, old)
        return self._view(rt, new)

    def delete(self, rt: ResourceType, ns: str | None, name: str, options: dict) -> dict:
        with self.lock:
            old = self._current(rt, ns, name)
            pre = options.get("preconditions") or {}
            if pre.get("uid") not in (None, old["metadata"]["uid"]) or pre.get(
                "resourceVersion"
            ) not in (None, old["metadata"]["resourceVersion"]):
                raise conflict(rt.plural, name, rt.group)
            policy = options.get("propagationPolicy") or "Background"
            if policy not in ("Background", "Foreground", "Orphan"):
                raise ApiError(400, f"unsupported propagationPolicy {policy!r}")
            if policy == "Orphan" and not _dry_run():
                self._orphan(old["metadata"]["uid"])
            new = copy.deepcopy(old)
            meta = new["metadata"]
            finalizers = list(meta.get("finalizers") or [])
            if policy == "Foreground" and "foregroundDeletion" not in finalizers:
                finalizers.append("foregroundDeletion")
            if finalizers:
                meta["finalizers"] = finalizers
            if rt.storage_key == NS_KEY:
                new.setdefault("status", {})["phase"] = "Terminating"
            if not _blocked(rt, new):
                self._remove(rt, new)
                return self._view(rt, new)
            if meta.get("deletionTimestamp") and finalizers == list(
                old["metadata"].get("finalizers") or []
            ):
                return self._view(rt, old)
            meta.update(
                deletionTimestamp=meta.get("deletionTimestamp") or now_iso(),
                deletionGracePeriodSeconds=0,
            )
            self._store(rt, new)
            self._emit(rt, "MODIFIED", new, old)
            return self._view(rt, new)

    def _orphan(self, owner_uid: str) -> None:
        for rt, obj in self.dependents(owner_uid):
            refs = [r for r in obj["metadata"]["ownerReferences"] if r.get("uid") != owner_uid]
            self.write(
                rt,
                obj["metadata"].get("namespace"),
                obj["metadata"]["name"],
                lambda o, refs=refs: {**o, "metadata": {**o["metadata"], "ownerReferences": refs}},
                WriteOptions(manager="garbage-collector"),
            )

    def any_type(self, storage_key: tuple[str, str]) -> ResourceType:
        return next(t for t in self.types.values() if t.storage_key == storage_key)

    def dependents(self, owner_uid: str) -> list[tuple[ResourceType, dict]]:
        out = []
        for key, objs in self.objects.items():
            for obj in objs.values():
                if any(
                    r.get("uid") == owner_uid for r in obj["metadata"].get("ownerReferences") or []
                ):
                    out.append((self.any_type(key), obj))
        return out

    def compact(self) -> None:
        """Forget all history: every watch that resumes from an older RV gets 410 Gone."""
        with self.lock:
            self.history.clear()
            self.compacted_rv = self.rv

    def register_watcher(
        self, w: Watcher, rt: ResourceType, since: int | None, initial: bool
    ) -> int:
        """Replay the requested history into ``w`` and subscribe it, atomically; return the start RV."""
        with self.lock:
            if since is not None and since < self.compacted_rv:
                raise ApiError(
                    410, f"too old resource version: {since} ({self.compacted_rv})", "Expired"
                )
            if since is None:
                for obj in sorted(
                    self.objects[rt.storage_key].values(),
                    key=lambda o: int(o["metadata"]["resourceVersion"]),
                ):
                    if w.translate(Change(0, rt.storage_key, "ADDED", obj)):
                        w.put(("ADDED", obj, int(obj["metadata"]["resourceVersion"])))
                if initial:
                    w.put(("INITIAL-END", None, self.rv))
            else:
                for change in self.history:
                    if change.storage_key == rt.storage_key and change.rv > since:
                        w.put((w.translate(change), change.obj, change.rv))
            self.watchers.append(w)
            return self.rv if since is None else since

    def unregister_watcher(self, w: Watcher) -> None:
        with self.lock:
            if w in self.watchers:
                self.watchers.remove(w)


class WriteOptions:
    """How a write is made: by whom, to which subresource, with which ownership result."""

    def __init__(
        self,
        manager: str = "emulator",
        subresource: str = "",
        check_rv: bool = True,
        entries: dict | None = None,
    ) -> None:
        self.manager = manager
        self.subresource = subresource
        self.check_rv = check_rv
        self.entries = entries


def _blocked(rt: ResourceType, obj: dict) -> bool:
    """Whether a deleted object must stay: finalizers, or a namespace not yet emptied."""
    if obj["metadata"].get("finalizers"):
        return True
    return rt.storage_key == NS_KEY and bool((obj.get("spec") or {}).get("finalizers"))
