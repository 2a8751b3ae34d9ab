"""``kubectl scale gagarrun/NAME --replicas=N``: the GagarRun's scale subresource is a view of
``.spec.grader.replicas`` (status replicas and selector from the grader pool), so kubectl, an HPA
or a KEDA ScaledObject targeting the GagarRun scale the grader pool declaratively; refused, with a
message that says why, when the grader is autoscaled or external. Runs against the emulator, or a
real cluster with ``GAGAR_TEST_KUBECONFIG`` (see test_operator_scenarios)."""

from __future__ import annotations

from typing import Any

import pytest

from gagar.operator.kube import RUN_API, KubeError, path
from tests.integration.test_operator_scenarios import HPA, Env, env, manifest

__all__ = ["env"]  # the fixture


def scale_path(env: Env, name: str) -> str:
    return path(RUN_API, "GagarRun", env.namespace, name) + "/scale"


def read_scale(env: Env, name: str) -> dict[str, Any]:
    return env.kube._call("GET", scale_path(env, name))


def scale(env: Env, name: str, replicas: int) -> dict[str, Any]:
    """What ``kubectl scale`` sends: a merge patch of the scale subresource."""
    body = {"spec": {"replicas": replicas}}
    return env.kube.merge_patch(RUN_API, "GagarRun", env.namespace, name, body, "scale")


def test_kubectl_scale_gagarrun_scales_the_grader_pool(env: Env) -> None:
    run = manifest()
    name, dep = run["metadata"]["name"], f"{run['metadata']['name']}-grader"
    with env.operator():
        env.create(run)
        env.wait(
            lambda: env.status(name).get("pools", {}).get("grader", {}).get("selector"),
            what="the grader pool's selector in status",
        )
        view = read_scale(env, name)
        assert view["kind"] == "Scale" and view["spec"]["replicas"] == 1
        assert view["status"]["selector"] == (
            f"app.kubernetes.io/component=grader,gagar.dev/run={name}"
        )
        assert scale(env, name, 3)["spec"]["replicas"] == 3
        assert env.run(name)["spec"]["grader"]["replicas"] == 3
        env.wait(
            lambda: env.get("apps/v1", "Deployment", dep)["spec"]["replicas"] == 3,
            what="grader Deployment at 3",
        )
        if env.emulator:  # its Deployment controller makes them ready
            env.wait(lambda: read_scale(env, name)["status"]["replicas"] == 3, what="3 in status")
        scale(env, name, 0)  # to zero, like editing replicas
        env.wait(
            lambda: env.get("apps/v1", "Deployment", dep)["spec"]["replicas"] == 0,
            what="grader Deployment at 0",
        )


@pytest.mark.parametrize(
    ("grader", "words"),
    [
        ({"replicas": None, "autoscaling": HPA}, "grader pool is autoscaled"),
        ({"replicas": None, "endpoint": "http://grader.example:8080/v1"}, "grader is external"),
    ],
    ids=["autoscaled", "external"],
)
def test_scale_is_refused_when_the_grader_is_autoscaled_or_external(
    env: Env, grader: dict[str, Any], words: str
) -> None:
    run = manifest(**{f"grader.{k}": v for k, v in grader.items()})
    name = run["metadata"]["name"]
    env.create(run)
    with pytest.raises(KubeError) as err:
        scale(env, name, 3)
    assert err.value.status == 422 and words in err.value.message, err.value.message
    assert "replicas" not in env.run(name)["spec"]["grader"]
