"""The checkpoint volume on a default cluster: its access mode follows what the run needs, a
ReadWriteOnce volume keeps its pods on one node, and a claim that is not provisioned is named in
the status with its event.

Default StorageClasses (EBS on EKS, Persistent Disk on GKE) offer ReadWriteOnce only; the claim
was ReadWriteMany whenever the rollout pool ran in the cluster, so it never bound and the status
said only that the trainer's pods were ``Unschedulable``.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gagar.operator.builders import build_all
from gagar.operator.observe import Observed, TrainerObserved, claim_problem
from gagar.operator.status import compute_status
from tests.unit.test_builders import example, one

RUN = "qwen3-swe-1node"  # examples/single-gpu.yaml
HOSTNAME = "kubernetes.io/hostname"


def _modes(**changes: Any) -> list[str]:
    pvc = one(build_all(example("single-gpu", **changes)), "PersistentVolumeClaim",
              f"{RUN}-checkpoints")  # fmt: skip
    return pvc["spec"]["accessModes"]


def _pod(objs: list[dict[str, Any]], kind: str, component: str) -> dict[str, Any]:
    return one(objs, kind, f"{RUN}-{component}")["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    ("changes", "mode"),
    [
        ({}, "ReadWriteMany"),  # Auto: the rollout replicas may land on other nodes
        ({"rollout": {"endpoint": "http://vllm:8000/v1"}}, "ReadWriteOnce"),  # the trainer alone
        ({"trainer.checkpoint.accessMode": "ReadWriteOnce"}, "ReadWriteOnce"),
        (
            {
                "rollout": {"endpoint": "http://vllm:8000/v1"},
                "trainer.checkpoint.accessMode": "ReadWriteMany",
            },
            "ReadWriteMany",
        ),
    ],
)
def test_access_mode_follows_what_the_run_needs(changes: dict[str, Any], mode: str) -> None:
    assert _modes(**changes) == [mode]


def test_a_read_write_once_volume_keeps_its_pods_on_one_node() -> None:
    objs = build_all(example("single-gpu", **{"trainer.checkpoint.accessMode": "ReadWriteOnce"}))
    for kind, component in (("Job", "trainer"), ("Deployment", "rollout")):
        (term,) = _pod(objs, kind, component)["affinity"]["podAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert term["topologyKey"] == HOSTNAME
        selector = term["labelSelector"]
        assert selector["matchLabels"] == {"gagar.dev/run": RUN}
        assert selector["matchExpressions"][0]["values"] == ["trainer", "rollout"]
    assert "affinity" not in _pod(objs, "Deployment", "grader")  # it mounts no checkpoints
    # ReadWriteMany (Auto here) or a trainer alone: no placement
    for changes in ({}, {"rollout": {"endpoint": "http://vllm:8000/v1"},
                         "trainer.checkpoint.accessMode": "ReadWriteOnce"}):  # fmt: skip
        objs = build_all(example("single-gpu", **changes))
        assert "affinity" not in _pod(objs, "Job", "trainer")


def test_the_users_affinity_is_merged_with_the_placement() -> None:
    mine = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"cache": "warm"}}, "topologyKey": "topology.kubernetes.io/zone"}]},
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}]}}}  # fmt: skip
    run = example("single-gpu", **{"trainer.checkpoint.accessMode": "ReadWriteOnce",
                                   "rollout.podTemplate": {"affinity": mine}})  # fmt: skip
    affinity = _pod(build_all(run), "Deployment", "rollout")["affinity"]
    terms = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert [t["topologyKey"] for t in terms] == [HOSTNAME, "topology.kubernetes.io/zone"]
    assert affinity["nodeAffinity"] == mine["nodeAffinity"]


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
