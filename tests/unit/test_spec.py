"""The GagarRun models: defaults, examples, cross-field rules with field paths, and the CRD parity."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from gagar.crd import build_crd
from gagar.manifest import validate_document
from gagar.spec import MAX_NAME_LENGTH, GagarRun, GagarRunSpec
from tests.support.crd_check import crd_errors

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def minimal() -> dict[str, Any]:
    return {
        "apiVersion": "gagar.dev/v1alpha1",
        "kind": "GagarRun",
        "metadata": {"name": "demo"},
        "spec": {
            "model": {"preset": "tiny"},
            "rollout": {"replicas": 1},
            "grader": {"replicas": 1},
        },
    }


def with_spec(path: str, value: Any, base: dict[str, Any] | None = None) -> dict[str, Any]:
    doc = copy.deepcopy(base or minimal())
    node = doc
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return doc


def test_paper_defaults() -> None:
    spec = GagarRunSpec.model_validate({"model": {"preset": "tiny"}})
    alg = spec.algorithm
    qf = alg.redistribution.quality_factors
    assert (qf.t1_first, qf.t1_other, qf.t2_high, qf.t2_low, qf.t3) == (1.0, 0.9, 0.85, 0.4, 0.2)
    assert alg.redistribution.lambda_max == 1.5 and alg.redistribution.rescale
    lp = alg.length_penalty
    assert (lp.pass_rate_threshold, lp.weight, lp.delta, lp.scale, lp.gamma, lp.percentile) == (
        0.5,
        0.2,
        0,
        1,
        1.5,
        30,
    )
    sp = alg.segment_penalty
    assert (sp.kappa, sp.alpha_max, sp.beta_min) == (2, 2, 0.5)
    loss = alg.loss
    assert (loss.clip_low, loss.clip_high, loss.dual_clip, loss.aggregation) == (
        0.2,
        0.28,
        3,
        "prompt-mean",
    )
    assert loss.kl.coef == 0 and not alg.std_normalize and alg.eps == 1e-6


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid_for_pydantic_and_the_crd(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        run, problems = validate_document(doc, str(path))
        assert problems == [] and run is not None
        assert crd_errors(doc, build_crd()) == []


def test_round_trip_through_the_wire_form() -> None:
    run = GagarRun.model_validate(minimal())
    again = GagarRun.model_validate(run.to_wire())
    assert again == run


# (mutation, field path the message must name): what the schema refuses (types, bounds, enums,
# unknown fields, keyed lists), and rules of the table (gagar.spec.RULES) where the path through
# lists and nested pod templates is the point; each rule row is checked both ways, with its own
# examples, in tests/unit/test_spec_rules.py.
INVALID = [
    (("spec.rollout", {}), "spec.rollout"),
    (("spec.algorithm", {"groupSize": 1}), "groupSize"),
    (
        (
            "spec.model",
            {
                "preset": "tiny",
                "sftWarmupSteps": 4,
                "sftExpertStyles": {"clean": 0, "bloated": 0, "redundant": 0, "wrong": 0},
            },
        ),
        "sftExpertStyles",
    ),
    (
        ("spec.model", {"preset": "tiny", "sftWarmupSteps": 4, "sftExpertStyles": {"clean": -1}}),
        "clean",
    ),
    (("spec.dataset", {"sources": [{"kind": "jsonl"}]}), "path"),
    (("spec.algorithm", {"redistribution": {"qualityFactors": {"t3": 1.5}}}), "t3"),
    (("metadata.name", "x" * (MAX_NAME_LENGTH + 1)), "metadata.name"),
    (("metadata.name", "Bad_Name"), "metadata.name"),
    (("spec.sandbox", {"backend": "docker"}), "spec.sandbox.backend"),
    (("spec.unknownField", 1), "spec.unknownField"),
    (("spec.trainer", {"podTemplate": {"env": [{"name": "GAGAR_RUN", "value": "x"}]}}), "env"),
    (("spec.trainer", {"podTemplate": {"env": [{"name": "A"}]}}), "env"),
    (("spec.trainer", {"podTemplate": {"envFrom": [{"prefix": "X_"}]}}), "envFrom"),
    (("spec.trainer", {"podTemplate": {"labels": {"gagar.dev/run": "x"}}}), "labels"),
    (("spec.trainer", {"podTemplate": {"affinity": {"nodeAfinity": {}}}}), "affinity"),
    (
        ("spec.trainer", {"podTemplate": {"volumes": [{"name": "config", "emptyDir": {}}]}}),
        "volumes",
    ),
    (("spec.trainer", {"podTemplate": {"volumes": [{"name": "data"}]}}), "volumes"),
    (
        (
            "spec.trainer",
            {
                "podTemplate": {
                    "volumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]
                }
            },
        ),
        "volumes",
    ),
    (
        ("spec.trainer", {"podTemplate": {"volumeMounts": [{"name": "x", "mountPath": "/x"}]}}),
        "volumeMounts",
    ),
    (("spec.sandbox", {"podTemplate": {"env": [{"name": "A", "value": "1"}]}}), "env"),
    (("spec.sandbox", {"podTemplate": {"volumes": []}}), "volumes"),
    (("spec.sandbox", {"podTemplate": {"securityContext": {"runAsUser": 0}}}), "securityContext"),
    # entries colliding with the operator's own, or with each other (keyed lists)
    (("spec.trainer", {"podTemplate": {"env": [{"name": "NODE_RANK", "value": "0"}]}}), "env[0].name"),
    (("spec.rollout", {"podTemplate": {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}}), "env[1].name"),
    (("spec.grader", {"podTemplate": {"volumes": [{"name": "auth", "emptyDir": {}}]}}), "volumes[0].name"),
    (("spec.trainer", {"podTemplate": {"volumes": [{"name": "d", "emptyDir": {}}], "volumeMounts": [{"name": "d", "mountPath": "/dev/shm"}]}}), "volumeMounts[0].mountPath"),
    (("spec.trainer", {"podTemplate": {"volumes": [{"name": "d", "emptyDir": {}}], "volumeMounts": [{"name": "d", "mountPath": "/x"}, {"name": "d", "mountPath": "/x"}]}}), "volumeMounts[1].mountPath"),
    (("spec.trainer", {"podTemplate": {"initContainers": [{"name": "trainer", "image": "busybox"}]}}), "initContainers[0]"),
    (("spec.trainer", {"podTemplate": {"initContainers": [{"name": "a", "image": "busybox"}, {"name": "a", "image": "busybox"}]}}), "initContainers[1].name"),
    (("spec.trainer", {"podTemplate": {"initContainers": [{"name": "a"}]}}), "image"),
    (("spec.trainer", {"podTemplate": {"initContainers": [{"name": "a", "image": "b", "restartPolicy": "OnFailure"}]}}), "restartPolicy"),
    (("spec.trainer", {"podTemplate": {"initContainers": [{"name": "a", "image": "b", "env": [{"name": "GAGAR_RUN", "value": "x"}]}]}}), "env[0].name"),
    (("spec.trainer", {"podTemplate": {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "z", "whenUnsatisfiable": "DoNotSchedule"}] * 2}}), "topologySpreadConstraints[1]"),
    (("spec.trainer", {"podTemplate": {"imagePullSecrets": [{"name": "r"}, {"name": "r"}]}}), "imagePullSecrets[1].name"),
    (("spec.trainer", {"podTemplate": {"schedulerName": "Not A Name"}}), "schedulerName"),
    (("spec.trainer", {"podTemplate": {"env": [{"name": f"V{i}", "value": "1"} for i in range(129)]}}), "env"),
    (("spec.trainer", {"podTemplate": {"annotations": {"a": "x" * (256 * 1024 + 1)}}}), "annotations"),
    (("spec.trainer", {"image": "x" * 4097}), "image"),
    (("spec.observability", {"trackers": ["wandb", "wandb"]}), "trackers"),
]  # fmt: skip


def _mutated(case: tuple[str, Any]) -> dict[str, Any]:
    path, value = case
    return with_spec(path, value)


@pytest.mark.parametrize(
    ("case", "field"), INVALID, ids=[c[0][0] + str(i) for i, c in enumerate(INVALID)]
)
def test_invalid_specs_name_the_field(case: tuple[str, Any], field: str) -> None:
    doc = _mutated(case)
    run, problems = validate_document(doc)
    assert run is None and problems
    text = "\n".join(map(str, problems))
    assert field in text, text


@pytest.mark.parametrize(
    ("case", "field"), INVALID, ids=[c[0][0] + str(i) for i, c in enumerate(INVALID)]
)
def test_the_crd_rejects_what_pydantic_rejects(case: tuple[str, Any], field: str) -> None:
    assert crd_errors(_mutated(case), build_crd()), (
        "the CRD (schema + CEL) accepted an invalid GagarRun"
    )


def test_pod_template_overlay_is_valid() -> None:
    overlay = {
        "labels": {"team": "rl"},
        "nodeSelector": {"pool": "gpu"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {}},
        "priorityClassName": "high",
        "imagePullSecrets": [{"name": "regcred"}],
        "env": [{"name": "HF_HOME", "value": "/data/hf"}],
        "envFrom": [{"secretRef": {"name": "s3"}}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "swe"}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
        "serviceAccountAnnotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"},
    }
    doc = with_spec("spec.trainer", {"podTemplate": overlay})
    run, problems = validate_document(doc)
    assert problems == [] and run is not None
    assert run.spec.trainer.pod_template.volumes[0].persistent_volume_claim == {"claimName": "swe"}
    assert crd_errors(doc, build_crd()) == []


def test_autoscaled_pool_is_valid_without_replicas() -> None:
    doc = with_spec("spec.grader", {"autoscaling": {"minReplicas": 0, "maxReplicas": 4}})
    run, problems = validate_document(doc)
    assert problems == [] and run is not None and run.spec.grader.replicas is None
    assert crd_errors(doc, build_crd()) == []


def test_external_endpoint_pool() -> None:
    doc = with_spec("spec.rollout", {"endpoint": "http://vllm.example:8000/v1"})
    run, problems = validate_document(doc)
    assert problems == [] and run is not None
    assert crd_errors(doc, build_crd()) == []


def test_models_are_immutable() -> None:
    run = GagarRun.model_validate(minimal())
    with pytest.raises(ValidationError):
        run.spec.algorithm.group_size = 3  # type: ignore[misc]


def test_resources_gpus() -> None:
    doc = with_spec("spec.trainer", {"resources": {"limits": {"nvidia.com/gpu": "8"}}})
    run = GagarRun.model_validate(doc)
    assert run.spec.trainer.resources.gpus == 8
    bad = with_spec("spec.trainer", {"resources": {"limits": {"memory": "lots"}}})
    assert validate_document(bad)[1]


def test_trainer_and_model_change_only_while_suspended() -> None:
    """The CRD's transition rule (``oldSelf``), evaluated as the API server does on updates."""
    crd = build_crd()
    old = with_spec("spec.trainer", {"nodes": 1})
    bigger = with_spec("spec.trainer", {"nodes": 2})
    assert crd_errors(bigger, crd) == []  # a create has no old object
    assert any("only while the run is suspended" in e for e in crd_errors(bigger, crd, old=old))
    suspended_old = {**old, "spec": {**old["spec"], "suspend": True}}
    suspended_new = {**bigger, "spec": {**bigger["spec"], "suspend": True}}
    assert crd_errors(suspended_new, crd, old=suspended_old) == []
    assert crd_errors(suspended_new, crd, old=old)  # suspending and changing at once: refused
    pools = with_spec("spec.rollout", {"replicas": 5})
    assert crd_errors(pools, crd, old=with_spec("spec.rollout", {"replicas": 2})) == []


def test_strings_lists_and_maps_are_bounded_and_a_long_condition_message_is_cut() -> None:
    """Every spec string, list and map has a bound (pydantic and the CRD alike), but the status
    that reports a failure quoting a long pod message is still written, its message cut."""
    from gagar.spec import MAX_CONDITION_MESSAGE, Condition, GagarRunStatus

    status = GagarRunStatus(
        conditions=[Condition(type="Ready", status="False", message="x" * 10**5)]
    )
    assert len(status.conditions[0].message) == MAX_CONDITION_MESSAGE

    def unbounded(node: dict, path: str) -> list[str]:
        out = []
        kind = node.get("type")
        free = node.get("x-kubernetes-preserve-unknown-fields") and "properties" not in node
        if kind == "string" and "maxLength" not in node and "enum" not in node:
            out.append(path)
        if kind == "array" and "maxItems" not in node:
            out.append(path)
        if kind == "object" and "additionalProperties" in node and "maxProperties" not in node:
            out.append(path)
        for key, sub in (node.get("properties") or {}).items():
            out += unbounded(sub, f"{path}.{key}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict) and not free:
                out += unbounded(node[key], f"{path}.{key}")
        return out

    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert unbounded(schema["properties"]["spec"], "spec") == []
