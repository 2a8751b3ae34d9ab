"""Operator scenarios with the real kopf runtime against the Kubernetes API emulator.

Each scenario starts ``gagar``'s handlers (``register`` on a fresh kopf registry, a fresh
``Reconciler``) in a thread and drives the cluster through the API only. The operator logs in as
a real one does (``gagar.operator.main``: the kubernetes client's kubeconfig loader) and acts as
its ServiceAccount with exactly the RBAC the chart renders (default values, plus the integrations
a scenario turns on), so a missing rule fails here as it would in a cluster. Every scenario runs
against an emulator in this process (``emulator``; the scenarios that need its controls, failing
a Job on demand or injected API faults, only there) and, in ``make test-e2e``, against an emulator
served by a separate process and reached only through kubeconfigs (``kubeconfig``,
tests/e2e/test_operator_scenarios_kubeconfig.py). With
``GAGAR_TEST_KUBECONFIG`` set, they run against that cluster instead (namespace
``GAGAR_TEST_NAMESPACE``, default ``default``; the GagarRun CRD is applied first; the operator
acts as that kubeconfig's user); see docs/operations.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import kopf
import pytest
import yaml
from prometheus_client import CollectorRegistry

from gagar.crd import build_crd
from gagar.env import EXIT_PERMANENT
from gagar.metrics import Metrics
from gagar.operator.builders import BuildContext, build_all
from gagar.operator.builders.trust import TrustPolicy
from gagar.operator.handlers import (
    MANAGED,
    OperatorConfig,
    Reconciler,
    configure_settings,
    parse_run,
    register,
)
from gagar.operator.kube import RUN_API, Kube, KubeError
from gagar.operator.main import add_login, api_client
from tests.kube_emulator import KubeEmulator
from tests.kube_emulator.kopf_runner import run_operator
from tests.support.tools import ROOT, helm_template
from tests.unit.test_builders import example

REAL = os.environ.get("GAGAR_TEST_KUBECONFIG")
# generous: waits end as soon as their condition holds, and a shared 2-core machine at a load
# of 10 took longer than 30 s for some (issue 44)
TIMEOUT = 120.0 if REAL else 90.0
# The chart's operator identity (`helm template gagar charts/gagar --namespace gagar-system`).
OPERATOR_SA = ("gagar-system", "gagar")
# --integration group -> the chart value that grants its RBAC
CHART_INTEGRATION = {
    "keda.sh": "integrations.keda",
    "jobset.x-k8s.io": "integrations.jobset",
    "monitoring.coreos.com": "integrations.prometheusOperator",
    "kueue.x-k8s.io": "integrations.kueue",
    "extensions.agents.x-k8s.io": "integrations.agentSandbox",
}


def chart_rbac(integrations: frozenset[str], *more: str) -> list[dict[str, Any]]:
    """The operator's ClusterRole and binding as the chart renders them (``more``: further
    ``--set`` flags, e.g. ``podSecurity.runSecretLabel=...``)."""
    flags = [a for g in sorted(integrations) for a in ("--set", f"{CHART_INTEGRATION[g]}=true")]
    flags += [a for value in more for a in ("--set", value)]
    kinds = ("ClusterRole", "ClusterRoleBinding")
    return [o for o in helm_template(*flags) if o["kind"] in kinds]


@dataclass
class Env:
    """The cluster under test: the admin's REST helper, the operator's kubeconfig, and the
    emulator when it runs in this process. ``simulated``: an emulator's controllers make
    Deployments ready (in either process), a real cluster's may not."""

    kube: Kube
    namespace: str
    emulator: KubeEmulator | None
    operator_kubeconfig: str
    simulated: bool = True
    resync: float = 1.0  # the emulators: short, the waits below are multiples of it
    created: list[str] = field(default_factory=list)

    def need_emulator(self) -> KubeEmulator:
        if self.emulator is None:
            pytest.skip("needs the emulator's simulated controllers or fault injection")
        return self.emulator

    @contextlib.contextmanager
    def operator(
        self,
        integrations: frozenset[str] = frozenset(),
        run_selector: str = "",
        network_policy_probe: bool = False,
        trust: TrustPolicy | None = None,
    ) -> Iterator[Reconciler]:
        """A fresh operator (new registry, new in-memory state) for the duration of the block,
        logged in through its kubeconfig, with the chart's RBAC for ``integrations`` (and for
        ``trust``'s Secret label)."""
        trust = trust or TrustPolicy()
        if self.simulated:
            label = trust.secret_label
            more = [f"podSecurity.runSecretLabel={label}"] if label else []
            for obj in chart_rbac(integrations, *more):
                self.kube.apply(obj)
        client = api_client(self.operator_kubeconfig)
        reconciler = Reconciler(
            Kube(client),
            Metrics(CollectorRegistry(), "operator"),
            OperatorConfig(
                resync_seconds=self.resync,
                integrations=integrations,
                run_selector=run_selector,
                network_policy_probe=network_policy_probe,
                trust=trust,
            ),
        )
        registry = register(kopf.OperatorRegistry(), reconciler)
        add_login(registry, self.operator_kubeconfig)
        try:
            with run_operator(
                None,
                registry,
                namespaces=(self.namespace,),
                configure=lambda settings: configure_settings(settings, run_selector),
            ):
                yield reconciler
        finally:
            client.close()

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

    def reason(self, name: str, kind: str, reason: str, what: str) -> dict[str, Any]:
        """Wait until the run's ``kind`` condition has ``reason``; that condition."""
        return self.wait(
            lambda: (
                self.condition(name, kind).get("reason") == reason and self.condition(name, kind)
            ),
            what=what,
        )

    def stopped(self, name: str) -> None:
        """Wait until the run's trainer is suspended and its three pools are at zero."""
        self.wait(
            lambda: self.get("batch/v1", "Job", f"{name}-trainer")["spec"].get("suspend") is True,
            what="trainer suspended",
        )
        for pool in ("rollout", "grader", "sandbox"):
            self.wait(
                lambda p=pool: (
                    self.get("apps/v1", "Deployment", f"{name}-{p}")["spec"].get("replicas") == 0
                ),
                what=f"{pool} at 0",
            )

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
            ("policy/v1", "PodDisruptionBudget"),
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

    # -- the kubelet's part (the emulator's Job controller runs the pods; tests end them)
    def pods(self, job: str) -> dict[str, dict[str, Any]]:
        """The current Job's live (not failed, not deleted) pods by completion index."""
        current = self.get("batch/v1", "Job", job)
        pods = self.kube.list("v1", "Pod", self.namespace, f"batch.kubernetes.io/job-name={job}")
        return {
            p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p
            for p in pods
            if current is not None
            and p["metadata"]["ownerReferences"][0]["uid"] == current["metadata"]["uid"]
            and (p.get("status") or {}).get("phase") != "Failed"
            and not p["metadata"].get("deletionTimestamp")
        }

    def end_pod(self, job: str, index: int = 0, exit_code: int = 1, evicted: bool = False) -> str:
        """Rank ``index`` of ``job`` ends as the kubelet reports it: its container exited with
        ``exit_code`` (0: the pod succeeded), or the pod was evicted (``DisruptionTarget``, then killed). Its name."""
        if not self.simulated:
            pytest.skip("a real cluster's kubelet owns pod status")
        pod = self.wait(lambda: self.pods(job).get(str(index)), what=f"rank {index} of {job}")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        conditions = [{"type": "Ready", "status": "False", "lastTransitionTime": now}]
        if evicted:
            conditions.append({"type": "DisruptionTarget", "status": "True",
                               "reason": "EvictionByEvictionAPI", "lastTransitionTime": now})  # fmt: skip
        container = pod["spec"]["containers"][0]["name"]
        status = {
            "phase": "Succeeded" if exit_code == 0 and not evicted else "Failed",
            "conditions": conditions,
            "containerStatuses": [{
                "name": container, "image": "", "imageID": "", "ready": False, "restartCount": 0,
                "state": {"terminated": {"exitCode": exit_code, "reason": "Error"}},
            }],
        }  # fmt: skip
        name = pod["metadata"]["name"]
        self.kube.merge_patch("v1", "Pod", self.namespace, name, {"status": status}, "status")
        return name


