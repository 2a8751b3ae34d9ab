"""Drift and the writes that are not drift, against the emulator with the real kopf runtime (the
harness of tests/integration/test_operator_scenarios.py).

- Every kind of child is watched: one deleted comes back at once, and alone (one apply), where a
  deleted NetworkPolicy or PodDisruptionBudget once stayed missing (only Jobs, Deployments and
  the progress ConfigMap were watched, and the resync applies only a changed desired state).
- Drift is a field the operator applies that someone else changed (its ownership moved away),
  not a higher ``generation``: an autoscaler scaling a pool through ``/scale`` and Kueue
  admitting a suspended trainer (its node selector and tolerations) cost no apply, where each
  once cost a forced re-apply of every child (about 35 requests, 22 of them PATCH).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gagar.operator.kube import PLURALS
from tests.integration.test_operator_scenarios import (
    HPA,
    KUEUE_API,
    OPERATOR_SA,
    REAL,
    Env,
    make_env,
    manifest,
    optional_crd,
)
from tests.kube_emulator import KubeEmulator

OPERATOR = "system:serviceaccount:{}:{}".format(*OPERATOR_SA)
READS = frozenset({"get", "list", "watch"})
RETURN_S = 5.0  # a deleted child is back within this (the resync never re-applies it)
KINDS = dict(  # the kinds of child Env.children lists, and their API versions
    ConfigMap="v1", ServiceAccount="v1", Service="v1", PersistentVolumeClaim="v1",
    Deployment="apps/v1", HorizontalPodAutoscaler="autoscaling/v2",
    NetworkPolicy="networking.k8s.io/v1", PodDisruptionBudget="policy/v1",
    Role="rbac.authorization.k8s.io/v1", RoleBinding="rbac.authorization.k8s.io/v1",
)  # fmt: skip


@pytest.fixture(params=["real"] if REAL else ["emulator"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    yield from make_env(request.param, tmp_path)


def operator_requests(emulator: KubeEmulator, since: int) -> list[dict[str, Any]]:
    """The operator's requests after the first ``since`` (watches left out)."""
    return [
        r
        for r in emulator.requests_for()[since:]
        if r.get("user") == OPERATOR and r["verb"] != "watch"
    ]


def applies(requests: list[dict[str, Any]]) -> list[str]:
    """The paths of the server-side applies among ``requests``."""
    return [
        r["path"] for r in requests if (r.get("content_type") or "").startswith("application/apply")
    ]


def quiet(emulator: KubeEmulator, env: Env, still: float = 1.5) -> None:
    """Until the operator has written nothing for ``still`` seconds (its resync keeps reading):
    the reconciles of what came before (start-up, the last child's return) are over. A fixed
    sleep is not enough on a loaded machine (at a load of 9 on 2 cores a start-up reconcile's
    Deployment applies once fell into the next deletion's window)."""
    seen = [-1, time.monotonic()]

    def settled() -> bool:
        n = sum(r["verb"] not in READS for r in operator_requests(emulator, 0))
        if n != seen[0]:
            seen[:] = [n, time.monotonic()]
        return time.monotonic() - seen[1] >= still

    env.wait(settled, timeout=60.0, what="the operator quiet")


def ready(env: Env, name: str) -> None:
    """The run Ready and the reconciles of its start-up over (the operator writes nothing)."""
    env.wait(lambda: env.condition(name, "Ready").get("status") == "True", what="Ready")
    if env.emulator is not None:
        quiet(env.emulator, env)
    else:
        time.sleep(1.0)  # the last events of start-up pass


def test_every_kind_of_child_deleted_comes_back_alone(env: Env) -> None:
    """Each child, of every kind, deleted in turn (a user, a cleanup script, a namespace
    policy): it is back within ``RETURN_S`` (the watch's event, not the resync), and the operator
    applies that child only."""
    emulator = env.need_emulator()
    run = manifest(**{"rollout.replicas": None, "rollout.autoscaling": HPA})
    name = run["metadata"]["name"]
    with env.operator():
        env.create(run)
        ready(env, name)
        children = [c for c in env.children(name) if c[0] != "Job"]  # the trainer: its own test
        kinds = {kind for kind, _, _ in children}
        assert {"NetworkPolicy", "PodDisruptionBudget", "HorizontalPodAutoscaler"} <= kinds
        back: dict[str, float] = {}
        for kind, child, uid in children:
            api = KINDS[kind]
            quiet(emulator, env)
            since, started = len(emulator.requests_for()), time.monotonic()
            env.kube.delete(api, kind, env.namespace, child)
            env.wait(
                lambda a=api, k=kind, c=child, u=uid: (
                    (o := env.get(a, k, c)) is not None and o["metadata"]["uid"] != u
                ),
                timeout=20.0,
                what=f"{kind}/{child} back",
            )
            back[f"{kind}/{child}"] = round(time.monotonic() - started, 2)
            quiet(emulator, env, still=0.5)  # the reconciles its return causes
            paths = applies(operator_requests(emulator, since))
            assert paths and all(p.endswith(f"/{PLURALS[kind]}/{child}") for p in paths), paths
        print("seconds until each deleted child was back:", back)
        assert max(back.values()) < RETURN_S, back


