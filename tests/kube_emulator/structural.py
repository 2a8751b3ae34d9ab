"""``ValidateStructural``: the shape the API server requires of a CRD's schema (pure).

A reading of apiextensions-apiserver's ``pkg/apiserver/schema/validation.go`` and ``complete.go``
(the Go code is the reference; nothing here is copied from it): a ``type`` on every node (none
needed under ``x-kubernetes-int-or-string`` or ``x-kubernetes-preserve-unknown-fields``),
``items`` on every array, ``object`` at the root and no ``additionalProperties`` there,
``metadata`` at the root restricting nothing but ``name`` and ``generateName`` (not even with a
``description``), ``kind``/``apiVersion`` strings and ``metadata`` an object in every resource
(the root and each ``x-kubernetes-embedded-resource``), an embedded resource an object with
properties (or preserving unknown fields) and no ``additionalProperties``,
``x-kubernetes-int-or-string`` without the other two extensions, and inside
``anyOf``/``allOf``/``oneOf``/``not`` value validations only: no ``type`` (but the two
int-or-string shapes, ``anyOf: [integer, string]`` and ``allOf[0]`` of it), ``description``,
``default``, ``nullable``, ``additionalProperties``, extensions or ``metadata``. The
``properties``/``items`` such a clause names must exist in the structure (the server checks
this for the root's clauses). Patterns must compile (Python's ``re``, not RE2).

The rest of the CRD validation (the API's own checks, defaults) is :mod:`.crd_schema`. Messages
are the server's ``field.Error`` strings (``path: Forbidden: detail``).
"""

from __future__ import annotations

import json
import re
from typing import Any

_INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]
# what a nested value validation (under anyOf/allOf/oneOf/not) must leave out
_NESTED_FORBIDDEN = {
    "type": "must be empty to be structural",
    "additionalProperties": "must be undefined to be structural",
    "default": "must be undefined to be structural",
    "title": "must be empty to be structural",
    "description": "must be empty to be structural",
    "nullable": "must be false to be structural",
    "externalDocs": "must be undefined to be structural",
    "x-kubernetes-preserve-unknown-fields": "must be false to be structural",
    "x-kubernetes-embedded-resource": "must be false to be structural",
    "x-kubernetes-int-or-string": "must be false to be structural",
    "x-kubernetes-list-map-keys": "must be empty to be structural",
    "x-kubernetes-list-type": "must be undefined to be structural",
    "x-kubernetes-map-type": "must be undefined to be structural",
    "x-kubernetes-validations": "must be empty to be structural",
}
_METADATA_ONLY_NAMES = (
    "must not specify anything other than name and generateName, but metadata is implicitly "
    "specified"
)


def _go(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))[:200]


def forbidden(path: str, detail: str) -> str:
    return f"{path}: Forbidden: {detail}"


def required(path: str, detail: str) -> str:
    return f"{path}: Required value: {detail}"


def invalid(path: str, value: Any, detail: str) -> str:
    return f"{path}: Invalid value: {_go(value)}: {detail}"


def unsupported(path: str, value: Any, allowed: tuple[str, ...]) -> str:
    return f"{path}: Unsupported value: {_go(value)}: supported values: " + ", ".join(
        f'"{a}"' for a in allowed
    )


def dict_or_none(node: Any) -> dict[str, Any] | None:
    return node if isinstance(node, dict) else None


def properties(node: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in (node.get("properties") or {}).items() if isinstance(v, dict)}


