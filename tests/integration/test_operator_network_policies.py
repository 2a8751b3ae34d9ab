"""Does the cluster enforce the runs' NetworkPolicies? The operator probes each namespace once
(``gagar.operator.netprobe``) and says so in the ``NetworkPoliciesEnforced`` condition; with the
run's weight-sync token Secret made once and handed to the trainer and the rollout pool.

Against the emulator (the harness of tests/integration/test_operator_scenarios.py) the probe
client's pod ends as the kubelet would report it: exit 0 where a CNI enforces the policy, 1 where
it does not, so both outcomes are played; with ``GAGAR_TEST_KUBECONFIG`` the cluster's own CNI
decides and the scenario checks that a verdict comes and the probe leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gagar.operator.builders.netprobe import PREFIX
from tests.integration.test_operator_scenarios import REAL, Env, make_env, manifest

COND = "NetworkPoliciesEnforced"
CLIENT = f"{PREFIX}-client"


@pytest.fixture(params=["real"] if REAL else ["emulator"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    yield from make_env(request.param, tmp_path)


def _probe_gone(env: Env) -> bool:
    return all(
        env.get(api, kind, name) is None
        for api, kind, name in (
            ("networking.k8s.io/v1", "NetworkPolicy", PREFIX),
            ("v1", "Service", PREFIX),
            ("batch/v1", "Job", CLIENT),
            ("batch/v1", "Job", f"{PREFIX}-server"),
        )
    )


def _verdict(env: Env, name: str) -> dict:
    return env.wait(
        lambda: (
            env.condition(name, COND).get("status") in ("True", "False")
            and env.condition(name, COND)
        ),
        what=f"a {COND} verdict",
    )


@pytest.mark.parametrize("enforced", [True, False], ids=["enforced", "not-enforced"])
def test_the_namespace_is_probed_once_and_the_condition_says_the_verdict(
    env: Env, enforced: bool
) -> None:
    if REAL and not enforced:
        pytest.skip("a real cluster's CNI decides: played once, by the enforced case")
    first, second = manifest(), manifest()
    with env.operator(network_policy_probe=True):
        env.create(first)
        name = first["metadata"]["name"]
        probing = env.reason(name, COND, "Probing", "the probe running")
        assert probing["status"] == "Unknown"
        policy = env.wait(lambda: env.get("networking.k8s.io/v1", "NetworkPolicy", PREFIX))
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        if env.simulated:  # the kubelet's part: the client's verdict as its exit code
            env.end_pod(CLIENT, exit_code=0 if enforced else 1)
        cond = _verdict(env, name)
        if env.simulated:
            assert cond["status"] == ("True" if enforced else "False")
            assert cond["reason"] == ("Enforced" if enforced else "NotEnforced")
        if cond["status"] == "False":
            assert "sandboxed code can reach the network" in cond["message"]
            warned = [e for e in env.events(name) if e["reason"] == "NotEnforced"]
            assert warned and warned[0]["type"] == "Warning"
        env.wait(lambda: _probe_gone(env), what="the probe's objects deleted")
        env.create(second)  # the same namespace: the verdict is known, no second probe
        again = _verdict(env, second["metadata"]["name"])
        assert (again["status"], again["reason"]) == (cond["status"], cond["reason"])
        assert _probe_gone(env)
        if env.emulator is not None:
            made = [
                r
                for r in env.emulator.requests_for("patch")
                if r["path"].endswith(f"/jobs/{CLIENT}")
            ]
            assert len(made) == 1, made  # one probe per namespace


def test_without_the_probe_the_condition_says_not_checked(env: Env) -> None:
    run = manifest()
    with env.operator():
        env.create(run)
        cond = env.reason(run["metadata"]["name"], COND, "NotChecked", "NotChecked")
    assert cond["status"] == "Unknown" and "--no-network-policy-probe" in cond["message"]
    assert env.get("networking.k8s.io/v1", "NetworkPolicy", PREFIX) is None


def test_the_weight_sync_token_is_a_secret_made_once_for_the_trainer_and_the_pool(
    env: Env,
) -> None:
    run = manifest()
    name = run["metadata"]["name"]
    secret = f"{name}-weight-sync"
    with env.operator():
        env.create(run)
        made = env.wait(lambda: env.get("v1", "Secret", secret), what="the token's Secret")
        job = env.wait(lambda: env.get("batch/v1", "Job", f"{name}-trainer"))
        pool = env.wait(lambda: env.get("apps/v1", "Deployment", f"{name}-rollout"))
        env.patch_spec(name, {"rollout": {"replicas": 3}})  # a new apply of every child
        env.wait(
            lambda: env.get("apps/v1", "Deployment", f"{name}-rollout")["spec"]["replicas"] == 3
        )
    assert made["metadata"]["ownerReferences"][0]["name"] == name  # deleted with the run
    assert len(made["data"]["token"]) >= 40
    assert env.get("v1", "Secret", secret)["data"] == made["data"]  # never rotated
    for pod in (job["spec"]["template"]["spec"], pool["spec"]["template"]["spec"]):
        refs = [e["valueFrom"]["secretKeyRef"] for c in pod["containers"] for e in c.get("env", [])
                if e["name"] == "GAGAR_WEIGHT_SYNC_TOKEN"]  # fmt: skip
        assert refs == [{"name": secret, "key": "token"}]
