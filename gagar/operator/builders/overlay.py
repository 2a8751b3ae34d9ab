"""``spec.<component>.podTemplate``: the user's overlay on the pods the operator builds.

The operator's pod comes first and the overlay adds to it: labels and annotations, scheduling
(nodeSelector, tolerations, affinity, priorityClassName), imagePullSecrets, and for trainer,
rollout and grader pods also env/envFrom and extra volumes mounted in every container. Validation
(``gagar.spec.PodTemplate``) already refused what would collide with the operator's own names
(its labels, volumes, GAGAR_* variables), so adding never overrides. Sandbox pods take the
scheduling part only: nothing of the user's reaches the pods that run untrusted code.
Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from gagar.operator.builders.common import labels
from gagar.spec import GagarRun, PodScheduling, PodTemplate


def overlay_of(run: GagarRun, component: str) -> PodScheduling:
    spec = run.spec
    return {
        "trainer": spec.trainer.pod_template,
        "rollout": spec.rollout.pod_template,
        "grader": spec.grader.pod_template,
        "sandbox": spec.sandbox.pod_template,
    }[component]


def _scheduling(o: PodScheduling) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if o.node_selector:
        out["nodeSelector"] = dict(o.node_selector)
    if o.tolerations:
        out["tolerations"] = [t.to_wire() for t in o.tolerations]
    if o.affinity:
        out["affinity"] = dict(o.affinity)
    if o.priority_class_name:
        out["priorityClassName"] = o.priority_class_name
    if o.image_pull_secrets:
        out["imagePullSecrets"] = [r.to_wire() for r in o.image_pull_secrets]
    return out


def _container(container: dict[str, Any], o: PodTemplate) -> dict[str, Any]:
    out = dict(container)
    if o.env:
        out["env"] = [*container.get("env", []), *(e.to_wire() for e in o.env)]
    if o.env_from:
        out["envFrom"] = [*container.get("envFrom", []), *(e.to_wire() for e in o.env_from)]
    if o.volume_mounts:
        mounts = (m.to_wire() for m in o.volume_mounts)
        out["volumeMounts"] = [*container.get("volumeMounts", []), *mounts]
    return out


def pod_template(run: GagarRun, component: str, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod template of ``component``: the operator's ``pod`` spec with the run's overlay."""
    o = overlay_of(run, component)
    meta: dict[str, Any] = {"labels": {**o.labels, **labels(run, component)}}
    if o.annotations:
        meta["annotations"] = dict(o.annotations)
    spec = {**pod, **_scheduling(o)}
    if isinstance(o, PodTemplate):
        spec["containers"] = [_container(c, o) for c in pod["containers"]]
        if o.volumes:
            spec["volumes"] = [*pod.get("volumes", []), *(v.to_wire() for v in o.volumes)]
    return {"metadata": meta, "spec": spec}


def service_account_annotations(run: GagarRun, component: str) -> dict[str, str]:
    o = overlay_of(run, component)
    return dict(o.service_account_annotations) if isinstance(o, PodTemplate) else {}
