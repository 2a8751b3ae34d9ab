"""``gagar render`` for every example and variant: every object validates against Kubernetes 1.32.

Built-in kinds go through ``kubernetes-validate`` in strict mode (unknown fields are errors).
CRD-based kinds (KEDA ScaledObject, Prometheus Operator ServiceMonitor/PodMonitor, JobSet) are not
in its bundle: they are checked here against hand-written minimal structural schemas (required
fields, types, no unknown fields where the shape is fixed), and a JobSet's embedded Job template is
validated by kubernetes-validate as a real ``batch/v1`` Job.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gagar.operator.builders import BuildContext, build_all
from tests.unit.test_builders import ALL_CRDS, example, hpa_run

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.32.0"

_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_META = {
    "type": "object",
    "required": ["name", "labels", "ownerReferences"],
    "properties": {"name": {"type": "string"}, "labels": _STR_MAP, "annotations": _STR_MAP},
}
_SELECTOR = {
    "type": "object",
    "required": ["matchLabels"],
    "additionalProperties": False,
    "properties": {"matchLabels": _STR_MAP},
}


def _crd_kind(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": _META,
            "spec": spec,
        },
    }


CRD_SCHEMAS: dict[str, dict[str, Any]] = {
    # keda.sh/v1alpha1 ScaledObject (fields from KEDA's CRD)
    "ScaledObject": _crd_kind(
        {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"type": "string"},
                    },
                },
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "pollingInterval": {"type": "integer", "minimum": 1},
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "additionalProperties": False,
                        "properties": {
                            "type": {"enum": ["prometheus"]},
                            "metadata": {
                                "type": "object",
                                "required": ["serverAddress", "query", "threshold"],
                                "additionalProperties": {"type": "string"},
                            },
                        },
                    },
                },
            },
        }
    ),
    "ServiceMonitor": _crd_kind(
        {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": _SELECTOR,
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["port"],
                        "additionalProperties": False,
                        "properties": {"port": {"type": "string"}, "path": {"type": "string"}},
                    },
                },
            },
        }
    ),
    "PodMonitor": _crd_kind(
        {
            "type": "object",
            "required": ["selector", "podMetricsEndpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": _SELECTOR,
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["port"],
                        "additionalProperties": False,
                        "properties": {"port": {"type": "string"}, "path": {"type": "string"}},
                    },
                },
            },
        }
    ),
    # jobset.x-k8s.io/v1alpha2 JobSet; the Job template itself is validated by kubernetes-validate
    "JobSet": _crd_kind(
        {
            "type": "object",
            "required": ["replicatedJobs"],
            "additionalProperties": False,
            "properties": {
                "suspend": {"type": "boolean"},
                "failurePolicy": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "maxRestarts": {"type": "integer", "minimum": 0},
                        # jobset.x-k8s.io/v1alpha2 FailurePolicyRule (JobSet >= 0.6)
                        "rules": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["name", "action"],
                                "additionalProperties": False,
                                "properties": {
                                    "name": {"type": "string", "maxLength": 128},
                                    "action": {
                                        "enum": [
                                            "FailJobSet",
                                            "RestartJobSet",
                                            "RestartJobSetAndIgnoreMaxRestarts",
                                        ]
                                    },
                                    "onJobFailureReasons": {
                                        "type": "array",
                                        "items": {
                                            "enum": [
                                                "BackoffLimitExceeded",
                                                "DeadlineExceeded",
                                                "PodFailurePolicy",
                                                "MaxFailedIndexesExceeded",
                                            ]
                                        },
                                    },
                                    "targetReplicatedJobs": {
                                        "type": "array",
                                        "items": {"type": "string"},
                                    },
                                },
                            },
                        },
                    },
                },
                "successPolicy": {
                    "type": "object",
                    "required": ["operator"],
                    "additionalProperties": False,
                    "properties": {
                        "operator": {"enum": ["All", "Any"]},
                        "targetReplicatedJobs": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "network": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "enableDNSHostnames": {"type": "boolean"},
                        "subdomain": {"type": "string"},
                    },
                },
                "replicatedJobs": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "template"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "maxLength": 63},
                            "replicas": {"type": "integer", "minimum": 1},
                            "template": {
                                "type": "object",
                                "required": ["spec"],
                                "properties": {
                                    "metadata": {"type": "object"},
                                    "spec": {"type": "object"},
                                },
                            },
                        },
                    },
                },
            },
        }
    ),
}


def validate_object(obj: dict[str, Any]) -> None:
    """Raise when the object is not valid for Kubernetes 1.32 (or its CRD's minimal schema)."""
    kind = obj["kind"]
    if kind in CRD_SCHEMAS:
        jsonschema.Draft7Validator(CRD_SCHEMAS[kind]).validate(obj)
        if kind == "JobSet":
            for rj in obj["spec"]["replicatedJobs"]:
                job = {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {"name": "x"},
                    **rj["template"],
                }
                kubernetes_validate.validate(job, K8S_VERSION, strict=True)
        return
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


VARIANTS = {
    "local": lambda: example("local"),
    "local-smollm2": lambda: example("local-smollm2"),
    "single-gpu": lambda: example("single-gpu"),
    "flash-moe": lambda: example("flash-moe"),
    "hpa-autoscaled": hpa_run,
    "suspended": lambda: example("single-gpu", suspend=True),
    "suspended-keda": lambda: example("flash-moe", suspend=True),
    "jobset": lambda: example("flash-moe"),
}
CONTEXTS = {
    "bare": BuildContext(uid="u-1"),
    "all-crds": BuildContext(uid="u-1", crds=ALL_CRDS),
    "terminal": BuildContext(uid="u-1", crds=ALL_CRDS, state="terminal"),
}


@pytest.mark.parametrize("ctx_name", sorted(CONTEXTS))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendered_object_validates(variant: str, ctx_name: str) -> None:
    objs = build_all(VARIANTS[variant](), CONTEXTS[ctx_name])
    assert objs
    for obj in objs:
        try:
            validate_object(obj)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as err:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {err}")


def test_jobset_variant_renders_a_jobset() -> None:
    kinds = {o["kind"] for o in build_all(VARIANTS["jobset"](), CONTEXTS["all-crds"])}
    assert "JobSet" in kinds and "Job" not in kinds


def test_structural_checks_catch_errors() -> None:
    """The hand-written schemas and kubernetes-validate must reject broken objects."""
    objs = build_all(example("flash-moe"), CONTEXTS["all-crds"])
    so = next(o for o in objs if o["kind"] == "ScaledObject")
    broken = {**so, "spec": {**so["spec"], "replicas": 3}}
    with pytest.raises(jsonschema.ValidationError):
        validate_object(broken)
    js = next(o for o in objs if o["kind"] == "JobSet")
    rj = js["spec"]["replicatedJobs"][0]
    bad_job = {
        **rj,
        "template": {**rj["template"], "spec": {**rj["template"]["spec"], "completions": "many"}},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_object({**js, "spec": {**js["spec"], "replicatedJobs": [bad_job]}})
    dep = next(o for o in objs if o["kind"] == "Deployment")
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_object({**dep, "spec": {**dep["spec"], "replica": 2}})  # strict: unknown field


@pytest.mark.parametrize("name", ["local", "local-smollm2", "single-gpu", "flash-moe"])
def test_gagar_render_cli(name: str) -> None:
    """The CLI prints a YAML stream of exactly the builders' objects."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gagar.cli",
            "render",
            f"examples/{name}.yaml",
            "--uid",
            "abc",
            "--with-crd",
            "monitoring.coreos.com",
            "--with-crd",
            "keda.sh",
            "--with-crd",
            "jobset.x-k8s.io",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    docs = list(yaml.safe_load_all(out.stdout))
    expected = build_all(example(name), BuildContext(uid="abc", crds=ALL_CRDS))
    assert docs == expected  # (test_every_rendered_object_validates validates these objects)


def test_gagar_render_rejects_invalid_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        (ROOT / "examples/local.yaml")
        .read_text()
        .replace("replicas: 1\n    device", "replicas: -1\n    device", 1)
    )
    out = subprocess.run(
        [sys.executable, "-m", "gagar.cli", "render", str(bad)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    assert "spec.rollout.replicas" in out.stderr and out.stdout == ""


def test_single_gpu_render_shapes_the_gpu_pods() -> None:
    """`gagar render examples/single-gpu.yaml`: the example's podTemplate (GPU taint, the /data
    volume) reaches the pods; the rollout pool has a NetworkPolicy; vLLM has a startupProbe and
    resource requests."""
    out = subprocess.run(
        [sys.executable, "-m", "gagar.cli", "render", "examples/single-gpu.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    job = by[("Job", "qwen3-swe-1node-trainer")]["spec"]["template"]["spec"]
    assert gpu in job["tolerations"]
    data = {"name": "data", "persistentVolumeClaim": {"claimName": "swe-tasks", "readOnly": True}}
    assert data in job["volumes"]
    (trainer,) = job["containers"]
    assert {"name": "data", "mountPath": "/data", "readOnly": True} in trainer["volumeMounts"]
    rollout = by[("Deployment", "qwen3-swe-1node-rollout")]["spec"]["template"]["spec"]
    assert gpu in rollout["tolerations"]
    (vllm,) = rollout["containers"]
    assert vllm["startupProbe"]["httpGet"]["path"] == "/health"
    assert vllm["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert {"cpu", "memory"} <= set(vllm["resources"]["requests"])
    policy = by[("NetworkPolicy", "qwen3-swe-1node-rollout")]["spec"]
    assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "rollout"
    sources = [peer for rule in policy["ingress"] for peer in rule["from"]]
    trainer_only = {"gagar.dev/run": "qwen3-swe-1node", "app.kubernetes.io/component": "trainer"}
    assert {"podSelector": {"matchLabels": trainer_only}} in sources
    assert all(p.get("podSelector", {}).get("matchLabels") for p in sources)  # nobody else
    sandbox = by[("Deployment", "qwen3-swe-1node-sandbox")]["spec"]["template"]["spec"]
    assert "tolerations" not in sandbox  # the example's sandbox pods need no GPU node
    # /dev/shm is memory-backed and bounded in the vLLM and trainer pods
    shm = {v["name"]: v for v in rollout["volumes"]}["dshm"]["emptyDir"]
    assert shm == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert {v["name"]: v for v in job["volumes"]}["dshm"]["emptyDir"]["sizeLimit"] == "16Gi"
    # drains take the served pools one pod at a time; the trainer has no budget (docs)
    for pool in ("rollout", "grader"):
        pdb = by[("PodDisruptionBudget", f"qwen3-swe-1node-{pool}")]["spec"]
        assert pdb["maxUnavailable"] == 1 and pdb["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        assert pdb["selector"]["matchLabels"]["app.kubernetes.io/component"] == pool
    assert not [k for k, n in by if k == "PodDisruptionBudget" and "trainer" in n]
