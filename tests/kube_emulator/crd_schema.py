"""The API server's validation of a CRD's ``openAPIV3Schema`` (pure): what makes it refuse one.

:func:`crd_errors` is what the emulator runs when a CRD is written, and what the tests hold
gagar's CRD to. It joins :mod:`.structural` (``ValidateStructural``) with a reading of
apiextensions-apiserver's ``pkg/apis/apiextensions/validation/validation.go`` and
``pkg/apiserver/schema/defaulting/validation.go`` (the Go code is the reference, not copied):

- the root of a schema with a status subresource holds only the allowed fields, and no root is
  nullable;
- known ``type`` names, never ``null``; no ``$ref``/``id``/``definitions``/``patternProperties``/
  ``dependencies``/``additionalItems``/item arrays; no ``uniqueItems``; ``additionalProperties``
  (false or a schema) beside ``properties`` refused; no defaults in the top-level ``metadata``,
  ``kind``, ``apiVersion``; no embedded resource inside resource metadata;
  ``x-kubernetes-preserve-unknown-fields: false`` refused;
- ``x-kubernetes-map-type`` on objects only, ``x-kubernetes-list-type`` on arrays only, ``set``
  items atomic, ``map`` lists with ``x-kubernetes-list-map-keys`` naming scalar item properties
  that are required or defaulted and never nullable, ``map``/``set`` items never nullable;
- ``x-kubernetes-validations`` entries with a rule, a one-line message and a known reason;
- once the schema is structural: every default pruned (no field its schema does not know) and
  valid against its schema.

Not checked: CEL compilation and cost (the tests estimate the cost, ``tests/support/cel_cost.py``),
``format`` names, printer columns and subresource paths beyond :mod:`.resources`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from . import schema as oas
from .structural import (
    dict_or_none,
    forbidden,
    invalid,
    junctors,
    properties,
    required,
    structural_errors,
    unsupported,
)

OPENAPI_TYPES = ("array", "boolean", "integer", "number", "object", "string")
_META = ("metadata", "kind", "apiVersion")
_UNSUPPORTED = ("id", "$schema", "$ref", "patternProperties", "dependencies", "additionalItems",
                "definitions")  # fmt: skip
# the root's fields allowed beside a status subresource (the Go field names, as JSON keys)
ROOT_WITH_STATUS = (
    "description", "type", "format", "title", "maximum", "exclusiveMaximum", "minimum",
    "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems",
    "multipleOf", "required", "items", "properties", "externalDocs", "example",
    "x-kubernetes-preserve-unknown-fields", "x-kubernetes-validations",
)  # fmt: skip
_REASONS = ("FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid",
            "FieldValueRequired")  # fmt: skip

# ---------------------------------------------------------------- the whole CRD


def crd_errors(crd: dict[str, Any]) -> list[str]:
    """Every version's schema checked, the messages prefixed with the version's path."""
    spec = crd.get("spec") or {}
    errors: list[str] = []
    for i, version in enumerate(spec.get("versions") or []):
        schema = dict_or_none((version.get("schema") or {}).get("openAPIV3Schema"))
        if schema is not None:
            status = "status" in (version.get("subresources") or {})
            path = f"spec.versions[{i}].schema.openAPIV3Schema"
            errors += schema_errors(schema, path, status=status)
    return errors


def schema_errors(
    schema: dict[str, Any], path: str = "openAPIV3Schema", status: bool = False
) -> list[str]:
    """All the server's complaints about one ``openAPIV3Schema`` (empty: it is accepted)."""
    errors = _root(schema, path, status) + api_errors(schema, path, _Context(), root=True)
    shape = structural_errors(schema, path)
    # as the server: defaults are checked only against a structural schema
    return errors + (shape or default_errors(schema, path))


def _root(schema: dict[str, Any], path: str, status: bool) -> list[str]:
    errors = []
    if status and schema.get("type", "object") != "object":
        errors.append(
            invalid(
                f"{path}.type",
                schema["type"],
                'only "object" is allowed as the type at the root of the schema if the status subresource is enabled',
            )
        )
    extra = sorted(k for k in schema if k not in ROOT_WITH_STATUS)
    if status and extra:
        fields = "[" + " ".join(ROOT_WITH_STATUS) + "]"
        errors.append(
            invalid(
                path,
                extra,
                f"only {fields} fields are allowed at the root of the schema if the status subresource is enabled",
            )
        )
    if schema.get("nullable"):
        errors.append(forbidden(f"{path}.nullable", "nullable cannot be true at the root"))
    return errors


# ---------------------------------------------------------------- the API validation


@dataclass(frozen=True)
class _Context:
    no_defaults: str = ""  # why defaults are refused here ("" where they are allowed)
    inside_meta: bool = False


