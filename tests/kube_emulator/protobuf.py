"""Protobuf request bodies of the few built-in kinds typed clients send that way (pure).

client-go's typed clients (``kubectl create namespace``, ``kubectl create secret``, helm's
release storage, ``helm install --create-namespace``) encode built-in objects as protobuf, and
the API server reads them. The emulator answers JSON only (its ``Accept`` handling is in
:mod:`.server`), but it reads the protobuf bodies of the kinds here: Namespace, Secret,
ConfigMap, and the DeleteOptions typed deletes carry. Any other kind in protobuf is refused (415)
as a server without protobuf for it refuses it.

The wire format is the server's: the ``k8s\\x00`` magic, then a ``runtime.Unknown`` whose
``raw`` is the object's message. Field numbers come from the Kubernetes ``generated.proto``
files (k8s.io/api core/v1, k8s.io/apimachinery meta/v1). Zero values (empty strings, absent
times) are left out, as the JSON encoding's ``omitempty`` leaves them out.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

MAGIC = b"k8s\x00"
# a message: field number -> (name, type, repeated); a type is a scalar name, a message name or
# "map:<value type>" (map<string, string|bytes>)
_S, _B, _I, _T = "string", "bytes", "int", "bool"
MESSAGES: dict[str, dict[int, tuple[str, str, bool]]] = {
    "Unknown": {1: ("typeMeta", "TypeMeta", False), 2: ("raw", _B, False),
                3: ("contentEncoding", _S, False), 4: ("contentType", _S, False)},
    "TypeMeta": {1: ("apiVersion", _S, False), 2: ("kind", _S, False)},
    "Time": {1: ("seconds", _I, False), 2: ("nanos", _I, False)},
    "ObjectMeta": {1: ("name", _S, False), 2: ("generateName", _S, False),
                   3: ("namespace", _S, False), 4: ("selfLink", _S, False), 5: ("uid", _S, False),
                   6: ("resourceVersion", _S, False), 7: ("generation", _I, False),
                   8: ("creationTimestamp", "Time", False), 9: ("deletionTimestamp", "Time", False),
                   10: ("deletionGracePeriodSeconds", _I, False), 11: ("labels", "map:string", False),
                   12: ("annotations", "map:string", False),
                   13: ("ownerReferences", "OwnerReference", True), 14: ("finalizers", _S, True),
                   17: ("managedFields", "ManagedFieldsEntry", True)},
    "OwnerReference": {5: ("apiVersion", _S, False), 1: ("kind", _S, False), 3: ("name", _S, False),
                       4: ("uid", _S, False), 6: ("controller", _T, False),
                       7: ("blockOwnerDeletion", _T, False)},
    "ManagedFieldsEntry": {1: ("manager", _S, False), 2: ("operation", _S, False),
                           3: ("apiVersion", _S, False), 4: ("time", "Time", False),
                           6: ("fieldsType", _S, False), 7: ("fieldsV1", "FieldsV1", False),
                           8: ("subresource", _S, False)},
    "FieldsV1": {1: ("Raw", _B, False)},
    "Namespace": {1: ("metadata", "ObjectMeta", False), 2: ("spec", "NamespaceSpec", False),
                  3: ("status", "NamespaceStatus", False)},
    "NamespaceSpec": {1: ("finalizers", _S, True)},
    "NamespaceStatus": {1: ("phase", _S, False), 2: ("conditions", "NamespaceCondition", True)},
    "NamespaceCondition": {1: ("type", _S, False), 2: ("status", _S, False),
                           4: ("lastTransitionTime", "Time", False), 5: ("reason", _S, False),
                           6: ("message", _S, False)},
    "Secret": {1: ("metadata", "ObjectMeta", False), 2: ("data", "map:bytes", False),
               3: ("type", _S, False), 4: ("stringData", "map:string", False),
               5: ("immutable", _T, False)},
    "ConfigMap": {1: ("metadata", "ObjectMeta", False), 2: ("data", "map:string", False),
                  3: ("binaryData", "map:bytes", False), 4: ("immutable", _T, False)},
    "DeleteOptions": {1: ("gracePeriodSeconds", _I, False),
                      2: ("preconditions", "Preconditions", False),
                      3: ("orphanDependents", _T, False), 4: ("propagationPolicy", _S, False),
                      5: ("dryRun", _S, True),
                      6: ("ignoreStoreReadErrorWithClusterBreakingPotential", _T, False)},
    "Preconditions": {1: ("uid", _S, False), 2: ("resourceVersion", _S, False)},
}  # fmt: skip
# the kinds read: (apiVersion, kind) of the envelope
KINDS = {("v1", "Namespace"), ("v1", "Secret"), ("v1", "ConfigMap"), ("v1", "DeleteOptions"),
         ("meta.k8s.io/v1", "DeleteOptions")}  # fmt: skip


class ProtobufError(ValueError):
    """A body that is not a protobuf of a kind read here."""


def decode(body: bytes) -> dict:
    """A protobuf request body as the JSON object it encodes; :class:`ProtobufError` when it
    is malformed or of a kind not read here."""
    if not body.startswith(MAGIC):
        raise ProtobufError("the body does not start with the Kubernetes protobuf magic")
    envelope = _message(body[len(MAGIC) :], "Unknown")
    meta = envelope.get("typeMeta") or {}
    api_version, kind = meta.get("apiVersion", ""), meta.get("kind", "")
    if (api_version, kind) not in KINDS:
        raise ProtobufError(f"no protobuf for {api_version or '?'}, Kind={kind or '?'}")
    obj = _message(base64.b64decode(envelope.get("raw", "")), kind)
    return {"apiVersion": api_version, "kind": kind, **obj}


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(data):
            raise ProtobufError("truncated varint")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not byte & 0x80:
            return value, pos


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) pairs: an int for varints, bytes for length-delimited values."""
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            out.append((number, value))
        elif wire == 2:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise ProtobufError("truncated field")
            out.append((number, data[pos : pos + size]))
            pos += size
        else:  # no fixed-width fields in the messages read here
            raise ProtobufError(f"unsupported wire type {wire} (field {number})")
    return out


