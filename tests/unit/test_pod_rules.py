"""Pod and Service rules the API server enforces, held by ``gagar validate`` where the spec says
enough and by the emulator always: a probe or lifecycle hook on an init container that is not a
sidecar, an init container mounting a volume the pod lacks, a Service name that is no DNS-1035
label (``1bad``). Each answer is the server's 422, in its words."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from gagar.manifest import validate_document
from tests.kube_emulator import KubeEmulator

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
    _, problems = validate_document(run_with_init(init), "run.yaml")
    assert [str(p) for p in problems] == [
        f"run.yaml[0]: spec.trainer.podTemplate.initContainers[0]: Value error, {key}: {NOT_FOR_INIT}"
    ]
    run, problems = validate_document(run_with_init({**init, "restartPolicy": "Always"}), "r")
    assert problems == [] and run is not None  # a sidecar may be probed


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
        "spec.initContainers[0].volumeMounts[0].name: Not found: 'cache'",
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
