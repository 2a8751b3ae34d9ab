"""Pure parsing of observed children (dicts from the API) into the small facts status needs.

Kept apart from the calculator so ``status.py`` never looks into raw API objects. Pure: no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gagar.operator.builders.common import (
    ATTEMPT_ANNOTATION,
    IN_A_ROW_ANNOTATION,
    RESUMED_ANNOTATION,
    TEMPLATE_ANNOTATION,
)


@dataclass(frozen=True)
class TrainerObserved:
    """The trainer Job or JobSet, as far as status is concerned."""

    kind: str = "Job"
    uid: str = ""  # of the Job: a restart deletes exactly the object it observed
    attempt: int = 0
    active: int = 0
    ready: int = 0
    suspended: bool = False
    complete: bool = False
    failed: bool = False
    failed_reason: str = ""
    failed_message: str = ""
    failed_time: str | None = None  # when the Failed condition became True
    restarts: int = 0  # JobSet's own restart counter (a Job never restarts itself)
    in_a_row: int = 0  # the failure policy's restarts in a row when this Job was applied
    resumed_from: int | None = None  # newest checkpoint step at the restart that made this Job
    start_time: str | None = None
    template_hash: str = ""  # of the immutable spec it was built from ("" when unknown)


def environment_pool(environment: str) -> str:
    """The key of a task environment's executor pool among ``Observed.pools`` and
    ``status.pools`` (the default pool's is ``sandbox``)."""
    return f"sandbox/{environment}"


@dataclass(frozen=True)
class PoolObserved:
    """A pool's Deployment: desired (whoever wrote it), current and ready replicas."""

    desired: int = 0
    replicas: int = 0
    ready: int = 0
    selector: str = ""  # the Deployment's pod selector, as ``key=value,...``


@dataclass(frozen=True)
class Progress:
    """What the trainer last reported in ``<run>-progress`` (see builders.config)."""

    step: int | None = None
    policy_version: int | None = None
    rollout_policy_version: int | None = None
    checkpoint_step: int | None = None
    checkpoint_uri: str | None = None
    checkpoint_time: str | None = None
    start_time: str | None = None
    sandbox_images: str | None = None  # the task images it wants pools of, raw (builders.images)


@dataclass(frozen=True)
class Observed:
    """Everything the status calculator looks at besides the spec and the previous status.

    ``spec_error``: why the spec is invalid (with the field path), when it is. ``apply_error``: a
    permanent error applying children (e.g. 422), which needs a human. ``waiting``: reasons pods
    wait (``ImagePullBackOff``, ``Unschedulable``...), for messages.
    """

    generation: int = 1
    trainer: TrainerObserved | None = None
    pools: dict[str, PoolObserved] = field(default_factory=dict)
    progress: Progress = field(default_factory=Progress)
    spec_error: str | None = None
    apply_error: str | None = None
    apply_reason: str = "ApplyFailed"  # the Stalled reason of ``apply_error``
    waiting: tuple[str, ...] = ()
    sandbox_refused: str | None = None  # why sandbox pods exit at start (sandbox_refusal)
    claim_pending: str | None = None  # the checkpoint claim's provisioning failure (claim_problem)
    # the namespace's NetworkPolicy probe: (status, reason, message); None: not checked (off)
    network_policies: tuple[str, str, str] | None = None
    # why a pool's HorizontalPodAutoscaler cannot scale it, one message a pool (autoscaler_problem)
    autoscalers: tuple[str, ...] = ()


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


def parse_job(job: dict[str, Any]) -> TrainerObserved:
    status = job.get("status") or {}
    failed = _condition(job, "Failed") or {}
    annotations = job.get("metadata", {}).get("annotations") or {}
    return TrainerObserved(
        kind="Job",
        uid=job.get("metadata", {}).get("uid", ""),
        attempt=int(annotations.get(ATTEMPT_ANNOTATION, "0")),
        active=int(status.get("active", 0)),
        ready=int(status.get("ready", 0)),
        suspended=bool(job.get("spec", {}).get("suspend")),
        complete=_condition(job, "Complete") is not None,
        failed=bool(failed),
        failed_reason=failed.get("reason", ""),
        failed_message=failed.get("message", ""),
        failed_time=failed.get("lastTransitionTime"),
        start_time=status.get("startTime"),
        template_hash=annotations.get(TEMPLATE_ANNOTATION, ""),
        in_a_row=int(annotations.get(IN_A_ROW_ANNOTATION, "0")),
        resumed_from=_int(annotations, RESUMED_ANNOTATION),
    )


def parse_jobset(jobset: dict[str, Any], nodes: int) -> TrainerObserved:
    """A JobSet with one replicated Job: ready means its Job has all pods ready."""
    status = jobset.get("status") or {}
    jobs = status.get("replicatedJobsStatus") or [{}]
    failed = _condition(jobset, "Failed") or {}
    return TrainerObserved(
        kind="JobSet",
        uid=jobset.get("metadata", {}).get("uid", ""),
        active=int(jobs[0].get("active", 0)) * nodes,
        ready=int(jobs[0].get("ready", 0)) * nodes,
        suspended=bool(jobset.get("spec", {}).get("suspend")),
        complete=_condition(jobset, "Completed") is not None,
        failed=bool(failed),
        failed_reason=failed.get("reason", ""),
        failed_message=failed.get("message", ""),
        restarts=int(status.get("restarts", 0)),
        template_hash=(jobset.get("metadata", {}).get("annotations") or {}).get(
            TEMPLATE_ANNOTATION, ""
        ),
    )


def parse_deployment(deployment: dict[str, Any]) -> PoolObserved:
    status = deployment.get("status") or {}
    match = (deployment.get("spec", {}).get("selector") or {}).get("matchLabels") or {}
    return PoolObserved(
        desired=int(deployment.get("spec", {}).get("replicas", 1)),
        replicas=int(status.get("replicas", 0)),
        ready=int(status.get("readyReplicas", 0)),
        selector=",".join(f"{k}={v}" for k, v in sorted(match.items())),
    )


def _int(data: dict[str, str], key: str) -> int | None:
    try:
        return int(data[key]) if key in data else None
    except ValueError:
        return None  # a malformed report is ignored, not fatal


def parse_progress(data: dict[str, str] | None) -> Progress:
    """The trainer's ``<run>-progress`` data (string values)."""
    data = data or {}
    return Progress(
        step=_int(data, "step"),
        policy_version=_int(data, "policyVersion"),
        rollout_policy_version=_int(data, "rolloutPolicyVersion"),
        checkpoint_step=_int(data, "checkpointStep"),
        checkpoint_uri=data.get("checkpointUri"),
        checkpoint_time=data.get("checkpointTime"),
        start_time=data.get("startTime"),
        sandbox_images=data.get("sandboxImages"),
    )


def owned_fields(obj: dict[str, Any], manager: str) -> frozenset[tuple[str, ...]]:
    """Every field ``manager``'s server-side apply owns in ``obj``, as paths through its
    ``managedFields`` entry (operation ``Apply``, the object itself: no subresource). The server
    moves a field's ownership to whoever changes its value, so a path that disappears from here
    is a field someone else changed or removed."""
    for entry in (obj.get("metadata") or {}).get("managedFields") or []:
        if (entry.get("manager"), entry.get("operation")) == (manager, "Apply") and not entry.get(
            "subresource"
        ):
            return frozenset(_field_paths(entry.get("fieldsV1") or {}, ()))
    return frozenset()


def others_fields(obj: dict[str, Any], ours: frozenset[str]) -> frozenset[tuple[str, ...]]:
    """Every field of ``obj`` (not its status) that a manager not in ``ours`` owns."""
    paths: set[tuple[str, ...]] = set()
    for entry in (obj.get("metadata") or {}).get("managedFields") or []:
        if entry.get("manager") not in ours and not entry.get("subresource"):
            paths.update(_field_paths(entry.get("fieldsV1") or {}, ()))
    return frozenset(paths)


POD_OF_JOB = ("f:spec", "f:template", "f:spec")


def _pod_of_replicated_job(name: str) -> tuple[str, ...]:
    """The managedFields path of a JobSet's replicated Job's pod spec (a list keyed by name)."""
    key = "k:" + json.dumps({"name": name}, separators=(",", ":"))
    return ("f:spec", "f:replicatedJobs", key, "f:template", "f:spec", "f:template", "f:spec")


def _leave(
    pod: dict[str, Any], theirs: frozenset[tuple[str, ...]], at: tuple[str, ...]
) -> dict[str, Any]:
    """``pod`` without the scheduling fields at ``at`` that are ``theirs``."""
    out = dict(pod)
    if (*at, "f:tolerations") in theirs:
        out.pop("tolerations", None)
    selector = {k: v for k, v in (out.pop("nodeSelector", None) or {}).items()
                if (*at, "f:nodeSelector", f"f:{k}") not in theirs}  # fmt: skip
    out.update({"nodeSelector": selector} if selector else {})
    if (*at, "f:affinity", "f:nodeAffinity") in theirs and "affinity" in out:
        rest = {k: v for k, v in out.pop("affinity").items() if k != "nodeAffinity"}
        out.update({"affinity": rest} if rest else {})
    return out


def leave_to_queue(
    job: dict[str, Any], live: dict[str, Any], ours: frozenset[str]
) -> dict[str, Any]:
    """The trainer Job (or JobSet) to apply, without the scheduling fields of its pod templates
    that another manager owns on the live object: what a queue (Kueue) wrote when it admitted
    it, the flavor's node selector keys, its tolerations (an atomic list: the whole of it) and
    node affinity. Applied by force they would be taken back (the run's own values), which the
    server refuses once the Job has started (its template is immutable) and which would undo the
    admission before. Everything else is applied as built."""
    theirs = others_fields(live, ours)
    spec = job["spec"]
    if job.get("kind") == "Job":
        template = {
            **spec["template"],
            "spec": _leave(spec["template"]["spec"], theirs, POD_OF_JOB),
        }
        return {**job, "spec": {**spec, "template": template}}
    if job.get("kind") != "JobSet":
        return job
    replicated = []
    for rj in spec["replicatedJobs"]:
        inner = rj["template"]["spec"]["template"]
        pod = _leave(inner["spec"], theirs, _pod_of_replicated_job(rj["name"]))
        job_spec = {**rj["template"]["spec"], "template": {**inner, "spec": pod}}
        replicated.append({**rj, "template": {**rj["template"], "spec": job_spec}})
    return {**job, "spec": {**spec, "replicatedJobs": replicated}}


def _field_paths(node: dict[str, Any], prefix: tuple[str, ...]) -> list[tuple[str, ...]]:
    paths = []
    for key, child in node.items():
        paths.append((*prefix, key))
        if isinstance(child, dict):
            paths.extend(_field_paths(child, (*prefix, key)))
    return paths


SANDBOX_REFUSED_EXIT = 3  # ``gagar sandbox serve``: the isolation asked for cannot run here


def sandbox_refusal(pods: list[dict[str, Any]]) -> str | None:
    """The executor's own words when a sandbox pod that is not ready last exited because no
    isolation works on its node (its termination message: the log's ``gagar sandbox:`` line)."""
    for pod in pods:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if cs.get("ready"):
                continue
            for state in (cs.get("state") or {}, cs.get("lastState") or {}):
                done = state.get("terminated") or {}
                if done.get("exitCode") == SANDBOX_REFUSED_EXIT:
                    said = [
                        x for x in (done.get("message") or "").splitlines() if "gagar sandbox:" in x
                    ]
                    return (said[-1] if said else "exit 3, no message").strip()[-800:]
    return None


def waiting_reasons(pods: list[dict[str, Any]]) -> tuple[str, ...]:
    """Distinct reasons pods are stuck (container waiting reasons, unschedulable), sorted."""
    reasons: set[str] = set()
    for pod in pods:
        status = pod.get("status") or {}
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                reasons.add(cond.get("reason") or "Unschedulable")
        for cs in status.get("containerStatuses") or []:
            reason = (cs.get("state") or {}).get("waiting", {}).get("reason")
            if reason and reason not in ("ContainerCreating", "PodInitializing"):
                reasons.add(reason)
    return tuple(sorted(reasons))


def _when(event: dict[str, Any]) -> str:
    meta = event.get("metadata") or {}
    return (
        event.get("lastTimestamp") or event.get("eventTime") or meta.get("creationTimestamp") or ""
    )


def claim_problem(claim: dict[str, Any] | None, events: list[dict[str, Any]]) -> str | None:
    """Why a Pending PersistentVolumeClaim is not provisioned: its newest event, when that is a
    Warning (``ProvisioningFailed``: e.g. a StorageClass that offers no ReadWriteMany). A claim
    waiting for its first consumer (``WaitForFirstConsumer``, a Normal event) is not a problem."""
    if claim is None or (claim.get("status") or {}).get("phase") != "Pending":
        return None
    newest = max(events, key=_when, default=None)
    if newest is None or newest.get("type") != "Warning":
        return None
    name = claim["metadata"]["name"]
    message = " ".join(str(newest.get("message") or "").split())[:800]
    return f"PersistentVolumeClaim {name} is Pending: {newest.get('reason')}: {message}"


def autoscaler_problem(hpa: dict[str, Any], component: str, metric: str) -> str | None:
    """Why the HorizontalPodAutoscaler of ``component``'s pool cannot scale it, or None: its
    ``ScalingActive`` condition is False (most often no metrics adapter serves the Pods metric
    through ``custom.metrics.k8s.io``: reason ``FailedGetPodsMetric``), so the pool stays where it
    is, which nothing else would show."""
    for cond in (hpa.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "ScalingActive" and cond.get("status") == "False":
            why = f"{cond.get('reason', '')}: {cond.get('message', '')}".strip(": ")
            return (
                f"spec.{component}.autoscaling: the HorizontalPodAutoscaler cannot scale the "
                f"{component} pool ({why}); it needs a metrics adapter serving the Pods metric "
                f"{metric} through custom.metrics.k8s.io (e.g. prometheus-adapter, "
                "docs/operations.md), or backend: keda"
            )
    return None