def _emulator_process(tmp: Path) -> Iterator[Path]:
    """An emulator in a process of its own; yields the folder of its kubeconfigs."""
    account = "/".join(OPERATOR_SA)
    cmd = [sys.executable, "-m", "tests.kube_emulator", str(tmp), "--service-account", account,
           "--openapi-validate"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not (tmp / "ready").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the emulator process did not start")
            time.sleep(0.05)
        yield tmp
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _real_env() -> Iterator[Env]:
    assert REAL
    kube = Kube(api_client(REAL))
    kube.apply(build_crd())
    namespace = os.environ.get("GAGAR_TEST_NAMESPACE", "default")
    real = Env(kube, namespace, None, REAL, simulated=False, resync=5.0)
    yield real
    for name in real.created:  # a real cluster outlives the test: leave nothing behind
        with contextlib.suppress(Exception):  # the operator is gone: drop kopf's finalizer
            body = {"metadata": {"finalizers": None}}
            kube.merge_patch(RUN_API, "GagarRun", real.namespace, name, body)
            kube.delete(RUN_API, "GagarRun", real.namespace, name)


def make_env(kind: str, tmp_path: Path) -> Iterator[Env]:
    """The cluster a scenario drives: ``real`` (GAGAR_TEST_KUBECONFIG), ``emulator`` (in this
    process) or ``kubeconfig`` (an emulator in a process of its own)."""
    if kind == "real":
        yield from _real_env()
        return
    if kind == "kubeconfig":
        with contextlib.contextmanager(_emulator_process)(tmp_path) as folder:
            client = api_client(str(folder / "admin.kubeconfig"))
            kube = Kube(client)
            kube.create(build_crd())
            sa = str(folder / "{}.{}.kubeconfig".format(*OPERATOR_SA))
            try:
                yield Env(kube, "default", None, sa)
            finally:
                client.close()
        return
    with KubeEmulator(
        bookmark_interval=0.5, deployment_delay=0.05, openapi_validate=True
    ) as emulator:
        emulator.create(build_crd())
        client = emulator.api_client()
        sa = str(emulator.service_account_kubeconfig(*OPERATOR_SA))
        try:
            yield Env(Kube(client), "default", emulator, sa)
        finally:
            client.close()


# The emulator in another process, reached only through kubeconfigs: the same scenarios in
# tests/e2e/test_operator_scenarios_kubeconfig.py (`make test-e2e`)
@pytest.fixture(params=["real"] if REAL else ["emulator"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    yield from make_env(request.param, tmp_path)


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
        if env.simulated:
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
            progress = {"data": {"step": "7", "checkpointStep": "5", "checkpointUri": "pvc://c/5"}}
            env.kube.merge_patch("v1", "ConfigMap", env.namespace, f"{name}-progress", progress)
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
            "PodDisruptionBudget",
            "Role",
            "RoleBinding",
            "PersistentVolumeClaim",
        } <= kinds
        assert (
            reconciler.metrics["gagar_operator_reconciles_total"].labels(result="ok")._value.get()
            >= 1
        )


# What a user overrides in podTemplate: env, a volume and its mount, an init container and a
# native sidecar (restartPolicy: Always).
OVERRIDES = {
    "env": [{"name": "HF_HOME", "value": "/cache"}],
    "volumes": [{"name": "cache", "emptyDir": {"sizeLimit": "1Gi"}}],
    "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
    "initContainers": [
        {"name": "warm-cache", "image": "busybox:1.36", "command": ["sh", "-c", "true"],
         "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]},
        {"name": "log-shipper", "image": "fluent/fluent-bit:3.1", "restartPolicy": "Always",
         "env": [{"name": "FLB_LOG_LEVEL", "value": "info"}]},
    ],
}  # fmt: skip


def test_pod_template_overrides_render_valid_pods(env: Env) -> None:
    """The done-when scenario: the overridden pods are stored by a server that checks them
    against Kubernetes' OpenAPI schemas (strict) and its built-in pod validation, and they hold
    each override once, merged by key into the operator's own entries."""
    run = manifest(**{f"{c}.podTemplate": OVERRIDES for c in ("trainer", "rollout", "grader")})
    name = run["metadata"]["name"]
    with env.operator():
        env.create(run)
        job = env.wait(lambda: env.get("batch/v1", "Job", f"{name}-trainer"), what="trainer Job")
        pools = [
            env.wait(lambda c=c: env.get("apps/v1", "Deployment", f"{name}-{c}"), what=c)
            for c in ("rollout", "grader")
        ]
    for workload in (job, *pools):
        spec = workload["spec"]["template"]["spec"]
        own = ["fetch-weights"] if workload is pools[0] else []  # the rollout pod's, first
        assert [c["name"] for c in spec["initContainers"]] == [*own, "warm-cache", "log-shipper"]
        assert spec["initContainers"][-1]["restartPolicy"] == "Always"
        assert [v["name"] for v in spec["volumes"]].count("cache") == 1
        for c in spec["containers"]:
            names = [e["name"] for e in c["env"]]
            assert names.count("HF_HOME") == 1 and len(names) == len(set(names))
            paths = [m["mountPath"] for m in c["volumeMounts"]]
            assert paths.count("/cache") == 1 and len(paths) == len(set(paths))
    assert not any(e.get("type") == "Warning" for e in env.events(name)), env.events(name)


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
        if env.simulated:
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


def test_an_hpa_that_cannot_scale_its_pool_is_in_pools_ready(env: Env) -> None:
    """``backend: hpa`` on a cluster whose metrics adapter does not serve the pool's metric: the
    HPA controller says so on the HPA (``ScalingActive`` False) and the pool stays at its
    minimum; the run says so too (PoolsReady False, AutoscalerInactive, naming the field) until
    the HPA scales again. Emulated: the test writes what the HPA controller would."""
    if not env.simulated:
        pytest.skip("writes the HPA controller's status; a real cluster's controller owns it")
    run = manifest(**{"grader.replicas": None, "grader.autoscaling": HPA})
    name = run["metadata"]["name"]
    hpa = ("autoscaling/v2", "HorizontalPodAutoscaler", f"{name}-grader")

    def scaling(active: bool, reason: str, message: str = "") -> None:
        conditions = [{"type": "ScalingActive", "status": str(active), "reason": reason,
                       "message": message, "lastTransitionTime": "2026-01-01T00:00:00Z"}]  # fmt: skip
        status = {"currentReplicas": 1, "desiredReplicas": 1, "conditions": conditions}
        env.kube.merge_patch(*hpa[:2], env.namespace, hpa[2], {"status": status}, "status")

    with env.operator():
        env.create(run)
        env.wait(lambda: env.get(*hpa), what="HPA")
        env.wait(lambda: env.condition(name, "PoolsReady").get("status") == "True", what="ready")
        scaling(False, "FailedGetPodsMetric", "unable to get metric gagar_grader_queue_depth")
        pools = env.reason(name, "PoolsReady", "AutoscalerInactive", what="said")
        assert pools["message"].startswith("spec.grader.autoscaling: ")
        assert "gagar_grader_queue_depth" in pools["message"]
        assert env.condition(name, "Ready")["status"] == "False"
        scaling(True, "ValidMetricFound")
        env.reason(name, "PoolsReady", "PoolsReady", what="scaling again")


def test_suspend_and_resume(env: Env) -> None:
    run = manifest(**{"rollout.replicas": None, "rollout.autoscaling": HPA})
    name = run["metadata"]["name"]
    hpa = ("autoscaling/v2", "HorizontalPodAutoscaler", f"{name}-rollout")
    with env.operator():
        env.create(run)
        env.wait(lambda: env.get(*hpa), what="HPA")
        job_uid = env.wait(lambda: env.get("batch/v1", "Job", f"{name}-trainer"))["metadata"]["uid"]
        env.patch_spec(name, {"suspend": True})
        env.stopped(name)
        env.wait(lambda: env.get(*hpa) is None, what="HPA removed while suspended")
        env.wait(phase(env, name, "Suspended"), what="phase Suspended")
        if env.simulated:
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
        if env.simulated:
            env.wait(phase(env, name, "Running"), what="Running again")
            env.wait(  # kopf posts events from a queue of its own: a moment later
                lambda: "Resumed" in [e["reason"] for e in env.events(name)], what="Resumed"
            )


FAST_RESTARTS = {"trainer.failurePolicy.backoffSeconds": 0.2}


def test_trainer_failure_and_restart_budget(env: Env) -> None:
    run = manifest(**{"trainer.failurePolicy.maxRestarts": 1, **FAST_RESTARTS})
    name, job = run["metadata"]["name"], f"{run['metadata']['name']}-trainer"
    with env.operator():
        env.create(run)
        first = env.wait(lambda: env.get("batch/v1", "Job", job))["metadata"]["uid"]
        env.end_pod(job)
        second = env.wait(
            lambda: (j := env.get("batch/v1", "Job", job)) and j["metadata"]["uid"] != first and j,
            what="Job recreated",
        )
        assert second["metadata"]["annotations"]["gagar.dev/attempt"] == "1"
        env.wait(lambda: env.status(name).get("trainerRestarts") == 1, what="restart counted")
        env.wait(phase(env, name, "Running"), what="running again")
        env.end_pod(job)
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


class _StaleChildren:
    """kopf's children index as it stands while a replaced object's deletion event is still
    queued behind that object's handler: the old trainer Job (kopf indexes by uid) beside the
    live children, or alone when the successor's own event has not been indexed either."""

    def __init__(self, index: Any, stale: dict[str, Any], alone: bool) -> None:
        self.index, self.stale, self.alone = index, stale, alone

    def get(self, key: tuple[str, str], default: Any = ()) -> list[dict[str, Any]]:
        live = list(self.index.get(key, default))
        if self.alone:
            live = [b for b in live if b.get("kind") != "Job"]
        return [self.stale, *live]


@pytest.mark.parametrize("alone", [False, True], ids=["beside-its-successor", "alone"])
def test_a_stale_view_of_the_failed_attempt_never_deletes_the_new_one(
    env: Env, alone: bool
) -> None:
    """The Job of attempt 0 failed and attempt 1 runs; the operator still sees attempt 0's Job
    (kopf has not handled its deletion yet). Reading that, the operator once deleted the live Job
    by name again and again (each time "creating attempt 1"), and the run never counted its
    second failure (seen in `make test`: test_trainer_failure_and_restart_budget timed out)."""
    run = manifest(**{"trainer.failurePolicy.maxRestarts": 2, **FAST_RESTARTS})
    name, job = run["metadata"]["name"], f"{run['metadata']['name']}-trainer"
    with env.operator() as reconciler:
        env.create(run)
        first = env.wait(lambda: env.get("batch/v1", "Job", job))
        env.end_pod(job)
        env.wait(lambda: env.status(name).get("trainerRestarts") == 1, what="restart counted")
        live = env.wait(
            lambda: (
                (j := env.get("batch/v1", "Job", job))
                and j["metadata"]["annotations"]["gagar.dev/attempt"] == "1"
                and j
            ),
            what="attempt 1",
        )
        then = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60))  # backoff over
        failed = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                  "message": "Job has reached the specified backoff limit",
                  "lastTransitionTime": then}  # fmt: skip
        stale = {**first, "status": {"failed": 1, "conditions": [failed]}}  # as kopf indexed it
        reconciler.children = _StaleChildren(reconciler.children, stale, alone)
        finished = threading.Event()

        def three_reconciles() -> None:  # whole ones: each waits for one in progress
            for _ in range(3):
                reconciler.reconcile({"metadata": {"namespace": env.namespace, "name": name}})
            finished.set()

        threading.Thread(target=three_reconciles, daemon=True).start()
        assert finished.wait(TIMEOUT), "the reconciles never ended (a Job deleted and recreated?)"
        assert env.get("batch/v1", "Job", job)["metadata"]["uid"] == live["metadata"]["uid"]
        assert env.status(name)["trainerRestarts"] == 1


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


