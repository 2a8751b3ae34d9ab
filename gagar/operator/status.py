"""Pure status calculator: (spec, observed children, trainer progress, previous status, now) → status.

Conditions follow Kubernetes conventions (kstatus): ``Ready``, ``Reconciling``, ``Stalled``,
``TrainerReady``, ``PoolsReady``, ``Suspended``, ``Complete``, ``Failed``, every one always present
with a reason, a message and ``observedGeneration``; ``lastTransitionTime`` only moves when a
condition's status flips (``set_condition``), so identical observations give an identical status
and the handler can skip the patch. ``phase`` is derived from the conditions for ``kubectl get``.

Failure policy (indexed Job): a failed Job of the current attempt spends one restart, after an
exponential backoff from the moment it failed (``failurePolicy.backoffSeconds``, doubling, capped
by ``maxBackoffSeconds``; ``Outcome.retry_after`` tells the handler when to look again): the
handler deletes it and applies attempt + 1, which resumes from the last checkpoint. Restarts in a
row are limited by ``failurePolicy.maxRestarts``; a checkpoint newer than the one the last restart
resumed from refills that budget (and resets the backoff). When it is spent, or when the pod failure policy failed the Job
outright (``reason: PodFailurePolicy``: the trainer exited with its permanent-error code), the run
is ``Failed``. A JobSet restarts itself; its ``status.restarts`` is copied. Terminal phases
(``Succeeded``, ``Failed``) are sticky. Pure: no I/O, ``now`` is an input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from gagar.operator.builders.images import IMAGE_POOL_PREFIX
from gagar.operator.observe import Observed, PoolObserved, TrainerObserved, environment_pool
from gagar.spec import (
    CONDITION_TYPES,
    CheckpointStatus,
    Condition,
    ConditionStatus,
    ConditionType,
    GagarRunSpec,
    GagarRunStatus,
    PoolStatus,
)

TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Event:
    """A Kubernetes event the handler should post (``type`` is Normal or Warning)."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Outcome:
    """The new status and what the handler must do about it."""

    status: GagarRunStatus
    attempt: int = 0  # trainer attempt the Job must carry; an older Job is deleted and recreated
    terminal: bool = False
    events: list[Event] = field(default_factory=list)
    retry_after: float | None = None  # reconcile again after this many seconds (a backoff)


def set_condition(conditions: list[Condition], new: Condition, now: str) -> list[Condition]:
    """Replace the condition of ``new.type``; keep ``lastTransitionTime`` unless the status flips."""
    old = next((c for c in conditions if c.type == new.type), None)
    stamp = old.last_transition_time if old is not None and old.status == new.status else now
    updated = new.model_copy(update={"last_transition_time": stamp})
    rest = [c for c in conditions if c.type != new.type]
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted([*rest, updated], key=lambda c: order[c.type])


def get_condition(status: GagarRunStatus, kind: str) -> Condition | None:
    return next((c for c in status.conditions if c.type == kind), None)


def _is_true(status: GagarRunStatus, kind: str) -> bool:
    cond = get_condition(status, kind)
    return cond is not None and cond.status == "True"


@dataclass(frozen=True)
class _Trainer:
    """The failure-policy verdict on the trainer."""

    restarts: int
    attempt: int
    outcome: str  # running | backoff | restarting | complete | failed
    reason: str = ""
    message: str = ""
    in_a_row: int = 0
    resumed_from: int | None = None
    retry_after: float | None = None  # seconds until the backoff ends


def _seconds_between(start: str, end: str) -> float:
    parse = datetime.fromisoformat
    return (parse(end.replace("Z", "+00:00")) - parse(start.replace("Z", "+00:00"))).total_seconds()


def backoff(spec: GagarRunSpec, in_a_row: int) -> float:
    """Seconds to wait before a restart that follows ``in_a_row`` restarts in a row."""
    policy = spec.trainer.failure_policy
    return min(policy.max_backoff_seconds, policy.backoff_seconds * 2.0 ** min(in_a_row, 32))


# Failures no restart can mend: the trainer's own verdict on its configuration (the pod failure
# policy), and an attempt past trainer.activeDeadlineSeconds.
PERMANENT = {"PodFailurePolicy": "TrainerFailedPermanently", "DeadlineExceeded": "DeadlineExceeded"}


