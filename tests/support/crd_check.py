"""Validate an object the way the API server does with a CRD's structural schema (tests only).

Steps, in the API server's order: prune explicit nulls, apply schema defaults, check the OpenAPI v3
schema (JSON Schema draft 4 semantics: boolean ``exclusiveMinimum``), then evaluate every
``x-kubernetes-validations`` CEL rule with ``cel-python`` on the node it is attached to.
Returns the list of messages (empty when the object is accepted).
"""

from __future__ import annotations

import copy
from typing import Any

import celpy
import jsonschema


def _prune_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _prune_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_prune_nulls(v) for v in value]
    return value


def apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    if isinstance(value, dict) and "properties" in schema:
        for key, sub in schema["properties"].items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(value[key], sub)
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key in value:
            value[key] = apply_defaults(value[key], schema["additionalProperties"])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(v, schema["items"]) for v in value]
    return value


def _cel_errors(value: Any, schema: dict[str, Any], path: str, old: Any = None) -> list[str]:
    """CEL errors of ``value``; transition rules (``oldSelf``) only on an update (``old`` given)
    and where the old object has the node, as the API server evaluates them."""
    errors = []
    env = celpy.Environment()
    for rule in schema.get("x-kubernetes-validations", []):
        activation = {"self": celpy.json_to_cel(value)}
        if "oldSelf" in rule["rule"]:
            if old is None:
                continue
            activation["oldSelf"] = celpy.json_to_cel(old)
        program = env.program(env.compile(rule["rule"]))
        if not bool(program.evaluate(activation)):
            errors.append(f"{path}{rule.get('fieldPath', '')}: {rule['message']}")
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                before = old.get(key) if isinstance(old, dict) else None
                errors += _cel_errors(value[key], sub, f"{path}.{key}", before)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):  # no transition rules inside lists here
            errors += _cel_errors(item, schema["items"], f"{path}[{i}]")
    return errors


def crd_errors(
    obj: dict[str, Any],
    crd: dict[str, Any],
    version: str | None = None,
    old: dict[str, Any] | None = None,
) -> list[str]:
    """Messages the API server would answer when ``obj`` is created under ``crd``, or when it
    replaces ``old`` (empty = accepted)."""
    versions = crd["spec"]["versions"]
    entry = next(v for v in versions if version in (None, v["name"]))
    schema = entry["schema"]["openAPIV3Schema"]
    value = apply_defaults(_prune_nulls(copy.deepcopy(obj)), schema)
    if old is not None:
        old = apply_defaults(_prune_nulls(copy.deepcopy(old)), schema)
    validator = jsonschema.Draft4Validator(schema)
    errors = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(value)
    ]
    errors += _unknown_fields(value, schema, "")
    errors += list_type_errors(value, schema, "")
    return errors or _cel_errors(value, schema, "", old)


def list_type_errors(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """Duplicates in ``x-kubernetes-list-type: map`` (by ``x-kubernetes-list-map-keys``) and
    ``set`` lists, which the API server refuses ("Duplicate value")."""
    errors: list[str] = []
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        kind, keys = schema.get("x-kubernetes-list-type"), schema.get("x-kubernetes-list-map-keys")
        seen: list[Any] = []
        for i, item in enumerate(value):
            key = [item.get(k) for k in keys] if kind == "map" and isinstance(item, dict) else item
            if kind in ("map", "set") and key in seen:
                errors.append(f"{path}[{i}]: Duplicate value: {key!r}")
            seen.append(key)
            errors += list_type_errors(item, schema["items"], f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                errors += list_type_errors(value[key], sub, f"{path}.{key}")
    return errors


def _unknown_fields(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """Strict field validation (kubectl's default): unknown fields are errors, not pruned silently."""
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [
            e
            for i, v in enumerate(value)
            for e in _unknown_fields(v, schema["items"], f"{path}[{i}]")
        ]
    if not isinstance(value, dict) or "properties" not in schema:
        return []
    known = schema["properties"]
    preserve = schema.get("x-kubernetes-preserve-unknown-fields")
    errors = [f"{path}.{k}: unknown field" for k in value if k not in known and not preserve]
    for key, sub in known.items():
        if key in value and (path, key) != ("", "metadata"):  # ObjectMeta: the server's own
            errors += _unknown_fields(value[key], sub, f"{path}.{key}")
    return errors
