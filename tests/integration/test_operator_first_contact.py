"""First contact with a default cluster, against the emulator with the real kopf runtime (the
harness of tests/integration/test_operator_scenarios.py; with ``GAGAR_TEST_KUBECONFIG`` against
that cluster).

- A namespace whose ResourceQuota tracks cpu and memory admits a pod only when every container,
  init containers and sidecars included, requests them: the user's init container and sidecar
  get default requests, so the trainer pod is created (it once never was: the Job controller's
  ``FailedCreate`` said ``must specify requests.cpu,requests.memory``).
- A checkpoint claim the StorageClass cannot provision (ReadWriteMany on a default EBS or
  Persistent Disk class) stays Pending: the run's ``TrainerReady`` (and ``Ready``) condition names
  the claim and its ``ProvisioningFailed`` event, where the status once said only that the pods
  wait (``Unschedulable``).
- A spec edit re-applies every child by force; on a queued trainer that Kueue admitted (its
  flavor's node selector and tolerations written into the Job's pod template), the operator
  leaves the scheduling fields Kueue owns to Kueue: the admitted Job keeps its tolerations and the
  run does not stall on a refused apply (the template of a started Job is immutable).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_operator_scenarios import (
    KUEUE_API,
    REAL,
    Env,
    make_env,
    manifest,
    optional_crd,
)


@pytest.fixture(params=["real"] if REAL else ["emulator"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    yield from make_env(request.param, tmp_path)


SIDECARS = {
    "initContainers": [
        {"name": "fetch", "image": "busybox", "command": ["true"]},
        {"name": "log-shipper", "image": "busybox", "restartPolicy": "Always"},
    ]
}


def _quota(env: Env, on: str = "requests") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": f"compute-{uuid.uuid4().hex[:6]}", "namespace": env.namespace},
        "spec": {"hard": {f"{on}.cpu": "1k", f"{on}.memory": "64Ti"}},
    }


@pytest.mark.parametrize("on", ["requests", "limits"])
def test_a_quota_on_requests_admits_the_trainer_pod_with_sidecars(env: Env, on: str) -> None:
    """``limits``: a quota on ``limits.cpu``/``limits.memory`` (issue 46) needs a limit on every
    container, the user's init container and sidecar too: the operator lists the namespace's
    quotas and gives each container without a limit its request as its limit."""
    quota = env.kube.create(_quota(env, on))["metadata"]["name"]
    try:
        run = manifest(**{"trainer.podTemplate": SIDECARS})
        name = run["metadata"]["name"]
        job = f"{name}-trainer"
        with env.operator():
            env.create(run)
            selector = f"batch.kubernetes.io/job-name={job}"
            try:
                pods = env.wait(lambda: env.kube.list("v1", "Pod", env.namespace, selector))
            except AssertionError:
                refused = [e["message"] for e in env.events(job) if e["reason"] == "FailedCreate"]
                raise AssertionError(f"no pod of {job}: {refused}") from None
        for c in pods[0]["spec"]["initContainers"] + pods[0]["spec"]["containers"]:
            assert {"cpu", "memory"} <= set(c["resources"][on]), c["name"]
    finally:
        env.kube.delete("v1", "ResourceQuota", env.namespace, quota)


# what the EBS CSI provisioner answers a ReadWriteMany claim
NO_RWX = (
    'failed to provision volume with StorageClass "gp2": rpc error: code = InvalidArgument '
    "desc = Volume capabilities MULTI_NODE_MULTI_WRITER not supported. Only AccessModes"
    "[ReadWriteOnce] supported."
)


def _provisioning_fails(env: Env, claim: dict[str, Any]) -> None:
    """The external provisioner's part on a class without ReadWriteMany: a Warning event on the
    claim, which stays Pending. A real cluster answers for itself: the test waits for either."""
    meta = claim["metadata"]
    if not env.simulated:

        def settled() -> str | None:
            phase = ((env.get("v1", "PersistentVolumeClaim", meta["name"]) or {})
                     .get("status") or {}).get("phase")  # fmt: skip
            warned = any(e.get("type") == "Warning" for e in env.events(meta["name"]))
            return "Bound" if phase == "Bound" else ("warned" if warned else None)

        if env.wait(settled, what="the claim bound or refused") == "Bound":
            pytest.skip("this cluster's StorageClass provisioned the claim")
        return
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    env.kube.create({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:12]}", "namespace": env.namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                           "name": meta["name"], "namespace": env.namespace, "uid": meta["uid"]},
        "reason": "ProvisioningFailed", "message": NO_RWX, "type": "Warning",
        "source": {"component": "ebs.csi.aws.com_ebs-csi-controller"},
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    })  # fmt: skip
    status = {"status": {"phase": "Pending"}}
    env.kube.merge_patch(
        "v1", "PersistentVolumeClaim", env.namespace, meta["name"], status, "status"
    )


def test_a_claim_that_cannot_be_provisioned_is_named_in_the_status(env: Env) -> None:
    # a class without ReadWriteMany asked for it (Auto asks ReadWriteOnce of a one-node trainer)
    run = manifest(**{"trainer.checkpoint.accessMode": "ReadWriteMany"})
    name = run["metadata"]["name"]
    if env.emulator is not None:
        env.emulator.controllers.jobs = False  # the trainer's pods wait for their volume
    with env.operator():
        env.create(run)
        claim = env.wait(lambda: env.get("v1", "PersistentVolumeClaim", f"{name}-checkpoints"),
                         what="the checkpoint claim")  # fmt: skip
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
        _provisioning_fails(env, claim)
        cond = env.reason(
            name, "TrainerReady", "CheckpointClaimPending", what="the pending claim in the status"
        )
        assert cond["message"].startswith(
            f"PersistentVolumeClaim {name}-checkpoints is Pending: ProvisioningFailed: "
        )
        assert "accessMode: ReadWriteOnce" in cond["message"]
        ready = env.condition(name, "Ready")
        assert ready["reason"] == "CheckpointClaimPending" and ready["status"] == "False"


def test_a_forced_re_apply_leaves_kueues_scheduling_fields_on_an_admitted_trainer(
    env: Env,
) -> None:
    if not env.simulated:
        pytest.skip("installs a stand-in Workload CRD and plays Kueue")
    env.kube.create(optional_crd("kueue.x-k8s.io", "Workload", "workloads", "v1beta1"))
    own = {"key": "team", "operator": "Exists", "effect": "NoSchedule"}
    run = manifest(**{"trainer.queueName": "team-a", "trainer.podTemplate.tolerations": [own]})
    name, job = run["metadata"]["name"], f"{run['metadata']['name']}-trainer"
    with env.operator(integrations=frozenset({"kueue.x-k8s.io"})):
        env.create(run)
        created = env.wait(lambda: env.get("batch/v1", "Job", job), what="trainer Job")
        env.kube.create({
            "apiVersion": KUEUE_API, "kind": "Workload",
            "metadata": {"name": f"job-{job}", "namespace": env.namespace,
                         "labels": {"kueue.x-k8s.io/job-uid": created["metadata"]["uid"]}},
            "spec": {"queueName": "team-a"},
        })  # fmt: skip
        # Kueue admits: one update unsuspends the Job and writes the flavor's node selector and
        # tolerations (the whole list: it is atomic) into its pod template
        flavor = {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
        gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        admission = {"spec": {"suspend": False, "template": {"spec": {
            "nodeSelector": flavor, "tolerations": [own, gpu]}}}}  # fmt: skip
        url = f"/apis/batch/v1/namespaces/{env.namespace}/jobs/{job}"
        env.kube._call("PATCH", url, body=admission, query=[("fieldManager", "kueue")],
                       content_type="application/merge-patch+json")  # fmt: skip
        env.wait(lambda: env.status(name).get("phase") == "Running", what="Running")
        env.patch_spec(name, {"rollout": {"replicas": 3}})  # every child is applied by force
        env.wait(
            lambda: env.get("apps/v1", "Deployment", f"{name}-rollout")["spec"]["replicas"] == 3,
            what="re-applied",
        )
        time.sleep(env.resync * 1.5)  # and a resync
        pod = env.get("batch/v1", "Job", job)["spec"]["template"]["spec"]
        assert pod["tolerations"] == [own, gpu] and pod["nodeSelector"] == flavor
        stalled = env.condition(name, "Stalled")
        assert stalled.get("status") == "False", stalled