def judge_trainer(
    spec: GagarRunSpec,
    job: TrainerObserved | None,
    prev: GagarRunStatus,
    checkpoint: int | None,
    now: str,
) -> _Trainer:
    """Apply the failure policy to the observed trainer, given the previous status, the newest
    checkpoint's step and the time. A failed Job is restarted after ``backoff`` (from the moment
    it failed) while fewer than ``maxRestarts`` restarts happened in a row; a checkpoint newer
    than the one the last restart resumed from is progress, and refills the budget."""
    budget = spec.trainer.failure_policy.max_restarts
    restarts, in_a_row, resumed = (
        prev.trainer_restarts,
        prev.restarts_in_a_row,
        prev.restart_checkpoint_step,
    )
    if job is None:
        return _Trainer(restarts, restarts, "running", in_a_row=in_a_row, resumed_from=resumed)
    if job.kind == "Job" and job.attempt >= restarts:  # the current attempt's Job remembers too:
        in_a_row, resumed = job.in_a_row, job.resumed_from  # a lost status never resets the budget
    # the child remembers too: a lost or stale status never lowers the count
    restarts = max(restarts, job.restarts if job.kind == "JobSet" else job.attempt)
    if in_a_row and checkpoint is not None and checkpoint > (-1 if resumed is None else resumed):
        in_a_row = 0  # progress since the last restart: the budget refills

    def same(
        outcome: str, reason: str = "", message: str = "", after: float | None = None
    ) -> _Trainer:
        """A verdict that keeps the count and the failure policy's memory."""
        return _Trainer(restarts, restarts, outcome, reason, message, in_a_row, resumed, after)

    if job.complete:
        return same("complete", "TrainerSucceeded", "the trainer completed")
    if job.kind == "Job" and job.attempt < restarts:
        return same("restarting", "Restarting", f"attempt {restarts} is being created")
    if not job.failed:
        return same("running")
    detail = f"{job.failed_reason}: {job.failed_message}".strip(": ")
    if job.failed_reason in PERMANENT:
        return same("failed", PERMANENT[job.failed_reason], detail)
    if job.kind == "Job" and in_a_row < budget:
        wait = backoff(spec, in_a_row)
        left = wait - _seconds_between(job.failed_time, now) if job.failed_time else 0.0
        restart = (
            f"trainer failed ({detail}); restart {in_a_row + 1}/{budget} from the last checkpoint"
        )
        if left > 0:
            message = f"{restart} in {left:.0f} s (backoff {wait:.0f} s)"
            return same("backoff", "RestartBackoff", message, left)
        return _Trainer(
            restarts + 1, restarts + 1, "restarting", "TrainerRestarted", restart, in_a_row + 1,
            checkpoint,
        )  # fmt: skip
    if job.kind == "JobSet":  # JobSet counts its own restarts, never refilled
        message = f"trainer failed after {restarts} restarts ({detail})"
    else:
        message = f"trainer failed after {in_a_row} restarts in a row without progress ({detail})"
    return same("failed", "RestartBudgetExhausted", message)


def pool_statuses(spec: GagarRunSpec, obs: Observed) -> dict[str, PoolStatus]:
    """Per-pool replicas and ready replicas, for the pools this run has: those of its spec and
    the task images' pools its trainer asked for (``sandbox/image-<hash>``, which come and go
    with the trainer's list, so ``PoolsReady`` never waits for them)."""
    out = {}
    on_demand = [p for p in obs.pools if p.startswith(IMAGE_POOL_PREFIX)]
    for pool in [*expected_pools(spec), *on_demand]:
        seen = obs.pools.get(pool, PoolObserved())
        version = obs.progress.rollout_policy_version if pool == "rollout" else None
        out[pool] = PoolStatus(
            replicas=seen.replicas,
            ready_replicas=seen.ready,
            policy_version=version,
            selector=seen.selector or None,
        )
    return out


def expected_pools(spec: GagarRunSpec) -> list[str]:
    """The run's pools: rollout and grader (unless endpoints), and on sandbox pods the default
    executor pool and one per task environment (``sandbox/<environment>``)."""
    pools = [
        p for p, s in (("rollout", spec.rollout), ("grader", spec.grader)) if s.endpoint is None
    ]
    if spec.sandbox.backend != "pods":
        return pools
    return [*pools, "sandbox", *(environment_pool(e.name) for e in spec.sandbox.environments)]


def _pools_not_ready(spec: GagarRunSpec, obs: Observed) -> list[str]:
    """Pools that are missing or have fewer ready replicas than desired (desired 0 is ready)."""
    lagging = []
    for pool in expected_pools(spec):
        seen = obs.pools.get(pool)
        if seen is None:
            lagging.append(f"{pool} not created")
        elif seen.ready < seen.desired:
            lagging.append(f"{pool} {seen.ready}/{seen.desired} ready")
    return lagging


