"""A refused apply reaches the run's status at any generation, and a repeated event is one Event.

Scenarios with the real kopf runtime against the in-process Kubernetes API emulator (its fault
injection: a permanent 422 on one child's apply), driven through the API only, as in
``test_operator_scenarios``.
"""

from __future__ import annotations

from tests.integration.test_operator_scenarios import Env, env, manifest

__all__ = ["env"]  # the fixture, shared with test_operator_scenarios


def test_a_refused_apply_stalls_the_run_at_a_later_generation(env: Env) -> None:
    """The apply's error is remembered with the run's generation, not a child's: the run at
    generation 3 whose rollout Deployment (generation 1) is refused shows Stalled/ApplyFailed.
    (Before 4e126b9 the loop over children rebound ``generation`` to each child's, and the error
    reached the status only where the two numbers matched: generation 1.)"""
    emulator = env.need_emulator()
    run = manifest()
    name = run["metadata"]["name"]
    with env.operator():
        env.create(run)
        env.wait(lambda: env.condition(name, "Ready").get("status") == "True", what="Ready")
        path = f"/deployments/{name}-rollout$"
        refused = emulator.faults.fail_next(
            None, verb="patch", path=path, code=422, message="refused by the test"
        )
        for replicas in (3, 4):  # two spec changes: generation 3
            env.patch_spec(name, {"rollout": {"replicas": replicas}})
        assert env.run(name)["metadata"]["generation"] == 3
        env.wait(lambda: env.status(name).get("observedGeneration") == 3, what="generation 3")
        stalled = env.reason(name, "Stalled", "ApplyFailed", what="Stalled/ApplyFailed")
        assert stalled["status"] == "True" and "refused by the test" in stalled["message"]
        assert f"Deployment/{name}-rollout" in stalled["message"]
        assert env.condition(name, "Ready")["reason"] == "ApplyFailed"
        assert refused.hits >= 1
        emulator.faults.clear()  # the refusal lifted: the next reconcile applies and recovers
        env.wait(
            lambda: env.condition(name, "Stalled").get("status") == "False", what="not stalled"
        )
        rollout = env.get("apps/v1", "Deployment", f"{name}-rollout")
        assert rollout is not None and rollout["spec"]["replicas"] == 4


def test_an_event_repeated_is_one_event_with_a_count(env: Env) -> None:
    """The same refusal three times (each cycle: refused, Stalled; lifted, recovered) posts one
    ApplyFailed Event whose ``count`` is 3, as Kubernetes' own components count repeats."""
    emulator = env.need_emulator()
    run = manifest()
    name = run["metadata"]["name"]
    with env.operator():
        env.create(run)
        env.wait(lambda: env.condition(name, "Ready").get("status") == "True", what="Ready")
        for replicas in (3, 4, 5):
            emulator.faults.fail_next(
                None, verb="patch", path=f"/deployments/{name}-rollout$", code=422,
                message="refused by the test",
            )  # fmt: skip
            env.patch_spec(name, {"rollout": {"replicas": replicas}})
            env.reason(name, "Stalled", "ApplyFailed", what=f"Stalled at replicas {replicas}")
            emulator.faults.clear()
            env.wait(
                lambda: env.condition(name, "Stalled").get("status") == "False",
                what="recovered",
            )
        refused = [e for e in env.events(name) if e["reason"] == "ApplyFailed"]
        assert len(refused) == 1, refused
        assert refused[0]["count"] == 3 and "refused by the test" in refused[0]["message"]
        assert refused[0]["lastTimestamp"] >= refused[0]["firstTimestamp"]
