"""OpenAPI v3 documents of the served kinds, and the unknown fields of a body (pure).

``/openapi/v3`` lists one document per group-version (``api/v1``, ``apis/gagar.dev/v1alpha1``,
...) with a hash in its URL, as the API server does; each document holds the group-version's
paths (every operation carries ``x-kubernetes-group-version-kind`` and its query parameters,
``fieldValidation`` among them) and ``components.schemas`` named as the server names them
(``io.k8s.api.core.v1.Pod``, ``dev.gagar.v1alpha1.GagarRun``). That is what kubectl reads: the
paths tell it that the server validates fields itself (so ``kubectl apply``'s default
validation sends ``fieldValidation=Strict`` instead of downloading ``/openapi/v2``), the
schemas are what ``kubectl explain`` prints and what client-side apply computes strategic merge
patches from.

Built-in kinds' schemas come from Kubernetes 1.32's OpenAPI definitions as ``kubernetes-validate``
ships them (JSON Schema: nullable types, ``$defs``), turned back into OpenAPI; a custom kind's is
its CRD's ``openAPIV3Schema`` with the standard ``metadata``. Not served: ``/openapi/v2``
(kubectl and helm fall back to it only when v3 is missing), protobuf documents, and the
non-resource paths.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import pathlib
from typing import Any

from .resources import ResourceType

K8S_VERSION = "1.32.0"
REF = "#/components/schemas/"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
LIST_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"
SCALE = "io.k8s.api.autoscaling.v1.Scale"
_DESCRIPTIONS = {
    "apiVersion": "APIVersion defines the versioned schema of this representation of an object.",
    "kind": "Kind is a string value representing the REST resource this object represents.",
    "metadata": "Standard object's metadata.",
}
_QUERY = {
    "get": ("pretty",),
    "list": ("pretty", "labelSelector", "fieldSelector", "limit", "continue",
             "resourceVersion", "resourceVersionMatch", "watch", "timeoutSeconds"),
    "post": ("pretty", "dryRun", "fieldManager", "fieldValidation"),
    "put": ("pretty", "dryRun", "fieldManager", "fieldValidation"),
    "patch": ("pretty", "dryRun", "fieldManager", "fieldValidation", "force"),
    "delete": ("pretty", "dryRun", "gracePeriodSeconds", "propagationPolicy"),
}  # fmt: skip
ITEM_VERBS = ("get", "put", "patch", "delete")
_PATCH_TYPES = (
    "application/apply-patch+yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
)


# ----- built-in definitions ------------------------------------------------------------------


@functools.cache
def definitions() -> dict[str, dict]:
    """Kubernetes' own definitions, as OpenAPI v3 ``components.schemas``."""
    import kubernetes_validate

    root = pathlib.Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    source = json.loads((root / f"v{K8S_VERSION}-local" / "_definitions.json").read_text())
    return {name: _openapi(schema) for name, schema in source["$defs"].items()}


