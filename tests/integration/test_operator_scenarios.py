"""Operator scenarios with the real kopf runtime against the Kubernetes API emulator.

Each scenario starts ``gagar``'s handlers (``register`` on a fresh kopf registry, a fresh
``Reconciler``) in a thread and drives the cluster through the API only. With
``GAGAR_TEST_KUBECONFIG`` set, the same scenarios run against that cluster instead (namespace
``GAGAR_TEST_NAMESPACE``, default ``default``; the GagarRun CRD is applied first); scenarios that
need emulator-only controls (failing a Job on demand, injected API faults, simulated readiness)
are skipped there.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import kopf
import pytest
from prometheus_client import CollectorRegistry

from gagar.crd import build_crd
from gagar.metrics import Metrics
from gagar.operator.handlers import (
    OperatorConfig,
    Reconciler,
    configure_settings,
    parse_run,
    register,
)
from gagar.operator.kube import RUN_API, Kube
from tests.kube_emulator import KubeEmulator
from tests.kube_emulator.kopf_runner import run_operator
from tests.unit.test_builders import example

REAL = os.environ.get("GAGAR_TEST_KUBECONFIG")
TIMEOUT = 60.0 if REAL else 30.0  # generous: CI machines are shared and slow


@dataclass
class Env:
    """The cluster under test: the REST helper for both modes, the emulator when there is one."""

    kube: Kube
    namespace: str
    emulator: KubeEmulator | None
    resync: float = 3.0
    created: list[str] = field(default_factory=list)

    def need_emulator(self) -> KubeEmulator:
        if self.emulator is None:
            pytest.skip("needs the emulator's simulated controllers or fault injection")
        return self.emulator

    @contextlib.contextmanager
    def operator(self) -> Iterator[Reconciler]:
        """A fresh operator (new registry, new in-memory state) for the duration of the block."""
        reconciler = Reconciler(
            self.kube,
            Metrics(CollectorRegistry(), "operator"),
            OperatorConfig(resync_seconds=self.resync),
        )
        registry = register(kopf.OperatorRegistry(), reconciler)
        if self.emulator is None:
            registry._kube_emulator_login = True  # type: ignore[attr-defined]
            kopf.on.login(registry=registry)(lambda **kw: kopf.login_with_kubeconfig(**kw))
        with run_operator(
            self.emulator, registry, namespaces=(self.namespace,), configure=configure_settings
        ):  # type: ignore[arg-type]
            yield reconciler

    def wait(self, condition: Callable[[], Any], timeout: float = TIMEOUT, what: str = "") -> Any:
        deadline = time.monotonic() + timeout
        while True:
            result = condition()
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what or condition}")
            time.sleep(0.05)

    # -- runs
    def create(self, run: dict[str, Any]) -> dict[str, Any]:
        run = {**run, "metadata": {**run["metadata"], "namespace": self.namespace}}
        self.created.append(run["metadata"]["name"])
        return self.kube.create(run)

    def run(self, name: str) -> dict[str, Any] | None:
        return self.kube.get(RUN_API, "GagarRun", self.namespace, name)

    def status(self, name: str) -> dict[str, Any]:
        return (self.run(name) or {}).get("status") or {}

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        return next((c for c in self.status(name).get("conditions", []) if c["type"] == kind), {})

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.kube.merge_patch(RUN_API, "GagarRun", self.namespace, name, {"spec": spec})

    def get(self, api_version: str, kind: str, name: str) -> dict[str, Any] | None:
        return self.kube.get(api_version, kind, self.namespace, name)

    def children(self, run_name: str) -> list[tuple[str, str, str]]:
        """(kind, name, uid) of every object labelled with the run."""
        kinds = [
            ("v1", "ConfigMap"),
            ("v1", "ServiceAccount"),
            ("v1", "Service"),
            ("batch/v1", "Job"),
            ("apps/v1", "Deployment"),
            ("autoscaling/v2", "HorizontalPodAutoscaler"),
            ("networking.k8s.io/v1", "NetworkPolicy"),
            ("rbac.authorization.k8s.io/v1", "Role"),
            ("rbac.authorization.k8s.io/v1", "RoleBinding"),
            ("v1", "PersistentVolumeClaim"),
        ]
        out = []
        for api, kind in kinds:
            for obj in self.kube.list(api, kind, self.namespace, f"gagar.dev/run={run_name}"):
                out.append((kind, obj["metadata"]["name"], obj["metadata"]["uid"]))
        return sorted(out)

    def events(self, name: str) -> list[dict[str, Any]]:
        events = self.kube.list("v1", "Event", self.namespace)
        return [e for e in events if e.get("involvedObject", {}).get("name") == name]


@pytest.fixture
def env() -> Iterator[Env]:
    if REAL:
        import kubernetes

        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=REAL, client_configuration=config)
        os.environ["KUBECONFIG"] = REAL
        kube = Kube(kubernetes.client.ApiClient(config))
        kube.apply(build_crd())
        real = Env(kube, os.environ.get("GAGAR_TEST_NAMESPACE", "default"), None, resync=5.0)
        yield real
        for name in real.created:  # a real cluster outlives the test: leave nothing behind
            with contextlib.suppress(Exception):  # the operator is gone: drop kopf's finalizer
                body = {"metadata": {"finalizers": None}}
                kube.merge_patch(RUN_API, "GagarRun", real.namespace, name, body)
                kube.delete(RUN_API, "GagarRun", real.namespace, name)
        return
    with KubeEmulator(bookmark_interval=0.5, deployment_delay=0.05) as emulator:
        emulator.create(build_crd())
        client = emulator.api_client()
        try:
            yield Env(Kube(client), "default", emulator)
        finally:
            client.close()


def manifest(base: str = "single-gpu", **changes: Any) -> dict[str, Any]:
    """An example GagarRun with a unique name, as a dict ready to create."""
    run = example(base, **changes).model_dump(mode="json", by_alias=True, exclude_none=True)
    run.pop("status", None)
    run["metadata"] = {"name": f"{base[:8]}-{uuid.uuid4().hex[:6]}"}
    return run


def applied(emulator: KubeEmulator, deployment: str) -> int:
    """How many times the Deployment itself (not its scale subresource) was patched."""
    return sum(
        r["path"].endswith(f"/deployments/{deployment}") for r in emulator.requests_for("patch")
    )


HPA = {"minReplicas": 1, "maxReplicas": 6, "backend": "hpa", "targetQueueDepth": 4}


def phase(env: Env, name: str, want: str) -> Callable[[], bool]:
    return lambda: env.status(name).get("phase") == want


# ---------------------------------------------------------------------------------- scenarios
def test_create(env: Env) -> None:
    run = manifest()
    name = run["metadata"]["name"]
    with env.operator() as reconciler:
        uid = env.create(run)["metadata"]["uid"]
        job = env.wait(lambda: env.get("batch/v1", "Job", f"{name}-trainer"), what="trainer Job")
        assert job["metadata"]["ownerReferences"][0]["uid"] == uid
        for kind, child, _ in env.children(name):
            obj = (
                env.get({"Deployment": "apps/v1", "Job": "batch/v1"}.get(kind, "v1"), kind, child)
                if kind in ("Deployment", "Job", "Service", "ConfigMap")
                else None
            )
            if obj:
                assert obj["metadata"]["ownerReferences"][0]["controller"] is True
        env.wait(lambda: env.get("apps/v1", "Deployment", f"{name}-sandbox"), what="sandbox pool")
        if env.emulator:
            env.wait(phase(env, name, "Running"), what="Running")
            env.wait(lambda: env.condition(name, "Ready").get("status") == "True", what="Ready")
            status = env.status(name)
            assert status["observedGeneration"] == 1
            assert status["pools"]["rollout"] == {
                "replicas": 2,
                "readyReplicas": 2,
                "selector": f"app.kubernetes.io/component=rollout,gagar.dev/run={name}",
            }
            # trainer progress reported through the progress ConfigMap reaches the status
            env.emulator.patch(
                "v1",
                "ConfigMap",
                f"{name}-progress",
                lambda o: {
                    **o,
                    "data": {"step": "7", "checkpointStep": "5", "checkpointUri": "pvc://c/5"},
                },
                manager="trainer",
            )
            env.wait(lambda: env.status(name).get("step") == 7, what="step from progress")
            assert env.status(name)["lastCheckpoint"]["step"] == 5
            assert env.wait(lambda: env.events(name), what="events")
        kinds = {k for k, _, _ in env.children(name)}
        assert {
            "ConfigMap",
            "ServiceAccount",
            "Service",
            "Job",
            "Deployment",
            "NetworkPolicy",
            "Role",
            "RoleBinding",
            "PersistentVolumeClaim",
        } <= kinds
        assert (
            reconciler.metrics["gagar_operator_reconciles_total"].labels(result="ok")._value.get()
            >= 1
        )


def test_scale_by_editing_replicas(env: Env) -> None:
    run = manifest()
    name = run["metadata"]["name"]
    with env.operator():
        env.create(run)
        env.wait(lambda: env.get("apps/v1", "Deployment", f"{name}-rollout"), what="rollout pool")
        env.patch_spec(name, {"rollout": {"replicas": 4}})
        env.wait(
            lambda: env.get("apps/v1", "Deployment", f"{name}-rollout")["spec"]["replicas"] == 4,
            what="scaled to 4",
        )
        if env.emulator:
            env.wait(
                lambda: (
                    env.status(name).get("pools", {}).get("rollout", {}).get("readyReplicas") == 4
                ),
                what="4 ready",
            )
            assert env.status(name)["observedGeneration"] == 2


def test_autoscaled_pool_replicas_untouched(env: Env) -> None:
    run = manifest(**{"rollout.replicas": None, "rollout.autoscaling": HPA})
    name, dep = run["metadata"]["name"], f"{run['metadata']['name']}-rollout"
    with env.operator():
        env.create(run)
        hpa = env.wait(
            lambda: env.get("autoscaling/v2", "HorizontalPodAutoscaler", dep), what="HPA"
        )
        assert hpa["spec"]["maxReplicas"] == 6
        deployment = env.wait(lambda: env.get("apps/v1", "Deployment", dep), what="Deployment")
        owners = [
            m
            for m in deployment["metadata"].get("managedFields", [])
            if m.get("manager") == "gagar-operator"
        ]
        assert owners and all(
            "f:replicas" not in str(m.get("fieldsV1", {}).get("f:spec", {})) for m in owners
        )
        # the HPA scales the Deployment (a real cluster's HPA needs metrics, so the test writes it)
        scale = {"spec": {"replicas": 5}}
        env.kube.merge_patch("apps/v1", "Deployment", env.namespace, dep, scale, "scale")
        applies = applied(env.emulator, dep) if env.emulator else 0
        # a spec change later the operator has re-applied the Deployment and left replicas alone
        env.patch_spec(name, {"rollout": {"autoscaling": {**HPA, "maxReplicas": 8}}})
        env.wait(
            lambda: (
                env.get("autoscaling/v2", "HorizontalPodAutoscaler", dep)["spec"]["maxReplicas"]
                == 8
            ),
            what="bounds changed",
        )
        if env.emulator:
            env.wait(
                lambda: applied(env.emulator, dep) > applies,
                what="re-applied",
            )
        else:
            time.sleep(env.resync * 2.5)
        assert env.get("apps/v1", "Deployment", dep)["spec"]["replicas"] == 5


def test_suspend_and_resume(env: Env) -> None:
    run = manifest(**{"rollout.replicas": None, "rollout.autoscaling": HPA})
    name = run["metadata"]["name"]
    hpa = ("autoscaling/v2", "HorizontalPodAutoscaler", f"{name}-rollout")
    with env.operator():
        env.create(run)
        env.wait(lambda: env.get(*hpa), what="HPA")
        job_uid = env.wait(lambda: env.get("batch/v1", "Job", f"{name}-trainer"))["metadata"]["uid"]
        env.patch_spec(name, {"suspend": True})
        env.wait(
            lambda: env.get("batch/v1", "Job", f"{name}-trainer")["spec"]["suspend"] is True,
            what="Job suspended",
        )
        for pool in ("rollout", "grader", "sandbox"):
            env.wait(
                lambda p=pool: (
                    env.get("apps/v1", "Deployment", f"{name}-{p}")["spec"]["replicas"] == 0
                ),
                what=f"{pool} at 0",
            )
        env.wait(lambda: env.get(*hpa) is None, what="HPA removed while suspended")
        env.wait(phase(env, name, "Suspended"), what="phase Suspended")
        if env.emulator:
            env.wait(
                lambda: env.condition(name, "Suspended").get("reason") == "Suspended",
                what="drained",
            )
        env.patch_spec(name, {"suspend": False})
        env.wait(
            lambda: env.get("batch/v1", "Job", f"{name}-trainer")["spec"]["suspend"] is False,
            what="resumed",
        )
        env.wait(lambda: env.get(*hpa), what="HPA back")
        assert (
            env.get("batch/v1", "Job", f"{name}-trainer")["metadata"]["uid"] == job_uid
        )  # same Job resumes
        assert env.get("apps/v1", "Deployment", f"{name}-sandbox")["spec"]["replicas"] == 32
        if env.emulator:
            env.wait(phase(env, name, "Running"), what="Running again")
            reasons = [e["reason"] for e in env.events(name)]
            assert "Resumed" in reasons


def test_trainer_failure_and_restart_budget(env: Env) -> None:
    emulator = env.need_emulator()
    run = manifest(**{"trainer.failurePolicy.maxRestarts": 1})
    name, job = run["metadata"]["name"], f"{run['metadata']['name']}-trainer"
    with env.operator():
        env.create(run)
        first = env.wait(lambda: env.get("batch/v1", "Job", job))["metadata"]["uid"]
        emulator.fail_job(job)
        second = env.wait(
            lambda: (j := env.get("batch/v1", "Job", job)) and j["metadata"]["uid"] != first and j,
            what="Job recreated",
        )
        assert second["metadata"]["annotations"]["gagar.dev/attempt"] == "1"
        env.wait(lambda: env.status(name).get("trainerRestarts") == 1, what="restart counted")
        env.wait(phase(env, name, "Running"), what="running again")
        emulator.fail_job(job)
        env.wait(phase(env, name, "Failed"), what="Failed after the budget")
        assert env.condition(name, "Failed")["reason"] == "RestartBudgetExhausted"
        assert env.status(name)["trainerRestarts"] == 1
        assert env.get("batch/v1", "Job", job)["metadata"]["uid"] == second["metadata"]["uid"]
        for pool in ("rollout", "grader", "sandbox"):  # accelerators released
            env.wait(
                lambda p=pool: (
                    env.get("apps/v1", "Deployment", f"{name}-{p}")["spec"]["replicas"] == 0
                ),
                what=f"{pool} released",
            )
        reasons = [e["reason"] for e in env.events(name)]
        assert "TrainerRestarted" in reasons and "RestartBudgetExhausted" in reasons


def test_operator_restart_mid_reconcile(env: Env) -> None:
    emulator = env.need_emulator()
    run = manifest()
    name = run["metadata"]["name"]
    # every apply of the rollout Deployment fails: the first operator stops half-way through
    rule = emulator.faults.fail_next(None, verb="patch", path=f"/deployments/{name}-rollout$")
    with env.operator():
        env.create(run)
        env.wait(lambda: rule.hits >= 2, what="reconcile interrupted")
        env.wait(lambda: env.status(name).get("conditions"), what="first status")
    before = dict(((k, n), u) for k, n, u in env.children(name))
    status_before = env.status(name)
    assert ("Job", f"{name}-trainer") not in before  # it comes after the pools: never reached
    emulator.faults.clear()
    with env.operator():
        env.wait(phase(env, name, "Running"), what="converged after restart")
        env.wait(lambda: env.condition(name, "Ready").get("status") == "True", what="Ready")
    after = env.children(name)
    assert len({(k, n) for k, n, _ in after}) == len(after)
    for kind, child, uid in after:  # what existed was updated in place, not recreated
        if (kind, child) in before:
            assert before[(kind, child)] == uid
    status = env.status(name)
    assert status["trainerRestarts"] == status_before["trainerRestarts"] == 0
    assert env.run(name)["metadata"]["generation"] == 1
    kept = {c["type"]: c["lastTransitionTime"] for c in status_before["conditions"]}
    for c in status["conditions"]:
        if c["type"] in ("Stalled", "Failed", "Complete", "Suspended"):
            assert (
                c["lastTransitionTime"] == kept[c["type"]]
            )  # unchanged conditions keep their time


def test_delete_garbage_collects_children(env: Env) -> None:
    run = manifest()
    name = run["metadata"]["name"]
    with env.operator():
        env.create(run)
        env.wait(lambda: env.get("batch/v1", "Job", f"{name}-trainer"), what="children")
        # no finalizer of gagar's own: children go by owner references; kopf keeps one only to
        # stop the resync timer cleanly, and removes it
        assert set(env.run(name)["metadata"].get("finalizers") or []) <= {
            "kopf.gagar.dev/finalizer"
        }
        env.kube.delete(RUN_API, "GagarRun", env.namespace, name)
        env.wait(lambda: env.run(name) is None, what="run gone")
        env.wait(lambda: env.children(name) == [], what="children collected")


def test_invalid_spec_is_stalled_with_field_path(env: Env) -> None:
    run = manifest()
    # passes the CRD's OpenAPI schema; only the CEL rule (not evaluated by the emulator) or the
    # operator's own validation catches it
    run["spec"]["rollout"]["autoscaling"] = HPA
    name = run["metadata"]["name"]
    with env.operator():
        try:
            env.create(run)
        except Exception as err:  # a real API server's CEL rejects it at the door: also fine
            assert "replicas" in str(err)
            return
        env.wait(phase(env, name, "Stalled"), what="Stalled")
        stalled = env.condition(name, "Stalled")
        assert stalled["status"] == "True" and stalled["reason"] == "InvalidSpec"
        assert "spec.rollout" in stalled["message"] and "replicas" in stalled["message"]
        assert env.children(name) == []
        assert any(e["reason"] == "InvalidSpec" for e in env.wait(lambda: env.events(name)))
        env.patch_spec(name, {"rollout": {"autoscaling": None}})  # fix it: the run proceeds
        env.wait(lambda: env.get("batch/v1", "Job", f"{name}-trainer"), what="children after fix")
        env.wait(
            lambda: env.condition(name, "Stalled").get("status") == "False", what="not stalled"
        )


def test_api_errors_then_recovery(env: Env) -> None:
    emulator = env.need_emulator()
    run = manifest()
    name = run["metadata"]["name"]
    applies = emulator.faults.fail_next(2, verb="patch", path="/jobs/")
    reads = emulator.faults.fail_next(1, verb="get", path="/deployments/")
    status = emulator.faults.fail_next(1, verb="patch", path="/status$")
    with env.operator():
        env.create(run)
        env.wait(phase(env, name, "Running"), what="Running despite 500s")
        env.wait(lambda: env.condition(name, "Ready").get("status") == "True", what="Ready")
    assert (applies.hits, reads.hits, status.hits) == (2, 1, 1)
    assert len([c for c in env.children(name) if c[0] == "Job"]) == 1


def test_parse_run_names_every_bad_field() -> None:
    """The handler's boundary: problems become one message with field paths, never an exception."""
    run = manifest()
    run["spec"]["rollout"]["autoscaling"] = HPA
    run["spec"]["trainer"]["nodes"] = 0
    parsed, error = parse_run(run)
    assert parsed is None and error is not None
    assert "spec.trainer.nodes" in error and "spec.rollout" in error
    ok, none = parse_run(manifest())
    assert ok is not None and none is None


def test_completion_releases_accelerators(env: Env) -> None:
    emulator = env.need_emulator()
    run = manifest(**{"rollout.replicas": None, "rollout.autoscaling": HPA})
    name = run["metadata"]["name"]
    hpa = ("autoscaling/v2", "HorizontalPodAutoscaler", f"{name}-rollout")
    with env.operator():
        env.create(run)
        env.wait(lambda: env.get(*hpa), what="HPA")
        env.wait(phase(env, name, "Running"), what="Running")
        emulator.succeed_job(f"{name}-trainer")
        env.wait(phase(env, name, "Succeeded"), what="Succeeded")
        assert env.condition(name, "Complete")["status"] == "True"
        env.wait(lambda: env.get(*hpa) is None, what="autoscaler removed")
        for pool in ("rollout", "grader", "sandbox"):
            env.wait(
                lambda p=pool: (
                    env.get("apps/v1", "Deployment", f"{name}-{p}")["spec"]["replicas"] == 0
                ),
                what=f"{pool} released",
            )
        assert env.status(name)["completionTime"]
        assert env.condition(name, "PoolsReady")["reason"] == "Released"