def test_a_restarted_operator_sees_the_children_before_it_reconciles(env: Env) -> None:
    """kopf starts no run's handler before its index holds the first listing of every watched
    child kind: a new operator's first reconcile of a Ready run finds its trainer and pools, so
    the run's status is not rewritten (no flap to not-ready and back), even when the listing of
    Jobs comes late."""
    emulator = env.need_emulator()
    run = manifest()
    name = run["metadata"]["name"]
    with env.operator():
        env.create(run)
        env.wait(lambda: env.condition(name, "Ready").get("status") == "True", what="Ready")
    seen = len(emulator.requests_for())
    emulator.faults.add_latency(2.0, verb="list", path="/jobs$", times=1)
    with env.operator() as reconciler:
        ok = reconciler.metrics["gagar_operator_reconciles_total"].labels(result="ok")
        env.wait(lambda: ok._value.get() >= 1, what="the new operator's first reconcile")
        time.sleep(env.resync * 1.5)  # and a resync
    writes = [
        r["path"]
        for r in emulator.requests_for()[seen:]
        if r["verb"] == "patch" and r["path"].endswith(f"/gagarruns/{name}/status")
    ]
    assert writes == [], writes
    assert env.condition(name, "Ready").get("status") == "True"


def test_delete_garbage_collects_children(env: Env) -> None:
    """No finalizer at all (the resync is no kopf timer): a run deleted while no operator runs,
    as after `helm uninstall`, goes at once, and its children with it."""
    run, other = manifest(), manifest()
    name = run["metadata"]["name"]
    with env.operator() as reconciler:
        env.create(run)
        env.wait(lambda: env.get("batch/v1", "Job", f"{name}-trainer"), what="children")
        time.sleep(env.resync * 1.5)  # a resync has passed
        assert not env.run(name)["metadata"].get("finalizers")
        # a run deleted while the operator runs leaves no condition series behind
        gone = other["metadata"]["name"]
        env.create(other)
        series = reconciler.metrics["gagar_run_condition"]

        def samples() -> list[Any]:
            return [s for m in series.collect() for s in m.samples if s.labels["run"] == gone]

        env.wait(samples, what="condition series of the second run")
        env.kube.delete(RUN_API, "GagarRun", env.namespace, gone)
        env.wait(lambda: samples() == [], what="its series removed")
    env.kube.delete(RUN_API, "GagarRun", env.namespace, name)  # no operator now
    env.wait(lambda: env.run(name) is None, what="run gone")
    # every child but the checkpoints (retention: Retain, the default)
    kept = [("PersistentVolumeClaim", f"{name}-checkpoints")]
    env.wait(lambda: [c[:2] for c in env.children(name)] == kept, what="children collected")


def test_checkpoints_outlive_the_run_and_a_new_run_resumes_from_them(env: Env) -> None:
    """``checkpoint.retention: Retain`` (the default): deleting the run leaves its checkpoint
    PVC; a run re-created with the same name adopts that very claim and its trainer mounts it
    (resuming from the newest checkpoint on it). ``Delete``: the PVC goes with the run."""
    run = manifest()
    name = run["metadata"]["name"]
    pvc = ("v1", "PersistentVolumeClaim", f"{name}-checkpoints")
    job = ("batch/v1", "Job", f"{name}-trainer")
    with env.operator():
        env.create(run)
        first = env.wait(lambda: env.get(*pvc), what="checkpoint PVC")
        assert not first["metadata"].get("ownerReferences")
        env.wait(lambda: env.get(*job), what="trainer")
        env.kube.delete(RUN_API, "GagarRun", env.namespace, name)
        env.wait(lambda: env.get(*job) is None, what="trainer collected with the run")
        time.sleep(0.5)  # the collector has had its chance at the PVC too
        assert env.get(*pvc)["metadata"]["uid"] == first["metadata"]["uid"]
        env.create(run)  # the same name again
        second = env.wait(lambda: env.get(*job), what="new trainer")
        volumes = {v["name"]: v for v in second["spec"]["template"]["spec"]["volumes"]}
        assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == pvc[2]
        env.wait(lambda: env.get(*pvc)["metadata"]["labels"]["gagar.dev/run"] == name)
        assert env.get(*pvc)["metadata"]["uid"] == first["metadata"]["uid"]  # resumed from it
        # switching to Delete (spec.trainer changes while suspended) makes the run its owner;
        # deleting the run then deletes it
        env.patch_spec(name, {"suspend": True})
        env.patch_spec(name, {"trainer": {"checkpoint": {"retention": "Delete"}}})
        env.wait(lambda: env.get(*pvc)["metadata"].get("ownerReferences"), what="owned")
        env.kube.delete(RUN_API, "GagarRun", env.namespace, name)
        env.wait(lambda: env.get(*pvc) is None, what="checkpoints deleted with the run")


def without_cel(node: Any) -> Any:
    """A schema with every ``x-kubernetes-validations`` rule removed (a CRD from before them)."""
    if isinstance(node, dict):
        return {k: without_cel(v) for k, v in node.items() if k != "x-kubernetes-validations"}
    return [without_cel(v) for v in node] if isinstance(node, list) else node


def test_invalid_spec_is_stalled_with_field_path(env: Env) -> None:
    run = manifest()
    # replicas and autoscaling together: the CRD's CEL rule refuses it at the door; a run stored
    # under a CRD without the rule (an older CRD, an API server without CEL) reaches the operator,
    # whose own validation must catch it
    run["spec"]["rollout"]["autoscaling"] = HPA
    name = run["metadata"]["name"]
    if env.simulated:
        env.kube.apply(without_cel(build_crd()))
    with env.operator():
        try:
            env.create(run)
        except KubeError as err:  # a real API server's CEL rejects it at the door
            assert not env.simulated and "replicas" in str(err)
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
    status = emulator.faults.fail_next(1, verb="patch", path="/status$")
    with env.operator():
        env.create(run)
        # children are read from the watch cache: the reads left are of the run itself
        reads = emulator.faults.fail_next(1, verb="get", path=f"/gagarruns/{name}")

        def ready() -> bool:
            with contextlib.suppress(KubeError):  # the test's own read may take the fault
                return env.condition(name, "Ready").get("status") == "True"
            return False

        env.wait(ready, what="Ready despite 500s")
        assert env.status(name)["phase"] == "Running"
    assert (applies.hits, reads.hits, status.hits) == (2, 1, 1)
    assert len([c for c in env.children(name) if c[0] == "Job"]) == 1


def test_a_child_event_s_api_error_is_retried_before_the_resync(env: Env) -> None:
    """kopf retries a run's own handlers after a transient API error, never an event handler of
    a child: a deleted Deployment whose reconcile meets a 500 is recreated at the error's delay
    (the operator's requeue), not at the next resync, which is two minutes away here."""
    emulator = env.need_emulator()
    run = manifest()
    name = run["metadata"]["name"]
    with env.operator() as reconciler:
        reconciler.config.resync_seconds = 120.0
        env.create(run)
        env.wait(lambda: env.condition(name, "Ready").get("status") == "True", what="Ready")
        time.sleep(1.0)  # the last events of start-up pass
        read = emulator.faults.fail_next(1, verb="get", path=f"/gagarruns/{name}$")
        grader = ("apps/v1", "Deployment", f"{name}-grader")
        env.kube.delete(*grader[:2], env.namespace, grader[2])
        env.wait(lambda: read.hits == 1, what="the reconcile's read of the run failed")
        env.wait(lambda: env.get(*grader), timeout=10.0, what="recreated after the error")


def test_steady_state_writes_nothing_and_reads_little_but_drift_is_repaired(env: Env) -> None:
    """Three Ready runs, several resyncs: no write at all (children are applied when their
    desired state changes, never on a timer) and one read per run and resync (children come
    from the watch cache). A child changed by someone else (a Deployment scaled by hand) is
    applied again at once; one deleted is recreated."""
    emulator = env.need_emulator()
    runs = [manifest() for _ in range(3)]
    names = [r["metadata"]["name"] for r in runs]
    with env.operator():
        for run in runs:
            env.create(run)
        for name in names:
            env.wait(lambda n=name: env.condition(n, "Ready").get("status") == "True", what="Ready")
        time.sleep(1.0)  # the last events of start-up pass
        before = len(emulator.requests_for())
        time.sleep(env.resync * 3)
        window = [r for r in emulator.requests_for()[before:] if r["verb"] != "watch"]
        assert [r for r in window if r["verb"] not in ("get", "list")] == [], window
        assert len(window) <= len(names) * 4 + 1, window  # a read per run and resync (+ discovery)
        rollout = ("apps/v1", "Deployment", f"{names[0]}-rollout")
        env.kube.merge_patch(*rollout[:2], env.namespace, rollout[2], {"spec": {"replicas": 5}})
        env.wait(lambda: env.get(*rollout)["spec"]["replicas"] == 2, what="drift repaired")
        env.kube.delete(
            "networking.k8s.io/v1", "NetworkPolicy", env.namespace, f"{names[1]}-trainer"
        )
        env.kube.delete("apps/v1", "Deployment", env.namespace, f"{names[1]}-grader")
        env.wait(lambda: env.get("apps/v1", "Deployment", f"{names[1]}-grader"), what="recreated")
        policy = ("networking.k8s.io/v1", "NetworkPolicy", f"{names[1]}-trainer")
        env.wait(lambda: env.get(*policy), what="with every other child")


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
    run = manifest(**{"rollout.replicas": None, "rollout.autoscaling": HPA})
    name = run["metadata"]["name"]
    hpa = ("autoscaling/v2", "HorizontalPodAutoscaler", f"{name}-rollout")
    with env.operator():
        env.create(run)
        env.wait(lambda: env.get(*hpa), what="HPA")
        env.wait(phase(env, name, "Running"), what="Running")
        env.end_pod(f"{name}-trainer", exit_code=0)
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


