"""kopf handlers: the imperative shell around the pure builders and status calculator.

One reconcile (``Reconciler.reconcile``) per trigger: validate the spec once (an invalid spec
becomes a ``Stalled`` condition naming the field, never a crash), observe the children, compute the
status (pure), write it when it changed, apply the failure policy (a failed trainer Job of the
current attempt is deleted and recreated as the next attempt, from the last checkpoint), apply
every child with server-side apply under the ``gagar-operator`` field manager (``force``), prune
children the spec no longer wants (an HPA while suspended, a pool switched to an endpoint), and post
events. The reconcile is level-triggered: whatever triggered it, it reads the run and its children
afresh and converges them, so a trigger lost or doubled costs nothing.

Triggers and runtime, kopf's own wherever it fits; what is hand-written says why:

- create/update/resume of a GagarRun: kopf's change handlers, serialised per run by kopf and
  retried by kopf after ``kopf.TemporaryError(delay=)`` (a transient API error).
- the children, every kind the operator applies (``child_watches``): their watch events
  reconcile their run through ``Reconciler.child_changed`` (hand-written coalescing: kopf cannot
  trigger one object's handler from another object's event); a child deleted, or changed in a
  field the operator applies (``drifted``), is applied again at once, alone. The trainer Jobs,
  pool Deployments and the trainer's progress ConfigMap feed the status too: kopf's index
  (``CHILD_INDEX``) is the cache the reconcile reads them from.
- delayed re-checks (a restart's backoff, a Workload Kueue has yet to make, a transient error of
  a child's reconcile) and the periodic resync: ``Reconciler.requeue`` and one thread,
  ``resync_loop`` (hand-written: kopf's timers and daemons put a finalizer on every run).
- the installed optional API groups: ``Reconciler.crds``, cached (kopf's discovery is internal).

Crash safety: names are deterministic and SSA is idempotent, so a restarted operator converges
without duplicates; the status (restart count included) is written *before* the trainer Job is
deleted, so a crash in between never loses or double-counts a restart. Deletion needs no
finalizer, and none is set (no kopf timer, no mandatory delete handler): every child carries a
controller owner reference and is garbage-collected, also when no operator runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from gagar import API_GROUP, API_VERSION, RUN_FILE
from gagar.metrics import Metrics
from gagar.operator import telemetry
from gagar.operator.builders import (
    AGENT_SANDBOX,
    CHILD_KINDS,
    JOBSET,
    OPTIONAL_CRDS,
    TEMPLATE_ANNOTATION,
    BuildContext,
    Scraper,
    build_all,
    name,
    queued,
    uses_jobset,
)
from gagar.operator.builders.check import validate_run
from gagar.operator.builders.common import (
    build_weight_sync_secret,
    checkpoint_claim,
    image,
    quota_limited,
)
from gagar.operator.builders.images import IMAGES_KEY, demand, image_pools, no_image_pools
from gagar.operator.builders.integrations import blocking
from gagar.operator.builders.pools import hpa_metric
from gagar.operator.builders.sandbox import ENVIRONMENT_COMPONENT, environment_pools
from gagar.operator.builders.trust import (
    Level,
    TrustPolicy,
    namespace_level,
    run_secret_refs,
    trust_problems,
    unlisted_secrets,
)
from gagar.operator.kube import (
    FIELD_MANAGER,
    HANDOFF_MANAGER,
    KUEUE_HANDOFF_MANAGER,
    PLURALS,
    TTL_MANAGER,
    Kube,
    KubeError,
)
from gagar.operator.netprobe import NetworkPolicyProbe
from gagar.operator.observe import (
    Observed,
    PoolObserved,
    autoscaler_problem,
    claim_problem,
    environment_pool,
    leave_to_queue,
    owned_fields,
    parse_deployment,
    parse_job,
    parse_jobset,
    parse_progress,
    sandbox_refusal,
    waiting_reasons,
)
from gagar.operator.status import TERMINAL, Event, Outcome, compute_status
from gagar.spec import CONDITION_TYPES, PHASES, GagarRun, GagarRunStatus, rfc3339

log = logging.getLogger("gagar.operator")
AGENT_SANDBOX_API = f"{AGENT_SANDBOX}/v1beta1"
PLURAL = "gagarruns"
STOP_RESYNC_S = 35.0  # the resync's reconcile in flight: one API request's timeout (30 s) and more
MANAGED = {"app.kubernetes.io/managed-by": "gagar-operator"}
RUN_LABEL = "gagar.dev/run"  # on every child: the run it belongs to
CHILD_INDEX = "gagar_children"  # kopf's index of the watched children by run (its kwarg name)
# Kinds that can stop being wanted while the run exists (PVCs are never pruned: checkpoints).
OPTIONAL_GROUPS = frozenset(OPTIONAL_CRDS)
PRUNABLE = tuple(k for k in CHILD_KINDS if k[1] not in ("PersistentVolumeClaim", "ConfigMap"))
KUEUE_API = "kueue.x-k8s.io/v1beta1"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"  # Kueue's label on a Workload: its job's uid
KUEUE_RETRY_SECONDS = 2.0  # a suspend waiting for Kueue to make the trainer's Workload
# reconciles in a row one caller runs while events keep dirtying the run (then it is requeued)
MAX_PASSES = 3
PROBE_POLL_S = 3.0  # a run waiting for its namespace's NetworkPolicy probe looks again
# Not judged for drift: a trainer's pod templates. The server lets them change only while the
# trainer is suspended and has never started, which is a queue admitting it (Kueue writes the
# flavor's node selector and tolerations, replacing the whole tolerations list); at any other
# time they are immutable, so no one else can have changed them.
QUEUE_ADMITTED = {"Job": ("f:spec", "f:template"), "JobSet": ("f:spec", "f:replicatedJobs")}
# The operator's own field managers: a field any other manager owns is someone else's.
OURS = frozenset({FIELD_MANAGER, HANDOFF_MANAGER, KUEUE_HANDOFF_MANAGER, TTL_MANAGER})
# An event identical (type, reason, message) to one posted for the same run within this many
# seconds of its last occurrence is not posted again: that Event's count and lastTimestamp go up,
# as client-go's event correlator does for a component's repeated events (a condition flapping
# with a pool's rollout posted the same words three times in 25 s).
EVENT_SERIES_S = 600.0


def now_rfc3339() -> str:
    return rfc3339(time.time())


@dataclass
class OperatorConfig:
    """Operator knobs. ``resync_seconds``: full re-apply period; ``crd_cache_seconds``: how long
    the list of installed API groups is trusted; ``integrations``: the optional API groups the
    operator may manage (``--integration``, the chart's ``integrations.*``, which grant the RBAC
    for exactly these): a group installed in the cluster but not named here is never built,
    listed or pruned, so a default install never asks for what its RBAC does not grant. ``run_selector``: an equality-based label selector (``team=a,!canary``): only
    runs it selects are watched (server-side) and reconciled, so that several operators can
    share a cluster's runs."""

    resync_seconds: float = 30.0
    crd_cache_seconds: float = 60.0
    clock: Callable[[], str] = now_rfc3339
    integrations: frozenset[str] = frozenset()
    run_selector: str = ""  # label selector of the runs this operator owns (--run-selector)
    scraper: Scraper = field(default_factory=Scraper)  # the Prometheus runs' pods admit
    image_registry: str = ""  # where gagar's images are pulled from (--image-registry)
    # probe each namespace once for NetworkPolicy enforcement (``netprobe``); the operator's
    # command turns it on (--no-network-policy-probe: off), a bare Reconciler leaves it off
    network_policy_probe: bool = False
    # what creating a run entitles (--pod-security, --run-secret, ...: the chart's podSecurity)
    trust: TrustPolicy = field(default_factory=TrustPolicy)


