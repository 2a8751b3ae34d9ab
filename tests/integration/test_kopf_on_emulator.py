"""The real kopf runtime against the emulator: a toy operator with a CRD, a child and a status."""

from __future__ import annotations

import threading

import kopf
import pytest
from kubernetes.client import CoreV1Api  # imported eagerly: the lazy import takes seconds

from tests.kube_emulator import KubeEmulator
from tests.kube_emulator.kopf_runner import run_operator

CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: toys.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: toys, singular: toy, kind: Toy, shortNames: [ty]}
  versions:
    - name: v1
      served: true
      storage: true
      subresources: {status: {}}
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              required: [size]
              properties:
                size: {type: integer, minimum: 1, maximum: 10}
            status:
              type: object
              x-kubernetes-preserve-unknown-fields: true
"""


def toy(name: str, size: int = 3) -> dict:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Toy",
        "metadata": {"name": name},
        "spec": {"size": size},
    }


def make_registry(kube: KubeEmulator, calls: dict[str, list[str]]) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    lock = threading.Lock()

    @kopf.on.create("example.com", "v1", "toys", id="create", registry=registry)
    def create(name: str, namespace: str, spec: dict, body: kopf.Body, **_: object) -> dict:
        with lock:
            calls["create"].append(name)
        child = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{name}-child"},
            "data": {"size": str(spec["size"])},
        }
        kopf.adopt(child, owner=body)
        with kube.api_client() as client:
            CoreV1Api(client).create_namespaced_config_map(namespace, child)
        return {"child": child["metadata"]["name"]}

    @kopf.on.update("example.com", "v1", "toys", field="spec.size", registry=registry)
    def resize(name: str, new: int, **_: object) -> None:
        with lock:
            calls["update"].append(f"{name}={new}")

    @kopf.on.delete("example.com", "v1", "toys", registry=registry)
    def delete(name: str, **_: object) -> None:
        with lock:
            calls["delete"].append(name)

    return registry


@pytest.fixture
def kube():
    with KubeEmulator(bookmark_interval=0.5) as emulator:
        emulator.load_yaml(CRD)
        yield emulator


def test_toy_operator_lifecycle(kube: KubeEmulator) -> None:
    calls: dict[str, list[str]] = {"create": [], "update": [], "delete": []}
    with run_operator(kube, make_registry(kube, calls)):
        kube.create(toy("t1"))
        child = kube.wait_for(lambda: kube.find("v1", "ConfigMap", "t1-child"))
        owner = kube.get("example.com/v1", "Toy", "t1")
        assert child["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
        kube.wait_for(
            lambda: (kube.get("example.com/v1", "Toy", "t1").get("status") or {}).get("create")
        )
        toy_obj = kube.get("example.com/v1", "Toy", "t1")
        assert toy_obj["status"]["create"] == {"child": "t1-child"}
        assert "kopf.zalando.org/KopfFinalizerMarker" in toy_obj["metadata"]["finalizers"]
        assert toy_obj["metadata"]["generation"] == 1  # status and finalizer writes keep generation

        kube.patch("example.com/v1", "Toy", "t1", lambda o: {**o, "spec": {"size": 5}})
        kube.wait_for(lambda: calls["update"])
        assert calls["update"] == ["t1=5"]

        kube.delete("example.com/v1", "Toy", "t1")
        kube.wait_for(lambda: kube.find("example.com/v1", "Toy", "t1") is None)
        kube.wait_for(lambda: kube.find("v1", "ConfigMap", "t1-child") is None)
    assert calls["create"] == ["t1"]  # exactly once: no duplicate watch replays
    assert calls["delete"] == ["t1"]
