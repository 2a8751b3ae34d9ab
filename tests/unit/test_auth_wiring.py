"""The shared token reaches exactly the services and their caller: ``spec.authTokenSecret`` is
mounted in the trainer, grader and sandbox pods with ``GAGAR_AUTH_TOKEN_FILE`` pointing at it, and
the chart can create the Secret."""

from __future__ import annotations

import base64

import kubernetes_validate

from gagar.operator.builders import BuildContext, build_all
from tests.support.tools import helm_template
from tests.unit.test_builders import ALL_CRDS, UID, by_kind, example


def _pods(objs: list[dict]) -> dict[str, dict]:
    out = {}
    for o in objs:
        spec = o.get("spec", {})
        template = spec.get("template") or spec.get("replicatedJobs", [{}])[0].get("template", {})
        pod = template.get("spec", {}).get("template", {}).get("spec") or template.get("spec")
        if pod:
            out[o["metadata"]["labels"]["app.kubernetes.io/component"]] = pod
    return out


def test_token_secret_is_mounted_where_the_services_and_callers_run() -> None:
    run = example("flash-moe", authTokenSecret="run-token")
    pods = _pods(build_all(run, BuildContext(uid=UID, crds=ALL_CRDS)))
    assert {"trainer", "grader", "sandbox", "rollout"} <= set(pods)
    for component, pod in pods.items():
        secrets = [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v]
        envs = {e["name"]: e.get("value") for c in pod["containers"] for e in c.get("env", [])}
        if component == "rollout":
            assert secrets == [] and "GAGAR_AUTH_TOKEN_FILE" not in envs
            continue
        assert secrets == ["run-token"], component
        assert envs["GAGAR_AUTH_TOKEN_FILE"] == "/var/run/gagar/auth/token"
        service = pod["containers"][0]
        assert {"name": "auth", "mountPath": "/var/run/gagar/auth", "readOnly": True} in service[
            "volumeMounts"
        ]


def test_without_a_secret_nothing_is_mounted() -> None:
    pods = _pods(build_all(example("flash-moe"), BuildContext(uid=UID, crds=ALL_CRDS)))
    for pod in pods.values():
        assert not [v for v in pod["volumes"] if "secret" in v]


def test_chart_creates_a_random_token_secret() -> None:
    assert by_kind(helm_template(), "Secret") == []
    (secret,) = by_kind(helm_template("--set", "authSecret.create=true"), "Secret")
    kubernetes_validate.validate(secret, "1.30", strict=True)
    assert secret["metadata"]["name"] == "gagar-auth"
    assert len(base64.b64decode(secret["data"]["token"])) == 48