def api_errors(s: dict[str, Any], path: str, ctx: _Context, root: bool = False) -> list[str]:
    """``ValidateCustomResourceDefinitionOpenAPISchema``, recursively."""
    errors = _openapi_v3(s, path, ctx)
    if s.get("uniqueItems"):
        errors.append(
            forbidden(
                f"{path}.uniqueItems",
                "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
            )
        )
    extra = s.get("additionalProperties")
    if extra is not None and properties(s) and (extra is False or isinstance(extra, dict)):
        errors.append(
            forbidden(
                f"{path}.additionalProperties",
                "additionalProperties and properties are mutual exclusive",
            )
        )
    if isinstance(extra, dict):
        sub = (
            replace(ctx, no_defaults="inside additionalProperties applying to object metadata")
            if ctx.inside_meta
            else ctx
        )
        errors += api_errors(extra, f"{path}.additionalProperties", sub)
    for key, sub_schema in properties(s).items():
        errors += api_errors(sub_schema, f"{path}.properties[{key}]", _child(ctx, s, key, root))
    for suffix, clause in junctors(s):
        errors += api_errors(clause, path + suffix, ctx)
    if dict_or_none(s.get("items")) is not None:
        errors += api_errors(s["items"], f"{path}.items", ctx)
    if s.get("x-kubernetes-preserve-unknown-fields") is False:
        errors.append(
            invalid(
                f"{path}.x-kubernetes-preserve-unknown-fields", False, "must be true or undefined"
            )
        )
    return errors + _map_type(s, path) + _list_type(s, path) + _map_list(s, path) + _rules(s, path)


def _child(ctx: _Context, s: dict[str, Any], key: str, root: bool) -> _Context:
    if key not in _META or not (root or s.get("x-kubernetes-embedded-resource")):
        return ctx
    ctx = replace(ctx, inside_meta=True)
    return replace(ctx, no_defaults=f"in top-level {key}") if root else ctx


def _openapi_v3(s: dict[str, Any], path: str, ctx: _Context) -> list[str]:
    errors, kind = [], s.get("type")
    if kind and kind not in OPENAPI_TYPES:
        errors.append(unsupported(f"{path}.type", kind, OPENAPI_TYPES))
    if "default" in s and ctx.no_defaults:
        errors.append(forbidden(f"{path}.default", f"must not be set {ctx.no_defaults}"))
    errors += [
        forbidden(f"{path}.{key}", f"{key} is not supported") for key in _UNSUPPORTED if key in s
    ]
    if kind == "null":
        errors.append(
            forbidden(f"{path}.type", "type cannot be set to null, use nullable as an alternative")
        )
    if isinstance(s.get("items"), list):
        errors.append(forbidden(f"{path}.items", "items must be a schema object and not an array"))
    if ctx.inside_meta and s.get("x-kubernetes-embedded-resource"):
        errors.append(
            forbidden(
                f"{path}.x-kubernetes-embedded-resource", "must not be used inside of resource meta"
            )
        )
    return errors


def _must_be(path: str, kind: str, want: str, detail: str) -> list[str]:
    if kind == want:
        return []
    return [invalid(f"{path}.type", kind, detail) if kind else required(f"{path}.type", detail)]


def _map_type(s: dict[str, Any], path: str) -> list[str]:
    value = s.get("x-kubernetes-map-type")
    if value is None:
        return []
    errors = _must_be(
        path, s.get("type", ""), "object", "must be object if x-kubernetes-map-type is specified"
    )
    if value not in ("atomic", "granular"):
        errors.append(unsupported(f"{path}.x-kubernetes-map-type", value, ("atomic", "granular")))
    return errors


def _list_type(s: dict[str, Any], path: str) -> list[str]:
    value, keys = s.get("x-kubernetes-list-type"), s.get("x-kubernetes-list-map-keys") or []
    errors: list[str] = []
    if value is not None:
        errors += _must_be(
            path, s.get("type", ""), "array", "must be array if x-kubernetes-list-type is specified"
        )
        if not errors and value == "set":
            errors += _atomic_items(dict_or_none(s.get("items")) or {}, path)
        if value not in ("atomic", "set", "map"):
            errors.append(
                unsupported(f"{path}.x-kubernetes-list-type", value, ("atomic", "set", "map"))
            )
    if keys and value is None:
        errors.append(
            required(
                f"{path}.x-kubernetes-list-type",
                "must be map if x-kubernetes-list-map-keys is non-empty",
            )
        )
    elif keys and value != "map":
        errors.append(
            invalid(
                f"{path}.x-kubernetes-list-type",
                value,
                "must be map if x-kubernetes-list-map-keys is non-empty",
            )
        )
    return errors


def _atomic_items(items: dict[str, Any], path: str) -> list[str]:
    detail = "must be atomic as item of a list with x-kubernetes-list-type=set"
    kind = items.get("type")
    if kind == "array" and items.get("x-kubernetes-list-type", "atomic") != "atomic":
        return [
            invalid(f"{path}.items.x-kubernetes-list-type", items["x-kubernetes-list-type"], detail)
        ]
    if kind == "object" and items.get("x-kubernetes-map-type") != "atomic":
        return [
            invalid(
                f"{path}.items.x-kubernetes-map-type", items.get("x-kubernetes-map-type"), detail
            )
        ]
    return []


