"""The checkpoint volume on a default cluster: its access mode follows what the run needs, the
rollout pool reads the weights through the trainer (so the volume is the trainer's alone), and a
claim that is not provisioned is named in the status with its event.

Default StorageClasses (EBS on EKS, Persistent Disk on GKE) offer ReadWriteOnce only; the claim
was ReadWriteMany whenever the rollout pool ran in the cluster (its replicas read the published
weights from the volume), so it never bound and the status said only that the trainer's pods were
``Unschedulable``; a ReadWriteOnce volume then forced every replica onto the trainer's node.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gagar import env
from gagar.operator.builders import build_all
from gagar.operator.builders.common import JOBSET, BuildContext
from gagar.operator.observe import Observed, TrainerObserved, claim_problem
from gagar.operator.status import compute_status
from tests.unit.test_builders import example, one

RUN = "qwen3-swe-1node"  # examples/single-gpu.yaml
WEIGHTS_URL = f"http://{RUN}-trainer-0.{RUN}-trainer-rdzv:8600"


def _modes(**changes: Any) -> list[str]:
    pvc = one(build_all(example("single-gpu", **changes)), "PersistentVolumeClaim",
              f"{RUN}-checkpoints")  # fmt: skip
    return pvc["spec"]["accessModes"]


def _pod(objs: list[dict[str, Any]], kind: str, component: str) -> dict[str, Any]:
    return one(objs, kind, f"{RUN}-{component}")["spec"]["template"]["spec"]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.mark.parametrize(
    ("changes", "mode"),
    [
        ({}, "ReadWriteOnce"),  # Auto, in-cluster rollout pool, one trainer node: the trainer alone
        ({"rollout": {"endpoint": "http://vllm:8000/v1"}}, "ReadWriteOnce"),
        ({"trainer.nodes": 2}, "ReadWriteMany"),  # the trainer's pods on several nodes
        ({"trainer.checkpoint.accessMode": "ReadWriteOnce"}, "ReadWriteOnce"),
        ({"trainer.checkpoint.accessMode": "ReadWriteMany"}, "ReadWriteMany"),
    ],
)
def test_access_mode_follows_what_the_run_needs(changes: dict[str, Any], mode: str) -> None:
    assert _modes(**changes) == [mode]


@pytest.mark.parametrize("mode", ["Auto", "ReadWriteOnce", "ReadWriteMany"])
def test_the_rollout_pool_mounts_no_checkpoint_volume_and_goes_anywhere(mode: str) -> None:
    objs = build_all(example("single-gpu", **{"trainer.checkpoint.accessMode": mode}))
    rollout = _pod(objs, "Deployment", "rollout")
    assert "checkpoints" not in {v["name"] for v in rollout["volumes"]}
    for c in [*rollout["initContainers"], *rollout["containers"]]:
        assert all(m["name"] != "checkpoints" for m in c["volumeMounts"]), c["name"]
    assert {v["name"]: v for v in rollout["volumes"]}["weights"] == {"name": "weights",
                                                                     "emptyDir": {}}  # fmt: skip
    for kind, component in (("Job", "trainer"), ("Deployment", "rollout")):
        assert "affinity" not in _pod(objs, kind, component)  # no placement beside the trainer
    trainer = _pod(objs, "Job", "trainer")
    claim = {v["name"]: v for v in trainer["volumes"]}["checkpoints"]["persistentVolumeClaim"]
    assert claim == {"claimName": f"{RUN}-checkpoints"}  # the trainer's, read-write


def test_a_replica_boots_from_and_updates_through_the_trainers_weight_server() -> None:
    objs = build_all(example("single-gpu"))
    trainer = _pod(objs, "Job", "trainer")["containers"][0]
    assert _env(trainer)[env.WEIGHTS_URL] == WEIGHTS_URL
    assert {"name": "weights", "containerPort": 8600} in trainer["ports"]
    rollout = _pod(objs, "Deployment", "rollout")
    (fetch,) = rollout["initContainers"]
    assert fetch["command"] == ["gagar"]
    assert fetch["args"][:2] == ["rollout", "fetch-weights"]
    assert f"--url={WEIGHTS_URL}" in fetch["args"] and "--dest=/gagar/weights/boot" in fetch["args"]
    assert fetch["volumeMounts"] == [{"name": "weights", "mountPath": "/gagar/weights"}]
    vllm = rollout["containers"][0]
    for c in (fetch, vllm):  # the run's token, from its Secret, to present to the trainer
        ref = _env(c)[env.WEIGHT_SYNC_TOKEN]["secretKeyRef"]
        assert ref == {"name": f"{RUN}-weight-sync", "key": "token"}
    assert _env(vllm)[env.WEIGHTS_URL] == WEIGHTS_URL  # the one source its workers accept
    assert _env(vllm)[env.WEIGHTS_DIR] == "/gagar/weights"
    assert "/gagar/weights/boot" in vllm["command"][2]  # boots from what the init fetched
    rdzv = one(objs, "Service", f"{RUN}-trainer-rdzv")["spec"]
    assert {"name": "weights", "port": 8600, "targetPort": 8600} in rdzv["ports"]


def test_the_trainers_policy_lets_the_rollout_pods_reach_its_weight_server_only() -> None:
    policy = one(build_all(example("single-gpu")), "NetworkPolicy", f"{RUN}-trainer")["spec"]
    rules = [r for r in policy["ingress"] if r["from"][0].get("podSelector", {}).get(
        "matchLabels", {}).get("app.kubernetes.io/component") == "rollout"]  # fmt: skip
    assert rules == [{
        "from": [{"podSelector": {"matchLabels": {
            "gagar.dev/run": RUN, "app.kubernetes.io/component": "rollout"}}}],
        "ports": [{"protocol": "TCP", "port": 8600}],
    }]  # fmt: skip
    external = example("single-gpu", rollout={"endpoint": "http://vllm:8000/v1"})
    objs = build_all(external)
    policy = one(objs, "NetworkPolicy", f"{RUN}-trainer")["spec"]
    assert len(policy["ingress"]) == 2  # its own ranks and the scraper: no pool, no server
    assert env.WEIGHTS_URL not in _env(_pod(objs, "Job", "trainer")["containers"][0])


def test_a_jobset_trainer_serves_its_weights_under_jobsets_own_service() -> None:
    run = example("flash-moe")
    objs = build_all(run, BuildContext(crds=frozenset({JOBSET})))
    name = run.metadata.name
    jobset = one(objs, "JobSet", f"{name}-trainer")["spec"]
    pod = jobset["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    url = f"http://{name}-trainer-node-0-0.{name}-trainer-rdzv:8600"
    assert _env(pod["containers"][0])[env.WEIGHTS_URL] == url
    assert jobset["network"]["subdomain"] == f"{name}-trainer-rdzv"
    fetch = one(objs, "Deployment", f"{name}-rollout")["spec"]["template"]["spec"][
        "initContainers"][0]  # fmt: skip
    assert f"--url={url}" in fetch["args"]


def test_a_read_write_once_volume_needs_a_one_node_trainer() -> None:
    with pytest.raises(ValidationError, match="ReadWriteOnce checkpoint volume is mounted on one"):
        example("single-gpu", **{"trainer.checkpoint.accessMode": "ReadWriteOnce",
                                 "trainer.nodes": 2})  # fmt: skip


def _claim(phase: str | None) -> dict[str, Any]:
    status = {"phase": phase} if phase else {}
    return {"metadata": {"name": "demo-checkpoints"}, "status": status}


def _event(kind: str, reason: str, message: str, when: str) -> dict[str, Any]:
    return {"type": kind, "reason": reason, "message": message, "lastTimestamp": when}


FAILED = _event("Warning", "ProvisioningFailed", "Volume capabilities not supported",
                "2026-01-01T00:00:05Z")  # fmt: skip
WAITING = _event("Normal", "WaitForFirstConsumer", "waiting for first consumer",
                 "2026-01-01T00:00:01Z")  # fmt: skip


def test_a_pending_claim_is_named_with_its_newest_warning() -> None:
    assert claim_problem(_claim("Pending"), [WAITING, FAILED]) == (
        "PersistentVolumeClaim demo-checkpoints is Pending: ProvisioningFailed: "
        "Volume capabilities not supported"
    )
    assert claim_problem(_claim("Pending"), [WAITING]) is None  # a consumer will come
    assert claim_problem(_claim("Bound"), [FAILED]) is None
    assert claim_problem(_claim(None), [FAILED]) is None
    assert claim_problem(None, [FAILED]) is None


def test_the_status_names_the_pending_claim() -> None:
    problem = claim_problem(_claim("Pending"), [FAILED])
    spec = example("single-gpu").spec
    obs = Observed(trainer=TrainerObserved(active=1, ready=0), claim_pending=problem)
    status = compute_status(spec, obs, None, "2026-01-01T00:01:00Z").status
    conditions = {c.type: c for c in status.conditions}
    for kind in ("TrainerReady", "Ready"):
        assert conditions[kind].status == "False"
        assert conditions[kind].reason == "CheckpointClaimPending"
        assert conditions[kind].message.startswith(f"{problem}. The StorageClass must offer")
