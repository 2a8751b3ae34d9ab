"""``spec.<component>.podTemplate``: the user's overlay on the pods the operator builds.

The operator's pod comes first and the overlay is merged into it by key, as Kubeflow Trainer's
pod overrides and strategic merge do: env by name, volumes by name, mounts by mountPath,
imagePullSecrets by name, topology spread constraints by (topologyKey, whenUnsatisfiable), init
containers by name (after the operator's, in the user's order; ``restartPolicy: Always`` makes one
a native sidecar; each requests cpu and memory unless it says otherwise), affinity merged with the
operator's (its terms appended: a ReadWriteOnce checkpoint volume's placement stays). Validation (``gagar.spec.PodTemplate``) already refused an entry whose key the
operator owns (its labels, volumes, mount paths, containers, GAGAR_* and NODE_RANK variables), so
the merge never overrides the operator; should a key still collide, the operator's entry wins and
the user's is dropped, so a rendered pod never has a duplicate. The pod ``securityContext`` is
merged key by key and there the user's keys win (documented in docs/spec.md). Sandbox pods take the
scheduling part only: nothing of the user's reaches the pods that run untrusted code.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from gagar.operator.builders.common import container_security, labels, requests_with_defaults
from gagar.spec import Container, GagarRun, PodScheduling, PodTemplate, ResourceRequirements


def overlay_of(run: GagarRun, component: str) -> PodScheduling:
    spec = run.spec
    return {
        "trainer": spec.trainer.pod_template,
        "rollout": spec.rollout.pod_template,
        "grader": spec.grader.pod_template,
        "sandbox": spec.sandbox.pod_template,
    }[component]


def merge_by_key(
    base: Iterable[dict[str, Any]],
    extra: Iterable[dict[str, Any]],
    key: Callable[[dict[str, Any]], Any],
) -> list[dict[str, Any]]:
    """``base`` then each entry of ``extra`` whose key no earlier entry has (the first wins)."""
    out: list[dict[str, Any]] = []
    seen = set()
    for entry in [*base, *extra]:
        if key(entry) not in seen:
            seen.add(key(entry))
            out.append(entry)
    return out


def _name(entry: dict[str, Any]) -> Any:
    return entry["name"]


def _path(entry: dict[str, Any]) -> Any:
    return entry["mountPath"]


def _spread(entry: dict[str, Any]) -> Any:
    return (entry["topologyKey"], entry["whenUnsatisfiable"])


def merge_affinity(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """The operator's ``affinity`` with the user's: lists of terms (pod (anti-)affinity's
    required and preferred terms) concatenated, anything else (node affinity's required
    selector) the user's."""
    out = dict(base)
    for kind, rules in extra.items():
        mine = base.get(kind) or {}
        out[kind] = {**mine}
        for key, value in rules.items():
            both = isinstance(value, list) and isinstance(mine.get(key), list)
            out[kind][key] = [*mine[key], *value] if both else value
    return out


def _scheduling(pod: dict[str, Any], o: PodScheduling) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if o.node_selector:
        out["nodeSelector"] = {**pod.get("nodeSelector", {}), **o.node_selector}
    if o.tolerations:
        out["tolerations"] = [*pod.get("tolerations", []), *(t.to_wire() for t in o.tolerations)]
    if o.affinity:
        out["affinity"] = merge_affinity(pod.get("affinity") or {}, o.affinity.to_wire())
    if o.topology_spread_constraints:
        extra = (c.to_wire() for c in o.topology_spread_constraints)
        out["topologySpreadConstraints"] = merge_by_key(
            pod.get("topologySpreadConstraints", []), extra, _spread
        )
    if o.priority_class_name:
        out["priorityClassName"] = o.priority_class_name
    if o.scheduler_name:
        out["schedulerName"] = o.scheduler_name
    if o.image_pull_secrets:
        extra = (r.to_wire() for r in o.image_pull_secrets)
        out["imagePullSecrets"] = merge_by_key(pod.get("imagePullSecrets", []), extra, _name)
    return out


def _container(container: dict[str, Any], o: PodTemplate) -> dict[str, Any]:
    out = dict(container)
    if o.env:
        out["env"] = merge_by_key(container.get("env", []), (e.to_wire() for e in o.env), _name)
    if o.env_from:
        out["envFrom"] = [*container.get("envFrom", []), *(e.to_wire() for e in o.env_from)]
    if o.volume_mounts:
        mounts = (m.to_wire() for m in o.volume_mounts)
        out["volumeMounts"] = merge_by_key(container.get("volumeMounts", []), mounts, _path)
    return out


# Requests of a user's init container or sidecar that names none: a namespace whose ResourceQuota
# covers cpu or memory refuses a pod in which any container (init containers and sidecars too)
# lacks the request, and a sidecar's request is what the scheduler reserves for it beside the
# component's containers. Small: a sidecar that needs more says so in its ``resources``.
INIT_DEFAULT_REQUESTS = {"cpu": "100m", "memory": "128Mi"}


def _init_container(c: Container) -> dict[str, Any]:
    """A user's init container or sidecar, with the operator's restricted security context
    under the keys it names of its own, a cpu and memory request unless it names them (or their limits);
    empty lists left out."""
    out = {k: v for k, v in c.to_wire().items() if v not in ([], {})}
    # the user's keys over the operator's restricted context (trust.py refuses those that
    # leave ``restricted`` unless the operator's configuration allows them)
    out["securityContext"] = {**container_security(), **(c.security_context or {})}
    req = c.resources or ResourceRequirements()
    out["resources"] = requests_with_defaults(req, INIT_DEFAULT_REQUESTS)
    return out


def _workload(pod: dict[str, Any], o: PodTemplate) -> dict[str, Any]:
    out: dict[str, Any] = {"containers": [_container(c, o) for c in pod["containers"]]}
    if o.volumes:
        extra = (v.to_wire() for v in o.volumes)
        out["volumes"] = merge_by_key(pod.get("volumes", []), extra, _name)
    if o.init_containers:
        extra = (_init_container(c) for c in o.init_containers)
        taken = {c["name"] for c in pod["containers"]}
        init = merge_by_key(pod.get("initContainers", []), extra, _name)
        out["initContainers"] = [c for c in init if c["name"] not in taken]
    if o.security_context:
        out["securityContext"] = {**pod.get("securityContext", {}), **o.security_context}
    return out


def pod_template(run: GagarRun, component: str, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod template of ``component``: the operator's ``pod`` spec with the run's overlay."""
    o = overlay_of(run, component)
    meta: dict[str, Any] = {"labels": {**o.labels, **labels(run, component)}}
    if o.annotations:
        meta["annotations"] = dict(o.annotations)
    spec = {**pod, **_scheduling(pod, o)}
    if isinstance(o, PodTemplate):
        spec.update(_workload(pod, o))
    return {"metadata": meta, "spec": spec}


def service_account_annotations(run: GagarRun, component: str) -> dict[str, str]:
    o = overlay_of(run, component)
    return dict(o.service_account_annotations) if isinstance(o, PodTemplate) else {}
