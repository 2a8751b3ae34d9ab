"""The real kopf runtime against the emulator: a toy operator with a CRD, a child and a status."""

from __future__ import annotations

import os
import subprocess
import sys
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
        kopf.info(body, reason="ChildCreated", message=f"created {child['metadata']['name']}")
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
        events = kube.wait_for(lambda: kube.list("v1", "Event"))
        assert (events[0]["involvedObject"]["name"], events[0]["reason"]) == ("t1", "ChildCreated")

        kube.patch("example.com/v1", "Toy", "t1", lambda o: {**o, "spec": {"size": 5}})
        kube.wait_for(lambda: calls["update"])
        assert calls["update"] == ["t1=5"]

        kube.delete("example.com/v1", "Toy", "t1")
        kube.wait_for(lambda: kube.find("example.com/v1", "Toy", "t1") is None)
        kube.wait_for(lambda: kube.find("v1", "ConfigMap", "t1-child") is None)
    assert calls["create"] == ["t1"]  # exactly once: no duplicate watch replays
    assert calls["delete"] == ["t1"]


def test_operator_restart_does_not_rerun_create(kube: KubeEmulator) -> None:
    calls: dict[str, list[str]] = {"create": [], "update": [], "delete": []}
    registry = make_registry(kube, calls)
    with run_operator(kube, registry):
        kube.create(toy("t1"))
        kube.wait_for(
            lambda: (kube.get("example.com/v1", "Toy", "t1").get("status") or {}).get("create")
        )
    with run_operator(kube, registry):
        kube.create(toy("t2"))
        kube.wait_for(
            lambda: (kube.get("example.com/v1", "Toy", "t2").get("status") or {}).get("create")
        )
    assert sorted(calls["create"]) == ["t1", "t2"]


def test_operator_survives_api_errors_dropped_watches_and_expired_history(
    kube: KubeEmulator,
) -> None:
    calls: dict[str, list[str]] = {"create": [], "update": [], "delete": []}
    with run_operator(kube, make_registry(kube, calls)):
        rule = kube.faults.fail_next(2, verb="patch", path="/toys/t1/status")
        kube.create(toy("t1"))
        kube.wait_for(
            lambda: (kube.get("example.com/v1", "Toy", "t1").get("status") or {}).get("create")
        )
        assert rule.hits == 2  # kopf retried the failed status patches

        kube.wait_for(lambda: kube.drop_watches("toys"))
        kube.create(toy("t2"))
        kube.wait_for(lambda: kube.find("v1", "ConfigMap", "t2-child"))

        lists = len(kube.requests_for(verb="list", path="/toys"))
        kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unrelated"}})
        kube.compact_history()  # kopf's last toys version is now older than the history
        kube.wait_for(lambda: kube.drop_watches("toys"))
        kube.wait_for(
            lambda: len(kube.requests_for(verb="list", path="/toys")) > lists
        )  # 410: re-list
        kube.create(toy("t3"))
        kube.wait_for(lambda: kube.find("v1", "ConfigMap", "t3-child"))
    assert sorted(calls["create"]) == ["t1", "t2", "t3"]


def test_kopf_default_login_reads_the_kubeconfig(kube: KubeEmulator) -> None:
    """A separately started operator (``gagar operator``) finds the emulator via KUBECONFIG.

    A subprocess, because the kubernetes client reads KUBECONFIG once, when it is imported.
    """
    code = (
        "import logging, kopf; "
        "info = kopf.login_via_client(logger=logging.getLogger(), settings=kopf.OperatorSettings()); "
        "print(info.server)"
    )
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == kube.url, out.stderr


def test_registry_runs_against_successive_emulators_with_the_default_client() -> None:
    """Cluster-wide kopf, one registry reused, operator code using the default ApiClient()."""
    from kubernetes.client import ApiClient

    calls: dict[str, list[str]] = {"create": [], "update": [], "delete": []}
    registry = kopf.OperatorRegistry()

    @kopf.on.create("", "v1", "configmaps", labels={"watched": "yes"}, registry=registry)
    def create(name: str, namespace: str, **_: object) -> None:
        calls["create"].append(name)
        with ApiClient() as client:  # the global default, as operator code may use it
            CoreV1Api(client).create_namespaced_config_map(
                namespace, {"metadata": {"name": f"{name}-seen"}}
            )

    for run in ("first", "second"):
        with (
            KubeEmulator() as kube,
            kube.as_default_client(),
            run_operator(kube, registry, namespaces=()),
        ):
            kube.create(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": run, "labels": {"watched": "yes"}},
                }
            )
            kube.wait_for(lambda kube=kube, run=run: kube.find("v1", "ConfigMap", f"{run}-seen"))
    assert calls["create"] == ["first", "second"]