def test_a_finished_trainer_gets_its_ttl_and_a_deadline_fails_the_run(env: Env) -> None:
    """``trainer.ttlSecondsAfterFinished`` reaches the trainer Job only once the run has ended
    (a failed attempt awaiting its restart is never collected); an attempt past
    ``activeDeadlineSeconds`` fails the run at once, with no restart."""
    run = manifest(**{"trainer.ttlSecondsAfterFinished": 600,
                      "trainer.activeDeadlineSeconds": 7200})  # fmt: skip
    name, job = run["metadata"]["name"], f"{run['metadata']['name']}-trainer"
    late = manifest(**{"trainer.activeDeadlineSeconds": 60})
    with env.operator():
        env.create(run)
        env.create(late)
        created = env.wait(lambda: env.get("batch/v1", "Job", job), what="trainer")
        assert created["spec"]["activeDeadlineSeconds"] == 7200
        assert "ttlSecondsAfterFinished" not in created["spec"]
        env.wait(phase(env, name, "Running"), what="Running")
        env.end_pod(job, exit_code=0)
        env.wait(phase(env, name, "Succeeded"), what="Succeeded")
        env.wait(
            lambda: env.get("batch/v1", "Job", job)["spec"].get("ttlSecondsAfterFinished") == 600,
            what="TTL set on the finished trainer",
        )
        if env.emulator is None:
            return  # failing a Job on demand needs the emulator in this process
        # the Job controller's verdict on an attempt past its deadline
        other = f"{late['metadata']['name']}-trainer"
        env.wait(lambda: env.get("batch/v1", "Job", other), what="second trainer")
        env.emulator.fail_job(other, env.namespace, "DeadlineExceeded")
        env.wait(phase(env, late["metadata"]["name"], "Failed"), what="Failed")
        stalled = env.condition(late["metadata"]["name"], "Stalled")
        assert (stalled["status"], stalled["reason"]) == ("True", "DeadlineExceeded")
        assert env.status(late["metadata"]["name"]).get("trainerRestarts", 0) == 0


def optional_crd(group: str, kind: str, plural: str, version: str = "v1") -> dict[str, Any]:
    """A schemaless CRD standing in for an optional integration's (Prometheus Operator, ...)."""
    schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


MONITORING_CRDS = (("ServiceMonitor", "servicemonitors"), ("PodMonitor", "podmonitors"))


def test_default_install_ignores_integrations_it_has_no_rbac_for(env: Env) -> None:
    """Prometheus Operator CRDs installed, chart defaults (no integration): the operator neither
    lists nor builds monitors (its RBAC would refuse: 403) and the run becomes Ready; with
    ``integrations.prometheusOperator`` on, the same operator creates them."""
    if env.simulated:
        for kind, plural in MONITORING_CRDS:
            env.kube.create(optional_crd("monitoring.coreos.com", kind, plural))
    run = manifest()
    name = run["metadata"]["name"]
    with env.operator():
        env.create(run)
        env.wait(lambda: env.get("batch/v1", "Job", f"{name}-trainer"), what="trainer Job")
        if env.simulated:
            env.wait(lambda: env.condition(name, "Ready").get("status") == "True", what="Ready")
        assert env.condition(name, "Stalled").get("status") != "True", env.status(name)
        if env.emulator:
            requests = env.emulator.requests_for()
            assert [r for r in requests if r["code"] == 403] == []
            operator = "system:serviceaccount:{}:{}".format(*OPERATOR_SA)
            assert {r["user"] for r in requests} == {operator, "emulator-admin"}
    if not env.simulated:
        return
    with env.operator(integrations=frozenset({"monitoring.coreos.com"})):
        env.wait(
            lambda: env.kube.get(
                "monitoring.coreos.com/v1", "ServiceMonitor", env.namespace, f"{name}-rollout"
            ),
            what="ServiceMonitor with the integration on",
        )
        env.wait(lambda: env.condition(name, "Ready").get("status") == "True", what="Ready")


def test_finished_run_stays_down(env: Env) -> None:
    """A Failed run whose Job is deleted gets no new Job (it would hold accelerators for rollouts
    that never come), and the resync leaves a finished run alone: no applies, no lists."""
    run = manifest(**{"trainer.failurePolicy.maxRestarts": 0})
    name, job = run["metadata"]["name"], f"{run['metadata']['name']}-trainer"
    with env.operator():
        env.create(run)
        env.wait(lambda: env.get("batch/v1", "Job", job), what="trainer Job")
        env.end_pod(job)
        env.wait(phase(env, name, "Failed"), what="Failed")
        env.wait(
            lambda: env.get("apps/v1", "Deployment", f"{name}-rollout")["spec"]["replicas"] == 0,
            what="pools released",
        )
        env.wait(lambda: env.get("v1", "Service", f"{job}-rdzv") is None, what="pruned")
        time.sleep(0.5)  # the rest of that reconcile
        env.kube.delete("batch/v1", "Job", env.namespace, job)
        env.wait(lambda: env.get("batch/v1", "Job", job) is None, what="Job deleted")
        seen = len(env.emulator.requests_for()) if env.emulator else 0
        time.sleep(env.resync * 2.5)  # two resyncs and the deletion's watch event
        assert env.get("batch/v1", "Job", job) is None
        assert env.status(name)["phase"] == "Failed"
        if env.emulator is None:
            return  # the request log is the in-process emulator's
        later = env.emulator.requests_for()[seen:]
        writes = [r for r in later if r["verb"] in ("patch", "create", "delete", "update")]
        lists = [r for r in later if r["verb"] == "list"]
        assert writes == [] and lists == [], (writes, lists)


def test_other_managers_items_survive_the_operator(env: Env) -> None:
    """A sidecar and an env var another field manager applied to a pool's pod template (a mesh,
    a policy engine) stay when the operator re-applies: containers and env are listType=map."""
    run = manifest()
    name, dep = run["metadata"]["name"], f"{run['metadata']['name']}-rollout"
    with env.operator():
        env.create(run)
        env.wait(lambda: env.get("apps/v1", "Deployment", dep), what="rollout pool")
        theirs = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": dep, "namespace": env.namespace},
            "spec": {"template": {"spec": {"containers": [
                {"name": "vllm", "env": [{"name": "MESH", "value": "on"}]},
                {"name": "proxy", "image": "envoy:1"},
            ]}}},
        }  # fmt: skip
        url = f"/apis/apps/v1/namespaces/{env.namespace}/deployments/{dep}"
        env.kube._call("PATCH", url, body=theirs, query=[("fieldManager", "mesh")],
                       content_type="application/apply-patch+yaml")  # fmt: skip
        env.patch_spec(name, {"rollout": {"replicas": 3}})
        env.wait(
            lambda: env.get("apps/v1", "Deployment", dep)["spec"]["replicas"] == 3,
            what="re-applied",
        )
        pod = env.get("apps/v1", "Deployment", dep)["spec"]["template"]["spec"]
        containers = {c["name"]: c for c in pod["containers"]}
        assert set(containers) == {"vllm", "proxy"}
        assert {"name": "MESH", "value": "on"} in containers["vllm"]["env"]
        assert any(e["name"] == "GAGAR_RUN" for e in containers["vllm"]["env"])


