"""The operator enforces what creating a GagarRun entitles (docs/security.md), with the real
kopf runtime against the emulator (or ``GAGAR_TEST_KUBECONFIG``'s cluster), as in
``test_operator_scenarios``: a privileged init container, a root trainer and a Secret the
operator's configuration does not allow are each a Stalled condition naming the field, with
nothing created; a Secret carrying the configured label is allowed; a namespace whose Pod
Security admission enforces ``restricted`` refuses the run whose sandbox executor needs
``baseline``, naming ``spec.sandbox.isolation``, before any pod is refused."""

from __future__ import annotations

import time

from gagar.operator.builders.trust import TrustPolicy
from tests.integration.test_operator_scenarios import Env, env, manifest

__all__ = ["env"]  # the fixture, shared with test_operator_scenarios

PRIVILEGED = {"initContainers": [{"name": "pwn", "image": "busybox", "securityContext": {
    "privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}}}]}  # fmt: skip
SECRET_ENV = {"env": [{"name": "PW", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}}]}


def _stalled(env: Env, name: str, field: str) -> None:
    stalled = env.reason(name, "Stalled", "InvalidSpec", what=f"refused: {field}")
    assert stalled["status"] == "True" and field in stalled["message"], stalled
    time.sleep(env.resync * 1.2)
    assert env.children(name) == []


def test_privileged_root_and_secret_paths_stall_the_run(env: Env) -> None:
    runs = {
        "spec.trainer.podTemplate.initContainers[0].securityContext.privileged":
            manifest(**{"trainer.podTemplate": PRIVILEGED}),
        "spec.trainer.podTemplate.securityContext.runAsUser":
            manifest(**{"trainer.podTemplate": {"securityContext": {"runAsUser": 0}}}),
        "spec.rollout.podTemplate.env[0].valueFrom.secretKeyRef.name":
            manifest(**{"rollout.podTemplate": SECRET_ENV}),
    }  # fmt: skip
    with env.operator():
        for run in runs.values():
            env.create(run)
        for field, run in runs.items():
            _stalled(env, run["metadata"]["name"], field)


def test_a_secret_with_the_configured_label_may_be_read(env: Env) -> None:
    label = "gagar.dev/allow-runs=true"
    allowed = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
               "metadata": {"name": f"db-{time.monotonic_ns() % 10**6}", "namespace": env.namespace,
                            "labels": {"gagar.dev/allow-runs": "true"}},
               "stringData": {"pw": "x"}}  # fmt: skip
    secret = allowed["metadata"]["name"]
    env.kube.create(allowed)
    try:
        ref = {
            "env": [{"name": "PW", "valueFrom": {"secretKeyRef": {"name": secret, "key": "pw"}}}]
        }
        ok, other = (
            manifest(**{"rollout.podTemplate": ref}),
            manifest(**{"rollout.podTemplate": SECRET_ENV}),
        )
        with env.operator(trust=TrustPolicy(secret_label=label)):
            env.create(ok)
            env.create(other)
            name = ok["metadata"]["name"]
            env.wait(lambda: env.get("apps/v1", "Deployment", f"{name}-rollout"), what="allowed")
            _stalled(env, other["metadata"]["name"], "secretKeyRef.name")
    finally:
        env.kube.delete("v1", "Secret", env.namespace, secret)


def test_a_restricted_namespace_stalls_a_run_whose_sandbox_needs_baseline(env: Env) -> None:
    enforce = "pod-security.kubernetes.io/enforce"
    before = (env.kube.get("v1", "Namespace", None, env.namespace) or {}).get("metadata", {})
    old = (before.get("labels") or {}).get(enforce)
    patch = {"metadata": {"labels": {enforce: "restricted"}}}
    env.kube.merge_patch("v1", "Namespace", None, env.namespace, patch)
    try:
        run = manifest()
        with env.operator():
            env.create(run)
            _stalled(env, run["metadata"]["name"], "spec.sandbox.isolation")
    finally:
        undo = {"metadata": {"labels": {enforce: old}}}
        env.kube.merge_patch("v1", "Namespace", None, env.namespace, undo)


def test_suspend_stops_a_running_run_whose_new_spec_is_refused(env: Env) -> None:
    """A running run patched with what the trust model refuses is Stalled and its children keep
    the last applied spec (nothing of the refused one reaches a pod); ``suspend: true`` still
    stops them: the trainer suspended, the pools at zero, without the refused overlay."""
    run = manifest()
    name = run["metadata"]["name"]
    with env.operator():
        env.create(run)
        env.wait(lambda: env.get("batch/v1", "Job", f"{name}-trainer"), what="trainer Job")
        env.wait(lambda: env.get("apps/v1", "Deployment", f"{name}-rollout"), what="rollout")
        env.patch_spec(name, {"rollout": {"podTemplate": SECRET_ENV}})
        field = "spec.rollout.podTemplate.env[0].valueFrom.secretKeyRef.name"
        stalled = env.reason(name, "Stalled", "InvalidSpec", what="refused")
        assert field in stalled["message"] and "suspended" not in stalled["message"]
        env.patch_spec(name, {"suspend": True})
        env.stopped(name)
        stalled = env.wait(
            lambda: (
                "pods of the last applied spec" in env.condition(name, "Stalled")["message"]
                and env.condition(name, "Stalled")
            ),
            what="the Stalled message says the pods are stopped",
        )
        assert field in stalled["message"]
        pod = env.get("apps/v1", "Deployment", f"{name}-rollout")["spec"]["template"]["spec"]
        assert "PW" not in str(pod["containers"])  # the refused overlay never applied
