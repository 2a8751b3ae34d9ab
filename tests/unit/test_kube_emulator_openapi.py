"""The emulator for clients as they are: OpenAPI v3 (what kubectl's default validation and
``explain`` read), server-side field validation, content negotiation down to JSON, protobuf
bodies of the kinds typed clients send, and ``pods/log``."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import httpx
import pytest

from gagar.crd import build_crd
from tests.kube_emulator import KubeEmulator, protobuf
from tests.kube_emulator.rbac import ADMIN_HEADERS

NS = "/api/v1/namespaces"
RUNS = "/apis/gagar.dev/v1alpha1/namespaces/default/gagarruns"
PROTOBUF = "application/vnd.kubernetes.protobuf"
# `kubectl create namespace demo`'s body, as kubectl 1.32 sends it (`-v=8`)
NAMESPACE_DEMO = bytes.fromhex(
    "6b3873000a0f0a02763112094e616d657370616365121c0a140a0464656d6f1200"
    "1a0022002a003200380042001200"
    "1a020a001a002200"
)


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeEmulator]:
    with KubeEmulator() as emulator:
        emulator.create(build_crd())
        yield emulator


@pytest.fixture
def http(kube: KubeEmulator) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=kube.url, timeout=30, headers=ADMIN_HEADERS) as client:
        yield client


def run(name: str, **spec: object) -> dict:
    return {"apiVersion": "gagar.dev/v1alpha1", "kind": "GagarRun",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


def test_openapi_v3_lists_each_group_version_by_a_hashed_url(http: httpx.Client) -> None:
    paths = http.get("/openapi/v3").json()["paths"]
    assert {"api/v1", "apis/apps/v1", "apis/gagar.dev/v1alpha1"} <= set(paths)
    url = paths["apis/gagar.dev/v1alpha1"]["serverRelativeURL"]
    assert url.startswith("/openapi/v3/apis/gagar.dev/v1alpha1?hash=")
    assert http.get("/openapi/v3").json()["paths"] == paths  # stable while nothing changes
    assert http.get("/openapi/v3/apis/nope/v1").status_code == 404
    anonymous = httpx.get(f"{http.base_url}/openapi/v3", timeout=10)
    assert anonymous.status_code == 403  # discovery is for authenticated users


def test_a_custom_kinds_document_has_its_schema_and_paths(http: httpx.Client) -> None:
    doc = http.get("/openapi/v3/apis/gagar.dev/v1alpha1").json()
    schemas = doc["components"]["schemas"]
    run_schema = schemas["dev.gagar.v1alpha1.GagarRun"]
    gvk = {"group": "gagar.dev", "version": "v1alpha1", "kind": "GagarRun"}
    assert run_schema["x-kubernetes-group-version-kind"] == [gvk]
    assert "description" in run_schema["properties"]["spec"]["properties"]["trainer"]
    meta = run_schema["properties"]["metadata"]["allOf"][0]["$ref"]
    assert meta.removeprefix("#/components/schemas/") in schemas  # ObjectMeta travels along
    item = "/apis/gagar.dev/v1alpha1/namespaces/{namespace}/gagarruns/{name}"
    patch = doc["paths"][item]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == gvk
    assert "fieldValidation" in [p["name"] for p in patch["parameters"]]
    # kubectl sends a custom kind a JSON merge patch only when its PATCH lists no strategic one
    assert "application/strategic-merge-patch+json" not in patch["requestBody"]["content"]
    assert f"{item}/scale" in doc["paths"]


def test_a_built_in_groups_document_has_kubernetes_schemas(http: httpx.Client) -> None:
    doc = http.get("/openapi/v3/apis/apps/v1").json()
    deployment = doc["components"]["schemas"]["io.k8s.api.apps.v1.Deployment"]
    assert deployment["properties"]["spec"]["allOf"] == [
        {"$ref": "#/components/schemas/io.k8s.api.apps.v1.DeploymentSpec"}
    ]
    containers = doc["components"]["schemas"]["io.k8s.api.core.v1.PodSpec"]["properties"][
        "containers"
    ]
    assert containers["type"] == "array" and containers["x-kubernetes-patch-merge-key"] == "name"
    patch = doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"]
    assert "application/strategic-merge-patch+json" in patch["requestBody"]["content"]


def test_strict_field_validation_refuses_unknown_fields_as_the_server_words_it(
    http: httpx.Client,
) -> None:
    strict = {"fieldValidation": "Strict"}
    bad = http.post(RUNS, json=run("typo", trainr={"device": "cpu"}), params=strict)
    assert bad.status_code == 400, bad.text
    assert bad.json()["message"] == (
        'GagarRun in version "v1alpha1" cannot be handled as a GagarRun: '
        'strict decoding error: unknown field "spec.trainr"'
    )
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x", "labls": {}}}
    refused = http.post(NS, json=ns, params=strict)
    assert refused.status_code == 400
    assert 'strict decoding error: unknown field "metadata.labls"' in refused.json()["message"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "c", "image": "i", "imagePullPolicyy": "Always"}]}}  # fmt: skip
    refused = http.post("/api/v1/namespaces/default/pods", json=pod, params=strict)
    assert 'unknown field "spec.containers[0].imagePullPolicyy"' in refused.json()["message"]
    merge = {"Content-Type": "application/merge-patch+json"}
    patched = http.patch(f"{NS}/default", json={"spek": {}}, params=strict, headers=merge)
    assert patched.status_code == 400 and 'unknown field "spek"' in patched.json()["message"]


def test_warn_names_unknown_fields_of_built_in_kinds_and_ignore_does_not(
    http: httpx.Client,
) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "w"}, "dataa": {}}
    warned = http.post("/api/v1/namespaces/default/configmaps", json=cm)  # unset: Warn
    assert warned.status_code == 201
    assert warned.headers["Warning"] == r'299 - "unknown field \"dataa\""'
    ignored = http.post("/api/v1/namespaces/default/configmaps", json={**cm, "metadata": {"name": "i"}},
                        params={"fieldValidation": "Ignore"})  # fmt: skip
    assert ignored.status_code == 201 and "Warning" not in ignored.headers


def test_an_accept_listing_protobuf_first_gets_json(http: httpx.Client) -> None:
    typed = {"Accept": f"{PROTOBUF},application/json"}
    got = http.get(f"{NS}/default", headers=typed)
    assert got.status_code == 200 and got.headers["Content-Type"].startswith("application/json")
    assert got.json()["kind"] == "Namespace"
    only = http.get(f"{NS}/default", headers={"Accept": PROTOBUF})
    assert only.status_code == 406
    assert only.json()["message"] == (
        "only the following media types are accepted: application/json, application/yaml"
    )


def test_protobuf_bodies_of_the_kinds_typed_clients_send_are_read(http: httpx.Client) -> None:
    created = http.post(NS, content=NAMESPACE_DEMO, headers={"Content-Type": PROTOBUF})
    assert created.status_code == 201, created.text
    assert created.json()["metadata"]["name"] == "demo"
    assert created.json()["status"] == {"phase": "Active"}
    # a custom kind has no protobuf on a real server either
    body = protobuf.MAGIC + b"\x0a\x00"
    refused = http.post(RUNS, content=body, headers={"Content-Type": PROTOBUF})
    assert refused.status_code == 415
    assert refused.json()["message"] == (
        "the body of the request was in an unknown format - accepted media types include: "
        "application/json, application/yaml"
    )


def test_protobuf_decoding_of_a_secret() -> None:
    def field(number: int, payload: bytes) -> bytes:
        return bytes([number << 3 | 2, len(payload)]) + payload

    meta = field(1, b"s") + field(11, field(1, b"owner") + field(2, b"helm"))
    secret = field(1, meta) + field(2, field(1, b"k") + field(2, b"\x00\xff")) + field(3, b"Opaque")
    envelope = field(1, field(1, b"v1") + field(2, b"Secret")) + field(2, secret)
    assert protobuf.decode(protobuf.MAGIC + envelope) == {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s", "labels": {"owner": "helm"}},
        "data": {"k": base64.b64encode(b"\x00\xff").decode()},
        "type": "Opaque",
    }
    with pytest.raises(protobuf.ProtobufError, match="no protobuf for apps/v1, Kind=Deployment"):
        protobuf.decode(protobuf.MAGIC + field(1, field(1, b"apps/v1") + field(2, b"Deployment")))


def test_pod_logs_say_that_no_process_runs(http: httpx.Client) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "lg"},
           "spec": {"containers": [{"name": "main", "image": "busybox", "command": ["sleep", "1"]}]}}  # fmt: skip
    assert http.post("/api/v1/namespaces/default/pods", json=pod).status_code == 201
    logs = http.get("/api/v1/namespaces/default/pods/lg/log")
    assert logs.status_code == 200 and logs.headers["Content-Type"].startswith("text/plain")
    assert "container main" in logs.text and "no process runs here" in logs.text
    assert "command: sleep 1" in logs.text
    wrong = http.get("/api/v1/namespaces/default/pods/lg/log", params={"container": "nope"})
    assert wrong.status_code == 400 and wrong.json()["message"] == (
        "container nope is not valid for pod lg"
    )


def test_kubectl_get_shows_the_servers_columns_of_common_kinds(http: httpx.Client) -> None:
    table = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}
    pods = http.get("/api/v1/namespaces/default/pods", headers=table).json()
    names = [c["name"] for c in pods["columnDefinitions"]]
    assert names == ["Name", "Ready", "Status", "Restarts", "Age"]
    namespaces = http.get(NS, headers=table).json()
    assert ["default", "Active"] == namespaces["rows"][0]["cells"][:2]


def test_kubectl_get_all_finds_the_all_category_and_the_crds_own(http: httpx.Client) -> None:
    """``kubectl get all`` and ``kubectl get gagar`` resolve categories from discovery."""
    core = {r["name"]: r for r in http.get("/api/v1").json()["resources"]}
    assert core["pods"]["categories"] == ["all"] and "categories" not in core["configmaps"]
    runs = {r["name"]: r for r in http.get("/apis/gagar.dev/v1alpha1").json()["resources"]}
    assert runs["gagarruns"]["categories"] == build_crd()["spec"]["names"]["categories"]


def test_a_table_watch_sends_each_object_as_a_row(http: httpx.Client) -> None:
    """``kubectl get -w``: the watch asks for Tables and prints each event's row."""
    table = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}
    params = {"watch": "true", "resourceVersion": "0", "timeoutSeconds": "1"}
    with http.stream("GET", NS, headers=table, params=params) as stream:
        events = [json.loads(line) for line in stream.iter_lines() if line]
    assert events and {e["type"] for e in events} == {"ADDED"}
    first = events[0]["object"]
    assert first["kind"] == "Table" and len(first["rows"]) == 1
    assert [c["name"] for c in first["columnDefinitions"]] == ["Name", "Status", "Age"]


def test_kubectl_get_events_shows_what_happened_to_which_object(http: httpx.Client) -> None:
    event = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "r.1"}, "type": "Normal",
             "reason": "Running", "message": "training at step 0",
             "involvedObject": {"kind": "GagarRun", "name": "r", "namespace": "default"}}  # fmt: skip
    assert http.post("/api/v1/namespaces/default/events", json=event).status_code == 201
    table = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}
    got = http.get("/api/v1/namespaces/default/events", headers=table).json()
    shown = [c["name"] for c in got["columnDefinitions"] if c["priority"] == 0]
    assert shown == ["Last Seen", "Type", "Reason", "Object", "Message"]
    (row,) = [r for r in got["rows"] if r["cells"][0] == "r.1"]
    assert row["cells"][2:] == ["Normal", "Running", "gagarrun/r", "training at step 0"]
