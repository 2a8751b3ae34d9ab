"""What creating a GagarRun entitles (``gagar.operator.builders.trust``, docs/security.md).

Issue 49's confused deputy: a run's creator, through the operator's ServiceAccount, got a
privileged ``SYS_ADMIN`` init container of any image, trainer pods as uid 0 with seccomp
``Unconfined``, and any Secret of the namespace in the rollout pods. Each is now refused by
``gagar validate`` in one line naming the field, unless the operator's configuration (the chart's
``podSecurity``, never the run) allows it; the namespace's Pod Security label lowers the level.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gagar.cli import main
from gagar.operator.builders import build_all
from gagar.operator.builders.check import pod_specs
from gagar.operator.builders.trust import TrustPolicy, trust_problems
from tests.unit.test_builders import example

ROOT = Path(__file__).resolve().parents[2]

PRIVILEGED_INIT = {"initContainers": [{"name": "pwn", "image": "busybox", "securityContext": {
    "privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}}}]}  # fmt: skip
ROOT_UNCONFINED = {"securityContext": {"runAsUser": 0, "runAsNonRoot": False,
                                       "seccompProfile": {"type": "Unconfined"}}}  # fmt: skip
SECRETS = {
    "env": [{"name": "PW", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}}],
    "envFrom": [{"secretRef": {"name": "cloud"}}],
    "volumes": [
        {"name": "v", "secret": {"secretName": "vault"}},
        {"name": "p", "projected": {"sources": [{"secret": {"name": "tls"}}]}},
    ],
}
CASES = {
    "privileged": ("trainer", PRIVILEGED_INIT, [
        "spec.trainer.podTemplate.initContainers[0].securityContext.privileged",
        "spec.trainer.podTemplate.initContainers[0].securityContext.capabilities.add[0]"]),
    "root": ("trainer", ROOT_UNCONFINED, [
        "spec.trainer.podTemplate.securityContext.runAsUser",
        "spec.trainer.podTemplate.securityContext.runAsNonRoot",
        "spec.trainer.podTemplate.securityContext.seccompProfile.type"]),
    "secrets": ("rollout", SECRETS, [
        "spec.rollout.podTemplate.env[0].valueFrom.secretKeyRef.name",
        "spec.rollout.podTemplate.envFrom[0].secretRef.name",
        "spec.rollout.podTemplate.volumes[0].secret.secretName",
        "spec.rollout.podTemplate.volumes[1].projected.sources[0].secret.name"]),
}  # fmt: skip


def _file(tmp_path: Path, component: str, overlay: dict[str, Any]) -> Path:
    doc = yaml.safe_load((ROOT / "examples" / "single-gpu.yaml").read_text())
    doc["spec"][component]["podTemplate"] = overlay
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("case", sorted(CASES))
def test_validate_refuses_each_path_in_one_line_naming_the_field(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    component, overlay, fields = CASES[case]
    assert main(["validate", str(_file(tmp_path, component, overlay))]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(": ")[1] for line in lines] == fields, lines


def test_the_operators_configuration_allows_named_exceptions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _file(tmp_path, "rollout", SECRETS)
    allow = [a for s in ("db", "cloud", "vault", "tls") for a in ("--run-secret", s)]
    assert main(["validate", *allow, str(path)]) == 0, capsys.readouterr().err
    path = _file(tmp_path, "trainer", ROOT_UNCONFINED)
    assert main(["validate", "--pod-security", "baseline", str(path)]) == 1
    assert "seccompProfile.type" in capsys.readouterr().err  # Unconfined is beyond baseline
    assert main(["validate", "--pod-security", "privileged", str(path)]) == 0


def test_the_namespaces_pod_security_label_lowers_the_level() -> None:
    """A namespace enforcing ``restricted`` refuses the sandbox executor of ``isolation: auto``
    (root, uid-switching capabilities: baseline) and a root trainer that the operator's
    configuration allows: the run is refused naming the field, not pods that never appear."""
    run = example("single-gpu")
    assert trust_problems(run, TrustPolicy(), "privileged") == []
    assert trust_problems(run, TrustPolicy(), "baseline") == []
    ((field, message),) = trust_problems(run, TrustPolicy(), "restricted")
    assert field == "spec.sandbox.isolation" and "enforce=restricted" in message
    assert trust_problems(example("single-gpu", **{"sandbox.isolation": "bubblewrap"}),
                          TrustPolicy(), "restricted") == []  # fmt: skip
    ((field, _),) = trust_problems(run, TrustPolicy(sandbox_baseline=False))
    assert field == "spec.sandbox.isolation"
    root = example("single-gpu", **{"trainer.podTemplate": {"securityContext": {"runAsUser": 0}}})
    assert trust_problems(root, TrustPolicy(runs="baseline"), "baseline") == []
    problems = trust_problems(root, TrustPolicy(runs="baseline"), "restricted")
    assert "spec.trainer.podTemplate.securityContext.runAsUser" in [p for p, _ in problems]


@pytest.mark.parametrize("name", ["single-gpu", "flash-moe", "gagar-vs-grpo", "local"])
def test_every_example_is_allowed_and_its_run_pods_are_restricted(name: str) -> None:
    """The examples validate under the chart's defaults; every pod but the sandbox's meets
    Pod Security ``restricted`` (non-root, RuntimeDefault seccomp, no escalation, all
    capabilities dropped), user init containers included."""
    run = example(name, **{"trainer.podTemplate.initContainers": [
        {"name": "side", "image": "busybox", "securityContext": {"readOnlyRootFilesystem": True}}]})  # fmt: skip
    assert trust_problems(run, TrustPolicy()) == []
    for obj in build_all(run):
        for _, pod in pod_specs(obj, ""):
            if obj["metadata"]["labels"]["app.kubernetes.io/component"] == "sandbox":
                continue
            sc = pod["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["seccompProfile"]["type"] == "RuntimeDefault"
            for c in [*pod.get("initContainers", []), *pod["containers"]]:
                assert c["securityContext"]["allowPrivilegeEscalation"] is False, c["name"]
                assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], c["name"]
