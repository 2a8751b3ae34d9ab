"""Pure status calculator: conditions, phase, failure policy, progress, transitions."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gagar.operator.observe import (
    Observed,
    PoolObserved,
    Progress,
    TrainerObserved,
    autoscaler_problem,
    parse_deployment,
    parse_job,
    parse_jobset,
    parse_progress,
    waiting_reasons,
)
from gagar.operator.status import (
    CONDITION_TYPES,
    compute_status,
    get_condition,
    set_condition,
)
from gagar.spec import Condition, GagarRunSpec, GagarRunStatus
from tests.unit.test_builders import example

T0, T1, T2 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"
SPEC = example("single-gpu").spec  # nodes 1, pools rollout 2, grader 1, sandbox 32, budget 3
READY_POOLS = {
    "rollout": PoolObserved(2, 2, 2),
    "grader": PoolObserved(1, 1, 1),
    "sandbox": PoolObserved(32, 32, 32),
}
RUNNING = TrainerObserved(active=1, ready=1, start_time=T0)


def obs(**kw: Any) -> Observed:
    base = {"generation": 1, "trainer": RUNNING, "pools": READY_POOLS}
    return Observed(**{**base, **kw})


def cond(status: GagarRunStatus, kind: str) -> tuple[str, str]:
    c = get_condition(status, kind)
    assert c is not None, kind
    return c.status, c.reason


def spec(**changes: Any) -> GagarRunSpec:
    return example("single-gpu", **changes).spec


# ------------------------------------------------------------------ the table
CASES: list[tuple[str, GagarRunSpec, Observed, str, dict[str, tuple[str, str]]]] = [
    (
        "nothing created yet",
        SPEC,
        obs(trainer=None, pools={}),
        "Pending",
        {
            "Ready": ("False", "NotCreated"),
            "TrainerReady": ("False", "NotCreated"),
            "PoolsReady": ("False", "PoolsNotReady"),
            "Reconciling": ("True", "Progressing"),
        },
    ),
    (
        "trainer starting, image pull stuck",
        SPEC,
        obs(trainer=TrainerObserved(), waiting=("ImagePullBackOff",)),
        "Pending",
        {
            "TrainerReady": ("False", "Starting"),
            "Ready": ("False", "Starting"),
            "Stalled": ("False", "NotStalled"),
        },
    ),
    (
        "all ready",
        SPEC,
        obs(),
        "Running",
        {
            "Ready": ("True", "Running"),
            "TrainerReady": ("True", "Running"),
            "PoolsReady": ("True", "PoolsReady"),
            "Reconciling": ("False", "Settled"),
            "Suspended": ("False", "NotSuspended"),
            "Complete": ("False", "InProgress"),
            "Failed": ("False", "NoFailure"),
        },
    ),
    (
        "pool lagging",
        SPEC,
        obs(pools={**READY_POOLS, "rollout": PoolObserved(2, 2, 1)}),
        "Running",
        {
            "Ready": ("False", "PoolsNotReady"),
            "PoolsReady": ("False", "PoolsNotReady"),
            "Reconciling": ("True", "Progressing"),
        },
    ),
    (
        "autoscaled at zero is ready",
        spec(
            **{
                "rollout.replicas": None,
                "rollout.autoscaling": {"minReplicas": 0, "maxReplicas": 4},
            }
        ),
        obs(pools={**READY_POOLS, "rollout": PoolObserved(0, 0, 0)}),
        "Running",
        {"PoolsReady": ("True", "PoolsReady"), "Ready": ("True", "Running")},
    ),
    (
        "suspending",
        spec(suspend=True),
        obs(trainer=replace(RUNNING, suspended=True)),
        "Suspended",
        {
            "Suspended": ("True", "Suspending"),
            "Reconciling": ("True", "Progressing"),
            "Ready": ("False", "Suspending"),
            "TrainerReady": ("False", "Suspended"),
        },
    ),
    (
        "suspended and drained",
        spec(suspend=True),
        obs(
            trainer=TrainerObserved(suspended=True),
            pools={p: PoolObserved(0, 0, 0) for p in READY_POOLS},
        ),
        "Suspended",
        {
            "Suspended": ("True", "Suspended"),
            "Reconciling": ("False", "Settled"),
            "PoolsReady": ("False", "Suspended"),
        },
    ),
    (
        "trainer complete",
        SPEC,
        obs(trainer=TrainerObserved(complete=True)),
        "Succeeded",
        {
            "Complete": ("True", "TrainerSucceeded"),
            "Ready": ("False", "Succeeded"),
            "Reconciling": ("False", "Settled"),
            "PoolsReady": ("False", "Released"),
        },
    ),
    (
        "permanent trainer failure (pod failure policy)",
        SPEC,
        obs(
            trainer=TrainerObserved(
                failed=True, failed_reason="PodFailurePolicy", failed_message="exit 3"
            )
        ),
        "Failed",
        {"Failed": ("True", "TrainerFailedPermanently"), "Ready": ("False", "Failed")},
    ),
    (
        "permanent apply error",
        SPEC,
        obs(apply_error="Job.batch is invalid: spec.template: field is immutable"),
        "Stalled",
        {
            "Stalled": ("True", "ApplyFailed"),
            "Ready": ("False", "ApplyFailed"),
            "Reconciling": ("False", "Settled"),
        },
    ),
    (
        "endpoint pools only",
        spec(
            **{
                "rollout.replicas": None,
                "rollout.endpoint": "http://x/v1",
                "grader.replicas": None,
                "grader.endpoint": "http://y/v1",
                "sandbox.backend": "local",
            }
        ),
        obs(pools={}),
        "Running",
        {"PoolsReady": ("True", "PoolsReady"), "Ready": ("True", "Running")},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_status_table(
    case: tuple[str, GagarRunSpec, Observed, str, dict[str, tuple[str, str]]],
) -> None:
    _, the_spec, observed, phase, expected = case
    out = compute_status(the_spec, observed, None, T0)
    assert out.status.phase == phase
    assert [c.type for c in out.status.conditions] == list(CONDITION_TYPES)  # all present, ordered
    for kind, want in expected.items():
        assert cond(out.status, kind) == want, kind
    for c in out.status.conditions:
        assert c.observed_generation == 1 and c.last_transition_time == T0
    assert out.status.observed_generation == 1


def test_messages_explain() -> None:
    out = compute_status(
        SPEC, obs(trainer=TrainerObserved(), waiting=("ImagePullBackOff",)), None, T0
    )
    assert (
        get_condition(out.status, "TrainerReady").message
        == "0/1 trainer pods ready (waiting: ImagePullBackOff)"
    )
    lag = compute_status(SPEC, obs(pools={"rollout": PoolObserved(2, 2, 1)}), None, T0)
    msg = get_condition(lag.status, "PoolsReady").message
    assert msg == "rollout 1/2 ready; grader not created; sandbox not created"


# ------------------------------------------------------------------ set_condition
def test_set_condition_keeps_time_unless_flipped() -> None:
    a = Condition(type="Ready", status="False", reason="X")
    conds = set_condition([], a, T0)
    assert conds[0].last_transition_time == T0
    same = set_condition(conds, a.model_copy(update={"reason": "Y", "message": "m"}), T1)
    assert same[0].last_transition_time == T0 and same[0].reason == "Y"
    flipped = set_condition(same, a.model_copy(update={"status": "True"}), T2)
    assert flipped[0].last_transition_time == T2 and len(flipped) == 1


def test_same_observation_gives_identical_status() -> None:
    """The handler patches only on change: a re-run with a later clock must be a no-op."""
    first = compute_status(SPEC, obs(), None, T0).status
    again = compute_status(SPEC, obs(), first, T2).status
    assert again == first


def test_transition_times_move_only_for_flipped_conditions() -> None:
    starting = compute_status(SPEC, obs(trainer=TrainerObserved()), None, T0).status
    ready = compute_status(SPEC, obs(), starting, T1).status
    assert get_condition(ready, "Ready").last_transition_time == T1
    assert get_condition(ready, "Failed").last_transition_time == T0
    assert get_condition(ready, "TrainerReady").last_transition_time == T1


# ------------------------------------------------------------------ failure policy
def failed(
    attempt: int, reason: str = "BackoffLimitExceeded", in_a_row: int | None = None, **kw: Any
) -> TrainerObserved:
    """The failed Job of ``attempt`` (made by ``in_a_row`` restarts in a row, default all)."""
    return TrainerObserved(
        attempt=attempt,
        failed=True,
        failed_reason=reason,
        failed_message="pod failed",
        in_a_row=attempt if in_a_row is None else in_a_row,
        **kw,
    )


def test_restart_budget_then_failed() -> None:
    status: GagarRunStatus | None = None
    for n in range(3):  # budget 3: three restarts
        out = compute_status(SPEC, obs(trainer=failed(n)), status, T1)
        assert out.attempt == n + 1 and out.status.trainer_restarts == n + 1
        assert not out.terminal and out.status.phase == "Running"
        assert cond(out.status, "TrainerReady") == ("False", "TrainerRestarted")
        assert [e.reason for e in out.events if e.type == "Warning"][:1] == ["TrainerRestarted"]
        status = out.status
        # the old Job is still there until the handler deletes it: no double counting
        again = compute_status(SPEC, obs(trainer=failed(n)), status, T1)
        assert (
            again.status.trainer_restarts == n + 1
            and cond(again.status, "TrainerReady")[1] == "Restarting"
        )
        assert not [e for e in again.events if e.reason == "TrainerRestarted"]
    out = compute_status(SPEC, obs(trainer=failed(3)), status, T2)
    assert out.terminal and out.status.phase == "Failed" and out.status.trainer_restarts == 3
    assert cond(out.status, "Failed") == ("True", "RestartBudgetExhausted")
    assert out.status.completion_time == T2
    assert any(e.type == "Warning" and e.reason == "RestartBudgetExhausted" for e in out.events)


def test_zero_budget_fails_at_once() -> None:
    out = compute_status(
        spec(**{"trainer.failurePolicy.maxRestarts": 0}), obs(trainer=failed(0)), None, T0
    )
    assert out.status.phase == "Failed" and out.attempt == 0


def test_restart_resumes_running_with_new_attempt() -> None:
    s1 = compute_status(SPEC, obs(trainer=failed(0)), None, T0).status
    s2 = compute_status(SPEC, obs(trainer=replace(RUNNING, attempt=1)), s1, T1)
    assert s2.status.phase == "Running" and cond(s2.status, "Ready") == ("True", "Running")
    assert s2.attempt == 1 and s2.status.trainer_restarts == 1


def test_jobset_restarts_are_copied() -> None:
    js = TrainerObserved(kind="JobSet", active=1, ready=1, restarts=2)
    out = compute_status(SPEC, obs(trainer=js), None, T0)
    assert out.status.trainer_restarts == 2 and out.status.phase == "Running"
    dead = compute_status(
        SPEC,
        obs(trainer=replace(js, active=0, failed=True, failed_reason="FailedJobs")),
        out.status,
        T1,
    )
    assert (
        dead.status.phase == "Failed" and cond(dead.status, "Failed")[1] == "RestartBudgetExhausted"
    )
    assert "after 2 restarts" in get_condition(dead.status, "Failed").message


def test_terminal_is_sticky() -> None:
    done = compute_status(SPEC, obs(trainer=TrainerObserved(complete=True)), None, T0).status
    later = compute_status(SPEC, obs(trainer=None, pools={}), done, T2)
    assert later.status.phase == "Succeeded" and later.terminal
    assert cond(later.status, "Complete") == ("True", "TrainerSucceeded")
    assert later.status.completion_time == T0
    assert get_condition(later.status, "Complete").last_transition_time == T0


# ------------------------------------------------------------------ invalid spec
def test_invalid_spec_stalls_with_field_path() -> None:
    running = compute_status(SPEC, obs(), None, T0).status
    msg = "spec.rollout.replicas: Input should be greater than or equal to 0"
    out = compute_status(None, Observed(generation=2, spec_error=msg), running, T1)
    assert out.status.phase == "Stalled"
    assert cond(out.status, "Stalled") == ("True", "InvalidSpec")
    assert get_condition(out.status, "Stalled").message == msg
    assert get_condition(out.status, "Ready").observed_generation == 2
    assert out.status.observed_generation == 2
    assert any(e.type == "Warning" and e.reason == "InvalidSpec" for e in out.events)
    fresh = compute_status(None, Observed(spec_error=msg), None, T0)
    assert [c.type for c in fresh.status.conditions] == list(CONDITION_TYPES)
    fixed = compute_status(SPEC, obs(generation=3), out.status, T2)
    assert (
        cond(fixed.status, "Stalled") == ("False", "NotStalled") and fixed.status.phase == "Running"
    )


# ------------------------------------------------------------------ progress
def test_progress_step_checkpoint_and_pools() -> None:
    p = Progress(
        step=12,
        policy_version=12,
        rollout_policy_version=11,
        checkpoint_step=10,
        checkpoint_uri="pvc://c/step-10",
        checkpoint_time=T1,
        start_time=T0,
    )
    out = compute_status(SPEC, obs(progress=p), None, T1).status
    assert (out.step, out.policy_version) == (12, 12)
    assert out.last_checkpoint is not None and out.last_checkpoint.step == 10
    assert out.pools["rollout"].ready_replicas == 2 and out.pools["rollout"].policy_version == 11
    assert out.pools["sandbox"].replicas == 32 and out.start_time == T0
    later = compute_status(SPEC, obs(), out, T2).status  # no report this time: keep the last one
    assert later.step == 12 and later.last_checkpoint == out.last_checkpoint


def test_events_on_suspend_and_resume() -> None:
    drained = obs(
        trainer=TrainerObserved(suspended=True),
        pools={p: PoolObserved(0, 0, 0) for p in READY_POOLS},
    )
    running = compute_status(SPEC, obs(), None, T0).status
    sus = compute_status(spec(suspend=True), drained, running, T1)
    assert "Suspended" in [e.reason for e in sus.events] or "Suspending" in [
        e.reason for e in sus.events
    ]
    back = compute_status(SPEC, obs(), sus.status, T2)
    assert "Resumed" in [e.reason for e in back.events]
    assert back.status.phase == "Running"


# ------------------------------------------------------------------ parsing
def test_parse_job_and_friends() -> None:
    job = {
        "metadata": {"annotations": {"gagar.dev/attempt": "2"}},
        "spec": {"suspend": False},
        "status": {
            "active": 0,
            "ready": 0,
            "startTime": T0,
            "conditions": [
                {"type": "FailureTarget", "status": "True", "reason": "PodFailurePolicy"},
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "PodFailurePolicy",
                    "message": "exit 3",
                },
            ],
        },
    }
    seen = parse_job(job)
    assert (
        seen.attempt == 2
        and seen.failed
        and seen.failed_reason == "PodFailurePolicy"
        and not seen.complete
    )
    assert parse_job({"metadata": {}, "spec": {}}).attempt == 0
    js = parse_jobset(
        {
            "spec": {"suspend": True},
            "status": {
                "restarts": 1,
                "replicatedJobsStatus": [{"name": "node", "ready": 1, "active": 1}],
                "conditions": [{"type": "Completed", "status": "False"}],
            },
        },
        nodes=4,
    )
    assert (js.restarts, js.ready, js.suspended, js.complete) == (1, 4, True, False)
    dep = parse_deployment({"spec": {"replicas": 3}, "status": {"replicas": 3, "readyReplicas": 2}})
    assert dep == PoolObserved(3, 3, 2)
    selected = {"replicas": 1, "selector": {"matchLabels": {"b": "2", "a": "1"}}}
    assert parse_deployment({"spec": selected}).selector == "a=1,b=2"  # the /scale selector
    assert parse_progress({"step": "7", "checkpointStep": "x"}) == Progress(step=7)
    pods = [
        {
            "status": {
                "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
                ]
            }
        },
        {"status": {"containerStatuses": [{"state": {"waiting": {"reason": "ImagePullBackOff"}}}]}},
        {
            "status": {
                "containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}]
            }
        },
    ]
    assert waiting_reasons(pods) == ("ImagePullBackOff", "Unschedulable")


def test_lost_status_recovers_restarts_from_the_job() -> None:
    """The Job's attempt annotation outlives a wiped status: the count never goes down."""
    out = compute_status(SPEC, obs(trainer=replace(RUNNING, attempt=2)), None, T0)
    assert out.status.trainer_restarts == 2 and out.attempt == 2
    last = compute_status(SPEC, obs(trainer=failed(2)), None, T0)
    assert last.status.trainer_restarts == 3 and last.attempt == 3
    assert last.status.restarts_in_a_row == 3  # from the Job's annotation, not the lost status
    done = compute_status(SPEC, obs(trainer=failed(3)), last.status, T1)
    assert done.status.phase == "Failed"


