"""What a forced re-apply leaves to a queue on an admitted trainer Job (``leave_to_queue``): the
scheduling fields of its pod template another manager (Kueue) owns on the live Job."""

from __future__ import annotations

from typing import Any

from gagar.operator.observe import leave_to_queue

OURS = frozenset({"gagar-operator", "gagar-kueue-handoff"})
OWN = {"key": "team", "operator": "Exists"}


def _job(pod: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "Job", "spec": {"parallelism": 1, "template": {"spec": pod}}}


def _live(manager: str, pod_fields: dict[str, Any]) -> dict[str, Any]:
    fields = {"f:spec": {"f:template": {"f:spec": pod_fields}}}
    entry = {"manager": manager, "operation": "Update", "fieldsV1": fields}
    return {"metadata": {"managedFields": [entry]}}


DESIRED = _job({
    "containers": [{"name": "trainer"}],
    "tolerations": [OWN],
    "nodeSelector": {"pool": "gpu", "cloud.google.com/gke-accelerator": "x"},
    "affinity": {"nodeAffinity": {"required": 1}, "podAffinity": {"terms": 1}},
})  # fmt: skip


def test_kueues_fields_are_left_to_kueue() -> None:
    kueue = _live("kueue", {"f:tolerations": {},
                            "f:nodeSelector": {"f:cloud.google.com/gke-accelerator": {}},
                            "f:affinity": {"f:nodeAffinity": {"f:required": {}}}})  # fmt: skip
    pod = leave_to_queue(DESIRED, kueue, OURS)["spec"]["template"]["spec"]
    assert pod == {
        "containers": [{"name": "trainer"}],
        "nodeSelector": {"pool": "gpu"},  # a map: only Kueue's keys go
        "affinity": {"podAffinity": {"terms": 1}},
    }
    assert DESIRED["spec"]["template"]["spec"]["tolerations"] == [OWN]  # not edited in place


def test_what_only_the_operator_wrote_is_applied_as_built() -> None:
    for live in (_live("gagar-operator", {"f:tolerations": {}}), {"metadata": {}}):
        assert leave_to_queue(DESIRED, live, OURS) == DESIRED


def test_a_jobsets_replicated_job_leaves_kueues_fields_too() -> None:
    pod = {"containers": [{"name": "trainer"}], "tolerations": [OWN]}
    jobset = {"kind": "JobSet", "spec": {"replicatedJobs": [
        {"name": "node", "replicas": 1, "template": {"spec": {"template": {"spec": pod}}}}]}}  # fmt: skip
    rj = {"f:template": {"f:spec": {"f:template": {"f:spec": {"f:tolerations": {}}}}}}
    fields = {"f:spec": {"f:replicatedJobs": {'k:{"name":"node"}': rj}}}
    live = {"metadata": {"managedFields": [
        {"manager": "kueue", "operation": "Update", "fieldsV1": fields}]}}  # fmt: skip
    out = leave_to_queue(jobset, live, OURS)
    assert out["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"] == {
        "containers": [{"name": "trainer"}]
    }