def test_kueue_owns_suspend_of_a_queued_trainer(env: Env) -> None:
    """With a queue named, Kueue suspends the trainer Job until it admits it; the operator's
    re-applies never undo that, and ``spec.suspend`` still suspends. Kueue is installed (its
    API group served: without it a queue name is Stalled, QueueUnavailable), the operator's
    integration off: Kueue's own Job webhook holds the labelled Job."""
    if env.simulated:
        env.kube.create(optional_crd("kueue.x-k8s.io", "Workload", "workloads", "v1beta1"))
    run = manifest(**{"trainer.queueName": "team-a"})
    name, job = run["metadata"]["name"], f"{run['metadata']['name']}-trainer"
    with env.operator():
        env.create(run)
        created = env.wait(lambda: env.get("batch/v1", "Job", job), what="trainer Job")
        assert created["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
        # Kueue (another field manager) holds the workload until there is quota
        url = f"/apis/batch/v1/namespaces/{env.namespace}/jobs/{job}"
        env.kube._call("PATCH", url, body={"spec": {"suspend": True}},
                       query=[("fieldManager", "kueue")],
                       content_type="application/merge-patch+json")  # fmt: skip
        env.patch_spec(name, {"rollout": {"replicas": 3}})  # the operator re-applies everything
        env.wait(
            lambda: env.get("apps/v1", "Deployment", f"{name}-rollout")["spec"]["replicas"] == 3,
            what="re-applied",
        )
        time.sleep(env.resync * 1.5)  # and the resync, which applies everything again
        assert env.get("batch/v1", "Job", job)["spec"]["suspend"] is True
        env.patch_spec(name, {"suspend": True})
        env.wait(phase(env, name, "Suspended"), what="Suspended by spec.suspend")
        assert env.get("batch/v1", "Job", job)["spec"]["suspend"] is True


KUEUE_API = "kueue.x-k8s.io/v1beta1"


def test_kueue_alone_suspends_a_queued_trainer_and_spec_suspend_goes_through_it(
    env: Env,
) -> None:
    """With the Kueue integration, the test plays Kueue: it admits the queued trainer
    (unsuspends the Job), preempts it, admits it again, and follows its Workload's
    ``spec.active``, while the user suspends and resumes the run. The operator never writes the
    Job's ``suspend`` after creating it held, never undoes Kueue, and writes the Workload
    exactly once per suspend and once per resume (no loop)."""
    if not env.simulated:
        pytest.skip("installs a stand-in Workload CRD and plays Kueue")
    env.kube.create(optional_crd("kueue.x-k8s.io", "Workload", "workloads", "v1beta1"))
    run = manifest(**{"trainer.queueName": "team-a"})
    name, job = run["metadata"]["name"], f"{run['metadata']['name']}-trainer"
    url = f"/apis/batch/v1/namespaces/{env.namespace}/jobs/{job}"
    seen: list[bool] = []  # the Job's suspend at every look: Kueue's decisions only

    def kueue_sets(value: bool) -> None:
        env.kube._call("PATCH", url, body={"spec": {"suspend": value}},
                       query=[("fieldManager", "kueue")],
                       content_type="application/merge-patch+json")  # fmt: skip

    def holds(value: bool, seconds: float) -> None:
        """The Job's suspend stays ``value`` for ``seconds`` (resyncs included)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            seen.append(env.get("batch/v1", "Job", job)["spec"]["suspend"])
            assert seen[-1] is value, f"suspend undone: {seen[-5:]}"
            time.sleep(0.05)

    def active() -> bool | None:
        return env.get(KUEUE_API, "Workload", f"job-{job}")["spec"].get("active")

    with env.operator(integrations=frozenset({"kueue.x-k8s.io"})):
        env.create(run)
        created = env.wait(lambda: env.get("batch/v1", "Job", job), what="trainer Job")
        assert created["spec"]["suspend"] is True  # held for Kueue, webhook or not
        workload = {
            "apiVersion": KUEUE_API, "kind": "Workload",
            "metadata": {"name": f"job-{job}", "namespace": env.namespace,
                         "labels": {"kueue.x-k8s.io/job-uid": created["metadata"]["uid"]}},
            "spec": {"queueName": "team-a"},
        }  # fmt: skip
        env.kube.create(workload)
        holds(True, 0.5)
        kueue_sets(False)  # admitted
        holds(False, env.resync * 1.5)
        kueue_sets(True)  # preempted
        holds(True, env.resync * 1.5)
        kueue_sets(False)  # admitted again
        holds(False, env.resync * 1.5)
        env.patch_spec(name, {"suspend": True})  # the user: through the Workload
        env.wait(lambda: active() is False, what="Workload deactivated")
        holds(False, 0.5)  # the operator left the Job to Kueue...
        kueue_sets(True)  # ...which evicts the deactivated Workload
        env.wait(phase(env, name, "Suspended"), what="Suspended")
        holds(True, env.resync * 1.5)
        env.patch_spec(name, {"suspend": False})
        env.wait(lambda: active() is True, what="Workload reactivated")
        holds(True, env.resync * 1.5)  # queued again: no start without Kueue's admission
        kueue_sets(False)
        holds(False, env.resync * 1.5)
        if env.emulator is not None:
            patches = env.emulator.requests_for("patch", "/workloads/")
            assert len(patches) == 2, patches  # one deactivation, one reactivation
        owners = [
            f["manager"]
            for f in env.get("batch/v1", "Job", job)["metadata"]["managedFields"]
            if "f:suspend" in (f.get("fieldsV1") or {}).get("f:spec", {})
        ]
        assert owners == ["kueue"], owners  # fmt: skip


def test_trainer_template_changes_wait_for_suspend(env: Env) -> None:
    """What may change during a run (the log level) never touches the immutable Job; a change
    that reaches its template is refused whole (nothing half-applied) until the run is
    suspended, then the trainer is recreated, and resumes from its last checkpoint."""
    run = manifest()
    name, job = run["metadata"]["name"], f"{run['metadata']['name']}-trainer"
    rollout = ("apps/v1", "Deployment", f"{name}-rollout")
    with env.operator():
        env.create(run)
        first = env.wait(lambda: env.get("batch/v1", "Job", job), what="trainer Job")
        env.patch_spec(name, {"observability": {"logLevel": "debug"}})
        env.wait(
            lambda: (
                json.loads(env.get("v1", "ConfigMap", f"{name}-config")["data"]["run.json"])[
                    "spec"
                ]["observability"]["logLevel"]
                == "debug"
            ),
            what="new log level in the ConfigMap",
        )
        assert env.condition(name, "Stalled").get("status") != "True", env.status(name)
        assert env.get("batch/v1", "Job", job)["metadata"]["uid"] == first["metadata"]["uid"]
        # the metrics port is declared in the trainer's pod template: refused while running
        env.patch_spec(name, {"observability": {"metricsPort": 9500}, "rollout": {"replicas": 3}})
        env.wait(
            lambda: "TrainerTemplateChanged" in env.condition(name, "Stalled").get("message", ""),
            what="refused",
        )
        assert env.get(*rollout)["spec"]["replicas"] == 2  # nothing half-applied
        env.patch_spec(name, {"suspend": True})
        second = env.wait(
            lambda: (j := env.get("batch/v1", "Job", job)) and j["metadata"]["uid"] != first[
                "metadata"]["uid"] and j,
            what="trainer recreated while suspended",
        )  # fmt: skip
        assert second["spec"]["suspend"] is True
        ports = second["spec"]["template"]["spec"]["containers"][0]["ports"]
        assert {"name": "metrics", "containerPort": 9500} in ports
        assert env.get(*rollout)["spec"]["replicas"] == 0  # suspended pools
        env.patch_spec(name, {"suspend": False})
        env.wait(lambda: env.get(*rollout)["spec"]["replicas"] == 3, what="rest applied")
        env.wait(
            lambda: env.get("batch/v1", "Job", job)["spec"]["suspend"] is False, what="resumed"
        )
        assert env.condition(name, "Stalled").get("status") != "True"
        assert env.status(name).get("trainerRestarts", 0) == 0  # a recreate is not a restart


def test_switching_a_pool_to_autoscaling_keeps_its_replicas(env: Env) -> None:
    """Fixed replicas -> autoscaling: the operator hands spec.replicas over instead of dropping
    the field (which the server would default to 1: a pool of 5 falling to 1 before the HPA
    acts)."""
    run = manifest(**{"rollout.replicas": 5})
    name, dep = run["metadata"]["name"], f"{run['metadata']['name']}-rollout"
    with env.operator():
        env.create(run)
        env.wait(
            lambda: (d := env.get("apps/v1", "Deployment", dep)) and d["spec"]["replicas"] == 5,
            what="5 replicas",
        )
        env.patch_spec(name, {"rollout": {"replicas": None, "autoscaling": HPA}})
        env.wait(lambda: env.get("autoscaling/v2", "HorizontalPodAutoscaler", dep), what="the HPA")
        time.sleep(env.resync * 1.5)  # and a resync's re-apply
        deployment = env.get("apps/v1", "Deployment", dep)
        assert deployment["spec"]["replicas"] == 5
        owners = {m["manager"] for m in deployment["metadata"]["managedFields"]
                  if "f:replicas" in str(m.get("fieldsV1", {}).get("f:spec", {}))}  # fmt: skip
        assert "gagar-operator" not in owners  # the HPA is the one writer from now on


def test_jobset_crd_installed_mid_run_keeps_the_running_job(env: Env) -> None:
    """The JobSet CRD appearing during a run (with the integration on) never replaces, or prunes,
    a run's running trainer Job; a run that asked for a JobSet was refused until then (no quiet
    fallback to a Job) and now gets its JobSet. A run that asked for one but runs as a Job (an
    older operator fell back to it) keeps that Job for its life too."""
    if not env.simulated:
        pytest.skip("installs a stand-in JobSet CRD")
    plain, wants = manifest(), manifest(**{"trainer.useJobSet": True})
    name, job = plain["metadata"]["name"], f"{plain['metadata']['name']}-trainer"
    other = wants["metadata"]["name"]
    legacy = env.create(manifest(**{"trainer.useJobSet": True}))
    old, parsed = legacy["metadata"]["name"], parse_run(legacy)[0]
    assert parsed is not None
    built = build_all(parsed, BuildContext(uid=legacy["metadata"]["uid"]))  # no JobSet CRD
    (older_job,) = [o for o in built if o["kind"] == "Job"]  # what an older operator fell back to
    old_uid = env.kube.create(older_job)["metadata"]["uid"]
    with env.operator(integrations=frozenset({"jobset.x-k8s.io"})) as reconciler:
        env.create(plain)
        env.create(wants)
        uid = env.wait(lambda: env.get("batch/v1", "Job", job), what="a Job")["metadata"]["uid"]
        stalled = env.reason(other, "Stalled", "JobSetUnavailable", what="useJobSet refused")
        assert "not installed" in stalled["message"]
        env.kube.create(optional_crd("jobset.x-k8s.io", "JobSet", "jobsets", "v1alpha2"))
        reconciler.config.crd_cache_seconds = 0  # see the new API group at once
        env.patch_spec(name, {"rollout": {"replicas": 3}})
        env.wait(
            lambda: env.get("apps/v1", "Deployment", f"{name}-rollout")["spec"]["replicas"] == 3,
            what="re-applied",
        )
        env.wait(
            lambda: env.kube.get(
                "jobset.x-k8s.io/v1alpha2", "JobSet", env.namespace, f"{other}-trainer"
            ),
            what="the JobSet of the run that asked for one (the next resync)",
        )
        env.wait(lambda: env.condition(other, "Stalled").get("status") == "False", what="unstalled")
        time.sleep(env.resync * 1.5)
        assert env.get("batch/v1", "Job", job)["metadata"]["uid"] == uid
        assert env.get("batch/v1", "Job", f"{other}-trainer") is None
        assert env.condition(name, "Stalled").get("status") != "True"
        assert env.get("batch/v1", "Job", f"{old}-trainer")["metadata"]["uid"] == old_uid
        jobset = ("jobset.x-k8s.io/v1alpha2", "JobSet", env.namespace, f"{old}-trainer")
        assert env.kube.get(*jobset) is None
        assert env.condition(old, "Stalled").get("status") == "False", env.status(old)


def test_use_jobset_without_the_integration_is_refused(env: Env) -> None:
    """useJobSet with the operator's JobSet integration off (chart default): Stalled with reason
    JobSetUnavailable naming the chart value, and nothing created (no accelerator held)."""
    run = manifest(**{"trainer.useJobSet": True})
    name = run["metadata"]["name"]
    with env.operator():
        env.create(run)
        stalled = env.reason(name, "Stalled", "JobSetUnavailable", what="refused")
        assert stalled["status"] == "True" and "integrations.jobset" in stalled["message"]
        assert env.status(name)["phase"] == "Stalled"
        time.sleep(env.resync * 1.2)
        assert env.children(name) == []
        assert any(e["reason"] == "JobSetUnavailable" for e in env.wait(lambda: env.events(name)))


def test_keda_integration_creates_scaled_objects_under_chart_rbac(env: Env) -> None:
    """integrations.keda on: the chart's RBAC lets the operator manage the pool's ScaledObject
    (and a run leaves no 403 behind)."""
    if not env.simulated:
        pytest.skip("installs a stand-in KEDA CRD")
    env.kube.create(optional_crd("keda.sh", "ScaledObject", "scaledobjects", "v1alpha1"))
    keda = {**HPA, "backend": "keda"}
    run = manifest(**{"rollout.replicas": None, "rollout.autoscaling": keda})
    name = run["metadata"]["name"]
    with env.operator(integrations=frozenset({"keda.sh"})):
        env.create(run)
        scaled = env.wait(
            lambda: env.kube.get(
                "keda.sh/v1alpha1", "ScaledObject", env.namespace, f"{name}-rollout"
            ),
            what="ScaledObject",
        )
        assert scaled["spec"]["maxReplicaCount"] == 6
        env.wait(lambda: env.condition(name, "Ready").get("status") == "True", what="Ready")
        if env.emulator:
            assert [r for r in env.emulator.requests_for() if r["code"] == 403] == []


def test_an_evicted_rank_takes_the_trainer_down_at_once(env: Env) -> None:
    """One rank of a two-node trainer is evicted: the whole Job fails at once (its peers would
    otherwise block in a collective until the NCCL timeout, the evicted rank recreated alone
    finding a rendezvous that is long over), the other rank is stopped, and after the backoff the
    operator starts the next attempt from the last checkpoint."""
    # a backoff long enough to be seen on a loaded machine, through a kubeconfig, after the Job's
    # failure and rank 0's stop (1 s was missed there: the next attempt had already started)
    policy = {"trainer.failurePolicy.backoffSeconds": 5.0}
    run = manifest(**{"trainer.nodes": 2, **policy})
    name, job = run["metadata"]["name"], f"{run['metadata']['name']}-trainer"
    with env.operator():
        env.create(run)
        first = env.wait(lambda: env.get("batch/v1", "Job", job), what="trainer Job")
        env.wait(lambda: len(env.pods(job)) == 2, what="two ranks running")
        peer = env.pods(job)["0"]["metadata"]["name"]
        env.end_pod(job, index=1, exit_code=137, evicted=True)
        failed = env.wait(
            lambda: next((c for c in (env.get("batch/v1", "Job", job) or {}).get("status", {})
                          .get("conditions", []) if c["type"] == "Failed"), None),
            what="the Job failed", timeout=10,
        )  # fmt: skip
        assert failed["reason"] == "BackoffLimitExceeded"
        env.wait(lambda: env.get("v1", "Pod", peer) is None, what="rank 0 stopped", timeout=10)
        backoff = env.reason(name, "TrainerReady", "RestartBackoff", what="waiting for the backoff")
        assert "restart 1/3" in backoff["message"]
        started = time.monotonic()
        second = env.wait(
            lambda: (j := env.get("batch/v1", "Job", job))
            and j["metadata"]["uid"] != first["metadata"]["uid"] and j,
            what="the next attempt",
        )  # fmt: skip
        assert time.monotonic() - started > 0.3  # it waited (5 s from the failure)
        assert second["metadata"]["annotations"]["gagar.dev/attempt"] == "1"
        env.wait(lambda: len(env.pods(job)) == 2, what="both ranks of attempt 1")
        assert env.status(name)["trainerRestarts"] == 1


def test_a_permanent_exit_fails_the_run_without_restarts(env: Env) -> None:
    """A rank exiting with gagar.env's EXIT_PERMANENT (its configuration is unusable) fails the
    run at once: the pod failure policy fails the Job, no restart is spent."""
    run = manifest(**{"trainer.nodes": 2, **FAST_RESTARTS})
    name, job = run["metadata"]["name"], f"{run['metadata']['name']}-trainer"
    with env.operator():
        env.create(run)
        first = env.wait(lambda: env.get("batch/v1", "Job", job), what="trainer Job")
        env.end_pod(job, index=1, exit_code=EXIT_PERMANENT)
        env.wait(phase(env, name, "Failed"), what="Failed")
        failed = env.condition(name, "Failed")
        assert failed["reason"] == "TrainerFailedPermanently"
        assert f"exit code {EXIT_PERMANENT}" in failed["message"]
        time.sleep(0.5)
        assert env.get("batch/v1", "Job", job)["metadata"]["uid"] == first["metadata"]["uid"]
        assert env.status(name).get("trainerRestarts", 0) == 0


def test_a_checkpoint_refills_the_restart_budget(env: Env) -> None:
    """maxRestarts: 1 limits restarts in a row: a trainer that wrote a newer checkpoint since its
    last restart may fail again and restart; one that fails again before one is Failed."""
    run = manifest(**{"trainer.failurePolicy.maxRestarts": 1, **FAST_RESTARTS})
    name, job = run["metadata"]["name"], f"{run['metadata']['name']}-trainer"
    progress = ("v1", "ConfigMap", env.namespace, f"{name}-progress")

    def attempt(n: int) -> Callable[[], bool]:
        return lambda: (
            (j := env.get("batch/v1", "Job", job)) is not None
            and j["metadata"]["annotations"]["gagar.dev/attempt"] == str(n)
            and len(env.pods(job)) == 1
        )

    def checkpoint(step: int) -> None:
        """The trainer reports step ``step + 2`` and a checkpoint at ``step``."""
        data = {"step": str(step + 2), "checkpointStep": str(step), "checkpointUri": f"c/{step}"}
        env.kube.merge_patch(*progress, {"data": data})

    with env.operator():
        env.create(run)
        env.wait(attempt(0), what="attempt 0")
        checkpoint(10)
        env.wait(lambda: env.status(name).get("step") == 12, what="progress seen")
        env.end_pod(job)
        env.wait(attempt(1), what="attempt 1")
        assert env.status(name)["restartCheckpointStep"] == 10
        checkpoint(20)  # attempt 1 makes progress (20 > 10): its failure is a first one in a row
        env.wait(lambda: env.status(name).get("restartsInARow") == 0, what="budget refilled")
        env.end_pod(job)
        env.wait(attempt(2), what="attempt 2 (budget refilled)")
        assert env.status(name)["trainerRestarts"] == 2
        # attempt 2 fails before any newer checkpoint: the budget is spent
        env.end_pod(job)
        env.wait(phase(env, name, "Failed"), what="Failed")
        assert env.condition(name, "Failed")["reason"] == "RestartBudgetExhausted"


def test_auth_token_secret_changes_only_while_suspended(env: Env) -> None:
    """spec.authTokenSecret reaches the trainer's immutable template (its mount) and the grader
    and sandbox pools: changing it while running would roll the pools onto a token the running
    trainer does not send. The API refuses it (the CRD's transition rule); under a CRD without
    the rule, the operator refuses it whole (Stalled, the grader keeps its Secret); once the run
    is suspended, the change applies and the trainer is recreated with it."""
    run = manifest(**{"authTokenSecret": "token-a"})
    name, job = run["metadata"]["name"], f"{run['metadata']['name']}-trainer"

    def secrets(kind: str, obj: str) -> set[str]:
        api = {"Job": "batch/v1", "Deployment": "apps/v1"}[kind]
        found = env.get(api, kind, obj) or {"spec": {"template": {"spec": {}}}}  # mid-recreate
        pod = found["spec"]["template"]["spec"]
        return {v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}

    tokens = frozenset({"token-a", "token-b", "token-c"})  # Secrets runs may read
    with env.operator(trust=TrustPolicy(secrets=tokens)):
        env.create(run)
        first = env.wait(lambda: env.get("batch/v1", "Job", job), what="trainer Job")
        env.wait(lambda: env.get("apps/v1", "Deployment", f"{name}-grader"), what="grader")
        assert "token-a" in secrets("Job", job) and "token-a" in secrets(
            "Deployment", f"{name}-grader"
        )
        with pytest.raises(KubeError) as refused:
            env.patch_spec(name, {"authTokenSecret": "token-b"})
        assert refused.value.status == 422 and "authTokenSecret" in str(refused.value)
        if env.simulated:  # a CRD without the rule: the operator's own check
            env.kube.apply(without_cel(build_crd()))
            env.patch_spec(name, {"authTokenSecret": "token-b"})
            env.wait(
                lambda: (
                    "TrainerTemplateChanged" in env.condition(name, "Stalled").get("message", "")
                ),
                what="refused by the operator",
            )
            time.sleep(0.5)
            assert "token-a" in secrets("Deployment", f"{name}-grader")  # nothing half-applied
            assert env.get("batch/v1", "Job", job)["metadata"]["uid"] == first["metadata"]["uid"]
            env.kube.apply(build_crd())
        env.patch_spec(name, {"suspend": True})
        env.patch_spec(name, {"authTokenSecret": "token-c"})
        second = env.wait(
            lambda: (j := env.get("batch/v1", "Job", job))
            and j["metadata"]["uid"] != first["metadata"]["uid"] and j,
            what="trainer recreated while suspended",
        )  # fmt: skip
        env.wait(lambda: "token-c" in secrets("Job", job), what="new Secret on the trainer")
        assert "token-c" in secrets("Deployment", f"{name}-grader")
        assert second["spec"]["suspend"] is True


def test_watches_are_filtered_on_the_server(env: Env) -> None:
    """The children's watches ask the API server for the operator's own objects only, and with
    a run selector (the chart's runSelector) the operator sees, and touches, only the runs it
    selects, also when another run's children change."""
    mine = manifest()
    mine["metadata"]["labels"] = {"team": "a"}
    theirs = manifest()
    name, other = mine["metadata"]["name"], theirs["metadata"]["name"]
    with env.operator(run_selector="team=a"):
        env.create(theirs)
        env.create(mine)
        env.wait(lambda: env.get("batch/v1", "Job", f"{name}-trainer"), what="my run's Job")
        # a child of the other run (another operator's) changes: still not this operator's
        env.kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": f"{other}-progress", "namespace": env.namespace,
                                      "labels": {"gagar.dev/run": other, **MANAGED,
                                                 "app.kubernetes.io/component": "progress"}},
                         "data": {"step": "3"}})  # fmt: skip
        time.sleep(env.resync * 1.5)
        assert env.run(other).get("status") is None
        assert env.children(other) == [("ConfigMap", f"{other}-progress", ANY)]
        if env.emulator:
            watches = [r for r in env.emulator.requests_for() if r["query"].get("watch")]
            selectors = {r["path"].rsplit("/", 1)[-1]: r["query"].get("labelSelector")
                         for r in watches}  # fmt: skip
            managed = "app.kubernetes.io/managed-by=gagar-operator"
            assert selectors["jobs"] == selectors["deployments"] == managed
            assert managed in selectors["configmaps"]
            assert selectors["gagarruns"] == "team=a"


