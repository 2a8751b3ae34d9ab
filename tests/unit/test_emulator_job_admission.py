"""The emulator's Job template rule is the real server's (``pkg/apis/batch/validation``,
``validatePodTemplateUpdate`` with ``AllowMutableSchedulingDirectives``): a Job's pod template is
immutable, except that while the Job is suspended and has never started (no
``status.startTime``) its scheduling directives may change, which is how Kueue admits a Job to a
flavor (node selector, tolerations, node affinity, scheduling gates, template labels and
annotations), in the same write that unsuspends it."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.kube_emulator import KubeEmulator
from tests.kube_emulator.rbac import ADMIN_HEADERS

JOBS = "/apis/batch/v1/namespaces/default/jobs"


@pytest.fixture
def http():
    with (
        KubeEmulator() as kube,
        httpx.Client(base_url=kube.url, timeout=10, headers=ADMIN_HEADERS) as client,
    ):
        yield client


def job(name: str, suspend: bool) -> dict:
    pod = {"containers": [{"name": "c", "image": "i"}], "restartPolicy": "Never"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"suspend": suspend, "template": {"spec": pod}},
    }


def patch(http: httpx.Client, name: str, spec: dict) -> httpx.Response:
    headers = {"Content-Type": "application/merge-patch+json"}
    return http.patch(f"{JOBS}/{name}", json={"spec": spec}, headers=headers)


ADMISSION = {
    "suspend": False,
    "template": {
        "metadata": {"labels": {"kueue.x-k8s.io/podset": "main"}},
        "spec": {
            "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        },
    },
}


def test_kueue_admits_a_suspended_job_that_never_started(http: httpx.Client) -> None:
    assert http.post(JOBS, json=job("queued", suspend=True)).status_code == 201
    admitted = patch(http, "queued", ADMISSION)
    assert admitted.status_code == 200, admitted.text
    pod = admitted.json()["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]


def test_the_rest_of_a_suspended_job_s_template_stays_immutable(http: httpx.Client) -> None:
    http.post(JOBS, json=job("queued", suspend=True))
    containers = [{"name": "c", "image": "other"}]
    refused = patch(http, "queued", {"template": {"spec": {"containers": containers}}})
    assert refused.status_code == 422 and "spec.template" in refused.json()["message"]


def test_scheduling_directives_are_immutable_once_the_job_runs_or_ran(
    http: httpx.Client,
) -> None:
    http.post(JOBS, json=job("running", suspend=False))
    refused = patch(http, "running", {"template": ADMISSION["template"]})
    assert refused.status_code == 422, refused.text
    # suspended again after it started (status.startTime set): still immutable
    deadline = time.monotonic() + 10
    while not (http.get(f"{JOBS}/running").json().get("status") or {}).get("startTime"):
        assert time.monotonic() < deadline, "the Job controller never started the Job"
        time.sleep(0.02)
    assert patch(http, "running", {"suspend": True}).status_code == 200
    refused = patch(http, "running", {"template": ADMISSION["template"]})
    assert refused.status_code == 422, refused.text