@dataclass(frozen=True)
class _Facts:
    """What the condition functions share (computed once per reconcile)."""

    spec: GagarRunSpec
    obs: Observed
    verdict: _Trainer
    terminal: str | None  # Succeeded | Failed | None
    prev: GagarRunStatus


def _c(kind: ConditionType, ok: bool | None, reason: str, message: str = "") -> Condition:
    status: ConditionStatus = "Unknown" if ok is None else ("True" if ok else "False")
    return Condition(type=kind, status=status, reason=reason, message=message)


def sandbox_advice(isolation: str) -> str:
    """What to change when sandbox pods cannot isolate commands in ``isolation``."""
    if isolation == "bubblewrap":
        return (
            "set spec.sandbox.isolation to pod or auto (the pod is the boundary: best with a "
            "gVisor or Kata spec.sandbox.runtimeClassName), or give the sandbox pods a node "
            "where they may create namespaces (user-namespaced pods with a seccomp profile "
            "that allows unshare and mount; docs/operations.md)"
        )
    return (
        "the pod mode needs an executor that may switch uids and load a seccomp filter: keep "
        "the rendered securityContext (root with SETUID/SETGID/CHOWN/FOWNER/DAC_OVERRIDE/KILL/"
        "SETPCAP, no privilege escalation) and admit it (Pod Security baseline; docs/operations.md)"
    )


# What to change when the checkpoint claim is not provisioned (docs/operations.md, "Storage").
CLAIM_ADVICE = (
    "The StorageClass must offer the claim's access mode: a cluster's default class (EBS, "
    "Persistent Disk) offers ReadWriteOnce only. Set spec.trainer.checkpoint.accessMode: "
    "ReadWriteOnce (or Auto; a one-node trainer alone mounts it), or storageClassName to a "
    "ReadWriteMany class (EFS, Filestore, NFS)"
)


def _trainer_ready(f: _Facts) -> Condition:
    nodes, job = f.spec.trainer.nodes, f.obs.trainer
    if f.terminal is not None:
        return _c("TrainerReady", False, "Completed" if f.terminal == "Succeeded" else "Failed")
    if f.verdict.outcome in ("restarting", "backoff"):
        return _c("TrainerReady", False, f.verdict.reason, f.verdict.message)
    if f.obs.sandbox_refused and not f.spec.suspend:
        held = "the trainer is held (suspended) until sandbox pods can start; see PoolsReady"
        return _c("TrainerReady", False, "WaitingForSandbox", held)
    if job is None:
        return _c("TrainerReady", False, "NotCreated", "the trainer is not created yet")
    if f.spec.suspend:
        return _c("TrainerReady", False, "Suspended", "the trainer is suspended")
    message = f"{min(job.ready, nodes)}/{nodes} trainer pods ready"
    if job.ready >= nodes:
        return _c("TrainerReady", True, "Running", message)
    if f.obs.claim_pending:
        return _c("TrainerReady", False, "CheckpointClaimPending",
                  f"{f.obs.claim_pending}. {CLAIM_ADVICE}")  # fmt: skip
    waiting = f" (waiting: {', '.join(f.obs.waiting)})" if f.obs.waiting else ""
    return _c("TrainerReady", False, "Starting", message + waiting)


def _pools_ready(f: _Facts) -> Condition:
    if f.terminal is not None:
        return _c("PoolsReady", False, "Released", "pools scaled to zero: the run ended")
    if f.spec.suspend:
        return _c("PoolsReady", False, "Suspended", "pools scaled to zero while suspended")
    if f.obs.sandbox_refused:
        why = f"sandbox pods cannot start: {f.obs.sandbox_refused}. To fix: "
        return _c(
            "PoolsReady",
            False,
            "SandboxUnavailable",
            why + sandbox_advice(f.spec.sandbox.isolation),
        )
    lagging = _pools_not_ready(f.spec, f.obs)
    if lagging:
        return _c("PoolsReady", False, "PoolsNotReady", "; ".join(lagging))
    if f.obs.autoscalers:  # ready at their minimum, but never scaling: said, not silent
        return _c("PoolsReady", False, "AutoscalerInactive", "; ".join(f.obs.autoscalers))
    pools = expected_pools(f.spec)
    return _c(
        "PoolsReady",
        True,
        "PoolsReady",
        f"ready: {', '.join(pools) or 'none (external endpoints)'}",
    )


def _drained(f: _Facts) -> bool:
    job = f.obs.trainer
    idle = job is None or job.active == 0
    return idle and all(
        f.obs.pools.get(p, PoolObserved()).replicas == 0 for p in expected_pools(f.spec)
    )


