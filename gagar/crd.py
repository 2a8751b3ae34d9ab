"""Generate the GagarRun CustomResourceDefinition from the pydantic models in ``gagar.spec``.

Kubernetes wants a *structural* OpenAPI v3 schema: no ``$ref``, a ``type`` on every node (but
``x-kubernetes-int-or-string`` ones, the quantities, whose ``anyOf`` is kept), no
``additionalProperties`` beside ``properties``, OpenAPI 3.0 forms (boolean ``exclusiveMinimum``),
no ``const``/``prefixItems``/``null`` types. ``structural`` rewrites pydantic's JSON Schema into
that form; optional fields are simply not required (the API server prunes explicit nulls before
validation, so ``has(self.x)`` in CEL is false for them). Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from gagar import API_GROUP, API_VERSION, KIND
from gagar.spec import DNS_LABEL, MAX_NAME_LENGTH, MAX_NUMBER, GagarRunSpec, GagarRunStatus

PLURAL = "gagarruns"
CRD_NAME = f"{PLURAL}.{API_GROUP}"
_DROP = {"title", "$defs", "discriminator"}


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline a ``$ref`` (keeping sibling keys such as ``description``)."""
    if "$ref" in node:
        target = defs[node["$ref"].split("/")[-1]]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    if "allOf" in node and len(node["allOf"]) == 1:
        node = {
            **_resolve(node["allOf"][0], defs),
            **{k: v for k, v in node.items() if k != "allOf"},
        }
    return node


def _strip_null(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """``anyOf: [X, {type: null}]`` → ``X`` (optional fields are expressed by not being required)."""
    options = node.get("anyOf")
    if not options or node.get("x-kubernetes-int-or-string"):  # its anyOf is [integer, string]
        return node
    rest = [o for o in options if o.get("type") != "null"]
    if len(rest) != 1:
        raise ValueError(f"cannot express a union of {len(rest)} types structurally: {options}")
    merged = {**_resolve(rest[0], defs), **{k: v for k, v in node.items() if k != "anyOf"}}
    if merged.get("default", 0) is None:
        del merged["default"]
    return merged


def _openapi30(node: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema 2020-12 keywords → OpenAPI 3.0 ones."""
    out = dict(node)
    for key, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(key), (int, float)) and not isinstance(out.get(key), bool):
            out[bound], out[key] = out[key], True
    if "const" in out:
        out["enum"] = [out.pop("const")]
    if "prefixItems" in out:
        items = out.pop("prefixItems")
        out["items"] = items[0]
        out["minItems"] = out["maxItems"] = len(items)
    return out


def structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Rewrite one JSON Schema node (recursively) into a structural OpenAPI v3 schema."""
    node = _openapi30(_strip_null(_resolve(node, defs), defs))
    out: dict[str, Any] = {k: v for k, v in node.items() if k not in _DROP}
    if "description" in out:  # docstrings → one line, Markdown backticks
        out["description"] = " ".join(out["description"].split()).replace("``", "`")
    if "properties" in out:
        out["properties"] = {k: structural(v, defs) for k, v in out["properties"].items()}
        out.pop("additionalProperties", None)
        out.setdefault("type", "object")
    elif isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = structural(out["additionalProperties"], defs)
    if isinstance(out.get("items"), dict):
        out["items"] = structural(out["items"], defs)
    if "anyOf" in out:  # an int-or-string's [integer, string]: a copy per field, no YAML anchors
        out["anyOf"] = [dict(option) for option in out["anyOf"]]
    if isinstance(out.get("default"), (dict, list)):
        del out["default"]  # object defaults would be applied before nested ones; keep scalars only
    if "type" not in out and "enum" in out:
        out["type"] = "string"
    if "type" not in out and not out.get("x-kubernetes-int-or-string"):
        raise ValueError(f"schema node without a type: {node}")
    if out.get("type") in ("integer", "number"):  # finite, as pydantic's ``Model._bounded``
        out.setdefault("maximum", MAX_NUMBER)
        out.setdefault("minimum", -MAX_NUMBER)
    return out


def model_schema(model: type[Any]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return structural(raw, raw.get("$defs", {}))


def _printer_columns() -> list[dict[str, Any]]:
    return [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Mode", "type": "string", "jsonPath": ".spec.algorithm.mode"},
        {"name": "Step", "type": "integer", "jsonPath": ".status.step"},
        {"name": "Total", "type": "integer", "jsonPath": ".spec.algorithm.totalSteps"},
        {"name": "Restarts", "type": "integer", "jsonPath": ".status.trainerRestarts"},
        {
            "name": "Ready",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
        },
        {
            "name": "Reason",
            "type": "string",
            "priority": 1,
            "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
        },
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


# ``kubectl scale gagarrun/NAME --replicas=N`` (and an HPA or KEDA ScaledObject targeting the
# GagarRun) scales the grader pool: the scale subresource is a view of .spec.grader.replicas. A
# write while the grader is autoscaled or external fails the grader's CEL rules (docs/scaling.md).
SCALE = {
    "specReplicasPath": ".spec.grader.replicas",
    "statusReplicasPath": ".status.pools.grader.replicas",
    "labelSelectorPath": ".status.pools.grader.selector",
}


def build_crd() -> dict[str, Any]:
    """The GagarRun CRD, as a manifest dict."""
    root = {
        "type": "object",
        "description": "GagarRun: one GAGAR (or GRPO) training run of a code agent.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            # kube-apiserver lets a CRD bound these two only, and say nothing else of metadata (not
            # even a description: "must not specify anything other than name and generateName");
            # bounded, the CEL rules below on the name cost 140 instead of 2.2 million (an
            # unbounded name counts as 3 MiB).
            "metadata": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": MAX_NAME_LENGTH},
                    "generateName": {"type": "string", "maxLength": MAX_NAME_LENGTH},
                },
            },
            "spec": model_schema(GagarRunSpec),
            "status": model_schema(GagarRunStatus),
        },
        "x-kubernetes-validations": [
            {
                "rule": f"self.metadata.name.size() <= {MAX_NAME_LENGTH}",
                "message": f"metadata.name must be at most {MAX_NAME_LENGTH} characters so child object names fit",
            },
            {
                "rule": f"self.metadata.name.matches('{DNS_LABEL}')",
                "message": "metadata.name must be a DNS-1035 label (child Services are named after it)",
            },
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/name": "gagar", "app.kubernetes.io/component": "crd"},
        },
        "spec": {
            "group": API_GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": "gagarrun",
                "shortNames": ["gr"],
                "categories": ["gagar"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}, "scale": SCALE},
                    "additionalPrinterColumns": _printer_columns(),
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }
