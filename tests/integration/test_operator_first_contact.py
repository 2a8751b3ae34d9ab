"""First contact with a default cluster, against the emulator with the real kopf runtime (the
harness of tests/integration/test_operator_scenarios.py; with ``GAGAR_TEST_KUBECONFIG`` against
that cluster).

- A namespace whose ResourceQuota tracks cpu and memory admits a pod only when every container,
  init containers and sidecars included, requests them: the user's init container and sidecar
  get default requests, so the trainer pod is created (it once never was: the Job controller's
  ``FailedCreate`` said ``must specify requests.cpu,requests.memory``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_operator_scenarios import REAL, Env, make_env, manifest


@pytest.fixture(params=["real"] if REAL else ["emulator"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    yield from make_env(request.param, tmp_path)


SIDECARS = {
    "initContainers": [
        {"name": "fetch", "image": "busybox", "command": ["true"]},
        {"name": "log-shipper", "image": "busybox", "restartPolicy": "Always"},
    ]
}


def _quota(env: Env) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": f"compute-{uuid.uuid4().hex[:6]}", "namespace": env.namespace},
        "spec": {"hard": {"requests.cpu": "1k", "requests.memory": "64Ti"}},
    }


def test_a_quota_on_requests_admits_the_trainer_pod_with_sidecars(env: Env) -> None:
    quota = env.kube.create(_quota(env))["metadata"]["name"]
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
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]), c["name"]
    finally:
        env.kube.delete("v1", "ResourceQuota", env.namespace, quota)