def _openapi(node: Any) -> Any:
    """One JSON Schema node (``type: [x, "null"]``, ``#/$defs/`` refs) as OpenAPI v3."""
    if not isinstance(node, dict):
        return node
    if "oneOf" in node and all(set(o) == {"type"} for o in node["oneOf"]):  # IntOrString, Quantity
        kinds = {_scalar(o["type"]) for o in node["oneOf"]}
        fmt = {"format": "int-or-string"} if kinds == {"string", "integer"} else {}
        described = {"description": node["description"]} if "description" in node else {}
        return {"type": "string", **fmt, **described}
    out: dict = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: _openapi(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = _openapi(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [_openapi(sub) for sub in value]
        elif key == "type":
            out[key] = _scalar(value)
        elif key != "$ref":
            out[key] = value
    if "$ref" in node:
        ref = {"$ref": REF + node["$ref"].rsplit("/", 1)[1]}
        return {"allOf": [ref], **out} if out else ref
    return out


def _scalar(kind: Any) -> str:
    return next(k for k in kind if k != "null") if isinstance(kind, list) else kind


def _gvk_of(schema: dict) -> list[dict]:
    return schema.get("x-kubernetes-group-version-kind") or []


@functools.cache
def _builtin_names() -> dict[tuple[str, str, str], str]:
    """(group, version, kind) -> the definition's name."""
    return {
        (g["group"], g["version"], g["kind"]): name
        for name, schema in definitions().items()
        for g in _gvk_of(schema)
    }


def builtin_schema_name(rt: ResourceType) -> str | None:
    return _builtin_names().get((rt.group, rt.version, rt.kind))


def _closure(names: list[str], schemas: dict[str, dict]) -> dict[str, dict]:
    """The named schemas and every schema they reference, transitively."""
    out: dict[str, dict] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in out or name not in schemas:
            continue
        out[name] = schemas[name]
        todo += _refs(schemas[name])
    return out


def _refs(node: Any) -> list[str]:
    if isinstance(node, list):
        return [r for n in node for r in _refs(n)]
    if not isinstance(node, dict):
        return []
    own = [node["$ref"].removeprefix(REF)] if isinstance(node.get("$ref"), str) else []
    return own + [r for v in node.values() for r in _refs(v)]


# ----- custom kinds --------------------------------------------------------------------------


def schema_name(rt: ResourceType) -> str:
    """``dev.gagar.v1alpha1.GagarRun``: the server's name for a custom kind's schema."""
    if not rt.custom:
        return builtin_schema_name(rt) or f"{rt.group or 'core'}.{rt.version}.{rt.kind}"
    return ".".join([*reversed(rt.group.split(".")), rt.version, rt.kind])


def _custom_schemas(rt: ResourceType) -> dict[str, dict]:
    gvk = [{"group": rt.group, "kind": rt.kind, "version": rt.version}]
    schema = copy.deepcopy(rt.schema or {"type": "object"})
    props = schema.setdefault("properties", {})
    for key in ("apiVersion", "kind"):
        props.setdefault(key, {"type": "string", "description": _DESCRIPTIONS[key]})
    props["metadata"] = {"allOf": [{"$ref": REF + OBJECT_META}], "default": {},
                         "description": _DESCRIPTIONS["metadata"]}  # fmt: skip
    schema["x-kubernetes-group-version-kind"] = gvk
    list_gvk = [{**gvk[0], "kind": f"{rt.kind}List"}]
    listing = {
        "description": f"{rt.kind}List is a list of {rt.kind}",
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {"type": "string", "description": _DESCRIPTIONS["apiVersion"]},
            "kind": {"type": "string", "description": _DESCRIPTIONS["kind"]},
            "items": {"type": "array", "items": {"$ref": REF + schema_name(rt)}},
            "metadata": {"allOf": [{"$ref": REF + LIST_META}], "default": {}},
        },
        "x-kubernetes-group-version-kind": list_gvk,
    }
    return {schema_name(rt): schema, schema_name(rt) + "List": listing}


# ----- documents -----------------------------------------------------------------------------


def group_versions(types: list[ResourceType]) -> list[tuple[str, str]]:
    return sorted({(t.group, t.version) for t in types})


def gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def document(group: str, version: str, types: list[ResourceType]) -> dict:
    """The OpenAPI v3 document of one group-version."""
    served = [t for t in types if (t.group, t.version) == (group, version)]
    schemas: dict[str, dict] = {}
    roots = []
    for t in served:
        if t.custom:
            schemas.update(_custom_schemas(t))
            roots += [OBJECT_META, LIST_META]
        else:
            name = builtin_schema_name(t)
            roots += [name, f"{name}List"] if name else []
        if t.scale:
            roots.append(SCALE)
    schemas.update(_closure(roots, definitions()))  # a custom kind's refs are the meta types'
    paths: dict[str, dict] = {}
    for t in served:
        paths.update(_paths(t, f"/{gv_path(group, version)}"))
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.31.0-gagar-emulator"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def _paths(rt: ResourceType, prefix: str) -> dict[str, dict]:
    gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind, "custom": rt.custom}
    ref = REF + schema_name(rt)
    scope = f"{prefix}/namespaces/{{namespace}}" if rt.namespaced else prefix
    item = f"{scope}/{rt.plural}/{{name}}"
    out = {
        f"{scope}/{rt.plural}": {
            "get": _op("list", gvk, ref + "List"),
            "post": _op("post", gvk, ref),
            "delete": _op("delete", gvk, None),
        },
        item: {v: _op(v, gvk, ref if v != "delete" else None) for v in ITEM_VERBS},
    }
    if rt.namespaced:
        out[f"{prefix}/{rt.plural}"] = {"get": _op("list", gvk, ref + "List")}
    for sub in rt.subresources:
        scale = {"group": "autoscaling", "version": "v1", "kind": "Scale", "custom": rt.custom}
        sub_gvk = scale if sub == "scale" else gvk
        sub_ref = REF + SCALE if sub == "scale" else ref
        out[f"{item}/{sub}"] = {
            verb: _op(verb, sub_gvk, sub_ref) for verb in ("get", "put", "patch")
        }
    return out


