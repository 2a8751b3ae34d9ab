"""Sandbox pods that cannot isolate commands: the pure half (observe, status, the trainer's
``suspend``); the scenario against the emulator is in tests/integration/test_operator_scenarios.py."""

from __future__ import annotations

from typing import Any

from gagar.operator.builders import BuildContext, build_all
from gagar.operator.observe import Observed, PoolObserved, TrainerObserved, sandbox_refusal
from gagar.operator.status import compute_status, get_condition
from tests.unit.test_builders import example

SAID = "gagar sandbox: no isolation works here: bubblewrap: ...; pod: ..."


def pod(ready: bool = False, state: str = "lastState", code: int = 3, log: str = SAID) -> dict:
    done = {"terminated": {"exitCode": code, "message": "a warning line\n" + log + "\n"}}
    cs: dict[str, Any] = {"name": "executor", "ready": ready, "state": {}, "lastState": {}}
    cs[state] = done
    return {"status": {"containerStatuses": [cs]}}


def test_the_refusal_is_the_executors_own_line() -> None:
    assert sandbox_refusal([pod()]) == SAID
    assert sandbox_refusal([pod(state="state")]) == SAID  # terminated right now, not yet waiting
    assert sandbox_refusal([pod(log="Killed")]) == "exit 3, no message"


def test_other_exits_and_ready_pods_are_no_refusal() -> None:
    assert sandbox_refusal([pod(code=137), pod(code=1)]) is None  # OOM, a crash: not isolation
    assert sandbox_refusal([pod(ready=True)]) is None  # restarted and serving since
    assert sandbox_refusal([{"status": {}}, {}]) is None


def test_the_run_says_why_and_holds_the_trainer() -> None:
    spec = example("single-gpu", **{"sandbox.isolation": "bubblewrap"}).spec
    pools = {
        "rollout": PoolObserved(2, 2, 2),
        "grader": PoolObserved(1, 1, 1),
        "sandbox": PoolObserved(32, 32, 0),
    }
    seen = Observed(trainer=TrainerObserved(suspended=True), pools=pools, sandbox_refused=SAID)
    status = compute_status(spec, seen, None, "2026-01-01T00:00:00Z").status
    pools_ready, trainer = (
        get_condition(status, "PoolsReady"),
        get_condition(status, "TrainerReady"),
    )
    assert pools_ready and pools_ready.reason == "SandboxUnavailable"
    assert (
        SAID in pools_ready.message
        and "spec.sandbox.isolation to pod or auto" in pools_ready.message
    )
    assert trainer and trainer.reason == "WaitingForSandbox"
    ready = get_condition(status, "Ready")
    assert ready and ready.status == "False"
    pod_mode = compute_status(example("single-gpu").spec, seen, None, "2026-01-01T00:00:00Z")
    pool_cond = get_condition(pod_mode.status, "PoolsReady")
    assert pool_cond and "SETUID" in pool_cond.message  # auto/pod: what their pods need


def test_a_held_trainer_is_built_suspended() -> None:
    run = example("single-gpu")
    job = next(o for o in build_all(run, BuildContext(hold_trainer=True)) if o["kind"] == "Job")
    assert job["spec"]["suspend"] is True
    free = next(o for o in build_all(run, BuildContext()) if o["kind"] == "Job")
    assert "suspend" not in free["spec"]  # never owned otherwise (Kueue may own it)