def junctors(node: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(path suffix, schema)`` of each anyOf/allOf/oneOf/not clause."""
    out = [
        (f".{key}[{i}]", sub)
        for key in ("anyOf", "allOf", "oneOf")
        for i, sub in enumerate(node.get(key) or [])
    ]
    return out + ([(".not", node["not"])] if isinstance(node.get("not"), dict) else [])


# ---------------------------------------------------------------- ValidateStructural


def structural_errors(schema: dict[str, Any], path: str = "openAPIV3Schema") -> list[str]:
    """``ValidateStructural``: the invariants, then the completeness of the root's junctors."""
    errors = _invariants(schema, "root", path) + _completeness(schema, path)
    return sorted(errors)


def _invariants(s: dict[str, Any], level: str, path: str) -> list[str]:
    errors = []
    items = dict_or_none(s.get("items"))
    if s.get("type") == "array" and items is None:
        errors.append(required(f"{path}.items", "must be specified"))
    if items is not None:
        errors += _invariants(items, "item", f"{path}.items")
    for key, sub in properties(s).items():
        errors += _invariants(sub, "field", f"{path}.properties[{key}]")
    if "additionalProperties" in s:
        if level == "root":
            errors.append(forbidden(f"{path}.additionalProperties", "must not be used at the root"))
        if dict_or_none(s["additionalProperties"]) is not None:
            errors += _invariants(
                s["additionalProperties"], "field", f"{path}.additionalProperties"
            )
    errors += _extensions(s, path) + _value_validation(s, path, *_int_or_string_shapes(s))
    errors += _types(s, level, path)
    embedded = bool(s.get("x-kubernetes-embedded-resource"))
    errors += _meta_fields(s, level == "root" or embedded, level, path)
    if embedded and not s.get("x-kubernetes-preserve-unknown-fields") and not properties(s):
        errors.append(
            required(
                f"{path}.properties",
                "must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields",
            )
        )
    return errors


def _int_or_string_shapes(s: dict[str, Any]) -> tuple[bool, bool]:
    """Whether ``anyOf`` is ``[integer, string]``, and whether ``allOf[0].anyOf`` is."""
    all_of = s.get("allOf") or []
    first = all_of[0] if all_of and isinstance(all_of[0], dict) else {}
    return s.get("anyOf") == _INT_OR_STRING, first.get("anyOf") == _INT_OR_STRING


def _extensions(s: dict[str, Any], path: str) -> list[str]:
    if not s.get("x-kubernetes-int-or-string"):
        return []
    return [
        invalid(f"{path}.{key}", True, "must be false if x-kubernetes-int-or-string is true")
        for key in ("x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource")
        if s.get(key)
    ]


_EMPTY_TYPE = {
    "root": "must not be empty at the root",
    "item": "must not be empty for specified array items",
    "field": "must not be empty for specified object fields",
}


def _types(s: dict[str, Any], level: str, path: str) -> list[str]:
    kind, errors = s.get("type", ""), []
    embedded = bool(s.get("x-kubernetes-embedded-resource"))
    untyped_ok = s.get("x-kubernetes-int-or-string") or s.get(
        "x-kubernetes-preserve-unknown-fields"
    )
    if embedded and kind != "object":
        detail = "must be object if x-kubernetes-embedded-resource is true"
        errors.append(
            invalid(f"{path}.type", kind, detail) if kind else required(f"{path}.type", detail)
        )
    elif not kind and not untyped_ok:
        errors.append(required(f"{path}.type", _EMPTY_TYPE[level]))
    if embedded and "additionalProperties" in s:
        errors.append(
            forbidden(
                f"{path}.additionalProperties",
                "must not be used if x-kubernetes-embedded-resource is set",
            )
        )
    if level == "root" and kind and kind != "object":
        errors.append(invalid(f"{path}.type", kind, "must be object at the root"))
    return errors


def _meta_fields(s: dict[str, Any], check: bool, level: str, path: str) -> list[str]:
    """``kind``/``apiVersion`` strings and ``metadata`` an object in a resource (the root or an
    embedded one); at the root, ``metadata`` may only bound ``name`` and ``generateName``."""
    props, errors = properties(s), []
    for key in ("kind", "apiVersion"):
        if check and key in props and props[key].get("type", "") != "string":
            errors.append(
                invalid(
                    f"{path}.properties[{key}].type", props[key].get("type", ""), "must be string"
                )
            )
    meta = props.get("metadata")
    if meta is None:
        return errors
    mpath = f"{path}.properties[metadata]"
    if check and meta.get("type", "") != "object":
        errors.append(invalid(f"{mpath}.type", meta.get("type", ""), "must be object"))
    if level == "root" and _restricts_more_than_names(meta):
        errors.append(forbidden(mpath, _METADATA_ONLY_NAMES))
    return errors


def _restricts_more_than_names(meta: dict[str, Any]) -> bool:
    names = set(properties(meta))
    # type and default are set aside (a default is refused by the API validation); an example is
    # not kept by the server
    rest = {k for k in meta if k not in ("type", "default", "example", "properties")}
    return bool(rest) or not names <= {"name", "generateName"}


def _value_validation(
    v: dict[str, Any], path: str, skip_any_of: bool, skip_first_all_of: bool
) -> list[str]:
    errors = []
    for suffix, sub in junctors(v):
        if suffix.startswith(".anyOf") and skip_any_of:
            continue
        errors += _nested(sub, path + suffix, skip_first_all_of and suffix == ".allOf[0]")
    pattern = v.get("pattern")
    if isinstance(pattern, str):
        try:
            re.compile(pattern)
        except re.error as e:
            errors.append(
                invalid(
                    f"{path}.pattern",
                    pattern,
                    f"must be a valid regular expression, but isn't: {e}",
                )
            )
    return errors


def _nested(v: dict[str, Any], path: str, skip_any_of: bool = False) -> list[str]:
    """A clause under a junctor: value validations only (and the properties/items they reach)."""
    errors = _value_validation(v, path, skip_any_of, False)
    if dict_or_none(v.get("items")) is not None:
        errors += _nested(v["items"], f"{path}.items")
    for key, sub in properties(v).items():
        errors += _nested(sub, f"{path}.properties[{key}]")
    for key, detail in _NESTED_FORBIDDEN.items():
        if v.get(key) not in (None, False, "", [], {}):
            errors.append(forbidden(f"{path}.{key}", detail))
    if "metadata" in properties(v):
        errors.append(
            forbidden(f"{path}.properties[metadata]", "must not be specified in a nested context")
        )
    return errors


def _completeness(s: dict[str, Any], path: str) -> list[str]:
    """Every property or items a clause of the root's junctors names is in the structure."""
    errors = []
    for suffix, clause in junctors(s):
        errors += _complete(clause, s, path, path + suffix)
    return errors


def _complete(v: dict[str, Any], s: dict[str, Any] | None, spath: str, vpath: str) -> list[str]:
    if s is None:
        return [required(spath, f"because it is defined in {vpath}")]
    errors = []
    for suffix, clause in junctors(v):
        errors += _complete(clause, s, spath, vpath + suffix)
    if dict_or_none(v.get("items")) is not None:
        errors += _complete(
            v["items"], dict_or_none(s.get("items")), f"{spath}.items", f"{vpath}.items"
        )
    structure = properties(s)
    for key, sub in properties(v).items():
        errors += _complete(
            sub, structure.get(key), f"{spath}.properties[{key}]", f"{vpath}.properties[{key}]"
        )
    return errors
