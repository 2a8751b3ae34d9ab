"""What counts as drift (``Reconciler.drifted``): a field the operator's last apply owned that it
owns no more (someone else changed or removed it), never a mere higher ``generation`` (an
autoscaler's replicas, Kueue's admission of a suspended trainer); plus the watches that bring
every kind of child's events (``child_watches``). No cluster: bodies as the API returns them."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from gagar.metrics import Metrics
from gagar.operator.builders import CHILD_KINDS
from gagar.operator.handlers import (
    RUN_LABEL,
    OperatorConfig,
    Owned,
    Reconciler,
    child_watches,
    feeds_status,
)
from gagar.operator.kube import FIELD_MANAGER
from gagar.operator.observe import owned_fields

APPLIED = {"f:metadata": {"f:labels": {f"f:{RUN_LABEL}": {}}},
           "f:spec": {"f:replicas": {}, "f:template": {"f:spec": {"f:containers": {
               'k:{"name":"vllm"}': {".": {}, "f:image": {}}}}}}}  # fmt: skip


def body(kind: str, generation: int, *entries: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    fields = [{"manager": m, "operation": op, "fieldsV1": f} for m, op, f in entries]
    return {
        "kind": kind,
        "metadata": {"name": "r-rollout", "namespace": "ns", "generation": generation,
                     "labels": {RUN_LABEL: "r"}, "managedFields": fields},
    }  # fmt: skip


def reconciler(kind: str, generation: int = 1) -> Reconciler:
    rec = Reconciler(None, Metrics(CollectorRegistry(), "operator"), OperatorConfig())  # type: ignore[arg-type]
    owned = owned_fields(body(kind, generation, (FIELD_MANAGER, "Apply", APPLIED)), FIELD_MANAGER)
    rec.memory("ns", "r").owned[kind, "r-rollout"] = Owned(generation, owned)
    return rec


def test_owned_fields_are_the_paths_of_the_operator_s_apply_entry() -> None:
    obj = body("Deployment", 1, ("kubectl", "Update", {"f:spec": {"f:paused": {}}}),
               (FIELD_MANAGER, "Update", {"f:spec": {"f:x": {}}}),
               (FIELD_MANAGER, "Apply", APPLIED))  # fmt: skip
    paths = owned_fields(obj, FIELD_MANAGER)
    assert ("f:spec", "f:replicas") in paths and ("f:spec", "f:paused") not in paths
    assert ("f:spec", "f:x") not in paths  # an Update entry: not what the operator applies
    assert ("f:spec", "f:template", "f:spec", "f:containers", 'k:{"name":"vllm"}', "f:image") in (
        paths
    )


def test_an_autoscaler_s_replicas_are_no_drift_but_a_hand_edit_of_owned_ones_is() -> None:
    without_replicas = {"f:metadata": APPLIED["f:metadata"],
                        "f:spec": {"f:template": APPLIED["f:spec"]["f:template"]}}  # fmt: skip
    rec = Reconciler(None, Metrics(CollectorRegistry(), "operator"), OperatorConfig())  # type: ignore[arg-type]
    autoscaled = body("Deployment", 1, (FIELD_MANAGER, "Apply", without_replicas))
    rec.memory("ns", "r").owned["Deployment", "r-rollout"] = Owned(
        1, owned_fields(autoscaled, FIELD_MANAGER)
    )
    scaled = body("Deployment", 2, (FIELD_MANAGER, "Apply", without_replicas),
                  ("hpa", "Update", {"f:spec": {"f:replicas": {}}}))  # fmt: skip
    assert not rec.drifted(scaled, deleted=False)  # generation 2, and still no drift
    # a pool whose replicas the run sets: scaling it by hand moves that field away: drift
    rec = reconciler("Deployment")
    edited = body("Deployment", 2, (FIELD_MANAGER, "Apply", without_replicas),
                  ("kubectl", "Update", {"f:spec": {"f:replicas": {}}}))  # fmt: skip
    assert rec.drifted(edited, deleted=False)
    # ... a rollout restart's annotation is not the operator's field: no drift
    restarted = body("Deployment", 2, (FIELD_MANAGER, "Apply", APPLIED),
                     ("kubectl", "Update", {"f:spec": {"f:template": {"f:metadata": {}}}}))  # fmt: skip
    assert not rec.drifted(restarted, deleted=False)
    assert rec.drifted(body("Deployment", 1), deleted=True)


def test_events_older_than_the_apply_or_of_the_apply_itself_are_not_judged() -> None:
    rec = reconciler("Deployment", generation=3)
    stale = body("Deployment", 2, (FIELD_MANAGER, "Apply", {"f:spec": {}}))
    assert not rec.drifted(stale, deleted=False)  # before the apply: its own event comes later
    rec.memory("ns", "r").applying.add(("Deployment", "r-rollout"))
    assert not rec.drifted(body("Deployment", 4), deleted=False)


def test_a_trainer_s_pod_template_written_by_its_queue_is_no_drift() -> None:
    """Kueue's admission replaces the tolerations list (atomic) of a suspended Job that never
    started: the only time anyone can change a Job's pod template."""
    rec = reconciler("Job")
    admitted = {"f:metadata": APPLIED["f:metadata"], "f:spec": {"f:replicas": {}}}
    assert not rec.drifted(body("Job", 2, (FIELD_MANAGER, "Apply", admitted)), deleted=False)
    lost_label = {"f:spec": APPLIED["f:spec"]}
    assert rec.drifted(body("Job", 2, (FIELD_MANAGER, "Apply", lost_label)), deleted=False)


def test_every_kind_of_child_is_watched_and_only_status_inputs_reconcile_every_event() -> None:
    kinds = {plural for _, _, plural in child_watches(frozenset())}
    assert {"networkpolicies", "poddisruptionbudgets", "services", "serviceaccounts", "roles",
            "rolebindings", "persistentvolumeclaims", "horizontalpodautoscalers"} <= kinds  # fmt: skip
    assert "scaledobjects" not in kinds and "jobsets" not in kinds  # integrations off: no RBAC
    every = child_watches(frozenset({"keda.sh", "jobset.x-k8s.io", "monitoring.coreos.com",
                                     "extensions.agents.x-k8s.io"}))  # fmt: skip
    assert len(every) == len(CHILD_KINDS)
    assert feeds_status({"kind": "Deployment"}) and not feeds_status({"kind": "NetworkPolicy"})
    progress = {"kind": "ConfigMap",
                "metadata": {"labels": {"app.kubernetes.io/component": "progress"}}}  # fmt: skip
    assert feeds_status(progress) and not feeds_status({"kind": "ConfigMap"})
