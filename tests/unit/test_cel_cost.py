"""The CRDs the project ships fit kube-apiserver's static CEL cost limits, with room to spare.

``tests/support/cel_cost.py`` redoes the API server's estimate; its numbers are pinned here to
values apiextensions-apiserver's own cost tests expect for the same schema and rule, so a drift
from the server's method fails here before it reaches a cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cel_cost import (
    STATIC_CRD_LIMIT,
    STATIC_RULE_LIMIT,
    CostError,
    crd_errors,
    crd_rule_costs,
    decl_of,
    rule_cost,
)

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(
    [*ROOT.glob("charts/gagar/crds/*.yaml"), *ROOT.glob("manifests/**/*.yaml")], key=str
)


def _array(items: dict[str, Any], n: int | None = None) -> dict[str, Any]:
    return {"type": "array", "items": items, **({"maxItems": n} if n is not None else {})}


def _map(values: dict[str, Any], n: int | None = None) -> dict[str, Any]:
    out = {"type": "object", "additionalProperties": values}
    return {**out, **({"maxProperties": n} if n is not None else {})}


def _string(n: int | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "string", **({"maxLength": n} if n is not None else {}), **extra}


NUMBER, BOOLEAN, INTEGER = {"type": "number"}, {"type": "boolean"}, {"type": "integer"}

# (schema, rule, the cost apiextensions-apiserver's TestCostEstimation expects)
SERVER_CASES = [
    (_array(NUMBER), "self.all(x, true)", 4718591),
    (_array(NUMBER, 10), "self.all(x, true)", 32),
    (_array(_string()), "self.all(x, true)", 3145727),
    (_array(_string(), 20), "self.all(x, true)", 62),
    (_array(BOOLEAN), "self.all(x, true)", 1887437),
    (_array(BOOLEAN, 5), "self.all(x, true)", 17),
    (_map(NUMBER), "self.all(x, true)", 1348169),
    (_map(NUMBER, 10), "self.all(x, true)", 32),
    (_map(_string()), "self.all(x, true)", 1179647),
    (_map(_string(), 3), "self.all(x, true)", 11),
    (_string(), "self.contains('test')", 314574),
    (_string(10), "self.contains('test')", 5),
    (_string(), "self.startsWith('test')", 2),
    (_string(30), "self.endsWith('test')", 2),
    (_string(), 'size(self + "hello") > size("hello")', 314578),
    (_string(4), 'size(self + "hello") > size("hello")', 7),
    (_array(NUMBER), "self[1] == 0.0", 2),
    (_array(_string(), 8), "self[1] == self[1]", 314577),
    (_array(NUMBER, 10), "self.all(x, self.all(y, true))", 352),
    (_array(NUMBER, 10), "self.all(x, self.all(y, self.all(z, true)))", 3552),
    (_string(), 'self.matches("x")', 314574),
    (_string(50), 'self.matches("x")', 22),
    (_string(), '"".matches("(((((((((())))))))))[0-9]")', 7),
    (_string(), 'self.matches("")', 1),
    (_map(_string()), "self.all(x, x.contains(self[x]))", 2752507),
    (_map(_string(10), 10), "self.all(x, x.contains(self[x]))", 72),
    (_string(), 'self == "x"', 2),
    (_string(0), 'self == "x"', 1),
    (_array(NUMBER), "self.all(x, x == 0.0)", 6291454),
    (_map(INTEGER), "oldSelf.size() == self.size()", 5),
    (_string(enum=["A", "B", "C", "LongValue"]), "self.contains('A')", 2),
    (_string(1000, enum=["A", "B", "C", "LongValue"]), "self.contains('A')", 401),
]


@pytest.mark.parametrize(("schema", "rule", "expected"), SERVER_CASES)
def test_estimate_matches_the_api_servers(schema: dict, rule: str, expected: int) -> None:
    assert rule_cost(rule, decl_of(schema)) == expected


def _crd(spec_schema: dict[str, Any]) -> dict[str, Any]:
    root = {"type": "object", "properties": {"spec": spec_schema}}
    return {"spec": {"versions": [{"name": "v1", "schema": {"openAPIV3Schema": root}}]}}


def _volumes(n: int | None) -> dict[str, Any]:
    volume = {"type": "object", "required": ["name"], "properties": {"name": _string(63)}}
    return {
        "type": "object",
        "properties": {"volumes": _array(volume, n)},
        "x-kubernetes-validations": [
            {"rule": "self.volumes.all(v, self.volumes.exists_one(w, w.name == v.name))"}
        ],
    }


def test_refuses_a_quadratic_rule_over_an_unbounded_list() -> None:
    errors = crd_errors(_crd(_volumes(None)))
    assert errors and "exceeds 10000000" in errors[0]


def test_accepts_the_same_rule_over_a_bounded_list() -> None:
    assert crd_errors(_crd(_volumes(16))) == []
    (cost,) = crd_rule_costs(_crd(_volumes(16)))
    # w.name == v.name: each side 2, the comparison ceil(0.1 * 63 * 4) = 26
    assert cost.estimate == 3 + 16 * (3 + 4 + 16 * (2 + 2 + 2 + 26)) == 8307


def test_a_rule_under_unbounded_lists_is_multiplied_by_its_nodes_request_cardinality() -> None:
    env = {
        "type": "object",
        "required": ["name"],
        "properties": {"name": _string(64)},
        "x-kubernetes-validations": [{"rule": "!self.name.startsWith('GAGAR_')"}],
    }
    unbounded = crd_rule_costs(_crd(_array(env)))[0]
    # {"name":""}: 2 + len("name") + 2 + 4 = 12 bytes, so 3 MiB holds 3145728 // 13 of them
    assert (unbounded.cost, unbounded.cardinality) == (4, 3145728 // 13)
    bounded = crd_rule_costs(_crd(_array(_array(env, 8), 4)))[0]
    assert (bounded.cardinality, bounded.estimate) == (32, 128)


def test_a_macro_over_an_object_does_not_compile() -> None:
    free = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    with pytest.raises(CostError, match="must be a list or a map"):
        rule_cost("self.all(k, k in ['a'])", decl_of(free))


def test_metadata_name_is_unbounded_unless_the_root_types_name_generate_name_kind_api_version() -> (
    None
):
    rule = "self.metadata.name.matches('^[a-z]+$')"
    plain = {"type": "object", "properties": {"metadata": {"type": "object"}}}
    assert rule_cost(rule, decl_of(plain, root=True)) == 314573 * 2 + 3
    name = {"type": "string", "maxLength": 42}
    meta = {"type": "object", "properties": {"name": name, "generateName": name}}
    typed = {"kind": {"type": "string"}, "apiVersion": {"type": "string"}}
    assert (
        rule_cost(rule, decl_of({"type": "object", "properties": {"metadata": meta}}, True)) > 1e5
    )
    bounded = {"type": "object", "properties": {"metadata": meta, **typed}}
    assert rule_cost(rule, decl_of(bounded, root=True)) == 17 * 2 + 3


def _shipped_crds() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in SHIPPED:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                out.append((str(path.relative_to(ROOT)), doc))
    return out


def test_the_project_ships_crds() -> None:
    shipped = {path for path, _ in _shipped_crds()}
    assert {"charts/gagar/crds/gagarruns.gagar.dev.yaml", "manifests/crd/gagarruns.gagar.dev.yaml"} <= shipped  # fmt: skip


@pytest.mark.parametrize(
    ("path", "crd"), _shipped_crds(), ids=lambda x: x if isinstance(x, str) else ""
)
def test_every_shipped_rule_costs_at_most_a_tenth_of_the_limits(path: str, crd: dict) -> None:
    costs = crd_rule_costs(crd)
    assert costs, f"{path} has no rules"
    dear = [
        f"{c.path}: {c.estimate}: {c.rule}" for c in costs if c.estimate > STATIC_RULE_LIMIT // 10
    ]
    assert dear == [], "\n".join(dear)
    assert sum(c.estimate for c in costs) <= STATIC_CRD_LIMIT // 10
