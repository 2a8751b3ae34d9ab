"""The API server's rules for a CRD schema (``tests/kube_emulator/crd_schema.py``): each rule
refuses a small hand-written schema, worded as the server words it; gagar's CRD, the chart's copy
and the emulator's other CRDs pass; and the emulator refuses a CRD that breaks one (422)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gagar.crd import build_crd
from tests.kube_emulator import KubeEmulator
from tests.kube_emulator.agent_sandbox import CRDS as SANDBOX_CRDS
from tests.kube_emulator.crd_schema import crd_errors, schema_errors
from tests.kube_emulator.rbac import ADMIN_HEADERS

ROOT = Path(__file__).resolve().parents[2]
S = "s"  # the path the messages below start from
IOS = [{"type": "integer"}, {"type": "string"}]  # the int-or-string anyOf


def spec(node: dict[str, Any], **root: Any) -> dict[str, Any]:
    """A root schema whose ``spec`` is ``node``."""
    return {"type": "object", "properties": {"spec": node}, **root}


def meta(node: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"metadata": node}}


def map_list(items: dict[str, Any], keys: list[str] | None = None) -> dict[str, Any]:
    node = {"type": "array", "x-kubernetes-list-type": "map", "items": items}
    return spec(node if keys is None else {**node, "x-kubernetes-list-map-keys": keys})


OBJ = {"type": "object", "properties": {"a": {"type": "string"}}}
P = f"{S}.properties[spec]"

# (schema, status subresource, the message it gets)
REFUSED: dict[str, tuple[dict[str, Any], bool, str]] = {
    # ValidateStructural: metadata at the root
    "root metadata with a description": (
        meta({"type": "object", "description": "standard metadata"}),
        True,
        f"{S}.properties[metadata]: Forbidden: must not specify anything other than name and "
        "generateName, but metadata is implicitly specified",
    ),
    "root metadata bounding labels": (
        meta({"type": "object", "properties": {"labels": {"type": "object"}}}),
        False,
        f"{S}.properties[metadata]: Forbidden: must not specify anything other than name",
    ),
    "root metadata with a pattern": (
        meta({"type": "object", "maxProperties": 3}),
        False,
        f"{S}.properties[metadata]: Forbidden: must not specify anything other than name",
    ),
    "root metadata not an object": (
        meta({"type": "string"}),
        False,
        f'{S}.properties[metadata].type: Invalid value: "string": must be object',
    ),
    # ValidateStructural: types
    "a field without a type": (
        spec({"properties": {"a": {"type": "string"}}}),
        False,
        f"{P}.type: Required value: must not be empty for specified object fields",
    ),
    "an item without a type": (
        spec({"type": "array", "items": {"maxLength": 3}}),
        False,
        f"{P}.items.type: Required value: must not be empty for specified array items",
    ),
    "a root without a type": (
        {"properties": {"spec": OBJ}},
        False,
        f"{S}.type: Required value: must not be empty at the root",
    ),
    "int-or-string's anyOf without the extension": (
        spec({"anyOf": IOS}),
        False,
        f"{P}.type: Required value: must not be empty for specified object fields",
    ),
    "an array without items": (
        spec({"type": "array"}),
        False,
        f"{P}.items: Required value: must be specified",
    ),
    "a root not an object": (
        {"type": "array", "items": {"type": "string"}},
        False,
        f'{S}.type: Invalid value: "array": must be object at the root',
    ),
    "additionalProperties at the root": (
        {"type": "object", "additionalProperties": {"type": "string"}},
        False,
        f"{S}.additionalProperties: Forbidden: must not be used at the root",
    ),
    # ValidateStructural: extensions
    "int-or-string preserving unknown fields": (
        spec({"x-kubernetes-int-or-string": True, "x-kubernetes-preserve-unknown-fields": True}),
        False,
        f"{P}.x-kubernetes-preserve-unknown-fields: Invalid value: true: must be false if "
        "x-kubernetes-int-or-string is true",
    ),
    "int-or-string embedding a resource": (
        spec(
            {
                "type": "object",
                "x-kubernetes-int-or-string": True,
                "x-kubernetes-embedded-resource": True,
                "x-kubernetes-preserve-unknown-fields": True,
            }
        ),
        False,
        f"{P}.x-kubernetes-embedded-resource: Invalid value: true: must be false if "
        "x-kubernetes-int-or-string is true",
    ),
    "an embedded resource without type": (
        spec(
            {"x-kubernetes-embedded-resource": True, "x-kubernetes-preserve-unknown-fields": True}
        ),
        False,
        f"{P}.type: Required value: must be object if x-kubernetes-embedded-resource is true",
    ),
    "an embedded resource without properties": (
        spec({"type": "object", "x-kubernetes-embedded-resource": True}),
        False,
        f"{P}.properties: Required value: must not be empty if x-kubernetes-embedded-resource is "
        "true without x-kubernetes-preserve-unknown-fields",
    ),
    "an embedded resource with additionalProperties": (
        spec(
            {
                "type": "object",
                "x-kubernetes-embedded-resource": True,
                "x-kubernetes-preserve-unknown-fields": True,
                "additionalProperties": True,
            }
        ),
        False,
        f"{P}.additionalProperties: Forbidden: must not be used if x-kubernetes-embedded-resource",
    ),
    "an embedded resource whose metadata is a string": (
        spec(
            {
                "type": "object",
                "x-kubernetes-embedded-resource": True,
                "properties": {"metadata": {"type": "string"}},
            }
        ),
        False,
        f'{P}.properties[metadata].type: Invalid value: "string": must be object',
    ),
    "an embedded resource whose kind is a number": (
        spec(
            {
                "type": "object",
                "x-kubernetes-embedded-resource": True,
                "properties": {"kind": {"type": "integer"}},
            }
        ),
        False,
        f'{P}.properties[kind].type: Invalid value: "integer": must be string',
    ),
    # ValidateStructural: value validations under anyOf/allOf/oneOf/not
    "a type under anyOf": (
        spec({"type": "string", "anyOf": [{"type": "string", "maxLength": 3}, {"minLength": 9}]}),
        False,
        f"{P}.anyOf[0].type: Forbidden: must be empty to be structural",
    ),
    "a description under allOf": (
        spec({"type": "string", "allOf": [{"description": "x"}]}),
        False,
        f"{P}.allOf[0].description: Forbidden: must be empty to be structural",
    ),
    "a default under oneOf": (
        spec({"type": "string", "oneOf": [{"default": "x"}, {"maxLength": 1}]}),
        False,
        f"{P}.oneOf[0].default: Forbidden: must be undefined to be structural",
    ),
    "nullable under not": (
        spec({"type": "string", "not": {"nullable": True}}),
        False,
        f"{P}.not.nullable: Forbidden: must be false to be structural",
    ),
    "additionalProperties under allOf": (
        spec(
            {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "allOf": [{"additionalProperties": {"maxLength": 2}}],
            }
        ),
        False,
        f"{P}.allOf[0].additionalProperties: Forbidden: must be undefined to be structural",
    ),
    "a CEL rule under anyOf": (
        spec({"type": "string", "anyOf": [{"x-kubernetes-validations": [{"rule": "true"}]}]}),
        False,
        f"{P}.anyOf[0].x-kubernetes-validations: Forbidden: must be empty to be structural",
    ),
    "a list type under allOf": (
        spec(
            {
                "type": "array",
                "items": {"type": "string"},
                "allOf": [{"x-kubernetes-list-type": "set"}],
            }
        ),
        False,
        f"{P}.allOf[0].x-kubernetes-list-type: Forbidden: must be undefined to be structural",
    ),
    "metadata under not": (
        spec({**OBJ, "not": {"properties": {"metadata": {"maxProperties": 1}}}}),
        False,
        f"{P}.not.properties[metadata]: Forbidden: must not be specified in a nested context",
    ),
    "a property only under the root's anyOf": (
        {**OBJ, "anyOf": [{"properties": {"b": {"maxLength": 1}}}, {"required": ["a"]}]},
        False,
        f"{S}.properties[b]: Required value: because it is defined in {S}.anyOf[0].properties[b]",
    ),
    "a pattern that does not compile": (
        spec({"type": "string", "pattern": "(a"}),
        False,
        f'{P}.pattern: Invalid value: "(a": must be a valid regular expression',
    ),
    # the API validation: the root
    "anyOf at a root with a status subresource": (
        {**OBJ, "anyOf": [{"required": ["a"]}]},
        True,
        f'{S}: Invalid value: ["anyOf"]: only [description type format title',
    ),
    "a nullable root": (
        {**OBJ, "nullable": True},
        False,
        f"{S}.nullable: Forbidden: nullable cannot be true at the root",
    ),
    # the API validation: OpenAPI v3 keywords
    "an unknown type": (
        spec({"type": "date"}),
        False,
        f'{P}.type: Unsupported value: "date": supported values: "array", "boolean"',
    ),
    "a null type": (
        spec({"type": "null"}),
        False,
        f"{P}.type: Forbidden: type cannot be set to null, use nullable as an alternative",
    ),
    "a $ref": (
        spec({"type": "object", "$ref": "#/x"}),
        False,
        f"{P}.$ref: Forbidden: $ref is not supported",
    ),
    "patternProperties": (
        spec({"type": "object", "patternProperties": {"^a": {"type": "string"}}}),
        False,
        f"{P}.patternProperties: Forbidden: patternProperties is not supported",
    ),
    "items as an array": (
        spec({"type": "array", "items": [{"type": "string"}]}),
        False,
        f"{P}.items: Forbidden: items must be a schema object and not an array",
    ),
    "uniqueItems": (
        spec({"type": "array", "items": {"type": "string"}, "uniqueItems": True}),
        False,
        f"{P}.uniqueItems: Forbidden: uniqueItems cannot be set to true",
    ),
    "additionalProperties beside properties": (
        spec({**OBJ, "additionalProperties": {"type": "string"}}),
        False,
        f"{P}.additionalProperties: Forbidden: additionalProperties and properties are mutual "
        "exclusive",
    ),
    "additionalProperties false beside properties": (
        spec({**OBJ, "additionalProperties": False}),
        False,
        f"{P}.additionalProperties: Forbidden: additionalProperties and properties are mutual",
    ),
    "a default on the name": (
        meta({"type": "object", "properties": {"name": {"type": "string", "default": "x"}}}),
        False,
        f"{S}.properties[metadata].properties[name].default: Forbidden: must not be set in "
        "top-level metadata",
    ),
    "a default on kind": (
        {"type": "object", "properties": {"kind": {"type": "string", "default": "X"}}},
        False,
        f"{S}.properties[kind].default: Forbidden: must not be set in top-level kind",
    ),
    "an embedded resource in resource metadata": (
        meta(
            {
                "type": "object",
                "properties": {
                    "name": {
                        "type": "object",
                        "x-kubernetes-embedded-resource": True,
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ),
        False,
        f"{S}.properties[metadata].properties[name].x-kubernetes-embedded-resource: Forbidden: "
        "must not be used inside of resource meta",
    ),
    "preserve-unknown-fields false": (
        spec({"type": "object", "x-kubernetes-preserve-unknown-fields": False}),
        False,
        f"{P}.x-kubernetes-preserve-unknown-fields: Invalid value: false: must be true or undefined",
    ),
    # the API validation: map and list types
    "a map type on a string": (
        spec({"type": "string", "x-kubernetes-map-type": "atomic"}),
        False,
        f'{P}.type: Invalid value: "string": must be object if x-kubernetes-map-type is specified',
    ),
    "an unknown map type": (
        spec({**OBJ, "x-kubernetes-map-type": "merged"}),
        False,
        f'{P}.x-kubernetes-map-type: Unsupported value: "merged": supported values: "atomic", '
        '"granular"',
    ),
    "a list type on an object": (
        spec({**OBJ, "x-kubernetes-list-type": "atomic"}),
        False,
        f'{P}.type: Invalid value: "object": must be array if x-kubernetes-list-type is specified',
    ),
    "an unknown list type": (
        spec({"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "bag"}),
        False,
        f'{P}.x-kubernetes-list-type: Unsupported value: "bag"',
    ),
    "a set of granular objects": (
        spec({"type": "array", "items": OBJ, "x-kubernetes-list-type": "set"}),
        False,
        f"{P}.items.x-kubernetes-map-type: Invalid value: null: must be atomic as item of a list "
        "with x-kubernetes-list-type=set",
    ),
    "map keys without a list type": (
        spec({"type": "array", "items": OBJ, "x-kubernetes-list-map-keys": ["a"]}),
        False,
        f"{P}.x-kubernetes-list-type: Required value: must be map if x-kubernetes-list-map-keys "
        "is non-empty",
    ),
    "a map list without keys": (
        map_list({**OBJ, "required": ["a"]}),
        False,
        f"{P}.x-kubernetes-list-map-keys: Required value: must not be empty if "
        "x-kubernetes-list-type is map",
    ),
    "a map list of strings": (
        map_list({"type": "string"}, ["a"]),
        False,
        f'{P}.items.type: Invalid value: "string": must be object if parent array\'s '
        "x-kubernetes-list-type is map",
    ),
    "a map key that is no property": (
        map_list({**OBJ, "required": ["a"]}, ["b"]),
        False,
        f'{P}.x-kubernetes-list-map-keys: Invalid value: ["b"]: entries must all be names of '
        "item properties",
    ),
    "a map key that is an object": (
        map_list({"type": "object", "required": ["a"], "properties": {"a": OBJ}}, ["a"]),
        False,
        f'{P}.items.properties[a].type: Invalid value: "object": must be a scalar type if parent '
        "array's x-kubernetes-list-type is map",
    ),
    "a map key neither required nor defaulted": (
        map_list(OBJ, ["a"]),
        False,
        f"{P}.items.properties[a].default: Required value: this property is in "
        "x-kubernetes-list-map-keys, so it must have a default or be a required property",
    ),
    "a nullable map key": (
        map_list(
            {
                "type": "object",
                "required": ["a"],
                "properties": {"a": {"type": "string", "nullable": True}},
            },
            ["a"],
        ),
        False,
        f"{P}.items.properties[a].nullable: Forbidden: this property is in "
        "x-kubernetes-list-map-keys, so it cannot be nullable",
    ),
    "nullable items of a map list": (
        map_list({**OBJ, "required": ["a"], "nullable": True}, ["a"]),
        False,
        f"{P}.items.nullable: Forbidden: cannot be nullable when x-kubernetes-list-type is map",
    ),
    # the API validation: CEL rules' shape
    "an empty rule": (
        spec({**OBJ, "x-kubernetes-validations": [{"rule": " "}]}),
        False,
        f"{P}.x-kubernetes-validations[0].rule: Required value: rule is not specified",
    ),
    "a message on two lines": (
        spec({**OBJ, "x-kubernetes-validations": [{"rule": "true", "message": "a\nb"}]}),
        False,
        f'{P}.x-kubernetes-validations[0].message: Invalid value: "a\\nb": message must not '
        "contain line breaks",
    ),
    "an unknown reason": (
        spec({**OBJ, "x-kubernetes-validations": [{"rule": "true", "reason": "Oops"}]}),
        False,
        f'{P}.x-kubernetes-validations[0].reason: Unsupported value: "Oops"',
    ),
    # defaults
    "a default with a field its schema does not know": (
        spec({**OBJ, "default": {"a": "x", "b": 1}}),
        False,
        f'{P}.default: Invalid value: {{"a":"x","b":1}}: must not have unknown fields',
    ),
    "a default below its minimum": (
        spec({"type": "integer", "minimum": 1, "default": 0}),
        False,
        f"{P}.default: Invalid value: 0: {P}.default in body should be greater than or equal to 1",
    ),
    "a default of the wrong type": (
        spec({"type": "string", "default": 3}),
        False,
        f"{P}.default: Invalid value: 3: {P}.default in body must be of type string",
    ),
    "a default outside its enum": (
        spec({"type": "string", "enum": ["a"], "default": "b"}),
        False,
        f'{P}.default: Unsupported value: "b": supported values: "a"',
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_each_rule_refuses_its_schema(case: str) -> None:
    schema, status, message = REFUSED[case]
    errors = schema_errors(schema, S, status=status)
    assert any(e.startswith(message) for e in errors), errors


ACCEPTED: dict[str, dict[str, Any]] = {
    "metadata bounding the name and generateName": meta(
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 40},
                "generateName": {"type": "string", "maxLength": 40},
            },
        }
    ),
    "metadata bounding the name only": meta(
        {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40}}}
    ),
    "int-or-string alone": spec({"x-kubernetes-int-or-string": True}),
    "int-or-string with its anyOf and a pattern": spec(
        {"x-kubernetes-int-or-string": True, "anyOf": IOS, "pattern": "^[0-9]+m?$"}
    ),
    "int-or-string with its allOf": spec(
        {"x-kubernetes-int-or-string": True, "allOf": [{"anyOf": IOS}, {"maxLength": 5}]}
    ),
    "value validations under anyOf": spec(
        {**OBJ, "anyOf": [{"required": ["a"]}, {"properties": {"a": {"maxLength": 1}}}]}
    ),
    "an embedded resource preserving unknown fields": spec(
        {
            "type": "object",
            "x-kubernetes-embedded-resource": True,
            "x-kubernetes-preserve-unknown-fields": True,
        }
    ),
    "a map list keyed by a required and a defaulted field": map_list(
        {
            "type": "object",
            "required": ["a"],
            "properties": {"a": {"type": "string"}, "b": {"type": "integer", "default": 0}},
        },
        ["a", "b"],
    ),
    "a set of atomic objects": spec(
        {
            "type": "array",
            "x-kubernetes-list-type": "set",
            "items": {**OBJ, "x-kubernetes-map-type": "atomic"},
        }
    ),
    "additionalProperties true beside properties": spec({**OBJ, "additionalProperties": True}),
    "a valid, pruned default": spec({**OBJ, "default": {"a": "x"}}),
    "a preserving object's default keeps its fields": spec(
        {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "default": {"z": 1}}
    ),
}


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_what_the_server_accepts_passes(case: str) -> None:
    assert schema_errors(ACCEPTED[case], S, status=True) == []


def test_gagars_crd_passes_the_servers_rules() -> None:
    assert crd_errors(build_crd()) == []
    for rel in (
        "manifests/crd/gagarruns.gagar.dev.yaml",
        "charts/gagar/crds/gagarruns.gagar.dev.yaml",
    ):
        assert crd_errors(yaml.safe_load((ROOT / rel).read_text())) == [], rel


def test_the_emulators_other_crds_pass() -> None:
    crds = [d for d in yaml.safe_load_all(SANDBOX_CRDS.read_text()) if d]
    assert crds and all(crd_errors(c) == [] for c in crds)


def test_the_emulator_refuses_a_crd_the_server_refuses() -> None:
    """The description on the root metadata, which gagar's CRD had: 422, the server's words."""
    crd = copy.deepcopy(build_crd())
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    root["properties"]["metadata"]["description"] = "Standard object metadata."
    with KubeEmulator() as kube, httpx.Client(base_url=kube.url, headers=ADMIN_HEADERS) as http:
        answer = http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
        assert answer.status_code == 422, answer.text
        assert answer.json()["message"] == (
            'CustomResourceDefinition.apiextensions.k8s.io "gagarruns.gagar.dev" is invalid: '
            "spec.versions[0].schema.openAPIV3Schema.properties[metadata]: Forbidden: must not "
            "specify anything other than name and generateName, but metadata is implicitly "
            "specified"
        )
        del root["properties"]["metadata"]["description"]
        assert (
            http.post(
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd
            ).status_code
            == 201
        )