def test_an_autoscaler_scaling_a_pool_is_not_drift(env: Env) -> None:
    """The HPA (or KEDA, through its HPA) scales an autoscaled pool through ``/scale``: the
    operator applies nothing (it does not own ``replicas`` of that pool) and only follows the
    pool's status; the replicas stay the autoscaler's."""
    emulator = env.need_emulator()
    run = manifest(**{"rollout.replicas": None, "rollout.autoscaling": HPA})
    name, dep = run["metadata"]["name"], f"{run['metadata']['name']}-rollout"
    with env.operator():
        env.create(run)
        ready(env, name)
        since = len(emulator.requests_for())
        for replicas in (3, 5, 2):
            scale = {"spec": {"replicas": replicas}}
            env.kube.merge_patch("apps/v1", "Deployment", env.namespace, dep, scale, "scale")
            env.wait(
                lambda r=replicas: (
                    env.status(name).get("pools", {}).get("rollout", {}).get("readyReplicas") == r
                ),
                what=f"{replicas} ready",
            )
        time.sleep(env.resync * 2)
        window = operator_requests(emulator, since)
        assert applies(window) == [], applies(window)
        writes = [r for r in window if r["verb"] not in ("get", "list")]
        # the status follows the pool (a few patches per scale as its pods become ready)
        # and events: a new one (POST .../events) or a repeat counted on it (PATCH .../events/X)
        assert all(
            r["path"].endswith(("/status", "/events")) or "/events/" in r["path"] for r in writes
        ), writes
        print(f"operator requests over 3 scales and 2 resyncs: {len(window)}, writes {len(writes)}")
        assert env.get("apps/v1", "Deployment", dep)["spec"]["replicas"] == 2


def test_a_pool_scaled_by_hand_is_drift_repaired_by_one_apply(env: Env) -> None:
    """A pool whose replicas the run sets, scaled by hand through ``/scale``: the operator owns
    that field, so it is drift, repaired by applying that Deployment only."""
    emulator = env.need_emulator()
    run = manifest()
    name, dep = run["metadata"]["name"], f"{run['metadata']['name']}-rollout"
    with env.operator():
        env.create(run)
        ready(env, name)
        want = env.get("apps/v1", "Deployment", dep)["spec"]["replicas"]
        since = len(emulator.requests_for())
        scale = {"spec": {"replicas": want + 3}}
        env.kube.merge_patch("apps/v1", "Deployment", env.namespace, dep, scale, "scale")
        env.wait(lambda: env.get("apps/v1", "Deployment", dep)["spec"]["replicas"] == want + 3)
        env.wait(
            lambda: env.get("apps/v1", "Deployment", dep)["spec"]["replicas"] == want,
            what="drift repaired",
        )
        time.sleep(env.resync * 1.5)
        paths = applies(operator_requests(emulator, since))
        assert paths and all(p.endswith(f"/deployments/{dep}") for p in paths), paths


def test_kueue_admitting_a_suspended_trainer_is_not_drift(env: Env) -> None:
    """Kueue admits the queued trainer as it does: one update that unsuspends the Job and sets
    the flavor's node selector and tolerations in its pod template (taking over the run's own
    tolerations list). The server (and so the emulator) allows that change of a suspended Job
    that never started; the operator applies nothing in answer (applying the run's tolerations
    again would be refused: the Job runs now), and Kueue's fields stay."""
    if not env.simulated:
        pytest.skip("installs a stand-in Workload CRD and plays Kueue")
    emulator = env.need_emulator()
    env.kube.create(optional_crd("kueue.x-k8s.io", "Workload", "workloads", "v1beta1"))
    own = {"key": "team", "operator": "Exists", "effect": "NoSchedule"}
    run = manifest(**{"trainer.queueName": "team-a", "trainer.podTemplate.tolerations": [own]})
    name, job = run["metadata"]["name"], f"{run['metadata']['name']}-trainer"
    with env.operator(integrations=frozenset({"kueue.x-k8s.io"})):
        env.create(run)
        created = env.wait(lambda: env.get("batch/v1", "Job", job), what="trainer Job")
        assert created["spec"]["suspend"] is True
        env.kube.create({
            "apiVersion": KUEUE_API, "kind": "Workload",
            "metadata": {"name": f"job-{job}", "namespace": env.namespace,
                         "labels": {"kueue.x-k8s.io/job-uid": created["metadata"]["uid"]}},
            "spec": {"queueName": "team-a"},
        })  # fmt: skip
        env.wait(lambda: env.status(name).get("phase"), what="a status")
        time.sleep(1.0)
        since = len(emulator.requests_for())
        flavor = {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
        # Kueue appends the flavor's tolerations: the whole list is written (an atomic list)
        tolerations = [own, {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        admission = {"spec": {"suspend": False, "template": {"spec": {
            "nodeSelector": flavor, "tolerations": tolerations}}}}  # fmt: skip
        url = f"/apis/batch/v1/namespaces/{env.namespace}/jobs/{job}"
        env.kube._call("PATCH", url, body=admission, query=[("fieldManager", "kueue")],
                       content_type="application/merge-patch+json")  # fmt: skip
        time.sleep(env.resync * 2.5)
        window = operator_requests(emulator, since)
        assert applies(window) == [], applies(window)
        pod = env.get("batch/v1", "Job", job)["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == flavor and pod["tolerations"] == tolerations
        assert env.get("batch/v1", "Job", job)["spec"]["suspend"] is False