def test_sandboxes_that_cannot_isolate_hold_the_trainer_with_the_reason(env: Env) -> None:
    """Sandbox pods of a bubblewrap run land on a stock runc node: the executor exits 3 at start
    ("no isolation works here") and crash-loops. The run says why and what to change
    (PoolsReady: SandboxUnavailable) and suspends its trainer instead of holding its GPUs for
    rollouts that cannot run; switching to the pod mode lets the pods start and the trainer go."""
    emulator = env.need_emulator()  # the test plays the kubelet of the sandbox pods
    run = manifest(**{"sandbox.isolation": "bubblewrap"})
    name = run["metadata"]["name"]
    job, sandbox = f"{name}-trainer", f"{name}-sandbox"
    emulator.hold_deployment(sandbox, ready=0)
    refusal = (
        "gagar sandbox: isolation bubblewrap does not work here: refusing to run untrusted code: "
        "bubblewrap cannot create its namespaces here (bwrap: Creating new namespace failed: "
        "Operation not permitted)"
    )
    with env.operator():
        env.create(run)
        env.wait(lambda: env.get("batch/v1", "Job", job), what="trainer Job")
        pod = _crash_looping_sandbox_pod(env, name, "Traceback-free log line\n" + refusal)
        pools = env.reason(name, "PoolsReady", "SandboxUnavailable", what="the refusal")
        assert refusal in pools["message"]
        assert "set spec.sandbox.isolation to pod or auto" in pools["message"]
        held = env.reason(name, "TrainerReady", "WaitingForSandbox", what="the trainer held")
        assert "suspended" in held["message"]
        assert env.condition(name, "Ready")["status"] == "False"
        env.wait(lambda: env.get("batch/v1", "Job", job)["spec"].get("suspend"), what="suspend")
        env.wait(lambda: env.pods(job) == {}, what="no trainer pod holds GPUs")
        # the fix: the pod mode; its pods start (the crash-looping one goes with the old template)
        env.patch_spec(name, {"sandbox": {"isolation": "pod"}})
        env.wait(
            lambda: "--isolation=pod"
            in env.get("apps/v1", "Deployment", sandbox)["spec"]["template"]["spec"]["containers"][0]["args"],
            what="the pod mode rendered",
        )  # fmt: skip
        env.kube.delete("v1", "Pod", env.namespace, pod)
        emulator.hold_deployment(sandbox, ready=None)
        env.wait(lambda: not env.get("batch/v1", "Job", job)["spec"].get("suspend"), what="resumed")
        env.wait(lambda: len(env.pods(job)) == 1, what="the trainer running")
        env.reason(name, "PoolsReady", "PoolsReady", what="pools ready")


