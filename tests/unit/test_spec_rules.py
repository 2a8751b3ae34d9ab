"""The spec's cross-field rules (``gagar.spec.RULES``): each row is one rule for both checkers.

Every row's valid example is accepted and its invalid example refused, by the CEL evaluator of the
Kubernetes API emulator (on the model's node of the generated schema, with the schema's defaults
applied, as the API server evaluates it) and by pydantic (with that row alone, then with all of
them), with the row's message. The CRD carries exactly the table's rules.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from gagar import spec
from gagar.crd import build_crd, model_schema
from gagar.manifest import validate_document
from gagar.spec import RULES, Rule
from tests.kube_emulator.cel import compile_rule, evaluate
from tests.support.crd_check import apply_defaults

CASES = [(rule, model) for rule in RULES for model in rule.on]
IDS = [f"{m.__name__}:{r.field or ''}:{i}" for i, (r, m) in enumerate(CASES)]


def _cel(rule: Rule, model: type, value: Any, old: Any = None) -> bool:
    node = apply_defaults(dict(value), model_schema(model))
    env = {"self": node}
    if old is not None:
        env["oldSelf"] = apply_defaults(dict(old), model_schema(model))
    result = evaluate(compile_rule(rule.cel), env)
    assert isinstance(result, bool)
    return result


@pytest.fixture
def only(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Make pydantic check one row only (the invalid example may break other rows too)."""

    def set_rule(rule: Rule) -> None:
        monkeypatch.setattr(spec, "_RULES_BY_MODEL", {m: [rule] for m in rule.on})

    yield set_rule


@pytest.mark.parametrize(("rule", "model"), CASES, ids=IDS)
def test_each_rule_accepts_its_valid_example_and_refuses_its_invalid_one(
    rule: Rule, model: type, only: Any
) -> None:
    assert rule.cel_json() in model_schema(model)["x-kubernetes-validations"]
    if rule.holds is None:  # a transition rule: CEL only, from ``valid`` to ``invalid``
        assert "oldSelf" in rule.cel
        assert _cel(rule, model, rule.valid, old=rule.valid)
        assert not _cel(rule, model, rule.invalid, old=rule.valid)
        suspended = [{**x, "suspend": True} for x in (rule.valid, rule.invalid)]
        assert _cel(rule, model, suspended[1], old=suspended[0])
        return
    assert "oldSelf" not in rule.cel
    assert _cel(rule, model, rule.valid), "CEL refused the valid example"
    assert not _cel(rule, model, rule.invalid), "CEL accepted the invalid example"
    accepted = model.model_validate(rule.valid)  # with every rule
    assert rule.holds(accepted)
    only(rule)
    with pytest.raises(ValidationError) as refused:
        model.model_validate(rule.invalid)
    (error,) = refused.value.errors()
    assert error["msg"] == f"Value error, {rule.message}"
    assert isinstance(error["ctx"]["error"], spec.RuleError)


def _crd_rules(node: Any) -> Iterator[Any]:
    if isinstance(node, dict):
        yield from node.get("x-kubernetes-validations", [])
        for key, value in node.items():
            if key != "x-kubernetes-validations":
                yield from _crd_rules(value)
    elif isinstance(node, list):
        for value in node:
            yield from _crd_rules(value)


def test_the_crd_carries_the_tables_rules_and_no_other() -> None:
    root = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    in_crd = list(_crd_rules(root["properties"]["spec"]))
    table = [r.cel_json() for r in RULES]
    assert [r for r in in_crd if r not in table] == []
    assert [r for r in table if r not in in_crd] == []


def test_a_rules_error_names_the_field_path_as_the_api_server_does() -> None:
    doc = {
        "apiVersion": "gagar.dev/v1alpha1",
        "kind": "GagarRun",
        "metadata": {"name": "r"},
        "spec": {
            "model": {"preset": "tiny"},
            "trainer": {"podTemplate": {"env": [{"name": "NODE_RANK", "value": "0"}]}},
        },
    }
    _, problems = validate_document(doc)
    assert [(p.path, p.message) for p in problems] == [
        ("spec.trainer.podTemplate.env[0].name", "Value error, the operator sets this variable")
    ]


