"""Simulated cluster controllers: garbage collection, namespace and CRD cleanup, Deployments, Jobs.

They run in one background thread, each tick a sweep over the store, and write through the same
store API the HTTP handlers use, so every change they make is a normal watch event.

* Garbage collector: a dependent whose owners (by uid) are all gone is deleted in the background;
  ``Foreground`` deletion deletes dependents first and then drops the ``foregroundDeletion``
  finalizer; a terminating namespace is emptied, then removed; a deleted CRD first deletes its
  custom objects (their finalizers still apply), then goes away.
* Deployments: after ``deployment_delay`` seconds the status reports ``replicas``,
  ``updatedReplicas``, ``readyReplicas``, ``availableReplicas`` equal to ``spec.replicas`` (default
  1, or fewer while a test holds it with :meth:`Controllers.hold_deployment`) and
  ``observedGeneration``. No ReplicaSets or Pods are created.
* Jobs: an unsuspended Job runs one Pod per index (``completions`` of an ``Indexed`` Job, else
  ``parallelism``), each ``Running`` and ready at once (the kubelet's part), named
  ``<job>-<index>-<suffix>`` with the completion-index label and annotation, owned by the Job. A Pod
  whose status someone sets to ``Succeeded`` completes its index (all indexes: the Job is
  ``Complete``); one set to ``Failed`` (as the kubelet does when a container exits non-zero, or
  an eviction with its ``DisruptionTarget`` condition) meets the Job's ``podFailurePolicy`` as the
  Job controller applies it: the first matching rule's ``Ignore`` deletes it (a new Pod replaces
  it), ``FailJob`` fails the Job (reason ``PodFailurePolicy``), ``Count`` or no match counts it;
  more counted failures than ``backoffLimit`` fail the Job (``BackoffLimitExceeded``). A failed or
  suspended Job's running Pods are deleted. Tests may also decide a Job's outcome directly with
  :meth:`Controllers.succeed_job` or :meth:`Controllers.fail_job`. A Pod the server refuses
  (quota admission: a container without the request a ResourceQuota tracks) is not created; the
  Job gets the controller's ``FailedCreate`` Warning event, and the next sweep tries again. HPAs
  are passive (nobody writes them).
"""

from __future__ import annotations

import threading
import time
import uuid

from .admission import CRD_FINALIZER, CRD_KEY, NS_KEY, now_iso
from .errors import ApiError
from .store import Store, WriteOptions

DEPLOY_KEY = ("apps", "deployments")
JOB_KEY = ("batch", "jobs")
POD_KEY = ("", "pods")
EVENT_KEY = ("", "events")
INDEX = "batch.kubernetes.io/job-completion-index"


