"""The shared token reaches exactly the services and their caller: ``spec.authTokenSecret`` is
mounted in the trainer, grader and sandbox pods with ``GAGAR_AUTH_TOKEN_FILE`` pointing at it, and
the chart can create the Secret."""

from __future__ import annotations

import base64
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from gagar.cli import main
from gagar.operator.builders import BuildContext, build_all
from gagar.operator.builders.trust import TrustPolicy, trust_problems
from tests.support.tools import helm_template
from tests.unit.test_builders import ALL_CRDS, UID, by_kind, example

ROOT = Path(__file__).resolve().parents[2]


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


def test_the_token_secret_is_held_to_the_operators_secret_allowlist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``spec.authTokenSecret`` is mounted in pods whose code the run chooses, so naming any
    Secret there reads it: it is refused like a pod overlay's reference, in one line naming the
    field, unless the operator's configuration lists it (or, by label, the operator finds it)."""
    run = example("flash-moe", authTokenSecret="someone-elses")
    ((field, message),) = trust_problems(run, TrustPolicy())
    assert field == "spec.authTokenSecret" and "'someone-elses'" in message
    assert trust_problems(run, TrustPolicy(secrets=frozenset({"someone-elses"}))) == []
    assert trust_problems(run, TrustPolicy(secret_label="a=b")) == []  # the operator checks it
    doc = yaml.safe_load((ROOT / "examples" / "flash-moe.yaml").read_text())
    doc["spec"]["authTokenSecret"] = "someone-elses"
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(path)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert ": spec.authTokenSecret: " in line
    assert main(["validate", "--run-secret", "someone-elses", str(path)]) == 0


def test_the_chart_lets_runs_read_the_token_secret_it_creates() -> None:
    def flags(*values: str) -> list[str]:
        (operator,) = by_kind(helm_template(*values), "Deployment")
        (container,) = operator["spec"]["template"]["spec"]["containers"]
        return [a for a in container["args"] if a.startswith("--run-secret")]

    assert flags() == []
    assert flags("--set", "authSecret.create=true") == ["--run-secret=gagar-auth"]
    named = ("--set", "authSecret.create=true", "--set", "authSecret.name=tok",
             "--set", "podSecurity.runSecrets={db}")  # fmt: skip
    assert flags(*named) == ["--run-secret=db", "--run-secret=tok"]
