"""Pod and Service rules the API server enforces, held by ``gagar validate`` (on the spec, and on
the pods the operator renders from it) and by the emulator: a probe or lifecycle hook on an init
container that is not a sidecar, an init container mounting a volume its pod lacks, mount paths
twice in a container, a ``subPath`` that is absolute or climbs with ``..``, a Service name that is
no DNS-1035 label (``1bad``). Each answer is the server's 422, in its words (validation.go's
``ValidateVolumeMounts``, ``validateLocalDescendingPath``)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from gagar.operator.builders import build_all
from gagar.operator.builders.check import pod_specs, validate_run
from gagar.spec import GagarRun
from tests.kube_emulator import KubeEmulator
from tests.kube_emulator.builtin import quota_refusal

ROOT = Path(__file__).resolve().parents[2]
PROBE = {"exec": {"command": ["true"]}}
NOT_FOR_INIT = "may not be set for init containers without restartPolicy=Always"


def run_with_init(container: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(yaml.safe_load((ROOT / "examples" / "single-gpu.yaml").read_text()))
    doc["spec"]["trainer"]["podTemplate"] = {"initContainers": [container]}
    return doc


@pytest.mark.parametrize("key", ["livenessProbe", "readinessProbe", "startupProbe", "lifecycle"])
def test_gagar_validate_refuses_a_probe_on_a_plain_init_container(key: str) -> None:
    init = {"name": "warm", "image": "busybox", key: PROBE}
    _, problems = validate_run(run_with_init(init), "run.yaml")
    assert [str(p) for p in problems] == [
        f"run.yaml[0]: spec.trainer.podTemplate.initContainers[0]: Value error, {key}: {NOT_FOR_INIT}"
    ]
    run, problems = validate_run(run_with_init({**init, "restartPolicy": "Always"}), "r")
    assert problems == [] and run is not None  # a sidecar may be probed


MISSING = 'volumeMounts[0].name: Not found: "{}"'


@pytest.mark.parametrize(
    ("component", "volume"),
    [("trainer", "x"), ("rollout", "cache"), ("grader", "checkpoints"), ("grader", "auth")],
)
def test_gagar_validate_refuses_an_init_container_mounting_no_volume_of_its_pod(
    component: str, volume: str
) -> None:
    """A mount of a volume the pod lacks: a typo, or an operator volume this component's pod does
    not have (a grader pod has no ``checkpoints``; ``auth`` only with ``authTokenSecret``)."""
    doc = copy.deepcopy(yaml.safe_load((ROOT / "examples" / "single-gpu.yaml").read_text()))
    init = {"name": "warm", "image": "busybox",
            "volumeMounts": [{"name": volume, "mountPath": "/warm"}]}  # fmt: skip
    doc["spec"].setdefault(component, {})["podTemplate"] = {"initContainers": [init]}
    run, problems = validate_run(doc, "run.yaml")
    assert run is None
    assert [str(p) for p in problems] == [
        f"run.yaml[0]: spec.{component}.podTemplate.initContainers[0].{MISSING.format(volume)}"
    ]


@pytest.mark.parametrize(("component", "volume"), [("trainer", "checkpoints"),
                                                   ("rollout", "weights"), ("grader", "config")])  # fmt: skip
def test_gagar_validate_accepts_an_init_container_mounting_its_pods_volume(
    component: str, volume: str
) -> None:
    doc = copy.deepcopy(yaml.safe_load((ROOT / "examples" / "single-gpu.yaml").read_text()))
    init = {"name": "warm", "image": "busybox",
            "volumeMounts": [{"name": volume, "mountPath": "/warm", "readOnly": True}]}  # fmt: skip
    doc["spec"].setdefault(component, {})["podTemplate"] = {"initContainers": [init]}
    run, problems = validate_run(doc, "run.yaml")
    assert problems == [] and run is not None


def pod(init: dict[str, Any], volumes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {
            "initContainers": [{"name": "init", "image": "busybox", **init}],
            "containers": [{"name": "main", "image": "busybox"}],
            "volumes": volumes or [],
        },
    }


def service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"ports": [{"port": 80}]},
    }


REFUSED = {
    "probe on an init container": (
        pod({"livenessProbe": PROBE}),
        f"spec.initContainers[0].livenessProbe: Forbidden: {NOT_FOR_INIT}",
    ),
    "lifecycle on an init container": (
        pod({"lifecycle": {"preStop": PROBE}}),
        f"spec.initContainers[0].lifecycle: Forbidden: {NOT_FOR_INIT}",
    ),
    "an init container mounting no volume": (
        pod({"volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}),
        'spec.initContainers[0].volumeMounts[0].name: Not found: "cache"',
    ),
    "a mount path twice in one container": (
        pod(
            {"volumeMounts": [{"name": "c", "mountPath": "/c"}, {"name": "c", "mountPath": "/c"}]},
            [{"name": "c", "emptyDir": {}}],
        ),
        'spec.initContainers[0].volumeMounts[1].mountPath: Invalid value: "/c": must be unique',
    ),
    "a subPath that climbs out of its volume": (
        pod(
            {"volumeMounts": [{"name": "c", "mountPath": "/c", "subPath": "a/../../etc"}]},
            [{"name": "c", "emptyDir": {}}],
        ),
        # the server's path has no index here (validation.go passes the list's path)
        'spec.initContainers[0].volumeMounts.subPath: Invalid value: "a/../../etc": '
        "must not contain '..'",
    ),
    "an absolute subPath": (
        pod(
            {"volumeMounts": [{"name": "c", "mountPath": "/c", "subPath": "/etc"}]},
            [{"name": "c", "emptyDir": {}}],
        ),
        'spec.initContainers[0].volumeMounts.subPath: Invalid value: "/etc": must be a relative path',
    ),
    "subPath and subPathExpr together": (
        pod(
            {
                "volumeMounts": [
                    {"name": "c", "mountPath": "/c", "subPath": "a", "subPathExpr": "$(POD)"}
                ]
            },
            [{"name": "c", "emptyDir": {}}],
        ),
        'spec.initContainers[0].volumeMounts[0].subPathExpr: Invalid value: "$(POD)": '
        "subPathExpr and subPath are mutually exclusive",
    ),
    "a Service named 1bad": (
        service("1bad"),
        'metadata.name: Invalid value: "1bad": a DNS-1035 label must consist of lower case '
        "alphanumeric characters or '-', start with an alphabetic character",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_emulator_refuses_what_the_server_refuses(case: str) -> None:
    obj, message = REFUSED[case]
    with KubeEmulator() as kube, pytest.raises(Exception) as refused:
        kube.create(obj)
    assert getattr(refused.value, "code", None) == 422 and message in str(refused.value)


ACCEPTED = {
    "a probed sidecar": pod({"restartPolicy": "Always", "readinessProbe": PROBE}),
    "an init container mounting its pod's volume": pod(
        {"volumeMounts": [{"name": "cache", "mountPath": "/cache"}]},
        [{"name": "cache", "emptyDir": {}}],
    ),
    "a Service named by a DNS-1035 label": service("demo-grader"),
}


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_the_emulator_accepts_what_the_server_accepts(case: str) -> None:
    with KubeEmulator() as kube:
        assert kube.create(ACCEPTED[case])["metadata"]["uid"]


QUOTA = {"metadata": {"name": "compute"}, "spec": {"hard": {"requests.cpu": "8", "memory": "1Ti"}}}


def with_user_init_containers(example: str) -> GagarRun:
    """The example with a user's init container (no resources) and sidecar (a CPU limit only)
    in the trainer's, rollout's and grader's pod templates."""
    doc = yaml.safe_load((ROOT / "examples" / f"{example}.yaml").read_text())
    user = [{"name": "fetch", "image": "busybox"},
            {"name": "shipper", "image": "busybox", "restartPolicy": "Always",
             "resources": {"limits": {"cpu": "50m"}}}]  # fmt: skip
    for component in ("trainer", "rollout", "grader"):
        doc["spec"].setdefault(component, {})["podTemplate"] = {"initContainers": user}
    run, problems = validate_run(doc)
    assert run is not None, problems
    return run