# ------------------------------------------------------------------ backoff and budget refill
BACKOFF = spec(
    **{"trainer.failurePolicy.backoffSeconds": 10, "trainer.failurePolicy.maxBackoffSeconds": 25}
)


def test_restart_waits_for_an_exponential_backoff() -> None:
    """The n-th restart in a row waits backoffSeconds * 2**(n-1) (capped) after the failure."""
    waits = []
    status: GagarRunStatus | None = None
    for n in range(3):
        job = failed(n, failed_time=T0)
        early = compute_status(BACKOFF, obs(trainer=job), status, "2026-01-01T00:00:04Z")
        assert early.attempt == n and not early.terminal  # no restart yet
        assert cond(early.status, "TrainerReady") == ("False", "RestartBackoff")
        assert early.retry_after is not None
        waits.append(round(early.retry_after + 4))
        due = f"2026-01-01T00:00:{waits[-1]:02d}Z"
        out = compute_status(BACKOFF, obs(trainer=job), early.status, due)
        assert out.attempt == n + 1 and out.retry_after is None
        status = out.status
    assert waits == [10, 20, 25]


def test_a_newer_checkpoint_refills_the_budget() -> None:
    """Failures far apart, each after a new checkpoint, never exhaust maxRestarts: 1."""
    one = spec(**{"trainer.failurePolicy.maxRestarts": 1})
    status: GagarRunStatus | None = None
    for n in range(4):
        # attempt n made progress: checkpoint 10*(n+1) is newer than the one it resumed from
        progress = Progress(step=10 * (n + 1), checkpoint_step=10 * (n + 1), checkpoint_uri="u")
        resumed = 10 * n if n else None
        job = failed(n, in_a_row=min(n, 1), resumed_from=resumed)
        out = compute_status(one, obs(trainer=job, progress=progress), status, T1)
        assert out.attempt == n + 1 and not out.terminal, n
        assert out.status.restarts_in_a_row == 1
        assert out.status.restart_checkpoint_step == 10 * (n + 1)
        status = out.status
    # attempt 4 fails before a checkpoint newer than 40: the budget (1 in a row) is spent
    progress = Progress(step=45, checkpoint_step=40, checkpoint_uri="u")
    job = failed(4, in_a_row=1, resumed_from=40)
    out = compute_status(one, obs(trainer=job, progress=progress), status, T2)
    assert out.terminal and cond(out.status, "Failed") == ("True", "RestartBudgetExhausted")
    assert out.status.trainer_restarts == 4


