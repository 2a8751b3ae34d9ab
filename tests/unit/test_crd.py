"""The generated CRD: structural, schema-valid, printer columns, and checked in without drift."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gagar.crd import CRD_NAME, build_crd
from gagar.generated import GENERATED, drifted

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.32.0"


def _walk(node: dict[str, Any], path: str = "$"):
    yield path, node
    for key, sub in node.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{key}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _walk(node[key], f"{path}.{key}")


def test_schema_is_structural() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        if node.get("x-kubernetes-int-or-string"):  # a quantity: Kubernetes' own shape for it
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
            assert "type" not in node, path
            continue
        assert "type" in node, f"{path} has no type"
        for banned in ("$ref", "anyOf", "oneOf", "allOf", "const", "prefixItems", "title", "$defs"):
            assert banned not in node, f"{path} uses {banned}"
        assert not ("properties" in node and "additionalProperties" in node), path
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            assert isinstance(node.get(key, True), bool), (
                f"{path}.{key} must be boolean in OpenAPI 3.0"
            )
        # every object documented but the root's metadata, where the API server refuses anything
        # but name and generateName bounds (tests/unit/test_crd_structural.py holds all its rules)
        if node["type"] == "object" and path.count(".") >= 1 and "properties" in node:
            assert node.get("description") or path == "$.metadata", f"{path} has no description"
    assert "description" not in schema["properties"]["metadata"]


def test_every_spec_field_is_documented() -> None:
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    missing = [
        path
        for path, node in _walk(spec)
        if not node.get("description")
        and ".items" not in path
        and "additionalProperties" not in path
    ]
    assert missing == []


def test_crd_validates_against_the_kubernetes_schemas() -> None:
    kubernetes_validate.validate(build_crd(), K8S_VERSION, strict=True)


def test_crd_basics() -> None:
    crd = build_crd()
    assert crd["metadata"]["name"] == "gagarruns.gagar.dev"
    assert crd["spec"]["names"]["shortNames"] == ["gr"]
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {
        "status": {},
        "scale": {  # kubectl scale gagarrun/NAME: the grader pool
            "specReplicasPath": ".spec.grader.replicas",
            "statusReplicasPath": ".status.pools.grader.replicas",
            "labelSelectorPath": ".status.pools.grader.selector",
        },
    }
    assert {c["name"] for c in version["additionalPrinterColumns"]} >= {
        "Phase",
        "Step",
        "Total",
        "Restarts",
        "Ready",
        "Age",
    }


@pytest.mark.parametrize("rel", sorted(GENERATED))
def test_generated_files_do_not_drift(rel: str) -> None:
    assert rel not in drifted(ROOT), f"{rel} drifted from its source: run `make crd`"
    if rel.endswith(f"{CRD_NAME}.yaml"):
        assert yaml.safe_load((ROOT / rel).read_text())["kind"]


def test_drift_is_detected(tmp_path: Path) -> None:
    from gagar.generated import write_all

    write_all(tmp_path)
    assert drifted(tmp_path) == []
    rel = f"manifests/crd/{CRD_NAME}.yaml"
    target = tmp_path / rel
    target.write_text(target.read_text().replace("prompt-mean", "token-mean", 1))
    assert drifted(tmp_path) == [rel]