@pytest.mark.parametrize("example", ["single-gpu", "flash-moe", "gagar-vs-grpo", "local"])
def test_a_quota_on_cpu_and_memory_admits_every_pod_of_a_run_with_sidecars(example: str) -> None:
    """Quota admission refuses a pod in which any container, init containers and sidecars too,
    lacks a request the namespace's ResourceQuota tracks: the user's get default requests."""
    run = with_user_init_containers(example)
    pods = [spec for obj in build_all(run) for _, spec in pod_specs(obj, "")]
    assert sum(len(p.get("initContainers") or []) for p in pods) >= 2
    for pod_spec in pods:
        assert quota_refusal({"spec": pod_spec}, [QUOTA]) is None
    shipper = next(c for p in pods for c in p.get("initContainers") or [] if c["name"] == "shipper")
    # a limit alone is its request (the server defaults it): no default beside it
    assert shipper["resources"] == {"requests": {"memory": "128Mi"}, "limits": {"cpu": "50m"}}


def test_gagar_validate_names_the_missing_volume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gagar.cli import main

    doc = yaml.safe_load((ROOT / "examples" / "single-gpu.yaml").read_text())
    init = {"name": "warm", "image": "busybox", "volumeMounts": [{"name": "x", "mountPath": "/x"}]}
    doc["spec"]["trainer"]["podTemplate"] = {"initContainers": [init]}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(path)]) == 1
    assert capsys.readouterr().err == (
        f'{path}[0]: spec.trainer.podTemplate.initContainers[0].volumeMounts[0].name: Not found: "x"\n'
    )


LIMITS_QUOTA = {"metadata": {"name": "compute"},
                "spec": {"hard": {"limits.cpu": "1k", "limits.memory": "64Ti"}}}  # fmt: skip


@pytest.mark.parametrize("example", ["single-gpu", "flash-moe", "gagar-vs-grpo", "local"])
def test_a_quota_on_limits_admits_every_pod_with_the_limits_the_operator_adds(
    example: str,
) -> None:
    """Issue 46: a ResourceQuota on ``limits.cpu``/``limits.memory`` refuses a pod in which any
    container, the user's init containers and sidecars too, states no limit (as the server's
    quota admission does, and the emulator with it); the operator, which lists the namespace's
    quotas, gives every container without one its request as its limit."""
    from gagar.operator.builders import BuildContext
    from gagar.operator.builders.common import quota_limited

    run = with_user_init_containers(example)
    bare = [spec for obj in build_all(run) for _, spec in pod_specs(obj, "")]
    assert any(quota_refusal({"spec": p}, [LIMITS_QUOTA]) for p in bare)
    limited = quota_limited(LIMITS_QUOTA["spec"]["hard"])
    assert limited == {"cpu", "memory"}
    objs = build_all(run, BuildContext(quota_limits=limited))
    for pod_spec in [spec for obj in objs for _, spec in pod_specs(obj, "")]:
        assert quota_refusal({"spec": pod_spec}, [LIMITS_QUOTA]) is None
    shipper = next(c for o in objs for _, p in pod_specs(o, "")
                   for c in p.get("initContainers") or [] if c["name"] == "shipper")  # fmt: skip
    assert shipper["resources"]["limits"] == {"cpu": "50m", "memory": "128Mi"}  # its own kept