def test_a_failed_run_is_stalled_for_kstatus() -> None:
    """kstatus reads ``Stalled=False`` as Current: a failed run must say ``Stalled=True`` (with
    the failure's reason), and post one warning for it, not two."""
    out = compute_status(
        spec(**{"trainer.failurePolicy.maxRestarts": 0}), obs(trainer=failed(0)), None, T0
    )
    assert out.status.phase == "Failed"
    assert cond(out.status, "Stalled") == cond(out.status, "Failed") == (
        "True", "RestartBudgetExhausted")  # fmt: skip
    assert [e.reason for e in out.events if e.type == "Warning"] == ["RestartBudgetExhausted"]
    again = compute_status(SPEC, obs(trainer=failed(0)), out.status, T1)  # sticky
    assert cond(again.status, "Stalled") == ("True", "RestartBudgetExhausted")


def test_the_phase_does_not_flap_across_a_backoff() -> None:
    """Running, then a failure waiting out its backoff, then the next attempt's pods pending:
    Running throughout (the conditions say why it is not Ready)."""
    running = compute_status(BACKOFF, obs(trainer=RUNNING), None, T0).status
    assert running.phase == "Running"
    job = failed(0, failed_time=T0)
    early = compute_status(BACKOFF, obs(trainer=job), running, "2026-01-01T00:00:04Z")
    assert early.retry_after is not None and early.status.phase == "Running"
    pending = replace(RUNNING, attempt=1, active=0, ready=0)
    later = compute_status(BACKOFF, obs(trainer=pending), early.status, T1)
    assert later.status.phase == "Running"