def _map_list(s: dict[str, Any], path: str) -> list[str]:
    """A ``map`` list: keys named, items objects, each key a scalar property of the items that is
    required or defaulted and not nullable; ``map`` and ``set`` items not nullable."""
    kind, items = s.get("x-kubernetes-list-type"), dict_or_none(s.get("items"))
    errors: list[str] = []
    if kind in ("map", "set") and items is not None and items.get("nullable"):
        errors.append(
            forbidden(
                f"{path}.items.nullable",
                f"cannot be nullable when x-kubernetes-list-type is {kind}",
            )
        )
    if kind != "map":
        return errors
    keys = s.get("x-kubernetes-list-map-keys") or []
    if not keys:
        errors.append(
            required(
                f"{path}.x-kubernetes-list-map-keys",
                "must not be empty if x-kubernetes-list-type is map",
            )
        )
    if items is None:
        return errors + [
            required(f"{path}.items", "must have a schema if x-kubernetes-list-type is map")
        ]
    if items.get("type") != "object":
        return errors + [
            invalid(
                f"{path}.items.type",
                items.get("type", ""),
                "must be object if parent array's x-kubernetes-list-type is map",
            )
        ]
    return errors + _map_keys(keys, items, path)


def _map_keys(keys: list[str], items: dict[str, Any], path: str) -> list[str]:
    props, needed, errors = properties(items), set(items.get("required") or []), []
    for i, key in enumerate(keys):
        kpath = f"{path}.items.properties[{key}]"
        if key in keys[:i]:
            errors.append(
                invalid(
                    f"{path}.x-kubernetes-list-map-keys", keys, "must not contain duplicate entries"
                )
            )
        if key not in props:
            errors.append(
                invalid(
                    f"{path}.x-kubernetes-list-map-keys",
                    keys,
                    "entries must all be names of item properties",
                )
            )
            continue
        if props[key].get("type") in ("array", "object"):
            errors.append(
                invalid(
                    f"{kpath}.type",
                    props[key]["type"],
                    "must be a scalar type if parent array's x-kubernetes-list-type is map",
                )
            )
        if key not in needed and "default" not in props[key]:
            errors.append(
                required(
                    f"{kpath}.default",
                    "this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property",
                )
            )
        if props[key].get("nullable"):
            errors.append(
                forbidden(
                    f"{kpath}.nullable",
                    "this property is in x-kubernetes-list-map-keys, so it cannot be nullable",
                )
            )
    return errors


def _rules(s: dict[str, Any], path: str) -> list[str]:
    """The shape of ``x-kubernetes-validations`` entries (their CEL is not compiled here)."""
    errors = []
    for i, rule in enumerate(s.get("x-kubernetes-validations") or []):
        rpath = f"{path}.x-kubernetes-validations[{i}]"
        text, message = rule.get("rule", "").strip(), rule.get("message", "")
        if not text:
            errors.append(required(f"{rpath}.rule", "rule is not specified"))
        elif message and not message.strip():
            errors.append(
                invalid(f"{rpath}.message", message, "message must be non-empty if specified")
            )
        elif re.search(r"[\n\r]", message.strip()):
            errors.append(
                invalid(f"{rpath}.message", message, "message must not contain line breaks")
            )
        elif re.search(r"[\n\r]", text) and not message.strip():
            errors.append(
                required(
                    f"{rpath}.message", "message must be specified if rule contains line breaks"
                )
            )
        if "reason" in rule and rule["reason"] not in _REASONS:
            errors.append(unsupported(f"{rpath}.reason", rule["reason"], _REASONS))
        field_path = rule.get("fieldPath", "")
        if field_path and (not field_path.strip() or re.search(r"[\n\r]", field_path)):
            errors.append(
                invalid(
                    f"{rpath}.fieldPath", field_path, "fieldPath must be non-empty and on one line"
                )
            )
    return errors


# ---------------------------------------------------------------- defaults


def default_errors(s: dict[str, Any], path: str, resource: bool = True) -> list[str]:
    """Each default pruned (no field its schema does not know) and valid against its schema.
    Not followed into ``additionalProperties``, as the server does not."""
    resource = resource or bool(s.get("x-kubernetes-embedded-resource"))
    errors = []
    if "default" in s:
        value = s["default"]
        pruned, dropped = oas.prune(value, s, root=resource)
        if dropped or pruned != value:
            errors.append(invalid(f"{path}.default", value, "must not have unknown fields"))
        errors += oas.validate(value, s, f"{path}.default", root=resource)
    if dict_or_none(s.get("items")) is not None:
        errors += default_errors(s["items"], f"{path}.items", resource=False)
    for key, sub in properties(s).items():
        errors += default_errors(sub, f"{path}.properties[{key}]", resource=False)
    return errors