def _op(verb: str, gvk_custom: dict, ref: str | None) -> dict:
    """One operation. A custom kind's PATCH lists no strategic merge patch: kubectl reads that
    to send a JSON merge patch instead (the server refuses strategic ones for custom kinds)."""
    gvk = {k: v for k, v in gvk_custom.items() if k != "custom"}
    patch_types = [t for t in _PATCH_TYPES if not gvk_custom["custom"] or "strategic" not in t]
    action = {"post": "post", "put": "put", "patch": "patch", "delete": "delete",
              "list": "list", "get": "get"}[verb]  # fmt: skip
    params = [{"name": n, "in": "query", "schema": {"type": "string"}} for n in _QUERY[verb]]
    body = {"content": {"application/json": {"schema": {"$ref": ref}}}} if ref else {}
    op: dict = {
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk,
        "parameters": params,
        "responses": {"200": {"description": "OK", **body}},
    }
    if verb in ("post", "put") and ref:
        op["requestBody"] = {"content": {"*/*": {"schema": {"$ref": ref}}}, "required": True}
    if verb == "patch":
        op["requestBody"] = {
            "content": {t: {"schema": {"type": "object"}} for t in patch_types},
            "required": True,
        }
    return op


# ----- unknown fields ------------------------------------------------------------------------


def unknown_fields(rt: ResourceType, body: Any) -> list[str]:
    """The paths (``spec.foo``, ``spec.containers[0].bar``) of the fields in ``body`` the kind's
    schema does not declare, as the server's strict decoding names them. Patch directives
    (``$patch``, ``$setElementOrder/...``) are not fields."""
    if rt.custom:
        schema: dict = rt.schema or {}
        schemas: dict[str, dict] = {}
    else:
        name = builtin_schema_name(rt)
        if name is None:
            return []
        schema, schemas = definitions()[name], definitions()
    return _unknown(body, schema, schemas, "", root=True)


def _resolve(schema: dict, schemas: dict[str, dict]) -> dict:
    while True:
        ref = schema.get("$ref") or next(
            (s.get("$ref") for s in schema.get("allOf") or [] if "$ref" in s), None
        )
        if not ref:
            return schema
        schema = schemas.get(ref.removeprefix(REF), {})


def _unknown(value: Any, schema: dict, schemas: dict[str, dict], path: str,
             root: bool = False) -> list[str]:  # fmt: skip
    schema = _resolve(schema, schemas)
    if isinstance(value, list):
        items = schema.get("items")
        if not isinstance(items, dict):
            return []
        return [u for i, v in enumerate(value) for u in _unknown(v, items, schemas, f"{path}[{i}]")]
    if not isinstance(value, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    props, extra = schema.get("properties"), schema.get("additionalProperties")
    if props is None and extra is None:
        return []  # free-form (RawExtension, JSON) or a scalar's schema
    out = []
    for key, sub in value.items():
        where = f"{path}.{key}" if path else key
        if key.startswith("$") or (root and key in ("apiVersion", "kind")):
            continue
        if root and key == "metadata":  # a custom kind's schema leaves it to ObjectMeta
            out += _unknown(sub, {"$ref": REF + OBJECT_META}, definitions(), where)
        elif props and key in props:
            out += _unknown(sub, props[key], schemas, where)
        elif isinstance(extra, dict):
            out += _unknown(sub, extra, schemas, where)
        elif extra is not True:
            out.append(where)
    return out


class Documents:
    """The documents by group-version, each rebuilt only when its served kinds change (a CRD
    created, updated or deleted): a document of ``api/v1`` takes about 50 ms to build."""

    def __init__(self) -> None:
        self._built: dict[tuple[str, str], tuple[str, dict, str]] = {}

    def get(self, group: str, version: str, types: list[ResourceType]) -> tuple[dict, str]:
        """(the document, its hash)."""
        served = [t for t in types if (t.group, t.version) == (group, version)]
        key = json.dumps([(t.plural, t.kind, t.namespaced, t.subresources, t.schema)
                          for t in sorted(served, key=lambda t: t.plural)], sort_keys=True)  # fmt: skip
        built = self._built.get((group, version))
        if built is None or built[0] != key:
            doc = document(group, version, types)
            digest = hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest()
            built = self._built[(group, version)] = (key, doc, digest[:128].upper())
        return built[1], built[2]

    def discovery(self, types: list[ResourceType]) -> dict:
        """``/openapi/v3``: each group-version's document, by a URL carrying its hash."""
        paths = {}
        for group, version in group_versions(types):
            path = gv_path(group, version)
            digest = self.get(group, version, types)[1]
            paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
        return {"paths": paths}