def test_a_task_environments_pool_that_cannot_isolate_says_why(env: Env) -> None:
    """The same refusal from the pool of a task environment's image (its pods are not the default
    pool's: another component label): PoolsReady says SandboxUnavailable with the executor's
    words, not only ``sandbox/db 0/N ready``, and the trainer is held."""
    emulator = env.need_emulator()  # the test plays the kubelet of db's pods
    run = manifest(**{"sandbox.environments": TASK_ENVIRONMENTS, "sandbox.isolation": "bubblewrap"})
    name = run["metadata"]["name"]
    db = f"{name}-sandbox-db"
    emulator.hold_deployment(db, ready=0, namespace=env.namespace)
    refusal = (
        "gagar sandbox: isolation bubblewrap does not work here: refusing to run untrusted code"
    )
    with env.operator():
        env.create(run)
        env.wait(lambda: env.get("apps/v1", "Deployment", db), what="db's pool")
        _crash_looping_sandbox_pod(env, name, refusal, environment="db")
        pools = env.reason(name, "PoolsReady", "SandboxUnavailable", what="the refusal")
        assert refusal in pools["message"]
        env.reason(name, "TrainerReady", "WaitingForSandbox", what="the trainer held")


def _crash_looping_sandbox_pod(env: Env, run_name: str, log: str, environment: str = "") -> str:
    """A sandbox pod whose executor exited 3 and waits in CrashLoopBackOff (as the kubelet
    reports it; ``FallbackToLogsOnError`` made the log's tail its termination message); of the
    pool of task ``environment`` when one is named."""
    labels = {"gagar.dev/run": run_name, "app.kubernetes.io/component": "sandbox"}
    if environment:
        labels |= {
            "app.kubernetes.io/component": "sandbox-env",
            "gagar.dev/environment": environment,
        }
    meta = {"name": f"{run_name}-sandbox-x1", "namespace": env.namespace, "labels": labels}
    containers = [{"name": "executor", "image": "gagar-sandbox"}]
    env.kube.create(
        {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": containers}}
    )
    status = {
        "phase": "Running",
        "containerStatuses": [{
            "name": "executor", "image": "", "imageID": "", "ready": False, "restartCount": 4,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 3, "reason": "Error", "message": log}},
        }],
    }  # fmt: skip
    env.kube.merge_patch("v1", "Pod", env.namespace, meta["name"], {"status": status}, "status")
    return meta["name"]


AGENT_SANDBOX_CRDS = ROOT / "tests" / "kube_emulator" / "crds" / "agent-sandbox.yaml"
AGENT_EXT = "extensions.agents.x-k8s.io/v1beta1"


def test_agent_sandbox_without_its_api_is_refused_with_what_to_change(env: Env) -> None:
    """isolation agent-sandbox, integration off (chart default): Stalled, reason
    SandboxUnavailable naming the chart value and the way out, and nothing created (no trainer
    holds accelerators for sessions that cannot start)."""
    run = manifest(**{"sandbox.isolation": "agent-sandbox"})
    name = run["metadata"]["name"]
    with env.operator():
        env.create(run)
        stalled = env.reason(name, "Stalled", "SandboxUnavailable", what="refused")
        assert "integrations.agentSandbox" in stalled["message"], stalled
        assert "isolation to auto" in stalled["message"], stalled
        time.sleep(env.resync * 1.2)
        assert env.children(name) == []


def test_agent_sandbox_renders_its_template_and_warm_pool(env: Env) -> None:
    """With agent-sandbox's CRDs and the integration: a SandboxTemplate of the hardened executor
    pod and a SandboxWarmPool of poolSize instead of the executor Deployment; the trainer gets the
    pool's name and a Role to claim from it; the run waits for the pool (the test plays
    agent-sandbox: it reports the pool's Sandboxes ready)."""
    if not env.simulated:
        pytest.skip("installs agent-sandbox's CRDs and plays its controller")
    for doc in yaml.safe_load_all(AGENT_SANDBOX_CRDS.read_text()):
        env.kube.apply(doc)
    run = manifest(**{"sandbox.isolation": "agent-sandbox"})
    name = run["metadata"]["name"]
    pool = f"{name}-sandbox"
    with env.operator(integrations=frozenset({"extensions.agents.x-k8s.io"})):
        env.create(run)
        tmpl = env.wait(lambda: env.get(AGENT_EXT, "SandboxTemplate", pool), what="template")
        warm = env.wait(lambda: env.get(AGENT_EXT, "SandboxWarmPool", pool), what="warm pool")
        assert warm["spec"] == {"replicas": run["spec"]["sandbox"]["poolSize"],
                                "sandboxTemplateRef": {"name": pool}}  # fmt: skip
        assert tmpl["spec"]["networkPolicyManagement"] == "Unmanaged"
        executor = tmpl["spec"]["podTemplate"]["spec"]["containers"][0]
        assert "--isolation=auto" in executor["args"]
        assert executor["securityContext"]["allowPrivilegeEscalation"] is False
        job = env.wait(lambda: env.get("batch/v1", "Job", f"{name}-trainer"), what="trainer")
        container = job["spec"]["template"]["spec"]["containers"][0]
        assert {"name": "GAGAR_SANDBOX_WARMPOOL", "value": pool} in container["env"]
        role = env.get("rbac.authorization.k8s.io/v1", "Role", f"{name}-trainer")
        assert {"apiGroups": ["extensions.agents.x-k8s.io"], "resources": ["sandboxclaims"],
                "verbs": ["create", "get", "list", "watch", "delete"]} in role["rules"]  # fmt: skip
        assert env.get("apps/v1", "Deployment", pool) is None
        waiting = env.wait(
            lambda: "sandbox 0/" in env.condition(name, "PoolsReady").get("message", ""),
            what="PoolsReady waits for the warm pool",
        )
        assert waiting
        replicas = warm["spec"]["replicas"]
        status = {"status": {"replicas": replicas, "readyReplicas": replicas}}
        env.kube.merge_patch(AGENT_EXT, "SandboxWarmPool", env.namespace, pool, status,
                             subresource="status")  # fmt: skip
        env.wait(
            lambda: (
                "sandbox" not in env.condition(name, "PoolsReady").get("message", "x")
                or env.condition(name, "PoolsReady").get("status") == "True"
            ),
            what="the warm pool counted ready",
        )


