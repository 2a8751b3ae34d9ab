"""Quantities are int-or-string, as Kubernetes takes them: an unquoted ``cpu: 32`` or
``nvidia.com/gpu: 1`` passes ``gagar validate``, the CRD and the emulator; a fraction written as a
number, a negative number and a string that is no quantity are refused by all of them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from gagar.crd import build_crd
from gagar.manifest import validate_document
from gagar.spec import ResourceRequirements
from tests.kube_emulator import KubeEmulator
from tests.support.crd_check import crd_errors

ROOT = Path(__file__).resolve().parents[2]
UNQUOTED = """
requests: {cpu: 32, memory: 512Gi}
limits: {nvidia.com/gpu: 8}
"""  # the trainer of examples/single-gpu.yaml: 8 processes, one per GPU


def run_with(resources: dict[str, Any]) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / "single-gpu.yaml").read_text())
    doc = copy.deepcopy(doc)
    doc["spec"]["trainer"]["resources"] = resources
    return doc


def test_unquoted_integers_are_quantities() -> None:
    res = ResourceRequirements.model_validate(yaml.safe_load(UNQUOTED))
    assert res.requests == {"cpu": "32", "memory": "512Gi"}
    assert res.limits == {"nvidia.com/gpu": "8"} and res.gpus == 8


def test_gagar_validate_and_the_crd_take_unquoted_quantities() -> None:
    doc = run_with(yaml.safe_load(UNQUOTED))
    run, problems = validate_document(doc, "run.yaml")
    assert problems == [] and run is not None
    assert run.spec.trainer.resources.requests["cpu"] == "32"
    assert crd_errors(doc, build_crd()) == []


@pytest.mark.parametrize(
    ("value", "pydantic_says", "crd_says"),
    [
        (
            0.5,
            "0.5 is a number: write a quantity as a string ('0.5', '500m')",
            "not valid under any",
        ),
        (-1, "is not a Kubernetes quantity", "less than the minimum of 0"),
        ("banana", "is not a Kubernetes quantity", "does not match"),
        (True, "valid string", "not valid under any"),
    ],
)
def test_what_is_no_quantity_is_refused_by_both(
    value: Any, pydantic_says: str, crd_says: str
) -> None:
    doc = run_with({"requests": {"cpu": value}})
    _, problems = validate_document(doc, "run.yaml")
    assert any(pydantic_says in str(p) for p in problems), problems
    assert any(crd_says in e for e in crd_errors(doc, build_crd())), crd_errors(doc, build_crd())


def test_an_integer_too_large_is_refused_by_both() -> None:
    doc = run_with({"requests": {"memory": 10**16}})
    _, problems = validate_document(doc, "run.yaml")
    assert any("use a suffix" in str(p) for p in problems), problems
    assert any("greater than the maximum" in e for e in crd_errors(doc, build_crd()))


def test_the_emulator_stores_an_unquoted_quantity_as_the_server_does() -> None:
    doc = run_with(yaml.safe_load(UNQUOTED))
    with KubeEmulator() as kube:
        kube.load_yaml(ROOT / "manifests" / "crd" / "gagarruns.gagar.dev.yaml")
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gagar"}})
        stored = kube.create(doc)
        fraction = run_with({"requests": {"cpu": 0.5}})
        fraction["metadata"]["name"] = "fraction"
        with pytest.raises(Exception, match="must be an integer or a string"):
            kube.create(fraction)
    assert stored["spec"]["trainer"]["resources"]["requests"]["cpu"] == 32
    assert stored["spec"]["trainer"]["resources"]["limits"] == {"nvidia.com/gpu": 8}
