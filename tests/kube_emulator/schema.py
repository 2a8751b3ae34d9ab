"""OpenAPI v3 validation, defaulting and pruning of custom objects (pure).

Mirrors what the API server does with a CRD's structural ``openAPIV3Schema`` on create/update:
defaults are filled in, unknown fields are pruned (or, with ``fieldValidation=Strict``,
rejected), and the object is validated: ``type`` (with ``nullable`` and
``x-kubernetes-int-or-string``), ``required``, ``enum``, ``minimum``/``maximum`` (and the
exclusive flags), ``multipleOf``, ``minLength``/``maxLength``, ``pattern``, ``minItems``/
``maxItems``, ``uniqueItems``, ``minProperties``/``maxProperties``, ``items``,
``additionalProperties``, ``allOf``/``anyOf``/``oneOf``/``not``, and unique keys of
``x-kubernetes-list-type: map`` (by ``x-kubernetes-list-map-keys``) and ``set`` lists.

CEL rules (``x-kubernetes-validations``) are evaluated separately by :mod:`.cel` (a subset;
rules outside it are skipped). Not checked: ``format``; ``metadata`` is only checked for the
object name, as the server does for CRs.
"""

from __future__ import annotations

import copy
import re
from typing import Any

_ROOT_KEYS = {"apiVersion", "kind", "metadata"}
_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
}


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def apply_defaults(value: Any, schema: dict) -> Any:
    """Fill in ``default`` for absent properties, recursively (the server's defaulting)."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        out = dict(value)
        for key, sub in props.items():
            if key not in out and "default" in sub:
                out[key] = copy.deepcopy(sub["default"])
            if key in out:
                out[key] = apply_defaults(out[key], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            out = {k: v if k in props else apply_defaults(v, extra) for k, v in out.items()}
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(v, schema["items"]) for v in value]
    return value


def prune(value: Any, schema: dict, path: str = "", root: bool = False) -> tuple[Any, list[str]]:
    """Drop fields the schema does not know; return the pruned value and the dropped paths."""
    if schema.get("x-kubernetes-preserve-unknown-fields") and not schema.get("properties"):
        return value, []
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        out, dropped = [], []
        for i, item in enumerate(value):
            pruned, d = prune(item, schema["items"], _join(path, i))
            out.append(pruned)
            dropped += d
        return out, dropped
    if not isinstance(value, dict):
        return value, []
    return _prune_object(value, schema, path, root)


def _prune_object(value: dict, schema: dict, path: str, root: bool) -> tuple[dict, list[str]]:
    props = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    preserve = schema.get("x-kubernetes-preserve-unknown-fields", False)
    out: dict = {}
    dropped: list[str] = []
    for key, sub_value in value.items():
        sub_path = _join(path, key)
        if root and key in _ROOT_KEYS:
            out[key] = sub_value
        elif key in props:
            out[key], d = prune(sub_value, props[key], sub_path)
            dropped += d
        elif isinstance(extra, dict):
            out[key], d = prune(sub_value, extra, sub_path)
            dropped += d
        elif extra is True or preserve:
            out[key] = sub_value
        else:
            dropped.append(sub_path)
    return out, dropped


def validate(value: Any, schema: dict, path: str = "", root: bool = False) -> list[str]:
    """Return error messages in the server's ``path: reason`` shape; empty when valid."""
    if value is None:
        return (
            []
            if schema.get("nullable")
            else [
                f'{path}: Invalid value: "null": {path} in body must be of type {schema.get("type", "object")}'
            ]
        )
    errors = _check_type(value, schema, path)
    if errors:
        return errors
    errors += _check_scalar(value, schema, path)
    errors += _check_combinators(value, schema, path)
    if isinstance(value, dict):
        errors += _check_object(value, schema, path, root)
    elif isinstance(value, list):
        errors += _check_array(value, schema, path)
    return errors


def _check_type(value: Any, schema: dict, path: str) -> list[str]:
    if schema.get("x-kubernetes-int-or-string"):
        ok = isinstance(value, str | int) and not isinstance(value, bool)
        return [] if ok else [f"{path}: Invalid value: {value!r}: must be an integer or a string"]
    kind = schema.get("type")
    if kind and kind in _TYPES and not _TYPES[kind](value):
        return [f"{path}: Invalid value: {_show(value)}: {path} in body must be of type {kind}"]
    return []