def _suspended(f: _Facts) -> Condition:
    if not f.spec.suspend or f.terminal is not None:
        return _c("Suspended", False, "NotSuspended")
    if _drained(f):
        return _c(
            "Suspended",
            True,
            "Suspended",
            "trainer stopped and pools at zero; resume continues from the last checkpoint",
        )
    return _c("Suspended", True, "Suspending", "stopping trainer pods and scaling pools to zero")


def _terminal_conditions(f: _Facts) -> list[Condition]:
    if f.prev.phase in TERMINAL:  # sticky: keep what was decided when the run ended
        kept = [get_condition(f.prev, t) for t in ("Complete", "Failed")]
        if all(kept):
            return [c.model_copy(update={"last_transition_time": None}) for c in kept if c]
    done, failed = f.terminal == "Succeeded", f.terminal == "Failed"
    complete = _c(
        "Complete",
        done,
        "TrainerSucceeded" if done else "InProgress",
        f.verdict.message if done else "",
    )
    fail = _c(
        "Failed",
        failed,
        f.verdict.reason if failed else "NoFailure",
        f.verdict.message if failed else "",
    )
    return [complete, fail]


def _network_policies(f: _Facts) -> Condition:
    """Whether the run's NetworkPolicies are enforced (``operator.netprobe``): a warning, not a
    readiness gate; the run works either way, less fenced where they are not."""
    probe = f.obs.network_policies
    if probe is None:
        return _c("NetworkPoliciesEnforced", None, "NotChecked",
                  "the operator's NetworkPolicy probe is off (--no-network-policy-probe)")  # fmt: skip
    status, reason, message = probe
    return _c("NetworkPoliciesEnforced", {"True": True, "False": False}.get(status), reason,
              message)  # fmt: skip


def _stalled(f: _Facts) -> Condition:
    if f.obs.apply_error:
        return _c("Stalled", True, f.obs.apply_reason, f.obs.apply_error)
    return _c("Stalled", False, "NotStalled")


def _ready(f: _Facts, parts: dict[str, Condition]) -> Condition:
    if f.terminal is not None:
        return _c("Ready", False, f.terminal, parts["Failed"].message or parts["Complete"].message)
    for kind in ("Stalled", "Suspended"):
        if parts[kind].status == "True":
            return _c("Ready", False, parts[kind].reason, parts[kind].message)
    for kind in ("TrainerReady", "PoolsReady"):
        if parts[kind].status != "True":
            return _c("Ready", False, parts[kind].reason, parts[kind].message)
    return _c("Ready", True, "Running", f"training at step {_step(f)}")


def _reconciling(f: _Facts, parts: dict[str, Condition]) -> Condition:
    settled = (
        f.terminal is not None
        or parts["Ready"].status == "True"
        or parts["Stalled"].status == "True"
    )
    if settled or parts["Suspended"].reason == "Suspended":
        return _c("Reconciling", False, "Settled")
    return _c("Reconciling", True, "Progressing", parts["Ready"].message)


def _step(f: _Facts) -> int:
    return f.obs.progress.step if f.obs.progress.step is not None else f.prev.step


def _phase(f: _Facts, parts: dict[str, Condition]) -> str:
    if f.terminal is not None:
        return f.terminal
    if parts["Stalled"].status == "True":
        return "Stalled"
    if f.spec.suspend:
        return "Suspended"
    job = f.obs.trainer
    started = job is not None and (job.active > 0 or job.ready > 0)
    # once Running, a run stays Running through restarts, backoffs and pods waiting to be
    # scheduled again (the conditions say why it is not Ready); only a resume starts at Pending
    was_running = f.prev.phase == "Running"
    running = started or was_running or _step(f) > 0 or f.verdict.restarts > 0
    return "Running" if running else "Pending"


def _checkpoint(f: _Facts) -> CheckpointStatus | None:
    p = f.obs.progress
    if p.checkpoint_step is None or p.checkpoint_uri is None:
        return f.prev.last_checkpoint
    return CheckpointStatus(step=p.checkpoint_step, uri=p.checkpoint_uri, time=p.checkpoint_time)


def _apply_conditions(
    prev: list[Condition], new: list[Condition], generation: int, now: str
) -> list[Condition]:
    out = list(prev)
    for cond in new:
        out = set_condition(out, cond.model_copy(update={"observed_generation": generation}), now)
    return out


