"""``spec.sandbox.isolation: agent-sandbox`` from the spec to the trainer's environment: where it
is refused, what the executor and the trainer are told, and which factory the trainer builds."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gagar.driver.cluster import resolve
from gagar.manifest import ConfigError
from gagar.operator.builders import AGENT_SANDBOX, BuildContext, build_all
from gagar.sandbox import isolation
from gagar.sandbox.types import SandboxUnavailable
from tests.unit.test_builders import example
from tests.unit.test_cluster_trainer import trainer_env


def test_agent_sandbox_needs_sandbox_pods() -> None:
    with pytest.raises(ValidationError, match="isolation agent-sandbox claims sandbox pods"):
        example("local", **{"sandbox.isolation": "agent-sandbox"})


def test_an_executor_refuses_agent_sandbox_as_its_own_mode() -> None:
    """The executor in a claimed pod runs auto; asked for agent-sandbox, it says why not."""
    with pytest.raises(SandboxUnavailable, match="claims a Sandbox pod per session"):
        isolation.choose("agent-sandbox")
    assert "agent-sandbox" not in isolation.EXECUTOR_MODES


def test_the_trainer_is_told_the_warm_pool_not_a_service() -> None:
    run = example("single-gpu", **{"sandbox.isolation": "agent-sandbox"})
    env = trainer_env(run)
    assert env["GAGAR_SANDBOX_WARMPOOL"] == f"{run.metadata.name}-sandbox"
    assert "GAGAR_SANDBOX_URL" not in env
    cluster = resolve({**env, "GAGAR_NAMESPACE": "ns"}, run)
    assert cluster.sandbox_warmpool == f"{run.metadata.name}-sandbox"
    assert cluster.sandbox_url is None
    with pytest.raises(ConfigError, match="GAGAR_SANDBOX_WARMPOOL is not set"):
        resolve({k: v for k, v in env.items() if k != "GAGAR_SANDBOX_WARMPOOL"}, run)


def test_without_the_crds_no_sandbox_object_is_built_and_with_them_no_deployment() -> None:
    run = example("single-gpu", **{"sandbox.isolation": "agent-sandbox"})
    sandbox = f"{run.metadata.name}-sandbox"

    def kinds(crds: frozenset[str]) -> set[str]:
        built = build_all(run, BuildContext(crds=crds))
        return {o["kind"] for o in built if o["metadata"]["name"] == sandbox}

    assert kinds(frozenset()) == {"ServiceAccount"}  # the handler refuses the run before applying
    assert kinds(frozenset({AGENT_SANDBOX})) == {
        "ServiceAccount",
        "SandboxTemplate",
        "SandboxWarmPool",
        "NetworkPolicy",
    }
    pods = example("single-gpu")
    assert {"Deployment", "Service"} <= {
        o["kind"]
        for o in build_all(pods)
        if o["metadata"]["name"] == f"{pods.metadata.name}-sandbox"
    }


def test_the_cluster_trainer_claims_from_the_warm_pool(tmp_path, monkeypatch) -> None:
    from kubernetes import client

    from gagar.driver.worker import ClusterProvider
    from gagar.sandbox.agent import AgentSandboxFactory

    run = example("single-gpu", **{"sandbox.isolation": "agent-sandbox"})
    env = {**trainer_env(run), "GAGAR_NAMESPACE": "ns", "GAGAR_RUN_DIR": str(tmp_path)}
    closers: list = []
    api = client.ApiClient()
    factory = ClusterProvider(resolve(env, run), api=api).sandboxes(run, closers)
    assert isinstance(factory, AgentSandboxFactory)
    assert (factory.warmpool, factory.namespace, factory.run) == (
        f"{run.metadata.name}-sandbox",
        "ns",
        run.metadata.name,
    )
    assert (
        factory.limits is not None
        and factory.limits.wall_time_s == run.spec.sandbox.limits.wall_seconds
    )
    assert closers == [factory.close]
    # outside a cluster, with no kubeconfig either: refused with the reason, not a traceback
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(SandboxUnavailable, match="no Kubernetes API to claim Sandboxes"):
        AgentSandboxFactory("pool", "ns")