def _show(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _check_scalar(value: Any, schema: dict, path: str) -> list[str]:
    errors = []
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(_show(e) for e in schema["enum"])
        errors.append(f"{path}: Unsupported value: {_show(value)}: supported values: {allowed}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        lo, hi = schema.get("minimum"), schema.get("maximum")
        if lo is not None and (value < lo or (schema.get("exclusiveMinimum") and value == lo)):
            errors.append(
                f"{path}: Invalid value: {value}: {path} in body should be greater than or equal to {lo}"
            )
        if hi is not None and (value > hi or (schema.get("exclusiveMaximum") and value == hi)):
            errors.append(
                f"{path}: Invalid value: {value}: {path} in body should be less than or equal to {hi}"
            )
        step = schema.get("multipleOf")
        if step and (value / step) != int(value / step):
            errors.append(
                f"{path}: Invalid value: {value}: {path} in body should be a multiple of {step}"
            )
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(
                f"{path}: Invalid value: {_show(value)}: {path} in body should be at least {schema['minLength']} chars long"
            )
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{path}: Too long: may not be longer than {schema['maxLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(
                f"{path}: Invalid value: {_show(value)}: {path} in body should match '{schema['pattern']}'"
            )
    return errors


def _check_combinators(value: Any, schema: dict, path: str) -> list[str]:
    errors = []
    for sub in schema.get("allOf") or []:
        errors += validate(value, sub, path)
    if schema.get("anyOf") and not any(not validate(value, s, path) for s in schema["anyOf"]):
        errors.append(
            f"{path}: Invalid value: {_show(value)}: must validate at least one schema (anyOf)"
        )
    if schema.get("oneOf"):
        matched = sum(not validate(value, s, path) for s in schema["oneOf"])
        if matched != 1:
            errors.append(
                f"{path}: Invalid value: {_show(value)}: must validate one and only one schema (oneOf)"
            )
    if "not" in schema and not validate(value, schema["not"], path):
        errors.append(f"{path}: Invalid value: {_show(value)}: must not validate the schema (not)")
    return errors


def _check_object(value: dict, schema: dict, path: str, root: bool) -> list[str]:
    errors = []
    for key in schema.get("required") or []:
        if key not in value:
            errors.append(f"{_join(path, key)}: Required value")
    props = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    for key, sub in value.items():
        if root and key in _ROOT_KEYS:
            continue
        if key in props:
            errors += validate(sub, props[key], _join(path, key))
        elif isinstance(extra, dict):
            errors += validate(sub, extra, _join(path, key))
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        errors.append(
            f"{path}: Invalid value: should have at least {schema['minProperties']} properties"
        )
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        errors.append(f"{path}: Too many: must have at most {schema['maxProperties']} items")
    return errors


def _list_type(value: list, schema: dict, path: str) -> list[str]:
    """``x-kubernetes-list-type: map`` lists are unique by their ``x-kubernetes-list-map-keys``,
    ``set`` lists by value, as the server checks them."""
    kind, keys = schema.get("x-kubernetes-list-type"), schema.get("x-kubernetes-list-map-keys")
    if kind not in ("map", "set"):
        return []
    seen, errors = [], []
    for i, item in enumerate(value):
        key = (
            {k: item.get(k) for k in keys or []}
            if kind == "map" and isinstance(item, dict)
            else item
        )
        if key in seen:
            errors.append(f"{path}[{i}]: Duplicate value: {key!r}")
        seen.append(key)
    return errors


def _check_array(value: list, schema: dict, path: str) -> list[str]:
    errors = []
    if "minItems" in schema and len(value) < schema["minItems"]:
        errors.append(
            f"{path}: Invalid value: {len(value)}: {path} in body should have at least {schema['minItems']} items"
        )
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        errors.append(
            f"{path}: Too many: {len(value)}: must have at most {schema['maxItems']} items"
        )
    if schema.get("uniqueItems") and len({repr(v) for v in value}) != len(value):
        errors.append(f"{path}: Duplicate value: shall give unique items")
    errors += _list_type(value, schema, path)
    if isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errors += validate(item, schema["items"], _join(path, i))
    return errors