class Controllers:
    def __init__(self, store: Store, tick: float = 0.05, deployment_delay: float = 0.1) -> None:
        self.store = store
        self.tick = tick
        self.deployment_delay = deployment_delay
        self.gc = True
        self.deployments = True
        self.jobs = True
        self._held: dict[tuple[str, str], int] = {}
        self._outcomes: dict[str, tuple[str, str, str]] = {}  # job uid -> (type, reason, message)
        self._reported: set[tuple[str, str]] = set()  # (job uid, message) of FailedCreate events
        self._counted: dict[str, set[str]] = {}  # job uid -> uids of its failed Pods counted
        self._seen: dict[str, float] = {}  # deployment uid+generation -> first seen stale
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ----- test controls ---------------------------------------------------------------------

    def hold_deployment(self, namespace: str, name: str, ready: int | None) -> None:
        """Cap the ready replicas of one Deployment (``None`` releases the cap)."""
        if ready is None:
            self._held.pop((namespace, name), None)
        else:
            self._held[(namespace, name)] = ready

    def succeed_job(self, namespace: str, name: str) -> None:
        self._set_outcome(
            namespace,
            name,
            ("Complete", "CompletionsReached", "Reached expected number of succeeded pods"),
        )

    def fail_job(
        self,
        namespace: str,
        name: str,
        reason: str = "BackoffLimitExceeded",
        message: str = "Job has reached the specified backoff limit",
    ) -> None:
        self._set_outcome(namespace, name, ("Failed", reason, message))

    def _set_outcome(self, namespace: str, name: str, outcome: tuple[str, str, str]) -> None:
        rt = self.store.type_for("batch", "v1", "jobs")
        uid = self.store.get(rt, namespace, name)["metadata"]["uid"]
        self._outcomes[uid] = outcome
        self.sweep()

    # ----- loop ------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name="kube-emulator-controllers", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.tick):
            self.sweep()

    def sweep(self) -> None:
        with self.store.lock:
            if self.gc:
                self._collect_garbage()
            if self.deployments:
                self._sync_deployments()
            if self.jobs:
                self._sync_jobs()

    # ----- garbage collection ----------------------------------------------------------------

    def _objects(self, key: tuple[str, str]) -> list[dict]:
        return list(self.store.objects.get(key, {}).values())

    def _delete(self, key: tuple[str, str], obj: dict) -> None:
        if obj["metadata"].get("deletionTimestamp"):
            return
        rt = self.store.any_type(key)
        self.store.delete(rt, obj["metadata"].get("namespace"), obj["metadata"]["name"], {})

    def _update(
        self,
        key: tuple[str, str],
        obj: dict,
        mutate,
        sub: str = "",
        manager: str = "garbage-collector",
    ) -> None:
        rt = self.store.any_type(key)
        self.store.write(
            rt,
            obj["metadata"].get("namespace"),
            obj["metadata"]["name"],
            mutate,
            WriteOptions(manager=manager, subresource=sub),
        )

    def _collect_garbage(self) -> None:
        for key in list(self.store.objects):
            for obj in self._objects(key):
                refs = obj["metadata"].get("ownerReferences") or []
                if refs and not any(r.get("uid") in self.store.uids for r in refs):
                    self._delete(key, obj)
        for key in list(self.store.objects):
            for obj in self._objects(key):
                if "foregroundDeletion" in (obj["metadata"].get("finalizers") or []):
                    self._foreground(key, obj)
        for ns in self._objects(NS_KEY):
            if ns["metadata"].get("deletionTimestamp"):
                self._finalize_namespace(ns)
        for crd in self._objects(CRD_KEY):
            if crd["metadata"].get("deletionTimestamp"):
                self._finalize_crd(crd)

    def _foreground(self, key: tuple[str, str], obj: dict) -> None:
        deps = self.store.dependents(obj["metadata"]["uid"])
        for rt, dep in deps:
            self._delete(rt.storage_key, dep)
        if not deps:
            self._update(key, obj, _drop_finalizer("foregroundDeletion"))

    def _finalize_namespace(self, ns: dict) -> None:
        name = ns["metadata"]["name"]
        content = [
            (key, o)
            for key in list(self.store.objects)
            if key != NS_KEY
            for o in self._objects(key)
            if o["metadata"].get("namespace") == name
        ]
        for key, obj in content:
            self._delete(key, obj)
        if not content:
            self._update(
                NS_KEY, ns, lambda o: {**o, "spec": {**o.get("spec", {}), "finalizers": []}}
            )

    def _finalize_crd(self, crd: dict) -> None:
        spec = crd["spec"]
        key = (spec["group"], spec["names"]["plural"])
        objs = self._objects(key)
        for obj in objs:
            self._delete(key, obj)
        if not objs:
            self._update(CRD_KEY, crd, _drop_finalizer(CRD_FINALIZER))

    # ----- workloads -------------------------------------------------------------------------

    def _sync_deployments(self) -> None:
        now = time.monotonic()
        for dep in self._objects(DEPLOY_KEY):
            if dep["metadata"].get("deletionTimestamp"):
                continue
            target = self._deployment_status(dep)
            current = dep.get("status") or {}
            if all(current.get(k) == v for k, v in target.items() if k != "conditions"):
                continue
            stamp = f"{dep['metadata']['uid']}/{dep['metadata']['resourceVersion']}"
            first = self._seen.setdefault(stamp, now)
            if now - first >= self.deployment_delay:
                self._update(
                    DEPLOY_KEY,
                    dep,
                    lambda o, t=target: {**o, "status": t},
                    "status",
                    "deployment-controller",
                )

    def _deployment_status(self, dep: dict) -> dict:
        meta, spec = dep["metadata"], dep.get("spec") or {}
        desired = spec.get("replicas", 1)
        ready = min(desired, self._held.get((meta["namespace"], meta["name"]), desired))
        available = "True" if ready >= desired else "False"
        conditions = [
            {
                "type": "Available",
                "status": available,
                "reason": "MinimumReplicasAvailable"
                if available == "True"
                else "MinimumReplicasUnavailable",
                "lastUpdateTime": now_iso(),
                "lastTransitionTime": now_iso(),
            },
            {
                "type": "Progressing",
                "status": "True",
                "reason": "NewReplicaSetAvailable",
                "lastUpdateTime": now_iso(),
                "lastTransitionTime": now_iso(),
            },
        ]
        status = {
            "observedGeneration": meta.get("generation", 1),
            "replicas": desired,
            "updatedReplicas": desired,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "conditions": conditions,
        }
        if desired > ready:
            status["unavailableReplicas"] = desired - ready
        return status

    def _sync_jobs(self) -> None:
        for job in self._objects(JOB_KEY):
            if job["metadata"].get("deletionTimestamp"):
                continue
            self._judge_pods(job)
            pods = self._run_pods(job)
            target = self._job_status(job, pods)
            if target != (job.get("status") or {}):
                self._update(
                    JOB_KEY, job, lambda o, t=target: {**o, "status": t}, "status", "job-controller"
                )

    def _pods_of(self, job: dict) -> list[dict]:
        uid = job["metadata"]["uid"]
        return [
            p
            for p in self._objects(POD_KEY)
            if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])
            and not p["metadata"].get("deletionTimestamp")
        ]

    def _judge_pods(self, job: dict) -> None:
        """The Job controller's verdict on its failed Pods (pod failure policy, backoff limit)."""
        uid, spec = job["metadata"]["uid"], job.get("spec") or {}
        if uid in self._outcomes:
            return
        counted = self._counted.setdefault(uid, set())
        for pod in self._pods_of(job):
            if _phase(pod) != "Failed" or pod["metadata"]["uid"] in counted:
                continue
            action, message = _pod_failure_rule(spec.get("podFailurePolicy") or {}, pod)
            if action == "Ignore":
                self._delete(POD_KEY, pod)
            elif action == "FailJob":
                self._outcomes[uid] = ("Failed", "PodFailurePolicy", message)
                return
            else:
                counted.add(pod["metadata"]["uid"])
        if len(counted) > spec.get("backoffLimit", 6):
            self._outcomes[uid] = (
                "Failed",
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
            )
            return
        if len(_indexes(self._pods_of(job), "Succeeded")) >= _completions(spec):
            self._outcomes[uid] = (
                "Complete",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
            )

    def _run_pods(self, job: dict) -> list[dict]:
        """Create a Pod for every index without a live one; delete the live ones of a finished
        or suspended Job. Returns the live (not failed) Pods."""
        spec = job.get("spec") or {}
        pods = self._pods_of(job)
        live = [p for p in pods if _phase(p) not in ("Failed", "Succeeded")]
        if job["metadata"]["uid"] in self._outcomes or spec.get("suspend"):
            for pod in live:
                self._delete(POD_KEY, pod)
            return []
        have = _indexes(live) | _indexes(pods, "Succeeded")
        for index in range(_completions(spec)):
            if str(index) not in have:
                try:
                    live.append(self._start_pod(job, index))
                except ApiError as refused:  # e.g. quota admission: the Job says so, and retries
                    self._failed_create(job, refused.message)
        return live

    def _failed_create(self, job: dict, message: str) -> None:
        """The Job controller's ``FailedCreate`` Warning event on the Job (once per message)."""
        meta = job["metadata"]
        key = (meta["uid"], message.partition(" is forbidden: ")[2] or message)  # not the pod name
        if key in self._reported:
            return
        self._reported.add(key)
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}"},
            "involvedObject": {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "reason": "FailedCreate",
            "message": f"Error creating: {message}",
            "type": "Warning",
            "count": 1,
            "source": {"component": "job-controller"},
            "firstTimestamp": now_iso(),
            "lastTimestamp": now_iso(),
        }  # fmt: skip
        self.store.create(
            self.store.any_type(EVENT_KEY), meta["namespace"], event, "job-controller"
        )

    def _start_pod(self, job: dict, index: int) -> dict:
        meta, template = job["metadata"], (job.get("spec") or {}).get("template") or {}
        tmeta = template.get("metadata") or {}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{meta['name']}-{index}-{uuid.uuid4().hex[:5]}",
                "labels": {
                    **(tmeta.get("labels") or {}),
                    "batch.kubernetes.io/job-name": meta["name"],
                    INDEX: str(index),
                },
                "annotations": {**(tmeta.get("annotations") or {}), INDEX: str(index)},
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {**(template.get("spec") or {}), "hostname": f"{meta['name']}-{index}"},
        }
        rt = self.store.any_type(POD_KEY)
        created = self.store.create(rt, meta["namespace"], pod, "job-controller", "Update")
        now = now_iso()
        running = {
            "phase": "Running",
            "startTime": now,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": now}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "state": {"running": {"startedAt": now}},
                }
                for c in pod["spec"].get("containers") or []
            ],
        }
        self._update(POD_KEY, created, lambda o: {**o, "status": running}, "status", "kubelet")
        return created

    def _job_status(self, job: dict, pods: list[dict]) -> dict:
        spec, old = job.get("spec") or {}, job.get("status") or {}
        uid = job["metadata"]["uid"]
        outcome = self._outcomes.get(uid)
        counted = len(self._counted.get(uid, ()))
        if outcome is None:
            if spec.get("suspend"):
                return {
                    **_keep(old, "startTime"),
                    "active": 0,
                    "conditions": [_cond(old, "Suspended", "JobSuspended", "Job suspended")],
                }
            return {
                "startTime": old.get("startTime") or now_iso(),
                "active": len(pods),
                "ready": len(pods),
                **({"failed": counted} if counted else {}),
            }
        kind, reason, message = outcome
        status = {"startTime": old.get("startTime") or now_iso(), "active": 0, "ready": 0}
        if kind == "Complete":
            completions = spec.get("completions") or 1
            status.update(
                succeeded=completions, completionTime=old.get("completionTime") or now_iso()
            )
            if spec.get("completionMode") == "Indexed":
                status["completedIndexes"] = "0" if completions == 1 else f"0-{completions - 1}"
            status["conditions"] = [
                _cond(old, "SuccessCriteriaMet", reason, message),
                _cond(old, "Complete", reason, message),
            ]
        else:
            status.update(failed=max(1, counted, old.get("failed", 0)))
            status["conditions"] = [
                _cond(old, "FailureTarget", reason, message),
                _cond(old, "Failed", reason, message),
            ]
        return status