@dataclass(frozen=True)
class Owned:
    """A child as the operator's apply left it: its generation and the fields it owns."""

    generation: int
    fields: frozenset[tuple[str, ...]]


@dataclass
class _RunMemory:
    """Per-run state kept in memory only (safe to lose: a restart just re-applies once)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    applied: str = ""  # fingerprint of the last manifests applied successfully
    # (generation, reason, message) of a permanent failure: an apply refused, or a change the
    # operator will not make (the Stalled condition's reason and message)
    apply_error: tuple[int, str, str] | None = None
    dirty: bool = False  # a child changed since the last reconcile started
    # what the operator's last apply of each child (kind, name) left it owning: drift is judged
    # against it (``Reconciler.drifted``)
    owned: dict[tuple[str, str], Owned] = field(default_factory=dict)
    # children whose apply is in flight: their own watch event may come before the answer
    applying: set[tuple[str, str]] = field(default_factory=set)
    # children seen deleted or drifted and not applied again yet: a drift is state, not a
    # trigger's argument, so a reconcile that fails or is coalesced keeps it
    drifted: set[tuple[str, str]] = field(default_factory=set)
    token_ready: bool = False  # the weight-sync Secret was seen or made (``_weight_sync_secret``)
    # the events posted, by (type, reason, message): their Event and how often they happened
    events: dict[tuple[str, str, str], _Series] = field(default_factory=dict)


@dataclass
class _Series:
    """One posted Event and its repeats (``Reconciler._post``)."""

    name: str  # the Event object's name (the server generates it)
    count: int
    last: float  # time.monotonic() of the latest occurrence


def parse_run(body: dict[str, Any]) -> tuple[GagarRun | None, str | None]:
    """Validate once at the boundary: the run, or the problems (with field paths) as one message."""
    doc = {k: body.get(k) for k in ("apiVersion", "kind", "spec")}
    meta = body.get("metadata") or {}
    doc["metadata"] = {
        k: meta[k] for k in ("name", "namespace", "labels", "annotations") if k in meta
    }
    run, problems = validate_run(doc, "GagarRun", 0)
    if run is None:
        return None, "; ".join(f"{p.path}: {p.message}" if p.path else p.message for p in problems)
    return run, None


def previous_status(body: dict[str, Any]) -> GagarRunStatus | None:
    try:
        return GagarRunStatus.model_validate(body.get("status") or {})
    except ValueError:
        return None  # a status this version cannot read is recomputed from scratch


class Reconciler:
    """Reconciles GagarRuns through a ``Kube`` client; thread-safe per run."""

    def __init__(self, kube: Kube, metrics: Metrics, config: OperatorConfig | None = None) -> None:
        self.kube, self.metrics, self.config = kube, metrics, config or OperatorConfig()
        self._memory: dict[tuple[str, str], _RunMemory] = {}
        self._groups: tuple[float, frozenset[str]] = (0.0, frozenset())
        self._levels: dict[str, tuple[float, Level]] = {}  # namespace -> Pod Security level
        self._quotas: dict[str, tuple[float, frozenset[str]]] = {}  # namespace -> limited
        self._phases: dict[tuple[str, str], str] = {}
        self._known: set[tuple[str, str]] = set()  # runs seen by the watch, for the resync
        self._guard = threading.Lock()
        # when each run is due for its next reconcile (time.monotonic()): the resync, a
        # restart's backoff, a Workload Kueue has yet to make, a transient API error
        self._due: dict[tuple[str, str], float] = {}
        self._wake = threading.Condition(self._guard)
        # kopf's index of the watched children (``CHILD_INDEX``): (namespace, run) -> their
        # latest bodies, kept by the watches that ``register`` sets up, so that reads of these
        # kinds cost no request. None until kopf hands it over at start-up (or never, for a
        # Reconciler used without kopf): every child is then read from the API.
        self.children: Mapping[tuple[str, str], Collection[dict[str, Any]]] | None = None
        self._resync: threading.Thread | None = None
        self._stop_resync = threading.Event()
        self.netprobe = NetworkPolicyProbe(kube)
        telemetry.watch_queue(metrics, self.queue_depth)

    def drifted(self, body: Mapping[str, Any], deleted: bool) -> bool:
        """Whether a watched child's event shows drift: deleted, or a field the operator's last
        apply owned is owned by it no more (the server moves a field's ownership to whoever
        changes or removes its value). A write to fields the operator does not apply is no
        drift: an autoscaler's replicas, Kueue's ``suspend``, node selector and tolerations, a
        rollout restart's annotation. Not judged: an event older than that apply (a lower
        generation) and one that comes while an apply of the child is in flight (its own)."""
        meta = body.get("metadata") or {}
        run_name = (meta.get("labels") or {}).get(RUN_LABEL)
        if deleted or not run_name:
            return deleted
        mem = self.memory(meta.get("namespace", ""), run_name)
        key = (body.get("kind", ""), meta.get("name", ""))
        last = mem.owned.get(key)
        if (
            last is None
            or key in mem.applying
            or int(meta.get("generation") or 0) < last.generation
        ):
            return False
        admitted = QUEUE_ADMITTED.get(key[0], ())
        judged = {p for p in last.fields if not admitted or p[: len(admitted)] != admitted}
        return not judged <= owned_fields(dict(body), FIELD_MANAGER)

    def child_changed(self, body: Mapping[str, Any], deleted: bool) -> None:
        """A watched child's event: its run is reconciled (coalesced, ``reconcile_named``) when
        the child drifted (it is applied again) or feeds the status (recomputed); other events
        cost nothing. Hand-written: kopf serialises the handlers of one object, but a child's
        event is another object's, and kopf cannot trigger the run's handler from it (nor
        retries an event handler: a transient API error requeues the run instead)."""
        meta = body.get("metadata") or {}
        run_name, namespace = (meta.get("labels") or {}).get(RUN_LABEL), meta.get("namespace", "")
        if not run_name:
            return
        if self.drifted(body, deleted):
            mem = self.memory(namespace, run_name)
            with self._guard:
                mem.drifted.add((body.get("kind", ""), meta.get("name", "")))
        elif not feeds_status(body):
            return
        try:
            self.reconcile_named(namespace, run_name)
        except kopf.TemporaryError as err:
            log.warning("reconcile of %s/%s failed: %s", namespace, run_name, err)
            self.requeue(namespace, run_name, err.delay or 1.0)

    def read(
        self, api_version: str, kind: str, namespace: str, obj_name: str, run_name: str
    ) -> dict[str, Any] | None:
        """A child of ``run_name`` from kopf's index when its kind is watched, else from the
        API."""
        if self.children is None or kind not in CACHED_KINDS:
            return self.kube.get(api_version, kind, namespace, obj_name)
        store = self.children.get((namespace, run_name), ())
        # list(): one C-level copy, safe while kopf's event loop updates the index
        found = [
            body
            for body in list(store)
            if body.get("kind") == kind and body["metadata"].get("name") == obj_name
        ]
        if len(found) > 1:
            # kopf indexes by uid: a replaced object (a restart's Job) stays beside its successor
            # until kopf handles its deletion event, which waits behind that object's handler
            return self.kube.get(api_version, kind, namespace, obj_name)
        return found[0] if found else None

    def memory(self, namespace: str, run_name: str) -> _RunMemory:
        with self._guard:
            return self._memory.setdefault((namespace, run_name), _RunMemory())

    def queue_depth(self) -> int:
        """Runs with a reconcile in progress or pending (the operator's work queue)."""
        with self._guard:
            return sum(m.dirty or m.lock.locked() for m in self._memory.values())

    def crds(self) -> frozenset[str]:
        """Optional API groups both installed and enabled (``OperatorConfig.integrations``)."""
        return self.installed() & self.config.integrations

    def installed(self) -> frozenset[str]:
        """Optional API groups the cluster serves, enabled or not (cached)."""
        stamp, groups = self._groups
        if time.monotonic() - stamp > self.config.crd_cache_seconds:
            groups = frozenset(self.kube.api_groups()) & OPTIONAL_GROUPS
            self._groups = (time.monotonic(), groups)
        return groups

    def reconcile_named(
        self, namespace: str, run_name: str, force_apply: bool = False, passes: int = MAX_PASSES
    ) -> None:
        """Reconcile a run by name (a child's event, the requeue). Coalesced: bursts of child
        events (a Deployment rolling, the trainer reporting) cost one reconcile at a time, and
        none is lost: whoever holds the run's lock goes again while the ``dirty`` flag is set,
        at most ``passes`` times; a run still dirty then is requeued (the resync thread takes
        it), so that a reconcile as slow as the events that dirty it (a loaded machine) never
        keeps its caller, a watch's thread or the resync thread, forever."""
        mem = self.memory(namespace, run_name)
        mem.dirty = True
        while mem.dirty:
            if not mem.lock.acquire(blocking=False):
                return
            try:
                while mem.dirty:
                    if passes <= 0:
                        self.requeue(namespace, run_name, 0.0)
                        return
                    passes -= 1
                    self._locked_reconcile(namespace, run_name, mem, force_apply)
            finally:
                mem.lock.release()

    def reconcile(self, body: Mapping[str, Any], force_apply: bool = False) -> Outcome | None:
        """One full reconcile (waits for one in progress); raises ``kopf.TemporaryError`` on
        transient API errors. Events that came during it are left to the resync thread (the
        run is due at once): the caller, kopf's handler, is not kept chasing them."""
        namespace, run_name = body["metadata"].get("namespace", ""), body["metadata"]["name"]
        mem = self.memory(namespace, run_name)
        with mem.lock:
            outcome = self._locked_reconcile(namespace, run_name, mem, force_apply)
        if mem.dirty:
            self.requeue(namespace, run_name, 0.0)
        return outcome

    def _locked_reconcile(
        self, namespace: str, run_name: str, mem: _RunMemory, force_apply: bool
    ) -> Outcome | None:
        """Re-read the run first: the body kopf hands over may predate our last status write."""
        started, result = time.monotonic(), "error"
        mem.dirty = False  # everything before this read is seen by it
        try:
            fresh = self.kube.get(f"{API_GROUP}/{API_VERSION}", "GagarRun", namespace, run_name)
            if (
                fresh is None
                or fresh["metadata"].get("deletionTimestamp")
                or not selects(self.config.run_selector, fresh["metadata"].get("labels") or {})
            ):  # gone, or another operator's run (a child's event names it too)
                result = "gone"
                return None
            outcome = self._reconcile(fresh, mem, force_apply)
            result = "invalid" if outcome.status.phase == "Stalled" else "ok"
            return outcome
        except KubeError as err:
            telemetry.reconcile_error(
                self.metrics, "api_transient" if err.transient else "api_permanent"
            )
            if err.transient:
                raise kopf.TemporaryError(f"API error, retrying: {err}", delay=1) from None
            raise
        except Exception:
            telemetry.reconcile_error(self.metrics, "internal")
            raise
        finally:
            elapsed = time.monotonic() - started
            log.debug("reconcile %s/%s: %s in %.3f s", namespace, run_name, result, elapsed)
            self.metrics.counter("gagar_operator_reconciles_total").labels(result=result).inc()
            self.metrics.histogram("gagar_operator_reconcile_duration_seconds").observe(elapsed)

    def _reconcile(self, raw: dict[str, Any], mem: _RunMemory, force_apply: bool) -> Outcome:
        """The level-triggered reconcile: observe -> status -> desired -> apply -> status."""
        generation = int(raw["metadata"].get("generation", 1))
        prev = previous_status(raw)
        run, error = parse_run(raw)
        if run is not None and not (prev is not None and prev.phase in TERMINAL):
            error = self._distrusted(run)
            run = None if error else run
        if run is None:
            if not (prev is not None and prev.phase in TERMINAL):
                error = self._suspend_last_applied(raw, mem, error or "invalid spec")
            outcome = compute_status(
                None, Observed(generation, spec_error=error), prev, self.config.clock()
            )
            self._write_status(raw, prev, outcome)
            return outcome
        # observe (children from kopf's index) and write the status before acting
        with self._guard:
            drifted = frozenset(mem.drifted)  # what it observes includes these
        # one read of the cluster's API groups per reconcile: what it builds, what it refuses
        # and what it prunes agree (two reads around the cache's expiry once built a Job for a
        # run that asked for a JobSet, then kept it as the trainer's kind for the run's life)
        installed = self.installed()
        crds = installed & self.config.integrations
        finished = prev is not None and prev.phase in TERMINAL
        observed = self._observe(run, generation, crds, mem, finished)
        if observed.trainer is not None and observed.trainer.kind == "Job":
            crds -= {JOBSET}  # the trainer keeps its kind for the run's life (never pruned mid-run)
        outcome = compute_status(run.spec, observed, prev, self.config.clock())
        self._write_status(raw, prev, outcome)  # before acting: a restart is counted exactly once
        restarted = self._restart_trainer(run, crds, observed, outcome.attempt)
        if outcome.retry_after is not None:  # a restart waits for its backoff: look again then
            self.requeue(raw["metadata"].get("namespace", ""), run.metadata.name,
                         outcome.retry_after + 0.05)  # fmt: skip
        # the desired state (pure) and its apply
        ctx = BuildContext(
            uid=raw["metadata"]["uid"],
            crds=crds,
            attempt=outcome.attempt,
            in_a_row=outcome.status.restarts_in_a_row,
            resumed_from=outcome.status.restart_checkpoint_step,
            state="terminal" if outcome.terminal else "active",
            hold_trainer=observed.sandbox_refused is not None,
            scraper=self.config.scraper,
            image_registry=self.config.image_registry,
            quota_limits=frozenset() if outcome.terminal else self._quota_limits(_namespace(run)),
            task_images=self._task_images(raw, run, observed.progress.sandbox_images),
        )
        before = mem.apply_error
        desired = build_all(run, ctx)
        # an integration the run needs and may not use: refused (nothing applied), never run
        # without it; a suspend or an end is applied all the same (builders.integrations)
        trainer_is_job = observed.trainer is not None and observed.trainer.kind == "Job"
        stopping = run.spec.suspend or outcome.terminal
        blocked = blocking(run, installed, self.config.integrations, stopping, trainer_is_job)
        if blocked is None and not restarted:
            blocked = self._trainer_template(run, desired, observed, crds)
        if blocked is not None:
            mem.apply_error, mem.applied = (generation, *blocked), ""  # nothing half-applied
        else:
            # a finished run's objects change only with its spec: the resync does not re-apply
            force = (force_apply and not outcome.terminal) or restarted
            if not outcome.terminal and (force or not mem.token_ready):
                self._weight_sync_secret(run, ctx, mem)
            self._apply(run, desired, mem, generation, ctx, force)
            if queued(run, ctx) and not outcome.terminal:
                self._kueue_activation(run, ctx.crds, ctx.hold_trainer)
            if outcome.terminal and run.spec.trainer.ttl_seconds_after_finished is not None:
                self._expire_trainer(run, observed)
        with self._guard:
            mem.drifted -= drifted
        if mem.apply_error != before:  # the apply's outcome changes the status
            observed = self._observe(run, generation, crds, mem)
            final = compute_status(run.spec, observed, outcome.status, self.config.clock())
            self._write_status(raw, outcome.status, final)
            outcome = final
        return outcome

    def _task_images(
        self, raw: dict[str, Any], run: GagarRun, wanted: str | None
    ) -> tuple[str, ...]:
        """The task images the trainer wants pools of, as many as the trust policy lets a run
        have; what is refused is a Warning Event (repeats count on it), never applied."""
        checked = demand(wanted, self.config.trust.max_image_pools)
        refused = list(checked.refused)
        if checked.images and (why := no_image_pools(run)):
            refused.append(why)
        if refused:
            self._post(raw, [Event("Warning", "TaskImagesRefused", "; ".join(refused))])
        return checked.images

    def _suspend_last_applied(self, raw: dict[str, Any], mem: _RunMemory, error: str) -> str:
        """``spec.suspend: true`` on a run whose spec cannot be applied (invalid, or refused by
        the trust model) still stops its pods: the run its children were built from (the
        ``run.json`` of its own ConfigMap, valid and trusted when applied) is applied again,
        suspended, through the same builders (trainer suspended, pools at zero, autoscalers
        pruned, the Kueue Workload deactivated), and nothing of the new spec is. The Stalled
        message says so. Without that ConfigMap (nothing was ever applied) there is nothing
        to stop."""
        if (raw.get("spec") or {}).get("suspend") is not True:
            return error
        meta = raw["metadata"]
        ns, run_name = meta.get("namespace", ""), meta["name"]
        # not from the index: it holds the progress ConfigMap only (``feeds_status``)
        config = self.kube.get("v1", "ConfigMap", ns, f"{run_name}-config") or {}
        owners = config.get("metadata", {}).get("ownerReferences") or []
        if not any(o.get("uid") == meta["uid"] for o in owners):
            return error
        try:
            last = GagarRun.model_validate_json((config.get("data") or {})[RUN_FILE])
        except (KeyError, ValueError) as err:
            log.warning("%s/%s: its ConfigMap holds no run to suspend: %s", ns, run_name, err)
            return error
        spec = last.spec.model_copy(update={"suspend": True})
        stopped = last.model_copy(update={"spec": spec})
        prev = previous_status(raw) or GagarRunStatus()
        ctx = BuildContext(  # the trainer's attempt as the status counts it: the same Job
            uid=meta["uid"],
            crds=self.crds(),
            attempt=prev.trainer_restarts,
            in_a_row=prev.restarts_in_a_row,
            resumed_from=prev.restart_checkpoint_step,
            scraper=self.config.scraper,
            image_registry=self.config.image_registry,
            quota_limits=self._quota_limits(ns),
        )
        desired = build_all(stopped, ctx)
        generation = int(meta.get("generation", 1))
        self._apply(stopped, desired, mem, generation, ctx, force=False)
        if queued(stopped, ctx):
            self._kueue_activation(stopped, ctx.crds)
        if mem.apply_error is not None and mem.apply_error[0] == generation:
            return f"{error}; suspending the last applied spec failed: {mem.apply_error[2]}"
        return f"{error}; suspended: the pods of the last applied spec are stopped"

    # ------------------------------------------------------------------ trust
    def _distrusted(self, run: GagarRun) -> str | None:
        """What the run asks for beyond what the operator's configuration and the namespace's
        Pod Security admission allow (``builders.trust``), as an invalid spec's message."""
        trust = self.config.trust
        problems = trust_problems(run, trust, self._namespace_level(_namespace(run)))
        if trust.secret_label:
            problems += [p for p in unlisted_secrets(run, trust) if not self._labelled(run, p)]
        return "; ".join(f"{path}: {message}" for path, message in problems) or None

    def _namespace_level(self, namespace: str) -> Level:
        """The namespace's enforced Pod Security level (cached as the API groups are)."""
        stamp, level = self._levels.get(namespace, (0.0, "privileged"))
        if time.monotonic() - stamp > self.config.crd_cache_seconds:
            try:
                found = self.kube.get("v1", "Namespace", None, namespace) or {}
            except KubeError as err:
                if err.transient:
                    raise
                log.warning("cannot read namespace %s's labels: %s", namespace, err.message)
                found = {}
            level = namespace_level((found.get("metadata") or {}).get("labels") or {})
            self._levels[namespace] = (time.monotonic(), level)
        return level

    def _quota_limits(self, namespace: str) -> frozenset[str]:
        """Resources the namespace's ResourceQuotas track as limits (cached as the API groups
        are): every container of a run's pods then states a limit (``with_quota_limits``)."""
        stamp, limited = self._quotas.get(namespace, (0.0, frozenset()))
        if time.monotonic() - stamp > self.config.crd_cache_seconds:
            try:
                quotas = self.kube.list("v1", "ResourceQuota", namespace)
            except KubeError as err:
                if err.transient:
                    raise
                log.warning("cannot list ResourceQuotas of %s: %s", namespace, err.message)
                quotas = []
            hard = [(q.get("spec") or {}).get("hard") or {} for q in quotas]
            limited = frozenset().union(*(quota_limited(h) for h in hard))
            self._quotas[namespace] = (time.monotonic(), limited)
        return limited

    def _labelled(self, run: GagarRun, problem: tuple[str, str]) -> bool:
        """Whether the Secret a refused reference names carries the configured label."""
        name = next(n for at, n in run_secret_refs(run) if at == problem[0])
        key, _, value = self.config.trust.secret_label.partition("=")
        try:
            secret = self.kube.get("v1", "Secret", _namespace(run), name) or {}
        except KubeError as err:
            if err.transient:
                raise
            log.warning("cannot read Secret %s's labels: %s", name, err.message)
            return False
        return ((secret.get("metadata") or {}).get("labels") or {}).get(key) == value

    # ------------------------------------------------------------------ requeue
    def requeue(self, namespace: str, run_name: str, seconds: float) -> None:
        """Reconcile the run again in ``seconds`` at the latest (the earliest due time of a run
        wins: a level-triggered reconcile that comes early just finds nothing to do)."""
        due, key = time.monotonic() + seconds, (namespace, run_name)
        with self._wake:
            if due < self._due.get(key, float("inf")):
                self._due[key] = due
                self._wake.notify()

    def resync_loop(self, stop: threading.Event) -> None:
        """The operator's one timer: every ``resync_seconds`` it reconciles every known run
        (its status from kopf's index and one read of the run itself; an apply only when the
        desired state changed — its hash — never a timed re-apply), and in between each run
        that ``requeue`` made due. An error is logged and the run tried again later: after the
        error's delay when it is transient, else at the next resync.

        Hand-written, not ``@kopf.timer``/``@kopf.daemon``: kopf puts a finalizer on every
        object with a timer or daemon, and a run deleted while no operator runs (after
        ``helm uninstall``) would then hang in deletion."""
        resync_at = time.monotonic() + self.config.resync_seconds
        while not stop.is_set():
            with self._wake:
                now = time.monotonic()
                resync = now >= resync_at
                due = set(self._known) if resync else set()
                due |= {k for k, t in self._due.items() if t <= now}
                if not due and not resync:
                    self._wake.wait(timeout=min([resync_at, *self._due.values()]) - now)
                    continue
                for key in due:
                    self._due.pop(key, None)
            for namespace, run_name in sorted(due):
                if stop.is_set():
                    return
                try:
                    self.reconcile_named(namespace, run_name)
                except kopf.TemporaryError as err:  # an API error: look again shortly
                    log.warning("reconcile of %s/%s failed: %s", namespace, run_name, err)
                    self.requeue(namespace, run_name, err.delay or 1.0)
                except Exception as err:  # the next resync retries; nothing to crash for
                    log.warning("reconcile of %s/%s failed: %s", namespace, run_name, err)
            if resync:
                resync_at = time.monotonic() + self.config.resync_seconds

    def start_resync(self) -> None:
        """Run ``resync_loop`` in a thread of its own (at the operator's start-up)."""
        self._stop_resync = threading.Event()
        self._resync = threading.Thread(
            target=self.resync_loop, args=(self._stop_resync,), name="gagar-resync", daemon=True
        )
        self._resync.start()

    def stop_resync(self, timeout: float = STOP_RESYNC_S) -> None:
        """Stop the resync thread and wait for a reconcile it has in flight (at the operator's
        clean-up): an operator that returned leaves nothing writing to the API or its log."""
        thread, self._resync = self._resync, None
        if thread is None:
            return
        self._stop_resync.set()
        self.wake()
        thread.join(timeout)
        if thread.is_alive():
            log.warning("the resync's reconcile in flight did not end within %.0f s", timeout)

    def wake(self) -> None:
        """Make ``resync_loop`` look at its stop flag and due times now."""
        with self._wake:
            self._wake.notify()

    # ------------------------------------------------------------------ observe
    def _observe(
        self,
        run: GagarRun,
        generation: int,
        crds: frozenset[str],
        mem: _RunMemory,
        finished: bool = False,
    ) -> Observed:
        ns, spec = _namespace(run), run.spec
        trainer = None
        if uses_jobset(run, BuildContext(crds=crds)):
            js = self.kube.get("jobset.x-k8s.io/v1alpha2", "JobSet", ns, name(run, "trainer"))
            trainer = parse_jobset(js, spec.trainer.nodes) if js else None
        if trainer is None:  # also a Job made before the JobSet CRD appeared: it stays a Job
            job = self.read("batch/v1", "Job", ns, name(run, "trainer"), run.metadata.name)
            trainer = (
                parse_job(job) if job and not job["metadata"].get("deletionTimestamp") else None
            )
        pools = {}
        for pool in ("rollout", "grader", "sandbox"):
            dep = self.read("apps/v1", "Deployment", ns, name(run, pool), run.metadata.name)
            if pool == "sandbox" and spec.sandbox.isolation == "agent-sandbox":
                dep = None  # its pool is the SandboxWarmPool (same replica fields)
                if AGENT_SANDBOX in crds:
                    dep = self.read(
                        AGENT_SANDBOX_API, "SandboxWarmPool", ns, name(run, pool), run.metadata.name
                    )
            if dep is not None:
                pools[pool] = parse_deployment(dep)
        for env in environment_pools(run):  # none with agent-sandbox (the spec refuses them)
            dep = self.read("apps/v1", "Deployment", ns, env.name, run.metadata.name)
            if dep is not None and env.environment is not None:
                pools[environment_pool(env.environment)] = parse_deployment(dep)
        progress = self.read("v1", "ConfigMap", ns, name(run, "progress"), run.metadata.name)
        progress = progress or {}
        wanted = demand(
            (progress.get("data") or {}).get(IMAGES_KEY), self.config.trust.max_image_pools
        )
        for img in image_pools(run, BuildContext(task_images=wanted.images)):
            dep = self.read("apps/v1", "Deployment", ns, img.name, run.metadata.name)
            if dep is not None:
                pools[img.metrics_pool] = parse_deployment(dep)
        pods, claim = [], None
        if not finished and (trainer is None or trainer.ready < spec.trainer.nodes):  # why it waits
            selector = f"gagar.dev/run={run.metadata.name},app.kubernetes.io/component=trainer"
            pods = self.kube.list("v1", "Pod", ns, selector)
            claim = self._claim_pending(run)
        error = mem.apply_error if mem.apply_error and mem.apply_error[0] == generation else None
        policies = self._network_policies(run, finished)
        return Observed(
            generation=generation,
            trainer=trainer,
            pools=pools,
            progress=parse_progress(progress.get("data")),
            apply_error=error[2] if error else None,
            apply_reason=error[1] if error else "ApplyFailed",
            waiting=waiting_reasons(pods),
            sandbox_refused=self._sandbox_refusal(run, pools, finished),
            claim_pending=claim,
            network_policies=policies,
            autoscalers=() if finished or spec.suspend else self._autoscalers(run),
        )

    def _autoscalers(self, run: GagarRun) -> tuple[str, ...]:
        """Why each HPA-scaled pool's HorizontalPodAutoscaler cannot scale it (``PoolsReady``)."""
        out = []
        for component in ("rollout", "grader"):
            pool = getattr(run.spec, component)
            auto = pool.autoscaling
            if pool.endpoint is not None or auto is None or auto.backend != "hpa":
                continue
            api = ("autoscaling/v2", "HorizontalPodAutoscaler")
            hpa = self.kube.get(*api, _namespace(run), name(run, component))
            problem = hpa and autoscaler_problem(hpa, component, hpa_metric(component))
            if problem:
                out.append(problem)
        return tuple(out)

    def _network_policies(self, run: GagarRun, finished: bool) -> tuple[str, str, str] | None:
        """The namespace's NetworkPolicy probe verdict (started by the first run that asks; a
        finished run starts none); while it runs the run is looked at again shortly."""
        if not self.config.network_policy_probe:
            return None
        ns = _namespace(run)
        if finished:
            return self.netprobe.cached(ns) or ("Unknown", "NotChecked", "the run ended first")
        ctx = BuildContext(image_registry=self.config.image_registry)
        verdict = self.netprobe.verdict(ns, image(run.spec.grader.image, ctx))
        if verdict is None:
            self.requeue(ns, run.metadata.name, PROBE_POLL_S)
            return ("Unknown", "Probing", f"probing whether {ns} enforces NetworkPolicies")
        return verdict

    def _claim_pending(self, run: GagarRun) -> str | None:
        """Why the checkpoint claim is not provisioned (its newest event, a Warning), while it
        is Pending: the events are listed only then."""
        ns, claim = _namespace(run), checkpoint_claim(run)
        if run.spec.trainer.checkpoint.existing_claim:  # not a child: not in kopf's index
            pvc = self.kube.get("v1", "PersistentVolumeClaim", ns, claim)
        else:
            pvc = self.read("v1", "PersistentVolumeClaim", ns, claim, run.metadata.name)
        if pvc is None or (pvc.get("status") or {}).get("phase") != "Pending":
            return None
        fields = f"involvedObject.kind=PersistentVolumeClaim,involvedObject.name={claim}"
        return claim_problem(pvc, self.kube.list("v1", "Event", ns, fields=fields))

    def _sandbox_refusal(
        self, run: GagarRun, pools: dict[str, PoolObserved], finished: bool
    ) -> str | None:
        """Why the pods of a sandbox pool, the default one or a task environment's, exit at
        start (no isolation works on their nodes), if they do; asked only while one is short."""
        sandboxes = [p for k, p in pools.items() if k == "sandbox" or k.startswith("sandbox/")]
        if finished or all(p.ready >= p.desired for p in sandboxes):
            return None
        components = f"app.kubernetes.io/component in (sandbox,{ENVIRONMENT_COMPONENT})"
        selector = f"gagar.dev/run={run.metadata.name},{components}"
        return sandbox_refusal(self.kube.list("v1", "Pod", run.metadata.namespace, selector))

    # ------------------------------------------------------------------ act
    def _restart_trainer(
        self, run: GagarRun, crds: frozenset[str], observed: Observed, attempt: int
    ) -> bool:
        """Delete the trainer Job of an older attempt (failure policy); the apply recreates it."""
        job = observed.trainer
        if job is None or job.kind != "Job" or job.attempt >= attempt:
            return False
        # by uid: a stale view of the old attempt must never delete the new attempt's Job (the
        # name may already be the new one's); either way the apply below makes the new attempt
        if self.kube.delete("batch/v1", "Job", _namespace(run), name(run, "trainer"), uid=job.uid):
            log.info("deleted trainer Job of attempt %d; creating attempt %d", job.attempt, attempt)
        return True

    def _trainer_template(
        self, run: GagarRun, desired: list[dict[str, Any]], observed: Observed, crds: frozenset[str]
    ) -> tuple[str, str] | None:
        """A change of the trainer's immutable template: once the run is suspended the trainer is
        deleted (its pods stop, as suspending stops them) and recreated, suspended, to resume from
        the last checkpoint; before that the change is refused, the message says why."""
        trainer = observed.trainer
        want = next((o for o in desired if o["kind"] in ("Job", "JobSet")), None)
        if trainer is None or want is None or not trainer.template_hash:
            return None
        if want["metadata"]["annotations"][TEMPLATE_ANNOTATION] == trainer.template_hash:
            return None
        if run.spec.suspend:
            api = "batch/v1" if trainer.kind == "Job" else f"{JOBSET}/v1alpha2"
            self.kube.delete(api, trainer.kind, _namespace(run), name(run, "trainer"), trainer.uid)
            log.info("trainer template changed while suspended: recreating the %s", trainer.kind)
            return None
        return (
            "TrainerTemplateChanged",
            "TrainerTemplateChanged: this change reaches the trainer's pod template, which a "
            "running Job cannot change; suspend the run (spec.suspend: true) to recreate the "
            "trainer from its last checkpoint, or revert the change",
        )

    def _weight_sync_secret(self, run: GagarRun, ctx: BuildContext, mem: _RunMemory) -> None:
        """The run's token for vLLM's weight-update routes: created once with a random token,
        never applied again (that would rotate it under running pods); made sure of once per
        operator process and run, and again on a forced apply or a trainer restart. Create only
        (409: it exists, the token stays): the operator's RBAC reads no Secret."""
        try:
            self.kube.create(build_weight_sync_secret(run, ctx, secrets.token_urlsafe(32)))
        except KubeError as err:
            if err.status != 409:
                raise
        mem.token_ready = True

    def _apply(
        self,
        run: GagarRun,
        desired: list[dict[str, Any]],
        mem: _RunMemory,
        generation: int,
        ctx: BuildContext,
        force: bool,
    ) -> None:
        """Apply every child (and prune) when the desired state changed or ``force``; else
        only the drifted children, alone (a deleted NetworkPolicy costs one request, not a
        re-apply of the run's dozens of children; a finished run's children are left as
        they are). ``ctx``: what the desired state was built with (its optional groups, and
        whether the run has ended)."""
        crds, terminal = ctx.crds, ctx.state == "terminal"
        fingerprint = hashlib.sha256(json.dumps(desired, sort_keys=True).encode()).hexdigest()
        with self._guard:
            drifted = frozenset() if terminal else frozenset(mem.drifted)
        whole = force or fingerprint != mem.applied
        objs = desired if whole else [o for o in desired if _key(o) in drifted]
        if not objs:
            return
        errors = [e for e in (self._apply_child(run, obj, mem, crds) for obj in objs) if e]
        if whole:
            self._prune(run, desired, terminal, crds)
        if errors:
            mem.apply_error, mem.applied = (generation, "ApplyFailed", "; ".join(errors)), ""
        elif whole:
            mem.apply_error, mem.applied = None, fingerprint

    def _apply_child(
        self, run: GagarRun, obj: dict[str, Any], mem: _RunMemory, crds: frozenset[str]
    ) -> str | None:
        """Apply one child and remember what it owns afterwards; a permanent refusal is
        returned as a message, a transient error raised."""
        key = _key(obj)
        mem.applying.add(key)  # set.add/discard are atomic: the watch threads read it unlocked
        try:
            self._hand_over_replicas(obj)
            queued_live = self._create_queued_suspended(run, obj, crds)
            if queued_live is not None:  # Kueue's admission stays Kueue's
                obj = leave_to_queue(obj, queued_live, OURS)
            live = self.kube.apply(obj) or {}
            # the child's generation, never named ``generation``: the run's apply error is
            # remembered with the run's generation (a child's made it miss the status)
            child_generation = int((live.get("metadata") or {}).get("generation") or 0)
            mem.owned[key] = Owned(child_generation, owned_fields(live, FIELD_MANAGER))
        except KubeError as err:
            if err.transient:
                raise
            return f"{key[0]}/{key[1]}: {err.message}"
        finally:
            mem.applying.discard(key)
        return None

    def _create_queued_suspended(
        self, run: GagarRun, obj: dict[str, Any], crds: frozenset[str]
    ) -> dict[str, Any] | None:
        """A queued trainer (no ``suspend`` in the operator's manifest: Kueue owns the field) is
        created suspended, by a manager of its own, so that it never starts before Kueue admits
        it, webhook or not, and the operator's later applies never remove the field (SSA
        removes only what the applier owns). The live queued trainer when it exists already."""
        meta = obj["metadata"]
        is_trainer = meta["name"] == name(run, "trainer") and obj["kind"] in ("Job", "JobSet")
        if not is_trainer or not queued(run, BuildContext(crds=crds)):
            return None
        live = self.kube.get(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        if live:
            return live
        held = {**obj, "spec": {**obj["spec"], "suspend": True}}
        self.kube.apply(held, manager=KUEUE_HANDOFF_MANAGER, force=False)
        return None

    def _expire_trainer(self, run: GagarRun, observed: Observed) -> None:
        """A finished run's trainer gets ``ttlSecondsAfterFinished`` only now: on a Job of a
        running run, the TTL controller could collect a failed attempt before the failure
        policy restarted it (a restart lost from the count)."""
        if observed.trainer is None:
            return
        kind = observed.trainer.kind
        api = f"{JOBSET}/v1alpha2" if kind == "JobSet" else "batch/v1"
        meta = {"name": name(run, "trainer"), "namespace": _namespace(run)}
        current = self.kube.get(api, kind, meta["namespace"], meta["name"])
        ttl = run.spec.trainer.ttl_seconds_after_finished
        if current is None or current["spec"].get("ttlSecondsAfterFinished") == ttl:
            return
        patch = {"apiVersion": api, "kind": kind, "metadata": meta}
        self.kube.apply({**patch, "spec": {"ttlSecondsAfterFinished": ttl}}, manager=TTL_MANAGER)

    def _kueue_activation(self, run: GagarRun, crds: frozenset[str], hold: bool = False) -> None:
        """``spec.suspend`` of a queued run (and ``hold``: its sandbox pods refuse to start, so
        its trainer must not hold accelerators) goes through Kueue: the trainer's Workload is
        deactivated (``spec.active: false``; Kueue evicts it, suspends the trainer and releases
        its quota) and reactivated on resume (Kueue queues it again and unsuspends the trainer
        when it admits it). Written only when it differs, so nothing loops. A Workload Kueue has
        not made yet is looked for again shortly."""
        ns, want = run.metadata.namespace, not (run.spec.suspend or hold)
        kind = "JobSet" if uses_jobset(run, BuildContext(crds=crds)) else "Job"
        api = f"{JOBSET}/v1alpha2" if kind == "JobSet" else "batch/v1"
        trainer = self.kube.get(api, kind, ns, name(run, "trainer"))
        uid = (trainer or {}).get("metadata", {}).get("uid")
        found = self.kube.list(KUEUE_API, "Workload", ns, f"{JOB_UID_LABEL}={uid}") if uid else []
        for wl in found:
            if (wl.get("spec") or {}).get("active", True) != want:
                body = {"spec": {"active": want}}
                self.kube.merge_patch(KUEUE_API, "Workload", ns, wl["metadata"]["name"], body)
                log.info("%s/%s: Workload %s active=%s", ns, run.metadata.name,
                         wl["metadata"]["name"], want)  # fmt: skip
        if not found and not want:
            self.requeue(_namespace(run), run.metadata.name, KUEUE_RETRY_SECONDS)

    def _hand_over_replicas(self, obj: dict[str, Any]) -> None:
        """Before the operator stops writing a Deployment's replicas (its pool became
        autoscaled), another manager applies the current value: the field keeps it until the
        autoscaler acts, instead of being removed and defaulted to 1 (8 replicas dropping to 1)."""
        if obj["kind"] != "Deployment" or "replicas" in obj["spec"]:
            return
        meta = obj["metadata"]
        current = self.kube.get("apps/v1", "Deployment", meta.get("namespace"), meta["name"])
        if current is None or not _applies_replicas(current):
            return
        handoff = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {k: meta[k] for k in ("name", "namespace") if k in meta},
            "spec": {"replicas": current["spec"].get("replicas", 1)},
        }
        self.kube.apply(handoff, manager=HANDOFF_MANAGER, force=False)

    def _prune(
        self, run: GagarRun, desired: list[dict[str, Any]], terminal: bool, crds: frozenset[str]
    ) -> None:
        """Delete children (by the run's label) that the current spec does not build; a finished
        trainer (built no more once the run is terminal) stays as the run's record. Kinds of an
        optional group outside ``crds`` (what ``desired`` was built with) are not listed."""
        wanted = {(o["kind"], o["metadata"]["name"]) for o in desired}
        if terminal:
            wanted |= {(kind, name(run, "trainer")) for kind in ("Job", "JobSet")}
        for api_version, kind in PRUNABLE:
            if api_version.split("/")[0] in OPTIONAL_GROUPS - crds:
                continue  # optional CRD not installed
            selector = f"gagar.dev/run={run.metadata.name}"
            try:
                found = self.kube.list(api_version, kind, run.metadata.namespace, selector)
            except KubeError as err:
                if err.status != 403:
                    raise
                log.warning("cannot prune %s (RBAC): %s", kind, err.message)
                continue  # a kind the operator may not list: it cannot have created one either
            for obj in found:
                if (kind, obj["metadata"]["name"]) not in wanted and _owned_by(obj, run):
                    self.kube.delete(
                        api_version, kind, run.metadata.namespace, obj["metadata"]["name"]
                    )

    def _write_status(
        self, raw: dict[str, Any], prev: GagarRunStatus | None, outcome: Outcome
    ) -> None:
        new = outcome.status.to_wire()
        if prev is None or new != prev.to_wire():
            meta = raw["metadata"]
            patch = dict(new)
            if gone := set(prev.pools if prev else ()) - set(outcome.status.pools):
                # a merge patch keeps map keys it does not name: a pool no more (a task
                # environment taken out, a pool switched to an endpoint) is deleted by a null
                patch["pools"] = {**new.get("pools", {}), **dict.fromkeys(gone)}
            self.kube.patch_status(meta.get("namespace"), meta["name"], patch)
            raw["status"] = new
        self._post(raw, outcome.events)
        self._export(raw, outcome.status)

    def _post(self, raw: dict[str, Any], events: list[Event]) -> None:
        """Post events through the API (not kopf's queue, which exists only inside kopf's
        handlers: a reconcile of the resync thread posts too); a failure is logged, not fatal.
        An event identical to one of the run's within ``EVENT_SERIES_S`` counts on that one."""
        meta = raw["metadata"]
        series = self.memory(meta["namespace"], meta["name"]).events
        for event in events:
            now, key = self.config.clock(), (event.type, event.reason, event.message)
            stamp = time.monotonic()
            for old in [k for k, s in series.items() if stamp - s.last > EVENT_SERIES_S]:
                del series[old]  # the series ended: a repeat after it is a new Event
            if key in series and self._repeat(meta["namespace"], series[key], now, stamp):
                continue
            body = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                "involvedObject": {
                    "apiVersion": f"{API_GROUP}/{API_VERSION}",
                    "kind": "GagarRun",
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "uid": meta.get("uid", ""),
                },
                "type": event.type,
                "reason": event.reason,
                "message": event.message[:1024],
                "source": {"component": FIELD_MANAGER},
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            }
            try:
                posted = self.kube.create(body)
            except KubeError as err:
                log.warning("event %s %s not posted: %s", event.type, event.reason, err)
                continue
            posted_name = ((posted or {}).get("metadata") or {}).get("name")
            if posted_name:
                series[key] = _Series(posted_name, 1, stamp)

    def _repeat(self, namespace: str, seen: _Series, now: str, stamp: float) -> bool:
        """Count a repeat on its Event (``count``, ``lastTimestamp``); False when that Event is
        gone (expired, deleted) or cannot be patched, so the repeat is posted anew."""
        body = {"count": seen.count + 1, "lastTimestamp": now}
        try:
            self.kube.merge_patch("v1", "Event", namespace, seen.name, body)
        except KubeError as err:
            log.debug("event %s not counted (%s): posting it again", seen.name, err)
            return False
        seen.count, seen.last = seen.count + 1, stamp
        return True

    def _export(self, raw: dict[str, Any], status: GagarRunStatus) -> None:
        meta = raw["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        self._phases[key] = status.phase
        self._count_phases()
        cond = self.metrics.gauge("gagar_run_condition")
        for c in status.conditions:
            for value in ("True", "False", "Unknown"):
                cond.labels(run=key[1], namespace=key[0], condition=c.type, status=value).set(
                    int(c.status == value)
                )

    def _count_phases(self) -> None:
        gauge = self.metrics.gauge("gagar_operator_runs")
        for phase in PHASES:
            gauge.labels(phase=phase).set(sum(p == phase for p in self._phases.values()))

    def remember(self, namespace: str, run_name: str) -> None:
        """A run the watch saw: resynced from now on."""
        with self._guard:
            self._known.add((namespace, run_name))

    def forget(self, namespace: str, run_name: str) -> None:
        """Drop a deleted run: its memory, its phase and its condition series."""
        with self._guard:
            self._known.discard((namespace, run_name))
            self._memory.pop((namespace, run_name), None)
            self._due.pop((namespace, run_name), None)
            self._phases.pop((namespace, run_name), None)
        cond = self.metrics.gauge("gagar_run_condition")
        for kind in CONDITION_TYPES:
            for value in ("True", "False", "Unknown"):
                with contextlib.suppress(KeyError):  # a series never exported
                    cond.remove(run_name, namespace, kind, value)
        self._count_phases()


def parse_selector(selector: str) -> list[tuple[str, str, str]]:
    """An equality-based label selector as (key, op, value) terms; op is ``=``, ``!=``,
    ``exists`` or ``!exists``. Set-based terms (``in``, ``notin``) are refused (ValueError)."""
    terms = []
    for raw in filter(None, (t.strip() for t in selector.split(","))):
        if " in " in raw or " notin " in raw or "(" in raw:
            raise ValueError(f"set-based selector terms are not supported: {raw!r}")
        if "!=" in raw:
            key, _, value = raw.partition("!=")
            terms.append((key.strip(), "!=", value.strip()))
        elif "=" in raw:
            key, _, value = raw.replace("==", "=").partition("=")
            terms.append((key.strip(), "=", value.strip()))
        elif raw.startswith("!"):
            terms.append((raw[1:].strip(), "!exists", ""))
        else:
            terms.append((raw, "exists", ""))
    return terms


def selects(selector: str, labels: Mapping[str, str]) -> bool:
    """Whether the labels match an equality-based selector (empty selects everything)."""
    checks = {
        "=": lambda k, v: labels.get(k) == v,
        "!=": lambda k, v: labels.get(k) != v,
        "exists": lambda k, _: k in labels,
        "!exists": lambda k, _: k not in labels,
    }
    return all(checks[op](key, value) for key, op, value in parse_selector(selector))


def _applies_replicas(obj: dict[str, Any]) -> bool:
    """Whether the operator's server-side apply owns ``spec.replicas``."""
    for entry in obj["metadata"].get("managedFields") or []:
        if entry.get("manager") == FIELD_MANAGER and entry.get("operation") == "Apply":
            spec = (entry.get("fieldsV1") or {}).get("f:spec") or {}
            return "f:replicas" in spec
    return False


def _owned_by(obj: dict[str, Any], run: GagarRun) -> bool:
    refs = obj["metadata"].get("ownerReferences") or []
    return any(r.get("kind") == "GagarRun" and r.get("name") == run.metadata.name for r in refs)


def register(registry: kopf.OperatorRegistry, reconciler: Reconciler) -> kopf.OperatorRegistry:
    """Attach the handlers to ``registry`` (a fresh one per operator: tests run several)."""

    @kopf.on.resume(API_GROUP, API_VERSION, PLURAL, registry=registry)
    @kopf.on.create(API_GROUP, API_VERSION, PLURAL, registry=registry)
    @kopf.on.update(API_GROUP, API_VERSION, PLURAL, field="spec", registry=registry)
    def run_changed(body: kopf.Body, **_: Any) -> None:
        outcome = reconciler.reconcile(body, force_apply=True)
        if outcome is not None and outcome.status.phase == "Stalled":
            stalled = next(c for c in outcome.status.conditions if c.type == "Stalled")
            if stalled.reason == "InvalidSpec":  # retrying cannot help; the next edit will
                raise kopf.PermanentError(stalled.message)

    # The resync and delayed re-checks are the operator's own thread over the runs it has seen
    # (``resync_loop`` says why no kopf timer).
    @kopf.on.event(API_GROUP, API_VERSION, PLURAL, registry=registry)
    def run_seen(name: str, namespace: str | None, type: str | None, **_: Any) -> None:
        if namespace is None:  # GagarRun is namespaced: the API never sends one without
            return
        if type == "DELETED":
            reconciler.forget(namespace, name)  # children go by owner-reference GC
        else:
            reconciler.remember(namespace, name)

    @kopf.on.startup(registry=registry)
    def start_resync(**kwargs: Any) -> None:
        reconciler.children = kwargs[CHILD_INDEX]  # kopf's indexes reach start-up handlers too
        reconciler.start_resync()

    @kopf.on.cleanup(registry=registry)
    def stop_resync(**_: Any) -> None:
        reconciler.stop_resync()

    async def child_indexed(body: kopf.Body, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
        """The children cache is kopf's: it indexes each watched child under its run (kopf
        drops a deleted one) before any handler sees the event, and starts no run's handler
        before the first listing of every child kind is indexed."""
        meta = body.get("metadata") or {}
        run_name = (meta.get("labels") or {}).get(RUN_LABEL)
        return {(meta.get("namespace", ""), run_name): dict(body)} if run_name else {}

    def child_changed(body: kopf.Body, type: str | None, **_: Any) -> None:
        reconciler.child_changed(body, deleted=type == "DELETED")

    _watch_children(registry, reconciler.config.integrations, child_indexed, child_changed)
    return registry


def _watch_children(
    registry: kopf.OperatorRegistry,
    integrations: Collection[str],
    indexed: Callable[..., Any],
    changed: Callable[..., Any],
) -> None:
    """kopf's watches of every kind of child (``child_watches``): each event goes to
    ``changed``; the kinds in ``CHILD_INDEXED`` feed kopf's index (``indexed``) too."""
    for group, version, plural in child_watches(integrations):
        resource = (group, version, plural) if group else (version, plural)
        kopf.on.event(*resource, labels=MANAGED, id=f"child-{plural}", registry=registry)(changed)
        if (group, version, plural) in CHILD_INDEXED:
            labels = {**MANAGED, **CHILD_INDEXED[group, version, plural]}
            kopf.index(*resource, labels=labels, id=CHILD_INDEX, registry=registry)(indexed)


# The watched children that kopf's index (CHILD_INDEX) keeps: those the status reads, by the
# labels (beyond MANAGED) that select them.
CHILD_INDEXED: dict[tuple[str, str, str], dict[str, str]] = {
    ("batch", "v1", "jobs"): {},
    ("apps", "v1", "deployments"): {},
    ("", "v1", "configmaps"): {"app.kubernetes.io/component": "progress"},
}
CACHED_KINDS = ("Job", "Deployment", "ConfigMap")  # what CHILD_INDEXED feeds CHILD_INDEX with
STATUS_KINDS = ("Job", "JobSet", "Deployment", "SandboxWarmPool")  # what the status reads


def child_watches(integrations: Collection[str]) -> list[tuple[str, str, str]]:
    """(group, version, plural) of every kind of child the operator applies: an optional
    group's kinds only when its integration is on (the chart grants their RBAC only then)."""
    watches = []
    for api_version, kind in CHILD_KINDS:
        group, _, version = api_version.rpartition("/")
        if group in OPTIONAL_GROUPS and group not in integrations:
            continue
        watches.append((group, version, PLURALS[kind]))
    return watches


def feeds_status(body: Mapping[str, Any]) -> bool:
    """Whether a child's changes reach the run's status (its trainer, pools and progress)."""
    labels = (body.get("metadata") or {}).get("labels") or {}
    kind = body.get("kind")
    return kind in STATUS_KINDS or (
        kind == "ConfigMap" and labels.get("app.kubernetes.io/component") == "progress"
    )


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def _namespace(run: GagarRun) -> str:
    """A GagarRun's namespace (the CRD is namespaced: one read from the API always has one)."""
    if run.metadata.namespace is None:
        raise ValueError(f"GagarRun {run.metadata.name} has no namespace")
    return run.metadata.namespace


def _label_selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def configure_settings(settings: kopf.OperatorSettings, run_selector: str = "") -> None:
    """Keep kopf's bookkeeping in annotations (the CRD's status schema has no room for it), and
    filter the watches on the server: the children's watches see only the operator's own objects
    (not every Job, Deployment, ConfigMap, Service... of the cluster), and the GagarRuns' watch
    only the runs ``run_selector`` selects."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kopf.gagar.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kopf.gagar.dev", key="last-handled-configuration"
    )
    settings.persistence.finalizer = "kopf.gagar.dev/finalizer"
    settings.posting.level = logging.INFO
    for api_version, kind in CHILD_KINDS:  # kinds not watched (integrations off) do no harm
        group, _, version = api_version.rpartition("/")
        key = (group, version, PLURALS[kind]) if group else (version, PLURALS[kind])
        settings.watching.label_selectors[key] = _label_selector(MANAGED)
    if run_selector:
        parse_selector(run_selector)  # refuses what the operator could not check itself
        settings.watching.label_selectors[API_GROUP, API_VERSION, PLURAL] = run_selector