def test_max_staleness_one_needs_the_truncated_importance_weight() -> None:
    """The learner's old log-probs are its own forward at the current weights (not the sampler's),
    so a one-version lag is corrected only by ``truncatedIsCap``: refused without it."""
    base = {"model": {"preset": "tiny"}, "rollout": {"replicas": 1, "maxStaleness": 1}}
    with pytest.raises(ValidationError, match=r"set algorithm\.loss\.truncatedIsCap"):
        spec.GagarRunSpec.model_validate(base)
    fixed = {**base, "algorithm": {"loss": {"truncatedIsCap": 2.0}}}
    assert spec.GagarRunSpec.model_validate(fixed).rollout.max_staleness == 1
    assert spec.GagarRunSpec.model_validate({**base, "rollout": {"replicas": 1}})


def _layout_problems(spec_fields: dict[str, Any]) -> list[tuple[str, str]]:
    doc = {"apiVersion": "gagar.dev/v1alpha1", "kind": "GagarRun", "metadata": {"name": "r"}}
    _, problems = validate_document({**doc, "spec": {"model": {"preset": "tiny"}, **spec_fields}})
    return [(p.path, p.message) for p in problems]


@pytest.mark.parametrize(
    ("fields", "path", "words"),
    [
        (  # 8 torchrun ranks on a 4-GPU pod: ranks 4..7 find no device
            {"rollout": {"replicas": 1},
             "trainer": {"processesPerNode": 8, "resources": {"limits": {"nvidia.com/gpu": 4}}}},
            "spec.trainer.processesPerNode", "8 processes per node on 4 GPUs",
        ),
        (  # vLLM tensor parallel 8 on a 1-GPU replica
            {"rollout": {"replicas": 1, "tensorParallelSize": 8,
                         "resources": {"limits": {"nvidia.com/gpu": "1"}}}},
            "spec.rollout.tensorParallelSize", "tensor parallel 8 on 1 GPUs",
        ),
        (  # expert parallelism on a dense model (no numExperts)
            {"rollout": {"replicas": 1},
             "trainer": {"processesPerNode": 2, "parallelism": {"expert": 2}}},
            "spec.model.numExperts", "needs model.numExperts",
        ),
    ],
)  # fmt: skip
def test_layouts_that_cannot_start_are_refused_naming_the_field(
    fields: dict[str, Any], path: str, words: str
) -> None:
    """Issue 49: layouts that validated and failed at start are refused in one line that names
    the field by its full path."""
    problems = _layout_problems(fields)
    assert len(problems) == 1, problems
    assert problems[0][0] == path and words in problems[0][1], problems


def test_moe_expert_parallelism_needs_more_than_one_expert() -> None:
    fields = {"rollout": {"replicas": 1}, "trainer": {"processesPerNode": 2}}
    one = {**fields, "trainer": {"processesPerNode": 2, "parallelism": {"expert": 2}}}
    doc = {"model": {"path": "/m", "numExperts": 1}, **one}
    with pytest.raises(ValidationError, match=r"needs model\.numExperts"):
        spec.GagarRunSpec.model_validate(doc)
    ok = {**doc, "model": {"path": "/m", "numExperts": 8}}
    assert spec.GagarRunSpec.model_validate(ok).trainer.parallelism.expert == 2
    fitting = {
        "replicas": 1,
        "tensorParallelSize": 2,
        "resources": {"limits": {"nvidia.com/gpu": 2}},
    }
    assert spec.GagarRunSpec.model_validate({**fields, "model": {"preset": "tiny"},
                                             "rollout": fitting})  # fmt: skip


def test_validate_names_num_experts_of_a_moe_checkpoint_on_this_machine(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """MoE with tensor parallelism and numExperts omitted validated and failed at trainer start
    (issue 49): where the checkpoint is on this machine, validate reads its config.json."""
    import json

    from gagar.cli import main

    model = tmp_path / "moe"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_local_experts": 8}))
    run = {"apiVersion": "gagar.dev/v1alpha1", "kind": "GagarRun", "metadata": {"name": "m"},
           "spec": {"model": {"path": str(model)}, "rollout": {"replicas": 1},
                    "trainer": {"processesPerNode": 2, "parallelism": {"tensor": 2}}}}  # fmt: skip
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(run))
    assert main(["validate", str(path)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert ": spec.model.numExperts: " in line and "numExperts: 8" in line
    run["spec"]["model"]["numExperts"] = 8  # type: ignore[index]
    path.write_text(json.dumps(run))
    assert main(["validate", str(path)]) == 1  # now the MoE tensor-parallel rule itself
    assert "spec.trainer.parallelism.tensor" in capsys.readouterr().err