def _message(data: bytes, name: str) -> dict:
    fields = MESSAGES[name]
    out: dict[str, Any] = {}
    for number, raw in _fields(data):
        if number not in fields:
            raise ProtobufError(f"{name} has no field {number} here")
        key, kind, repeated = fields[number]
        if kind.startswith("map:"):
            entry = dict(_fields(_bytes(raw)))
            out.setdefault(key, {})[_bytes(entry.get(1, b"")).decode()] = _scalar(
                entry.get(2, b""), kind[4:]
            )
            continue
        value = _message(_bytes(raw), kind) if kind in MESSAGES else _scalar(raw, kind)
        if kind == "Time":
            value = _time(value)
        elif kind == "FieldsV1":  # raw JSON in protobuf, the object itself in JSON
            value = json.loads(base64.b64decode(value.get("Raw", "")) or b"{}")
        if repeated:
            out.setdefault(key, []).append(value)
        elif value not in ("", 0, False, None, {}):
            out[key] = value
    return out


def _bytes(raw: int | bytes) -> bytes:
    if not isinstance(raw, bytes):
        raise ProtobufError("a length-delimited field expected")
    return raw


def _scalar(raw: int | bytes, kind: str) -> Any:
    if kind == _S:
        return _bytes(raw).decode()
    if kind == _B:
        return base64.b64encode(_bytes(raw)).decode()
    if isinstance(raw, bytes):
        raise ProtobufError(f"a varint expected for a {kind}")
    if kind == _T:
        return bool(raw)
    return raw - (1 << 64) if raw >= 1 << 63 else raw


def _time(value: dict) -> str | None:
    if not value.get("seconds"):
        return None
    return dt.datetime.fromtimestamp(value["seconds"], dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