def test_agent_sandbox_pods_that_cannot_isolate_hold_the_trainer(env: Env) -> None:
    """A warm pool's Sandbox pods that exit at start (their executor finds no isolation that
    works on the node) hold the run as the executor Deployment's do: PoolsReady says
    SandboxUnavailable with the executor's own words, and the trainer is suspended."""
    if not env.simulated:
        pytest.skip("installs agent-sandbox's CRDs and plays its controller and the kubelet")
    for doc in yaml.safe_load_all(AGENT_SANDBOX_CRDS.read_text()):
        env.kube.apply(doc)
    run = manifest(**{"sandbox.isolation": "agent-sandbox"})
    name = run["metadata"]["name"]
    job = f"{name}-trainer"
    refusal = (
        "gagar sandbox: no isolation works here: refusing to run untrusted code: bubblewrap "
        "cannot create its namespaces here and the pod mode cannot switch uids"
    )
    with env.operator(integrations=frozenset({"extensions.agents.x-k8s.io"})):
        env.create(run)
        env.wait(lambda: env.get(AGENT_EXT, "SandboxWarmPool", f"{name}-sandbox"), what="pool")
        env.wait(lambda: env.get("batch/v1", "Job", job), what="trainer Job")
        _crash_looping_sandbox_pod(env, name, refusal)
        pools = env.reason(name, "PoolsReady", "SandboxUnavailable", what="the refusal")
        assert refusal in pools["message"]
        env.reason(name, "TrainerReady", "WaitingForSandbox", what="the trainer held")
        env.wait(lambda: env.get("batch/v1", "Job", job)["spec"].get("suspend"), what="suspend")


def test_keda_autoscaling_without_keda_stalls_and_suspend_completes(env: Env) -> None:
    """The docs' KEDA patch on a default install (integrations.keda off): the run is Stalled
    with reason AutoscalerUnavailable naming the field and the chart value, never Ready with no
    ScaledObject; ``suspend: true`` then completes (the grader pods go away)."""
    keda = {"minReplicas": 1, "maxReplicas": 3, "backend": "keda"}
    run = manifest()
    name = run["metadata"]["name"]
    with env.operator():
        env.create(run)
        env.wait(lambda: env.get("apps/v1", "Deployment", f"{name}-grader"), what="grader pool")
        env.patch_spec(name, {"grader": {"replicas": None, "autoscaling": keda}})
        stalled = env.reason(name, "Stalled", "AutoscalerUnavailable", what="KEDA refused")
        assert "spec.grader.autoscaling.backend" in stalled["message"]
        assert "integrations.keda" in stalled["message"]
        assert env.condition(name, "Ready").get("status") != "True"
        env.patch_spec(name, {"suspend": True})
        env.stopped(name)
        env.wait(phase(env, name, "Suspended"), what="phase Suspended")


TASK_ENVIRONMENTS = [
    {"name": "web", "image": "registry.example/gagar-sandbox-web:1"},
    {"name": "db", "image": "registry.example/gagar-sandbox-db:1"},
]


def test_task_environments_get_pools_that_pools_ready_waits_for(env: Env) -> None:
    """Two task environments on sandbox pods: a pool of each one's image beside the default
    one, stored by a server that checks them (names, selectors, the CRD's rules), selected by
    their own Services only; the trainer's ConfigMap says where each is; PoolsReady waits for
    the pool not ready and names it; an environment taken out of the spec takes its pool."""
    emulator = env.need_emulator()  # holds one pool's pods not ready
    run = manifest(**{"sandbox.environments": TASK_ENVIRONMENTS})
    name = run["metadata"]["name"]
    web, db = f"{name}-sandbox-web", f"{name}-sandbox-db"
    emulator.hold_deployment(db, ready=0, namespace=env.namespace)
    with env.operator():
        env.create(run)
        deps = {p: env.wait(lambda p=p: env.get("apps/v1", "Deployment", p), what=p)
                for p in (f"{name}-sandbox", web, db)}  # fmt: skip
        images = {
            p: d["spec"]["template"]["spec"]["containers"][0]["image"] for p, d in deps.items()
        }
        assert images[web] == TASK_ENVIRONMENTS[0]["image"]
        assert images[db] == TASK_ENVIRONMENTS[1]["image"]
        default = env.get("v1", "Service", f"{name}-sandbox")["spec"]["selector"]
        for pool in (web, db):
            labels = deps[pool]["spec"]["template"]["metadata"]["labels"]
            assert not all(labels.get(k) == v for k, v in default.items())
            assert env.get("v1", "Service", pool)["spec"]["selector"]["gagar.dev/environment"]
        pools = json.loads(
            env.get("v1", "ConfigMap", f"{name}-config")["data"]["sandbox-pools.json"]
        )
        assert pools == {"web": f"http://{web}:8090", "db": f"http://{db}:8090"}
        waiting = env.wait(
            lambda: (
                "sandbox/db 0/" in env.condition(name, "PoolsReady").get("message", "")
                and env.condition(name, "PoolsReady")
            ),
            what="PoolsReady waits for db's pool",
        )
        assert waiting["status"] == "False" and "sandbox/web" not in waiting["message"]
        assert env.condition(name, "Ready")["status"] == "False"
        emulator.hold_deployment(db, ready=None, namespace=env.namespace)
        ready = env.reason(name, "PoolsReady", "PoolsReady", what="every pool ready")
        assert "sandbox/web, sandbox/db" in ready["message"]
        assert (
            env.status(name)["pools"]["sandbox/db"]["readyReplicas"] == deps[db]["spec"]["replicas"]
        )
        env.patch_spec(name, {"sandbox": {"environments": TASK_ENVIRONMENTS[:1]}})
        for kind in ("Deployment", "Service", "NetworkPolicy", "PodDisruptionBudget"):
            api = {"Deployment": "apps/v1", "Service": "v1", "NetworkPolicy": "networking.k8s.io/v1",
                   "PodDisruptionBudget": "policy/v1"}[kind]  # fmt: skip
            env.wait(lambda a=api, k=kind: env.get(a, k, db) is None, what=f"{kind} of db pruned")
        assert env.get("apps/v1", "Deployment", web) is not None
        env.wait(
            lambda: (
                set(env.status(name).get("pools", {}))
                == {"rollout", "grader", "sandbox", "sandbox/web"}
            ),
            what="db's pool gone from status",
        )


def test_task_images_the_trainer_lists_get_pools_on_demand_up_to_the_cap(env: Env) -> None:
    """The trainer lists the task images it wants in its progress ConfigMap (the object it may
    write): the operator makes a small pool of each of the first ``max_image_pools`` valid
    ones, named by hash (a server that checks names and labels stores them), lists them in the
    run's ConfigMap, says in a Warning Event what it refused and why, and prunes the pool of an
    image the trainer no longer lists."""
    astropy = "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"
    django = "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    third = "swebench/sweb.eval.x86_64.sympy_1776_sympy-20590:latest"
    run = manifest()
    name = run["metadata"]["name"]
    progress = ("v1", "ConfigMap", env.namespace, f"{name}-progress")

    def wanted(*images: str) -> None:
        env.kube.merge_patch(*progress, {"data": {"sandboxImages": json.dumps(images)}})

    def pool_of(ref: str) -> str | None:
        pools = json.loads(
            env.get("v1", "ConfigMap", f"{name}-config")["data"].get("sandbox-pools.json", "{}")
        )
        url = pools.get(f"image:{ref}")
        return url.removeprefix("http://").split(":")[0] if url else None

    with env.operator(trust=TrustPolicy(max_image_pools=2)):
        env.create(run)
        env.wait(lambda: env.get("apps/v1", "Deployment", f"{name}-sandbox"), what="default pool")
        wanted(astropy, "not an image\nkind: Pod", django, third)
        pools = {
            ref: env.wait(lambda r=ref: pool_of(r), what=f"{ref}'s pool")
            for ref in (astropy, django)
        }
        for ref, pool in pools.items():
            assert pool is not None and len(pool) <= 63 and pool.startswith(f"{name}-sandbox-i")
            dep = env.wait(lambda p=pool: env.get("apps/v1", "Deployment", p), what=pool)
            assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == ref
            assert dep["metadata"]["annotations"]["gagar.dev/image"] == ref
            service = env.wait(lambda p=pool: env.get("v1", "Service", p), what=f"{pool} Service")
            assert service["spec"]["clusterIP"] == "None"
        assert pool_of(third) is None
        keys = env.wait(
            lambda: (
                [p for p in env.status(name).get("pools", {}) if p.startswith("sandbox/image-")]
                if len(env.status(name).get("pools", {})) == 5
                else None
            ),
            what="the image pools in status.pools",
        )
        assert len(keys) == 2
        refused = env.wait(
            lambda: [e for e in env.events(name) if e["reason"] == "TaskImagesRefused"],
            what="the refusal's Event",
        )
        assert refused[0]["type"] == "Warning"
        assert "sandboxImages[1] is not an image reference" in refused[0]["message"]
        assert "at most 2 pools a run" in refused[0]["message"]
        wanted(django)
        gone = pools[astropy]
        for api, kind in (("apps/v1", "Deployment"), ("v1", "Service"),
                          ("networking.k8s.io/v1", "NetworkPolicy"), ("policy/v1", "PodDisruptionBudget")):  # fmt: skip
            env.wait(lambda a=api, k=kind: env.get(a, k, gone) is None, what=f"{kind} pruned")
        assert env.get("apps/v1", "Deployment", pools[django]) is not None
        env.wait(lambda: pool_of(astropy) is None, what="astropy's pool out of the config")
        env.wait(lambda: len(env.status(name).get("pools", {})) == 4, what="its status entry gone")


def test_a_long_environment_name_gets_a_pool_named_within_a_dns_label(env: Env) -> None:
    """An environment name of 60 characters: ``<run>-sandbox-<name>`` is past the 63 of a
    Service's name, which the server refuses; the pool is named by a cut and a hash instead,
    and the run's ConfigMap points at it."""
    long = "scientific-python-stack-with-compiled-extensions-and-fixtures"[:60]
    run = manifest(**{"sandbox.environments": [{"name": long, "image": "registry.example/s:1"}]})
    name = run["metadata"]["name"]
    with env.operator():
        env.create(run)
        config = env.wait(lambda: env.get("v1", "ConfigMap", f"{name}-config"), what="config")
        url = json.loads(config["data"]["sandbox-pools.json"])[long]
        pool = url.removeprefix("http://").split(":")[0]
        assert len(pool) <= 63 and pool.startswith(f"{name}-sandbox-scientific")
        for api, kind in (("apps/v1", "Deployment"), ("v1", "Service")):
            env.wait(lambda a=api, k=kind: env.get(a, k, pool), what=f"{kind} {pool}")
        if env.simulated:
            ready = env.reason(name, "PoolsReady", "PoolsReady", what="every pool ready")
            assert f"sandbox/{long}" in ready["message"]
