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
* Jobs: an unsuspended Job reports ``active = parallelism`` and ``startTime`` until a test marks it
  with :meth:`Controllers.succeed_job` or :meth:`Controllers.fail_job`; then it gets the
  ``Complete`` or ``Failed`` condition. No Pods are created. HPAs are passive (nobody writes them).
"""

from __future__ import annotations

import threading
import time

from .admission import CRD_FINALIZER, CRD_KEY, NS_KEY, now_iso
from .store import Store, WriteOptions

DEPLOY_KEY = ("apps", "deployments")
JOB_KEY = ("batch", "jobs")


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
            target = self._job_status(job)
            if target != (job.get("status") or {}):
                self._update(
                    JOB_KEY, job, lambda o, t=target: {**o, "status": t}, "status", "job-controller"
                )

    def _job_status(self, job: dict) -> dict:
        spec, old = job.get("spec") or {}, job.get("status") or {}
        outcome = self._outcomes.get(job["metadata"]["uid"])
        if outcome is None:
            if spec.get("suspend"):
                return {
                    **_keep(old, "startTime"),
                    "active": 0,
                    "conditions": [_cond(old, "Suspended", "JobSuspended", "Job suspended")],
                }
            return {
                "startTime": old.get("startTime") or now_iso(),
                "active": spec.get("parallelism", 1),
                "ready": spec.get("parallelism", 1),
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
            status.update(failed=max(1, old.get("failed", 0)))
            status["conditions"] = [
                _cond(old, "FailureTarget", reason, message),
                _cond(old, "Failed", reason, message),
            ]
        return status


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
