"""The Kubernetes API emulator over HTTP: CRUD, versions, conflicts, selectors, watch, deletion,
subresources, server-side apply, CR schemas and fault injection."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.kube_emulator import KubeEmulator
from tests.kube_emulator.rbac import ADMIN_HEADERS

CM = "/api/v1/namespaces/default/configmaps"
DEPLOY = "/apis/apps/v1/namespaces/default/deployments"
TOYS = "/apis/example.com/v1/namespaces/default/toys"
MERGE = {"Content-Type": "application/merge-patch+json"}
JSONP = {"Content-Type": "application/json-patch+json"}
APPLY = {"Content-Type": "application/apply-patch+yaml"}

TOY_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "toys.example.com"},
    "spec": {
        "group": "example.com",
        "scope": "Namespaced",
        "names": {"plural": "toys", "singular": "toy", "kind": "Toy"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {
                    "status": {},
                    "scale": {
                        "specReplicasPath": ".spec.replicas",
                        "statusReplicasPath": ".status.replicas",
                        "labelSelectorPath": ".status.selector",
                    },
                },
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["size"],
                                "properties": {
                                    "size": {"type": "integer", "minimum": 1, "maximum": 10},
                                    "replicas": {"type": "integer", "default": 1},
                                    "mode": {"type": "string", "enum": ["fast", "slow"]},
                                    "tags": {
                                        "type": "array",
                                        "items": {"type": "string"},
                                        "maxItems": 2,
                                    },
                                    "extra": {
                                        "type": "object",
                                        "x-kubernetes-preserve-unknown-fields": True,
                                    },
                                },
                            },
                            "status": {
                                "type": "object",
                                "properties": {
                                    "replicas": {"type": "integer"},
                                    "selector": {"type": "string"},
                                    "phase": {"type": "string"},
                                },
                            },
                        },
                    }
                },
            }
        ],
    },
}


@pytest.fixture
def kube():
    with KubeEmulator(bookmark_interval=0.2) as emulator:
        yield emulator


@pytest.fixture
def http(kube):
    with httpx.Client(base_url=kube.url, timeout=10, headers=ADMIN_HEADERS) as client:
        yield client


def cm(name: str, labels: dict | None = None, **data: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels or {}},
        "data": data,
    }


def deployment(name: str, replicas: int = 2) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "i"}]},
            },
        },
    }


def toy(name: str, **spec) -> dict:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Toy",
        "metadata": {"name": name},
        "spec": {"size": 3, **spec},
    }


def watch_events(
    kube: KubeEmulator, path: str, params: dict, count: int, timeout: float = 5.0
) -> list[dict]:
    """Read ``count`` events (or until the server ends the stream) from a watch."""
    events: list[dict] = []
    with httpx.Client(base_url=kube.url, timeout=timeout, headers=ADMIN_HEADERS) as client:
        with client.stream("GET", path, params={"watch": "true", **params}) as response:
            for line in response.iter_lines():
                if line.strip():
                    events.append(json.loads(line))
                if len(events) >= count:
                    break
    return events


# ----- discovery ---------------------------------------------------------------------------------


def test_discovery_lists_builtin_and_custom_kinds(kube, http):
    assert "v1" in http.get("/api").json()["versions"]
    groups = {g["name"] for g in http.get("/apis").json()["groups"]}
    assert {
        "apps",
        "batch",
        "autoscaling",
        "coordination.k8s.io",
        "events.k8s.io",
        "apiextensions.k8s.io",
    } <= groups
    apps = {r["name"]: r for r in http.get("/apis/apps/v1").json()["resources"]}
    assert (
        "deployments/scale" in apps
        and "deployments/status" in apps
        and apps["deployments"]["namespaced"]
    )
    assert http.get("/apis/example.com/v1").status_code == 404
    kube.create(TOY_CRD)
    toys = {r["name"] for r in http.get("/apis/example.com/v1").json()["resources"]}
    assert toys == {"toys", "toys/status", "toys/scale"}
    assert http.get("/version").json()["major"] == "1"
    assert http.get("/healthz").text == "ok"


def test_kubernetes_client_round_trip(kube):
    from kubernetes.client import CoreV1Api
    from kubernetes.client.exceptions import ApiException

    with kube.api_client() as client:
        core = CoreV1Api(client)
        created = core.create_namespaced_config_map("default", cm("a", {"x": "1"}, k="v"))
        assert created.metadata.uid and created.metadata.resource_version
        assert core.read_namespaced_config_map("a", "default").data == {"k": "v"}
        with pytest.raises(ApiException) as err:
            core.read_namespaced_config_map("missing", "default")
        assert err.value.status == 404


# ----- CRUD, resourceVersion, generation ---------------------------------------------------------


def test_create_get_list_delete(http):
    created = http.post(CM, json=cm("a", k="v"))
    assert created.status_code == 201
    body = created.json()
    assert (
        body["metadata"]["uid"]
        and body["metadata"]["creationTimestamp"]
        and body["metadata"]["generation"] == 1
    )
    assert http.get(f"{CM}/a").json()["data"] == {"k": "v"}
    assert http.post(CM, json=cm("a")).json()["reason"] == "AlreadyExists"
    generated = http.post(CM, json={"metadata": {"generateName": "gen-"}}).json()
    assert (
        generated["metadata"]["name"].startswith("gen-") and len(generated["metadata"]["name"]) == 9
    )
    assert len(http.get(CM).json()["items"]) == 2
    assert http.delete(f"{CM}/a").status_code == 200
    assert http.get(f"{CM}/a").status_code == 404


def test_bad_requests_are_rejected(http):
    assert http.post("/api/v1/namespaces/nope/configmaps", json=cm("a")).status_code == 404
    assert http.post(CM, json=cm("Bad_Name")).status_code == 422
    assert (
        http.post(
            CM, json={"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "a"}}
        ).status_code
        == 400
    )
    assert http.get("/apis/nothing.io/v1/things").status_code == 404
    assert http.get(CM, params={"labelSelector": "a in b"}).status_code == 400
    http.post(CM, json=cm("a"))
    assert (
        http.patch(f"{CM}/a", content="{}", headers={"Content-Type": "text/plain"}).status_code
        == 415
    )


def test_resource_version_is_global_and_monotonic(http):
    rvs = [
        int(http.post(CM, json=cm(f"c{i}")).json()["metadata"]["resourceVersion"]) for i in range(3)
    ]
    assert rvs == sorted(rvs) and len(set(rvs)) == 3
    updated = http.patch(f"{CM}/c0", json={"data": {"x": "1"}}, headers=MERGE).json()
    assert int(updated["metadata"]["resourceVersion"]) > rvs[-1]
    assert int(http.get(CM).json()["metadata"]["resourceVersion"]) == int(
        updated["metadata"]["resourceVersion"]
    )


def test_noop_write_keeps_resource_version(http):
    rv = http.post(CM, json=cm("a", k="v")).json()["metadata"]["resourceVersion"]
    same = http.patch(f"{CM}/a", json={"data": {"k": "v"}}, headers=MERGE).json()
    assert same["metadata"]["resourceVersion"] == rv


def test_put_with_stale_resource_version_conflicts(http):
    body = http.post(CM, json=cm("a", k="1")).json()
    fresh = http.put(f"{CM}/a", json={**body, "data": {"k": "2"}})
    assert fresh.status_code == 200
    stale = http.put(f"{CM}/a", json={**body, "data": {"k": "3"}})
    assert stale.status_code == 409 and stale.json()["reason"] == "Conflict"
    assert http.get(f"{CM}/a").json()["data"] == {"k": "2"}


def test_generation_bumps_on_spec_changes_only(kube, http):
    http.post(DEPLOY, json=deployment("d"))
    http.patch(f"{DEPLOY}/d", json={"metadata": {"labels": {"x": "y"}}}, headers=MERGE)
    assert http.get(f"{DEPLOY}/d").json()["metadata"]["generation"] == 1
    http.patch(f"{DEPLOY}/d/status", json={"status": {"replicas": 7}}, headers=MERGE)
    assert http.get(f"{DEPLOY}/d").json()["metadata"]["generation"] == 1
    http.patch(f"{DEPLOY}/d", json={"spec": {"replicas": 3}}, headers=MERGE)
    assert http.get(f"{DEPLOY}/d").json()["metadata"]["generation"] == 2


# ----- patches -----------------------------------------------------------------------------------


def test_merge_strategic_and_json_patches(http):
    http.post(CM, json=cm("a", k="v", drop="me"))
    merged = http.patch(f"{CM}/a", json={"data": {"drop": None, "n": "1"}}, headers=MERGE).json()
    assert merged["data"] == {"k": "v", "n": "1"}
    strategic = http.patch(
        f"{CM}/a",
        json={"data": {"s": "2"}},
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    ).json()
    assert strategic["data"]["s"] == "2"
    rv = strategic["metadata"]["resourceVersion"]
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/metadata/finalizers", "value": ["f"]},
    ]
    assert http.patch(f"{CM}/a", json=ops, headers=JSONP).json()["metadata"]["finalizers"] == ["f"]
    failed = http.patch(f"{CM}/a", json=ops, headers=JSONP)  # the RV moved on: the test op fails
    assert failed.status_code == 422


# ----- selectors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=web", {"a", "b"}),
        ("app!=web", {"c", "d"}),
        ("app in (web,db)", {"a", "b", "c"}),
        ("app notin (web)", {"c", "d"}),
        ("tier", {"a"}),
        ("!tier", {"b", "c", "d"}),
        ("app=web,tier=front", {"a"}),
    ],
)
def test_label_selectors(http, selector, expected):
    http.post(CM, json=cm("a", {"app": "web", "tier": "front"}))
    http.post(CM, json=cm("b", {"app": "web"}))
    http.post(CM, json=cm("c", {"app": "db"}))
    http.post(CM, json=cm("d"))
    items = http.get(CM, params={"labelSelector": selector}).json()["items"]
    assert {i["metadata"]["name"] for i in items} == expected


def test_field_selectors_and_namespaces(http):
    http.post("/api/v1/namespaces", json={"metadata": {"name": "other"}})
    http.post(CM, json=cm("a"))
    http.post("/api/v1/namespaces/other/configmaps", json=cm("a"))
    everywhere = http.get("/api/v1/configmaps", params={"fieldSelector": "metadata.name=a"}).json()[
        "items"
    ]
    assert {i["metadata"]["namespace"] for i in everywhere} == {"default", "other"}
    only = http.get(
        "/api/v1/configmaps", params={"fieldSelector": "metadata.namespace!=default"}
    ).json()["items"]
    assert [i["metadata"]["namespace"] for i in only] == ["other"]


def test_list_pagination(http):
    for i in range(5):
        http.post(CM, json=cm(f"c{i}"))
    first = http.get(CM, params={"limit": 2}).json()
    second = http.get(CM, params={"limit": 2, "continue": first["metadata"]["continue"]}).json()
    third = http.get(CM, params={"limit": 2, "continue": second["metadata"]["continue"]}).json()
    names = [i["metadata"]["name"] for page in (first, second, third) for i in page["items"]]
    assert names == [f"c{i}" for i in range(5)] and "continue" not in third["metadata"]


# ----- watch -------------------------------------------------------------------------------------


def test_watch_without_version_lists_then_streams(kube, http):
    http.post(CM, json=cm("a"))

    def later():
        time.sleep(0.2)
        http.post(CM, json=cm("b"))

    threading.Thread(target=later).start()
    events = watch_events(kube, CM, {}, 2)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a"),
        ("ADDED", "b"),
    ]


def test_watch_resumes_from_version_without_duplicates(kube, http):
    rv = http.post(CM, json=cm("a")).json()["metadata"]["resourceVersion"]
    http.patch(f"{CM}/a", json={"data": {"k": "1"}}, headers=MERGE)
    http.post(CM, json=cm("b"))
    http.delete(f"{CM}/a")
    events = watch_events(kube, CM, {"resourceVersion": rv, "timeoutSeconds": "1"}, 10)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("MODIFIED", "a"),
        ("ADDED", "b"),
        ("DELETED", "a"),
    ]


def test_watch_from_compacted_version_is_410_expired(kube, http):
    rv = http.post(CM, json=cm("a")).json()["metadata"]["resourceVersion"]
    http.post(CM, json=cm("b"))
    kube.compact_history()
    (event,) = watch_events(kube, CM, {"resourceVersion": rv}, 1)
    assert (
        event["type"] == "ERROR"
        and event["object"]["code"] == 410
        and event["object"]["reason"] == "Expired"
    )


def test_watch_history_is_bounded():
    with KubeEmulator(history_limit=5) as kube:
        with httpx.Client(base_url=kube.url, headers=ADMIN_HEADERS) as http:
            rv = http.post(CM, json=cm("a")).json()["metadata"]["resourceVersion"]
            for i in range(6):
                http.patch(f"{CM}/a", json={"data": {"i": str(i)}}, headers=MERGE)
        (event,) = watch_events(kube, CM, {"resourceVersion": rv}, 1)
        assert event["object"]["code"] == 410


def test_watch_bookmarks_timeout_and_selector_transitions(kube, http):
    rv = http.post(CM, json=cm("a", {"app": "x"})).json()["metadata"]["resourceVersion"]
    http.patch(f"{CM}/a", json={"metadata": {"labels": {"app": "y"}}}, headers=MERGE)
    http.patch(f"{CM}/a", json={"metadata": {"labels": {"app": "x"}}}, headers=MERGE)
    started = time.monotonic()
    events = watch_events(
        kube,
        CM,
        {
            "resourceVersion": rv,
            "labelSelector": "app=x",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "1",
        },
        100,
    )
    assert time.monotonic() - started < 3  # the server ended the stream at timeoutSeconds
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["DELETED", "ADDED"]  # leaving and re-entering the selector
    assert "BOOKMARK" in kinds
    bookmark = next(e for e in events if e["type"] == "BOOKMARK")
    assert int(bookmark["object"]["metadata"]["resourceVersion"]) >= int(
        events[1]["object"]["metadata"]["resourceVersion"]
    )


def test_watch_initial_events_end_with_bookmark(kube, http):
    http.post(CM, json=cm("a"))
    events = watch_events(kube, CM, {"sendInitialEvents": "true", "allowWatchBookmarks": "true"}, 2)
    assert events[0]["type"] == "ADDED"
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_dropped_watch_ends_the_stream(kube, http):
    result: list = []

    def watch():
        try:
            result.extend(watch_events(kube, CM, {"resourceVersion": "1"}, 100, timeout=10))
        except httpx.HTTPError as e:
            result.append(e)

    thread = threading.Thread(target=watch)
    thread.start()
    kube.wait_for(lambda: kube.store.watchers)
    assert kube.drop_watches("configmaps") == 1
    thread.join(5)
    assert not thread.is_alive()


# ----- deletion ----------------------------------------------------------------------------------


def test_finalizers_delay_deletion(kube, http):
    http.post(CM, json={**cm("a"), "metadata": {"name": "a", "finalizers": ["test/hold"]}})
    deleted = http.delete(f"{CM}/a").json()
    assert deleted["metadata"]["deletionTimestamp"]
    assert http.get(f"{CM}/a").status_code == 200
    refused = http.patch(
        f"{CM}/a", json={"metadata": {"finalizers": ["test/hold", "new"]}}, headers=MERGE
    )
    assert refused.status_code == 422
    http.patch(f"{CM}/a", json={"metadata": {"finalizers": []}}, headers=MERGE)
    assert http.get(f"{CM}/a").status_code == 404


def test_owner_references_are_garbage_collected(kube, http):
    owner = http.post(CM, json=cm("owner")).json()
    ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
    }
    http.post(CM, json={**cm("child"), "metadata": {"name": "child", "ownerReferences": [ref]}})
    http.post(CM, json={**cm("kept"), "metadata": {"name": "kept", "ownerReferences": [ref]}})
    http.patch(f"{CM}/kept", json={"metadata": {"finalizers": ["x/y"]}}, headers=MERGE)
    http.delete(f"{CM}/owner")
    kube.wait_for(lambda: http.get(f"{CM}/child").status_code == 404)
    assert http.get(f"{CM}/kept").json()["metadata"]["deletionTimestamp"]  # its finalizer holds it


def test_orphan_and_foreground_propagation(kube, http):
    for name in ("o1", "o2"):
        owner = http.post(CM, json=cm(name)).json()
        ref = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": name,
            "uid": owner["metadata"]["uid"],
        }
        http.post(
            CM,
            json={
                **cm(f"{name}-child"),
                "metadata": {"name": f"{name}-child", "ownerReferences": [ref]},
            },
        )
    http.delete(f"{CM}/o1", params={"propagationPolicy": "Orphan"})
    time.sleep(0.3)
    assert http.get(f"{CM}/o1-child").json()["metadata"]["ownerReferences"] == []
    held = http.request("DELETE", f"{CM}/o2", json={"propagationPolicy": "Foreground"}).json()
    assert "foregroundDeletion" in held["metadata"]["finalizers"]
    kube.wait_for(lambda: http.get(f"{CM}/o2").status_code == 404)
    assert http.get(f"{CM}/o2-child").status_code == 404


def test_namespace_deletion_empties_it(kube, http):
    http.post("/api/v1/namespaces", json={"metadata": {"name": "gone"}})
    held = {**cm("a"), "metadata": {"name": "a", "finalizers": ["test/hold"]}}
    http.post("/api/v1/namespaces/gone/configmaps", json=held)
    assert http.delete("/api/v1/namespaces/gone").json()["status"]["phase"] == "Terminating"
    assert http.post("/api/v1/namespaces/gone/configmaps", json=cm("b")).status_code == 403
    path = "/api/v1/namespaces/gone/configmaps/a"
    kube.wait_for(lambda: http.get(path).json()["metadata"].get("deletionTimestamp"))
    assert http.get("/api/v1/namespaces/gone").status_code == 200  # content still held
    http.patch(path, json={"metadata": {"finalizers": None}}, headers=MERGE)
    kube.wait_for(lambda: http.get("/api/v1/namespaces/gone").status_code == 404)


# ----- subresources ------------------------------------------------------------------------------


def test_status_subresource_is_separate(kube, http):
    kube.controllers.deployments = False  # nobody else writes the status here
    http.post(DEPLOY, json={**deployment("d"), "status": {"replicas": 99}})
    assert "replicas" not in (
        http.get(f"{DEPLOY}/d").json().get("status") or {}
    )  # ignored on create
    http.patch(
        f"{DEPLOY}/d/status",
        json={"status": {"observedGeneration": 5}, "spec": {"replicas": 9}},
        headers=MERGE,
    )
    body = http.get(f"{DEPLOY}/d").json()
    assert body["status"]["observedGeneration"] == 5 and body["spec"]["replicas"] == 2
    http.patch(f"{DEPLOY}/d", json={"status": {"observedGeneration": 1}}, headers=MERGE)
    assert http.get(f"{DEPLOY}/d").json()["status"]["observedGeneration"] == 5
    assert http.get(f"{CM}/x/status").status_code == 404


def test_deployment_scale_and_simulated_status(kube, http):
    http.post(DEPLOY, json=deployment("d", 2))
    kube.wait_for(
        lambda: (http.get(f"{DEPLOY}/d").json().get("status") or {}).get("readyReplicas") == 2
    )
    scale = http.get(f"{DEPLOY}/d/scale").json()
    assert (
        scale["kind"] == "Scale"
        and scale["spec"]["replicas"] == 2
        and scale["status"]["selector"] == "app=d"
    )
    kube.hold_deployment("d", ready=1)
    http.patch(f"{DEPLOY}/d/scale", json={"spec": {"replicas": 4}}, headers=MERGE)
    body = kube.wait_for(
        lambda: (lambda b: b if (b.get("status") or {}).get("replicas") == 4 else None)(
            http.get(f"{DEPLOY}/d").json()
        )
    )
    assert body["spec"]["replicas"] == 4 and body["metadata"]["generation"] == 2
    assert body["status"]["readyReplicas"] == 1 and body["status"]["observedGeneration"] == 2
    stale = http.put(f"{DEPLOY}/d/scale", json={**scale, "spec": {"replicas": 1}})
    assert stale.status_code == 409


def test_job_status_is_driven_by_the_test(kube, http):
    jobs = "/apis/batch/v1/namespaces/default/jobs"
    http.post(
        jobs,
        json={
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "ok"},
            "spec": {
                "parallelism": 2,
                "completions": 2,
                "completionMode": "Indexed",
                "template": {},
            },
        },
    )
    http.post(
        jobs,
        json={
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "bad"},
            "spec": {"template": {}},
        },
    )
    kube.wait_for(lambda: (http.get(f"{jobs}/ok").json().get("status") or {}).get("active") == 2)
    kube.succeed_job("ok")
    kube.fail_job("bad", reason="PodFailurePolicy")
    ok = kube.wait_for(lambda: (http.get(f"{jobs}/ok").json().get("status") or {}).get("succeeded"))
    assert ok == 2 and http.get(f"{jobs}/ok").json()["status"]["completedIndexes"] == "0-1"
    bad = http.get(f"{jobs}/bad").json()["status"]
    assert bad["failed"] == 1 and any(
        c["type"] == "Failed" and c["reason"] == "PodFailurePolicy" for c in bad["conditions"]
    )


def test_job_pods_meet_the_pod_failure_policy(kube, http):
    """The Job controller runs one pod per index and applies podFailurePolicy as Kubernetes
    does: Ignore replaces the pod, Count fails the Job past backoffLimit, FailJob at once, and
    a Job whose every index succeeded is Complete."""
    jobs, pods = "/apis/batch/v1/namespaces/default/jobs", "/api/v1/namespaces/default/pods"
    policy = {"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "FailJob", "onExitCodes": {"containerName": "c", "operator": "In",
                                              "values": [3]}},
    ]}  # fmt: skip
    template = {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}
    for job in ("a", "b", "c"):
        spec = {"completions": 2, "parallelism": 2, "completionMode": "Indexed",
                "backoffLimit": 0, "podFailurePolicy": policy, "template": template}  # fmt: skip
        body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": job}, "spec": spec}
        assert http.post(jobs, json=body).status_code == 201

    def live(job):
        items = http.get(pods, params={"labelSelector": f"batch.kubernetes.io/job-name={job}"})
        return {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p
                for p in items.json()["items"] if p["status"].get("phase") == "Running"}  # fmt: skip

    def end(pod, phase, code, *conditions):
        status = {"phase": phase, "conditions": [{"type": t, "status": "True"} for t in conditions],
                  "containerStatuses": [{"name": "c", "ready": False, "restartCount": 0,
                                         "image": "i", "imageID": "",
                                         "state": {"terminated": {"exitCode": code}}}]}  # fmt: skip
        url = f"{pods}/{pod['metadata']['name']}/status"
        assert http.patch(url, json={"status": status}, headers=MERGE).status_code == 200

    def failed(job):
        conds = (http.get(f"{jobs}/{job}").json().get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] in ("Failed", "Complete")), None)

    kube.wait_for(lambda: len(live("a")) == len(live("b")) == len(live("c")) == 2)
    evicted = live("a")["1"]
    end(evicted, "Failed", 137, "DisruptionTarget")  # ignored: a new pod for index 1
    kube.wait_for(lambda: len(live("a")) == 2 and live("a")["1"]["metadata"]["name"]
                  != evicted["metadata"]["name"])  # fmt: skip
    assert failed("a") is None
    end(live("a")["0"], "Failed", 1)  # counted: past backoffLimit 0
    assert kube.wait_for(lambda: failed("a"))["reason"] == "BackoffLimitExceeded"
    kube.wait_for(lambda: live("a") == {})  # the other rank stopped
    end(live("b")["1"], "Failed", 3)
    b = kube.wait_for(lambda: failed("b"))
    assert b["reason"] == "PodFailurePolicy" and "exit code 3" in b["message"]
    for index in ("0", "1"):
        end(live("c")[index], "Succeeded", 0)
    assert kube.wait_for(lambda: failed("c"))["type"] == "Complete"


# ----- server-side apply -------------------------------------------------------------------------


def apply(http, path, body, manager, force=False):
    params = {"fieldManager": manager, **({"force": "true"} if force else {})}
    return http.patch(path, content=json.dumps(body), headers=APPLY, params=params)


def test_apply_creates_merges_and_prunes_own_fields(http):
    first = apply(http, f"{CM}/a", {**cm("a", x="1", y="2")}, "op")
    assert first.status_code == 201
    apply(http, f"{CM}/a", {**cm("a", x="1")}, "op")  # y no longer applied: removed
    http.patch(f"{CM}/a", json={"data": {"z": "3"}}, headers=MERGE)  # another writer
    body = apply(http, f"{CM}/a", {**cm("a", x="1")}, "op").json()
    assert body["data"] == {"x": "1", "z": "3"}  # fields of others survive
    managers = {m["manager"]: m["operation"] for m in body["metadata"]["managedFields"]}
    assert managers["op"] == "Apply"
    assert apply(http, f"{CM}/a", cm("a"), "").status_code == 400  # fieldManager is required


def test_apply_conflicts_with_another_owner_unless_forced(http):
    apply(http, f"{DEPLOY}/d", deployment("d", 2), "op")
    http.patch(
        f"{DEPLOY}/d/scale",
        json={"spec": {"replicas": 5}},
        headers=MERGE,
        params={"fieldManager": "hpa"},
    )
    conflict = apply(http, f"{DEPLOY}/d", deployment("d", 2), "op")
    assert conflict.status_code == 409 and ".spec.replicas" in conflict.json()["message"]
    same_value = apply(http, f"{DEPLOY}/d", deployment("d", 5), "op")
    assert same_value.status_code == 200  # equal values: shared ownership, no conflict
    without = {
        **deployment("d"),
        "spec": {k: v for k, v in deployment("d")["spec"].items() if k != "replicas"},
    }
    assert (
        apply(http, f"{DEPLOY}/d", without, "op").json()["spec"]["replicas"] == 5
    )  # hpa still owns it
    http.patch(
        f"{DEPLOY}/d/scale",
        json={"spec": {"replicas": 6}},
        headers=MERGE,
        params={"fieldManager": "hpa"},
    )
    forced = apply(http, f"{DEPLOY}/d", deployment("d", 2), "op", force=True)
    assert forced.status_code == 200 and forced.json()["spec"]["replicas"] == 2


# ----- custom resources --------------------------------------------------------------------------


def test_custom_resource_schema_validation_and_defaults(kube, http):
    assert (
        http.post(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=TOY_CRD
        ).status_code
        == 201
    )
    crd = http.get(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/toys.example.com"
    ).json()
    assert any(
        c["type"] == "Established" and c["status"] == "True" for c in crd["status"]["conditions"]
    )
    good = http.post(TOYS, json=toy("t", extra={"any": {"thing": 1}}))
    assert good.status_code == 201 and good.json()["spec"]["replicas"] == 1  # defaulted
    cases = [
        ({"size": 0}, "greater than or equal to 1"),
        ({"size": "3"}, "must be of type integer"),
        ({"mode": "warp"}, "Unsupported value"),
        ({"tags": ["a", "b", "c"]}, "at most 2 items"),
    ]
    for spec, message in cases:
        bad = http.post(TOYS, json={**toy("b"), "spec": {"size": 3, **spec}})
        assert bad.status_code == 422 and message in bad.json()["message"], spec
    missing = http.post(TOYS, json={**toy("m"), "spec": {}})
    assert "spec.size: Required value" in missing.json()["message"]
    pruned = http.post(TOYS, json=toy("p", unknown=1))
    assert "unknown" not in pruned.json()["spec"]
    assert pruned.headers["Warning"] == r'299 - "unknown field \"spec.unknown\""'
    strict = http.post(TOYS, json=toy("s", unknown=1), params={"fieldValidation": "Strict"})
    assert strict.status_code == 400  # the server's strict decoding error, before admission
    ignored = http.post(TOYS, json=toy("i", unknown=1), params={"fieldValidation": "Ignore"})
    assert ignored.status_code == 201 and "Warning" not in ignored.headers


def test_strict_field_validation_rejects_unknown_fields():
    with KubeEmulator(strict_fields=True) as kube:
        kube.create(TOY_CRD)
        with httpx.Client(base_url=kube.url, headers=ADMIN_HEADERS) as http:
            rejected = http.post(TOYS, json=toy("p", unknown=1))
    assert (
        rejected.status_code == 400 and 'unknown field "spec.unknown"' in rejected.json()["message"]
    )


def test_invalid_crd_is_rejected(http):
    bad = {**TOY_CRD, "metadata": {"name": "wrong.example.com"}}
    assert (
        http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=bad).status_code
        == 422
    )


def test_custom_scale_and_crd_deletion(kube, http):
    kube.create(TOY_CRD)
    http.post(TOYS, json=toy("t", replicas=2))
    http.patch(
        f"{TOYS}/t/status", json={"status": {"replicas": 2, "selector": "app=t"}}, headers=MERGE
    )
    scale = http.get(f"{TOYS}/t/scale").json()
    assert (
        scale["spec"]["replicas"],
        scale["status"]["replicas"],
        scale["status"]["selector"],
    ) == (2, 2, "app=t")
    http.patch(f"{TOYS}/t/scale", json={"spec": {"replicas": 3}}, headers=MERGE)
    assert http.get(f"{TOYS}/t").json()["spec"]["replicas"] == 3
    http.delete("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/toys.example.com")
    kube.wait_for(lambda: http.get("/apis/example.com/v1").status_code == 404)


# ----- fault injection ---------------------------------------------------------------------------


def test_fault_injection(kube, http):
    kube.faults.fail_next(2, verb="create", path="/configmaps")
    assert [http.post(CM, json=cm(f"f{i}")).status_code for i in range(3)] == [500, 500, 201]
    assert (
        http.get("/api/v1/namespaces/default/configmaps/f0").status_code == 404
    )  # nothing written
    kube.faults.conflict_next()
    assert http.patch(f"{CM}/f2", json={"data": {"a": "b"}}, headers=MERGE).status_code == 409
    assert http.patch(f"{CM}/f2", json={"data": {"a": "b"}}, headers=MERGE).status_code == 200
    kube.faults.add_latency(0.3, verb="get", times=1)
    started = time.monotonic()
    http.get(f"{CM}/f2")
    assert time.monotonic() - started >= 0.3
    assert [r["code"] for r in kube.requests_for(verb="create")] == [500, 500, 201]


def test_strategic_merge_patch_merges_lists_by_key(kube, http):
    http.post(DEPLOY, json=deployment("d"))
    containers = [
        {"name": "c", "env": [{"name": "A", "value": "1"}]},
        {"name": "side", "image": "s"},
    ]
    sm = {"Content-Type": "application/strategic-merge-patch+json"}
    patch = {"spec": {"template": {"spec": {"containers": containers}}}}
    body = http.patch(f"{DEPLOY}/d", json=patch, headers=sm).json()
    merged = body["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in merged] == ["c", "side"] and merged[0]["image"] == "i"
    assert merged[0]["env"] == [{"name": "A", "value": "1"}]
    delete = {
        "spec": {"template": {"spec": {"containers": [{"name": "side", "$patch": "delete"}]}}}
    }
    body = http.patch(f"{DEPLOY}/d", json=delete, headers=sm).json()
    assert [c["name"] for c in body["spec"]["template"]["spec"]["containers"]] == ["c"]
    kube.create(TOY_CRD)
    http.post(TOYS, json=toy("t"))
    assert http.patch(f"{TOYS}/t", json={"spec": {"size": 4}}, headers=sm).status_code == 415


def test_controllers_can_be_switched_off_and_jobs_suspend(kube, http):
    kube.controllers.deployments = False
    http.post(DEPLOY, json=deployment("d"))
    jobs = "/apis/batch/v1/namespaces/default/jobs"
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j"},
        "spec": {"suspend": True},
    }
    http.post(jobs, json=job)
    status = kube.wait_for(lambda: http.get(f"{jobs}/j").json().get("status"))
    assert status["active"] == 0 and status["conditions"][0]["type"] == "Suspended"
    time.sleep(0.3)
    assert "status" not in http.get(f"{DEPLOY}/d").json()


def test_apply_to_status_subresource_owns_status_only(http):
    apply(http, f"{DEPLOY}/d", deployment("d"), "op")
    status_apply = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "status": {"replicas": 9},
        "spec": {"replicas": 7},
    }
    body = apply(http, f"{DEPLOY}/d/status", status_apply, "reporter").json()
    assert body["status"]["replicas"] == 9 and body["spec"]["replicas"] == 2
    entry = next(m for m in body["metadata"]["managedFields"] if m["manager"] == "reporter")
    assert entry["subresource"] == "status" and "f:spec" not in entry["fieldsV1"]


def test_shipped_crd_serves_the_examples_and_rejects_bad_specs(kube):
    import pathlib

    import yaml

    root = pathlib.Path(__file__).resolve().parents[2]
    kube.load_yaml(root / "manifests" / "crd" / "gagarruns.gagar.dev.yaml")
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gagar"}})
    examples = sorted((root / "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        (run,) = kube.load_yaml(path)
        assert run["kind"] == "GagarRun" and run["metadata"]["generation"] == 1
    bad = yaml.safe_load((root / "examples" / "local.yaml").read_text())
    bad["metadata"]["name"] = "bad"
    bad["spec"]["algorithm"]["mode"] = "nope"
    with pytest.raises(Exception, match=r"spec\.algorithm\.mode: Unsupported value"):
        kube.create(bad)
    long_name = yaml.safe_load((root / "examples" / "local.yaml").read_text())
    long_name["metadata"]["name"] = "x" * 43
    with pytest.raises(Exception, match="at most 42 characters"):  # a CEL rule of the CRD
        kube.create(long_name)


CEL_CRD = {
    **TOY_CRD,
    "spec": {
        **TOY_CRD["spec"],
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "x-kubernetes-validations": [
                                    {
                                        "rule": "self.low <= self.high",
                                        "message": "low must not exceed high",
                                        "fieldPath": ".low",
                                    },
                                    {
                                        "rule": "has(self.a) != has(self.b)",
                                        "message": "exactly one of a and b",
                                    },
                                    {"rule": "self.tags.all(t, t.startsWith('x-'))"},
                                    {
                                        "rule": "!has(self.a) || !has(oldSelf.a)"
                                        " || self.a == oldSelf.a",
                                        "message": "a is immutable",
                                    },
                                    {"rule": "self.q.isQuantity()"},
                                ],
                                "properties": {
                                    "low": {"type": "integer"},
                                    "high": {"type": "integer"},
                                    "a": {"type": "string"},
                                    "b": {"type": "string"},
                                    "tags": {
                                        "type": "array",
                                        "items": {"type": "string"},
                                        "default": [],
                                    },
                                },
                            }
                        },
                    }
                },
            }
        ],
    },
}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"low": 1, "high": 2, "a": "x"}, None),
        (
            {"low": 3, "high": 2, "a": "x"},
            'spec.low: Invalid value: "object": low must not exceed high',
        ),
        ({"low": 1, "high": 2}, "exactly one of a and b"),
        ({"low": 1, "high": 2, "a": "x", "tags": ["x-1", "y"]}, "failed rule: self.tags.all"),
        ({"high": 2, "a": "x"}, "no such key: low"),
    ],
)
def test_crd_cel_rules_subset(kube, http, spec, message):
    kube.create(CEL_CRD)
    response = http.post(
        TOYS,
        json={
            "apiVersion": "example.com/v1",
            "kind": "Toy",
            "metadata": {"name": "t"},
            "spec": spec,
        },
    )
    if message is None:
        assert response.status_code == 201  # the transition rule (a create) and the
        # unsupported one were skipped
    else:
        assert response.status_code == 422 and message in response.json()["message"]


def test_crd_transition_rules_see_the_stored_object(kube, http):
    """``oldSelf`` rules are evaluated on updates, against the stored object."""
    kube.create(CEL_CRD)
    body = {"apiVersion": "example.com/v1", "kind": "Toy", "metadata": {"name": "t"},
            "spec": {"low": 1, "high": 2, "a": "x"}}  # fmt: skip
    assert http.post(TOYS, json=body).status_code == 201
    patch = {"headers": {"Content-Type": "application/merge-patch+json"}}
    ok = http.patch(f"{TOYS}/t", json={"spec": {"high": 3}}, **patch)
    assert ok.status_code == 200
    refused = http.patch(f"{TOYS}/t", json={"spec": {"a": "y"}}, **patch)
    assert refused.status_code == 422 and "a is immutable" in refused.json()["message"]


def test_real_cluster_adapter_speaks_the_same_object_api(kube):
    """RealCluster (for GAGAR_TEST_KUBECONFIG) exercised over HTTP against the emulator."""
    from tests.kube_emulator.cluster import RealCluster

    real = RealCluster(kube.kubeconfig_path)
    assert real.url == kube.url and not real.emulated
    real.create(TOY_CRD)
    real.create(toy("t"))
    assert real.get("example.com/v1", "Toy", "t")["spec"]["replicas"] == 1
    real.patch("example.com/v1", "Toy", "t", lambda o: {**o, "spec": {**o["spec"], "size": 5}})
    real.patch(
        "example.com/v1",
        "Toy",
        "t",
        lambda o: {**o, "status": {"phase": "Up"}},
        subresource="status",
    )
    body = kube.get("example.com/v1", "Toy", "t")
    assert (body["spec"]["size"], body["status"]["phase"], body["metadata"]["generation"]) == (
        5,
        "Up",
        2,
    )
    assert [o["metadata"]["name"] for o in real.list("example.com/v1", "Toy", "default")] == ["t"]
    real.delete("example.com/v1", "Toy", "t")
    assert real.wait_for(lambda: real.find("example.com/v1", "Toy", "t") is None, timeout=5)


def test_apply_dropping_replicas_falls_back_to_the_default(http):
    """An applier that stops sending a field it alone owned loses it; the server defaults it."""
    apply(http, f"{DEPLOY}/d", deployment("d", 3), "op")
    without = {
        **deployment("d"),
        "spec": {k: v for k, v in deployment("d")["spec"].items() if k != "replicas"},
    }
    body = apply(http, f"{DEPLOY}/d", without, "op").json()
    assert body["spec"]["replicas"] == 1
    again = apply(http, f"{DEPLOY}/d", without, "op").json()
    assert again["metadata"]["resourceVersion"] == body["metadata"]["resourceVersion"]  # a no-op


def test_watch_opened_during_concurrent_writes_has_no_gaps_or_duplicates(kube, http):
    start_rv = int(http.post(CM, json=cm("seed")).json()["metadata"]["resourceVersion"])
    writes = 40

    def writer(index: int) -> None:
        with httpx.Client(base_url=kube.url, headers=ADMIN_HEADERS) as client:
            client.post(CM, json=cm(f"w{index}"))
            for i in range(writes):
                client.patch(f"{CM}/w{index}", json={"data": {"i": str(i)}}, headers=MERGE)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.05)  # the watch registers while the writers are busy
    total = 3 * (writes + 1)
    events = watch_events(kube, CM, {"resourceVersion": str(start_rv)}, total, timeout=30)
    for t in threads:
        t.join()
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(set(rvs)) and len(rvs) == total  # ordered, unique, complete
    assert rvs[0] > start_rv


def test_immutable_fields_and_job_defaults(http):
    jobs = "/apis/batch/v1/namespaces/default/jobs"
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j"},
        "spec": {"template": {"spec": {"containers": [{"name": "t", "image": "a"}]}}},
    }
    created = http.post(jobs, json=job).json()
    uid = created["metadata"]["uid"]
    assert created["spec"]["selector"] == {
        "matchLabels": {"batch.kubernetes.io/controller-uid": uid}
    }
    assert created["spec"]["template"]["metadata"]["labels"]["job-name"] == "j"
    assert created["spec"]["backoffLimit"] == 6 and created["spec"]["parallelism"] == 1
    new_template = {"spec": {"template": {"spec": {"containers": [{"name": "t", "image": "b"}]}}}}
    refused = http.patch(f"{jobs}/j", json=new_template, headers=MERGE)
    assert (
        refused.status_code == 422
        and "spec.template: Invalid value: field is immutable" in refused.json()["message"]
    )
    assert (
        http.patch(f"{jobs}/j", json={"spec": {"parallelism": 3}}, headers=MERGE).status_code == 200
    )
    http.post(CM, json={**cm("frozen", k="v"), "immutable": True})
    assert http.patch(f"{CM}/frozen", json={"data": {"k": "w"}}, headers=MERGE).status_code == 422


def test_reapplying_a_job_keeps_server_defaulted_fields(http):
    jobs = "/apis/batch/v1/namespaces/default/jobs"
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j"},
        "spec": {"template": {"spec": {"containers": [{"name": "t", "image": "a"}]}}},
    }
    first = apply(http, f"{jobs}/j", job, "op")
    assert first.status_code == 201
    again = apply(http, f"{jobs}/j", job, "op")
    assert again.status_code == 200, again.json()
    assert again.json()["spec"]["selector"] == first.json()["spec"]["selector"]
    assert again.json()["metadata"]["generation"] == 1  # nothing in the spec changed


# ----- identities and RBAC -------------------------------------------------------------------

RBAC = "rbac.authorization.k8s.io/v1"


def _as(kube: KubeEmulator, namespace: str, name: str) -> httpx.Client:
    token = kube.server.authorizer.issue(namespace, name)
    return httpx.Client(base_url=kube.url, headers={"Authorization": f"Bearer {token}"})


def test_service_account_requests_are_authorized_by_rbac(kube):
    reader = _as(kube, "ops", "reader")
    denied = reader.get(CM)
    assert denied.status_code == 403
    assert denied.json()["message"] == (
        'configmaps is forbidden: User "system:serviceaccount:ops:reader" cannot list '
        'resource "configmaps" in API group "" in the namespace "default"'
    )
    kube.create({"apiVersion": RBAC, "kind": "Role", "metadata": {"name": "r"},
                 "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                            "verbs": ["get", "list"], "resourceNames": []}]})  # fmt: skip
    kube.create({"apiVersion": RBAC, "kind": "RoleBinding", "metadata": {"name": "r"},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
                 "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "ops"}]})  # fmt: skip
    assert reader.get(CM).status_code == 200
    assert reader.post(CM, json={"metadata": {"name": "x"}}).status_code == 403  # no create
    assert reader.get("/api/v1/namespaces/other/configmaps").status_code == 403  # other ns
    assert reader.get("/apis").status_code == 200  # discovery is open
    bad = httpx.get(kube.url + CM, headers={"Authorization": "Bearer nobody"})
    assert bad.status_code == 401


def test_roles_grant_only_what_their_writer_holds(kube):
    kube.create({"apiVersion": RBAC, "kind": "ClusterRole", "metadata": {"name": "roles"},
                 "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"],
                            "verbs": ["create"]},
                           {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]})  # fmt: skip
    kube.create({"apiVersion": RBAC, "kind": "ClusterRoleBinding", "metadata": {"name": "roles"},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                             "name": "roles"},
                 "subjects": [{"kind": "ServiceAccount", "name": "op", "namespace": "ops"}]})  # fmt: skip
    op = _as(kube, "ops", "op")
    roles = "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles"

    def role(verbs: list[str]) -> dict:
        rule = {"apiGroups": [""], "resources": ["configmaps"], "verbs": verbs}
        return {"apiVersion": RBAC, "kind": "Role", "metadata": {"name": "-".join(verbs)},
                "rules": [rule]}  # fmt: skip

    assert op.post(roles, json=role(["get"])).status_code == 201
    escalated = op.post(roles, json=role(["get", "delete"]))
    assert escalated.status_code == 403
    assert "attempting to grant RBAC permissions not currently held" in escalated.json()["message"]


def test_apply_merges_map_lists_by_key(http):
    """containers and env are listType=map: each applier owns its items, not the whole list."""

    def deployment(containers: list[dict]) -> str:
        body = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "d"},
            "spec": {
                "selector": {"matchLabels": {"a": "b"}},
                "template": {
                    "metadata": {"labels": {"a": "b"}},
                    "spec": {"containers": containers},
                },
            },
        }
        return json.dumps(body)

    def apply(manager: str, containers: list[dict]) -> dict:
        r = http.patch(f"{DEPLOY}/d", params={"fieldManager": manager, "force": "true"},
                       content=deployment(containers), headers=APPLY)  # fmt: skip
        assert r.status_code in (200, 201), r.text
        return r.json()

    main = {"name": "main", "image": "m:1", "env": [{"name": "A", "value": "1"}]}
    apply("operator", [main])
    apply("mesh", [{"name": "main", "env": [{"name": "B", "value": "2"}]},
                   {"name": "proxy", "image": "p"}])  # fmt: skip
    out = apply("operator", [{**main, "image": "m:2"}])  # the operator re-applies
    containers = {c["name"]: c for c in out["spec"]["template"]["spec"]["containers"]}
    assert set(containers) == {"main", "proxy"}  # the other manager's sidecar survives
    assert containers["main"]["image"] == "m:2"
    assert [e["name"] for e in containers["main"]["env"]] == ["A", "B"]
    fields = json.dumps(out["metadata"]["managedFields"])
    assert 'k:{\\"name\\":\\"proxy\\"}' in fields
    out = apply("operator", [{"name": "main", "image": "m:2"}])  # drops its env var A
    (main_after,) = [
        c for c in out["spec"]["template"]["spec"]["containers"] if c["name"] == "main"
    ]
    assert main_after["env"] == [{"name": "B", "value": "2"}]


# ----- what a real server refuses ----------------------------------------------------------------


def test_anonymous_requests_have_no_rights(kube):
    for method, path in (("GET", CM), ("POST", CM), ("GET", "/api/v1/namespaces")):
        r = httpx.request(method, kube.url + path, json=cm("x") if method == "POST" else None)
        assert r.status_code == 403, (method, path, r.text)
        assert 'User "system:anonymous" cannot' in r.json()["message"]
    assert kube.find("v1", "ConfigMap", "x", "default") is None


def _pod_deployment(name: str, **pod: object) -> dict:
    d = deployment(name, replicas=1)
    d["spec"]["template"]["spec"] = {"containers": [{"name": "c", "image": "i"}], **pod}
    return d


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "banana"}}}]},
         "quantities must match"),
        ({"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}]},
         "less than or equal to cpu limit"),
        ({"volumes": [{"name": "v", "emptyDir": {}}],
          "containers": [{"name": "c", "image": "i", "volumeMounts": [
              {"name": "v", "mountPath": "/d"}, {"name": "v", "mountPath": "/d"}]}]},
         'volumeMounts[1].mountPath: Invalid value: "/d": must be unique'),
        ({"containers": [{"name": "c", "image": "i", "volumeMounts": [{"name": "nope", "mountPath": "/d"}]}]},
         "volumeMounts[0].name: Not found"),
        ({"volumes": [{"name": "v", "emptyDir": {}}, {"name": "v", "emptyDir": {}}]},
         "volumes[1].name: Duplicate value"),
        ({"initContainers": [{"name": "c", "image": "i"}]}, "initContainers[0].name: Duplicate value"),
        ({"initContainers": [{"name": "s", "image": "i", "restartPolicy": "OnFailure"}]},
         "initContainers[0].restartPolicy: Unsupported value"),
    ],
)  # fmt: skip
def test_built_in_validation_of_pod_templates(http, change, reason):
    r = http.post(DEPLOY, json=_pod_deployment("bad", **change))
    assert r.status_code == 422, r.text
    assert reason in r.json()["message"]


def test_label_sizes_and_selector_vs_template(http):
    d = deployment("web")
    d["metadata"]["labels"] = {"team": "x" * 70}
    r = http.post(DEPLOY, json=d)
    assert r.status_code == 422 and "at most 63 characters" in r.text
    d = deployment("web")
    d["spec"]["template"]["metadata"]["labels"] = {"app": "other"}
    r = http.post(DEPLOY, json=d)
    assert r.status_code == 422 and "`selector` does not match template `labels`" in r.text
    assert http.post(DEPLOY, json=_pod_deployment("ok", initContainers=[
        {"name": "side", "image": "i", "restartPolicy": "Always"}])).status_code == 201  # fmt: skip


def test_dry_run_on_every_verb_validates_and_stores_nothing(kube, http):
    dry = {"dryRun": "All"}
    r = http.post(CM, params=dry, json=cm("a", x="1"))
    assert r.status_code == 201 and r.json()["data"] == {"x": "1"}
    assert http.get(f"{CM}/a").status_code == 404
    assert http.post(DEPLOY, params=dry, json=_pod_deployment("bad", volumes=[
        {"name": "v", "emptyDir": {}}] * 2)).status_code == 422  # fmt: skip
    http.post(CM, json=cm("b", x="1"))
    rv = http.get(f"{CM}/b").json()["metadata"]["resourceVersion"]
    r = http.patch(f"{CM}/b", params=dry, json={"data": {"x": "2"}}, headers=MERGE)
    assert r.status_code == 200 and r.json()["data"] == {"x": "2"}
    applied = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "b"},
        "data": {"y": "3"},
    }
    r = http.patch(f"{CM}/b", params={**dry, "fieldManager": "me", "force": "true"},
                   content=json.dumps(applied), headers=APPLY)  # fmt: skip
    assert r.status_code == 200 and r.json()["data"]["y"] == "3"
    r = http.request("DELETE", f"{CM}/b", json={"dryRun": ["All"]})
    assert r.status_code == 200
    r = http.delete(f"{CM}/b", params=dry)
    assert r.status_code == 200
    after = http.get(f"{CM}/b").json()
    assert after["data"] == {"x": "1"} and after["metadata"]["resourceVersion"] == rv
    assert http.post(CM, params={"dryRun": "Some"}, json=cm("c")).status_code == 400


TABLE = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}


def test_table_output_has_the_crds_printer_columns(kube, http):
    crd = json.loads(json.dumps(TOY_CRD))
    crd["spec"]["versions"][0]["additionalPrinterColumns"] = [
        {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
        {"name": "Ready", "type": "string",
         "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]  # fmt: skip
    kube.create(crd)
    kube.wait_for(lambda: http.get(TOYS).status_code == 200)
    http.post(TOYS, json=toy("t1", size=4))
    table = http.get(TOYS, headers=TABLE).json()
    assert table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Size", "Ready", "Age"]
    (row,) = table["rows"]
    assert row["cells"][:3] == ["t1", 4, None] and row["cells"][3].endswith("s")
    assert row["object"]["metadata"]["name"] == "t1"
    one = http.get(f"{TOYS}/t1", headers=TABLE).json()
    assert one["rows"][0]["cells"][0] == "t1"
    plain = http.get(f"{CM}", headers=TABLE).json()
    assert [c["name"] for c in plain["columnDefinitions"]] == ["Name", "Created At"]


def test_openapi_validation_of_built_in_objects_is_strict():
    with KubeEmulator(openapi_validate=True) as kube:
        bad = cm("a")
        bad["data"] = {"k": 1}
        with httpx.Client(base_url=kube.url, headers=ADMIN_HEADERS) as http:
            r = http.post(CM, json=bad)
            assert r.status_code == 422 and "data.k" in r.text, r.text
            typo = _pod_deployment("web")
            typo["spec"]["template"]["spec"]["containers"][0]["imagePullPolice"] = "Always"
            r = http.post(DEPLOY, json=typo)
            assert r.status_code == 422 and "imagePullPolice" in r.text, r.text
            assert http.post(DEPLOY, json=_pod_deployment("web")).status_code == 201


def test_keyed_list_duplicates_are_refused(kube, http):
    d = _pod_deployment("web")
    d["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "A", "value": "1"},
        {"name": "A", "value": "2"},
    ]
    r = http.patch(f"{DEPLOY}/web", params={"fieldManager": "me"}, content=json.dumps(d),
                   headers=APPLY)  # fmt: skip
    assert (
        r.status_code == 422 and 'duplicate entries for key [{"name":"A"}]' in r.json()["message"]
    )
    crd = json.loads(json.dumps(TOY_CRD))
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    props["properties"]["ports"] = {
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["name"],
        "items": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}},
        },
    }
    kube.create(crd)
    kube.wait_for(lambda: http.get(TOYS).status_code == 200)
    r = http.post(TOYS, json=toy("t", ports=[{"name": "a"}, {"name": "a"}]))
    assert r.status_code == 422 and "spec.ports[1]: Duplicate value" in r.text, r.text