def _events(prev: GagarRunStatus, new: GagarRunStatus, verdict: _Trainer) -> list[Event]:
    """Events for condition flips that a user should see, and for every trainer restart."""
    events = []
    if verdict.reason == "TrainerRestarted" and new.trainer_restarts > prev.trainer_restarts:
        events.append(Event("Warning", "TrainerRestarted", verdict.message))
    failed = _is_true(new, "Failed")
    policies = get_condition(new, "NetworkPoliciesEnforced")
    if policies is not None and policies.status == "False":
        before = get_condition(prev, "NetworkPoliciesEnforced")
        if before is None or before.status != "False":
            events.append(Event("Warning", policies.reason, policies.message))
    for kind in ("Ready", "Suspended", "Complete", "Failed", "Stalled"):
        before, after = get_condition(prev, kind), get_condition(new, kind)
        if after is None or (before is not None and before.status == after.status):
            continue
        if kind == "Stalled" and failed:
            continue  # the Failed event says it
        if after.status == "True":
            warn = kind in ("Failed", "Stalled")
            events.append(
                Event("Warning" if warn else "Normal", after.reason, after.message or kind)
            )
        elif kind == "Suspended" and before is not None:
            events.append(Event("Normal", "Resumed", "resumed from the last checkpoint"))
    return events


def _invalid(obs: Observed, prev: GagarRunStatus, now: str) -> Outcome:
    """An invalid spec: Stalled with the field path; children are left as they are (but a
    ``suspend: true`` stops them: ``Reconciler._suspend_last_applied``)."""
    message = obs.spec_error or "invalid spec"
    new = [_c("Stalled", True, "InvalidSpec", message), _c("Ready", False, "InvalidSpec", message)]
    new.append(_c("Reconciling", False, "Stalled", "fix the spec to continue"))
    missing = [
        t
        for t in CONDITION_TYPES
        if get_condition(prev, t) is None and t not in ("Stalled", "Ready", "Reconciling")
    ]
    new += [_c(t, None, "InvalidSpec") for t in missing]
    conditions = _apply_conditions(prev.conditions, new, obs.generation, now)
    phase = prev.phase if prev.phase in TERMINAL else "Stalled"
    status = prev.model_copy(
        update={"conditions": conditions, "observed_generation": obs.generation, "phase": phase}
    )
    return Outcome(
        status,
        prev.trainer_restarts,
        prev.phase in TERMINAL,
        _events(prev, status, _Trainer(0, 0, "")),
    )


def compute_status(
    spec: GagarRunSpec | None, obs: Observed, previous: GagarRunStatus | None, now: str
) -> Outcome:
    """The new status of a run, the trainer attempt to run, and the events to post."""
    prev = previous or GagarRunStatus()
    if spec is None or obs.spec_error:
        return _invalid(obs, prev, now)
    checkpoint = obs.progress.checkpoint_step
    if checkpoint is None and prev.last_checkpoint is not None:
        checkpoint = prev.last_checkpoint.step
    verdict = judge_trainer(spec, obs.trainer, prev, checkpoint, now)
    ended = {"complete": "Succeeded", "failed": "Failed"}.get(verdict.outcome)
    terminal = prev.phase if prev.phase in TERMINAL else ended
    f = _Facts(spec, obs, verdict, terminal, prev)
    parts: dict[str, Condition] = {
        c.type: c
        for c in (
            _trainer_ready(f),
            _pools_ready(f),
            _suspended(f),
            _stalled(f),
            *_terminal_conditions(f),
            _network_policies(f),
        )
    }
    if parts["Failed"].status == "True":  # kstatus: a failed run will not progress by itself
        parts["Stalled"] = parts["Failed"].model_copy(update={"type": "Stalled"})
    parts["Ready"] = _ready(f, parts)
    parts["Reconciling"] = _reconciling(f, parts)
    job = obs.trainer
    status = GagarRunStatus(
        observed_generation=obs.generation,
        phase=_phase(f, parts),  # type: ignore[arg-type]
        conditions=_apply_conditions(prev.conditions, list(parts.values()), obs.generation, now),
        step=_step(f),
        policy_version=obs.progress.policy_version
        if obs.progress.policy_version is not None
        else prev.policy_version,
        trainer_restarts=verdict.restarts,
        restarts_in_a_row=verdict.in_a_row,
        restart_checkpoint_step=verdict.resumed_from,
        last_checkpoint=_checkpoint(f),
        pools=pool_statuses(spec, obs),
        start_time=prev.start_time or obs.progress.start_time or (job.start_time if job else None),
        completion_time=prev.completion_time or (now if terminal else None),
    )
    events = _events(prev, status, verdict)
    return Outcome(status, verdict.attempt, terminal is not None, events, verdict.retry_after)