def _phase(pod: dict) -> str:
    return (pod.get("status") or {}).get("phase") or "Pending"


def _indexes(pods: list[dict], phase: str | None = None) -> set[str]:
    """Completion indexes of ``pods`` (of those in ``phase`` when given)."""
    return {
        (p["metadata"].get("annotations") or {}).get(INDEX, "")
        for p in pods
        if phase is None or _phase(p) == phase
    }


def _completions(spec: dict) -> int:
    """Pods the Job runs at once: one per index of an Indexed Job, else ``parallelism``."""
    if spec.get("completionMode") == "Indexed":
        return spec.get("completions") or 1
    return spec.get("parallelism", 1)


def _pod_failure_rule(policy: dict, pod: dict) -> tuple[str, str]:
    """(action, message) of the first ``podFailurePolicy`` rule the failed Pod matches, as the
    Job controller words it; ``("Count", "")`` when none does."""
    status, meta = pod.get("status") or {}, pod["metadata"]
    who = f"{meta.get('namespace')}/{meta['name']}"
    for i, rule in enumerate(policy.get("rules") or []):
        codes = rule.get("onExitCodes")
        if codes:
            for cs in status.get("containerStatuses") or []:
                code = ((cs.get("state") or {}).get("terminated") or {}).get("exitCode")
                if code in (None, 0) or codes.get("containerName") not in (None, cs["name"]):
                    continue
                inside = code in codes.get("values", [])
                if inside == (codes.get("operator", "In") == "In"):
                    message = (
                        f"Container {cs['name']} for pod {who} failed with exit code {code} "
                        f"matching {rule['action']} rule at index {i}"
                    )
                    return rule["action"], message
        for want in rule.get("onPodConditions") or []:
            for cond in status.get("conditions") or []:
                if cond.get("type") == want.get("type") and cond.get("status") == want.get(
                    "status", "True"
                ):
                    message = (
                        f"Pod {who} has condition {cond['type']} matching {rule['action']} "
                        f"rule at index {i}"
                    )
                    return rule["action"], message
    return "Count", ""


def _keep(status: dict, *keys: str) -> dict:
    return {k: status[k] for k in keys if k in status}


def _cond(old: dict, kind: str, reason: str, message: str) -> dict:
    """A condition that keeps its timestamps once set, so re-syncs are no-ops."""
    for c in old.get("conditions") or []:
        if c.get("type") == kind and c.get("reason") == reason:
            return c
    now = now_iso()
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastProbeTime": now,
        "lastTransitionTime": now,
    }


def _drop_finalizer(name: str):
    def mutate(obj: dict) -> dict:
        fins = [f for f in obj["metadata"].get("finalizers") or [] if f != name]
        return {**obj, "metadata": {**obj["metadata"], "finalizers": fins}}

    return mutate