# what the HPA controller writes when no metrics adapter serves the Pods metric
NO_ADAPTER = {
    "status": {
        "conditions": [
            {"type": "AbleToScale", "status": "True", "reason": "SucceededGetScale"},
            {
                "type": "ScalingActive",
                "status": "False",
                "reason": "FailedGetPodsMetric",
                "message": "the HPA was unable to compute the replica count: unable to get "
                "metric gagar_grader_queue_depth: unable to fetch metrics from custom metrics "
                "API: the server could not find the requested resource",
            },
        ]
    }
}


def test_an_autoscaler_that_cannot_scale_its_pool_is_said_not_silent() -> None:
    """An HPA without a metrics adapter leaves its pool at the minimum forever: PoolsReady says
    so, naming the field, the metric and the way out (a pool that lags is said first)."""
    problem = autoscaler_problem(NO_ADAPTER, "grader", "gagar_grader_queue_depth")
    assert problem is not None and problem.startswith("spec.grader.autoscaling: ")
    assert "FailedGetPodsMetric" in problem and "custom.metrics.k8s.io" in problem
    active = {"status": {"conditions": [{"type": "ScalingActive", "status": "True"}]}}
    assert autoscaler_problem(active, "grader", "m") is None
    assert autoscaler_problem({}, "grader", "m") is None  # no status yet: not judged
    out = compute_status(SPEC, obs(autoscalers=(problem,)), None, T0).status
    assert cond(out, "PoolsReady") == ("False", "AutoscalerInactive")
    assert cond(out, "Ready")[0] == "False"
    assert get_condition(out, "PoolsReady").message == problem  # type: ignore[union-attr]
    lagging = {**READY_POOLS, "grader": PoolObserved(2, 2, 1)}
    out = compute_status(SPEC, obs(pools=lagging, autoscalers=(problem,)), None, T0).status
    assert cond(out, "PoolsReady") == ("False", "PoolsNotReady")
