"""The emulator refuses what a default kube-apiserver refuses: discovery without credentials,
and an exact-version list at a version its history no longer holds."""

from __future__ import annotations

import httpx
import pytest

from tests.kube_emulator import KubeEmulator
from tests.kube_emulator.rbac import ADMIN_HEADERS

CM = "/api/v1/namespaces/default/configmaps"
MERGE = {"Content-Type": "application/merge-patch+json"}


@pytest.fixture
def kube():
    with KubeEmulator(history_limit=50) as emulator:
        yield emulator


@pytest.fixture
def http(kube):
    with httpx.Client(base_url=kube.url, timeout=10, headers=ADMIN_HEADERS) as client:
        yield client


def cm(name: str, **data: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


@pytest.mark.parametrize("path", ["/api", "/api/v1", "/apis", "/apis/apps", "/apis/apps/v1"])
def test_anonymous_discovery_is_forbidden(kube, path):
    """``system:discovery`` is bound to ``system:authenticated`` only: without credentials a
    default server answers 403 (401 where anonymous auth is off), never the API's shape."""
    anonymous = httpx.get(kube.url + path)
    assert anonymous.status_code == 403
    assert (
        anonymous.json()["message"]
        == f'forbidden: User "system:anonymous" cannot get path "{path}"'
    )
    assert httpx.get(kube.url + path, headers=ADMIN_HEADERS).status_code == 200


def test_anonymous_requests_get_the_public_info_only(kube):
    for path in ("/version", "/healthz", "/livez", "/readyz"):  # system:public-info-viewer
        assert httpx.get(kube.url + path).status_code == 200
    assert httpx.get(kube.url + CM).status_code == 403
    assert httpx.get(kube.url + "/api", headers={"Authorization": "Bearer x"}).status_code == 401


def test_exact_list_reads_the_version_asked_for(http):
    rv = http.post(CM, json=cm("a", k="0")).json()["metadata"]["resourceVersion"]
    http.patch(f"{CM}/a", json={"data": {"k": "1"}}, headers=MERGE)
    http.post(CM, json=cm("b"))
    then = http.get(CM, params={"resourceVersion": rv, "resourceVersionMatch": "Exact"})
    assert then.status_code == 200
    assert then.json()["metadata"]["resourceVersion"] == rv
    assert [(o["metadata"]["name"], o["data"]) for o in then.json()["items"]] == [("a", {"k": "0"})]
    http.delete(f"{CM}/b")
    now = http.get(CM).json()
    assert [o["metadata"]["name"] for o in now["items"]] == ["a"]


def test_exact_list_at_a_compacted_version_is_410_gone(kube, http):
    rv = http.post(CM, json=cm("a")).json()["metadata"]["resourceVersion"]
    http.patch(f"{CM}/a", json={"data": {"k": "1"}}, headers=MERGE)
    kube.compact_history()
    gone = http.get(CM, params={"resourceVersion": rv, "resourceVersionMatch": "Exact"})
    assert gone.status_code == 410
    assert gone.json()["reason"] == "Expired"
    assert gone.json()["message"].startswith(f"too old resource version: {rv} (")
    # not-older-than at the same version is served from the current state, as the cache does
    newer = http.get(CM, params={"resourceVersion": rv, "resourceVersionMatch": "NotOlderThan"})
    assert newer.status_code == 200


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"resourceVersionMatch": "Exact"}, 400),  # a match needs a version
        ({"resourceVersion": "0", "resourceVersionMatch": "Exact"}, 400),
        ({"resourceVersion": "999999", "resourceVersionMatch": "Exact"}, 504),  # not yet written
    ],
)
def test_exact_list_refusals(http, params, code):
    assert http.get(CM, params=params).status_code == code
