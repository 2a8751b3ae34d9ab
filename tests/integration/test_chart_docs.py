"""Every command in the README, docs/operations.md and the chart README is exercised where it can run here.

Each ``sh`` block line is classified; a command no rule covers fails the test, so the docs cannot
grow unchecked commands. Helm and kustomize run for real (``helm template`` stands in for
``helm install``/``upgrade``); ``gagar`` commands run; ``kubectl patch`` bodies are applied, in
document order, to the example run they name and the result is validated like the API server
would (pydantic model, CRD schema, CEL rules); ``kubectl apply -f`` files must be valid; the rest
(``get``, ``describe``, ``wait``...) must name the CRD's short name and real conditions.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from gagar.alerts import Windows, alerts
from gagar.crd import build_crd
from gagar.dashboards import DASHBOARDS
from gagar.spec import GagarRun
from tests.support.crd_check import crd_errors
from tests.support.tools import ROOT, docs, run, system_tool, tool

DOCS = [ROOT / "README.md", ROOT / "docs/operations.md", ROOT / "charts/gagar/README.md"]
CLUSTER_ONLY = {"get", "describe", "wait", "edit", "create", "delete"}
CONDITIONS = {"Ready", "Reconciling", "Stalled", "TrainerReady", "PoolsReady", "Suspended", "Complete", "Failed"}  # fmt: skip


def commands(path: Path) -> list[list[str]]:
    blocks = re.findall(r"```sh\n(.*?)```", path.read_text(), flags=re.S)
    return [
        shlex.split(line, comments=True) for b in blocks for line in b.splitlines() if line.strip()
    ]


def example_runs() -> dict[str, dict[str, Any]]:
    runs = {}
    for path in (ROOT / "examples").glob("*.yaml"):
        for doc in docs(path.read_text()):
            runs[doc["metadata"]["name"]] = doc
    return runs


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what ``kubectl patch --type merge`` sends)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class Checker:
    """Runs or checks each documented command; keeps patched runs between commands."""

    def __init__(self) -> None:
        self.runs = example_runs()
        self.crd = build_crd()
        self.checked: list[str] = []

    def check(self, argv: list[str]) -> None:
        argv = [argv[0].partition("=")[0], *argv[1:]] if "=" in argv[0] else argv
        handler = {
            "helm": self.helm,
            "kubectl": self.kubectl,
            "gagar": self.gagar,
            "promtool": self.promtool,
            "kind": self.kind,
            "GAGAR_TEST_KUBECONFIG": self.scenario_tests,
        }
        assert argv[0] in handler, f"undocumented kind of command: {shlex.join(argv)}"
        handler[argv[0]](argv)
        self.checked.append(shlex.join(argv))

    def helm(self, argv: list[str]) -> None:
        verb, args = argv[1], argv[2:]
        if verb == "uninstall":
            return  # cluster only: nothing to render
        if verb in ("install", "upgrade"):
            argv = ["helm", "template", *args]
        run([tool("helm"), *argv[1:]])

    def kubectl(self, argv: list[str]) -> None:
        verb = argv[1]
        if verb == "kustomize":
            run([tool("kubectl"), *argv[1:]])
        elif verb == "apply" and "-k" in argv:
            run([tool("kubectl"), "kustomize", argv[argv.index("-k") + 1]])
        elif verb == "apply":
            self.apply_files(Path(argv[argv.index("-f") + 1]))
        elif verb == "patch":
            self.patch(argv)
        elif verb == "scale":
            self.scale(argv)
        else:
            assert verb in CLUSTER_ONLY, f"unchecked kubectl command: {shlex.join(argv)}"
            self.cluster_only(argv)

    def apply_files(self, path: Path) -> None:
        files = sorted((ROOT / path).glob("*.yaml")) if (ROOT / path).is_dir() else [ROOT / path]
        assert files, path
        for f in files:
            for obj in docs(f.read_text()):
                if obj["kind"] == "GagarRun":
                    GagarRun.model_validate(obj)
                    assert crd_errors(obj, self.crd) == []
                else:
                    kubernetes_validate.validate(obj, "1.32.0", strict=True)

    def patch(self, argv: list[str]) -> None:
        assert argv[2] == "gr" and argv[argv.index("--type") + 1] == "merge"
        name = argv[3]
        patched = merge_patch(self.runs[name], json.loads(argv[argv.index("-p") + 1]))
        GagarRun.model_validate(patched)
        # an update: the CRD's transition rules (oldSelf) see the run before the patch
        assert crd_errors(patched, self.crd, old=self.runs[name]) == [], shlex.join(argv)
        self.runs[name] = patched

    def scale(self, argv: list[str]) -> None:
        """``kubectl scale gr NAME --replicas=N`` writes the CRD's scale subresource path."""
        assert argv[2] == "gr"
        name, replicas = argv[3], int(argv[-1].removeprefix("--replicas="))
        path = self.crd["spec"]["versions"][0]["subresources"]["scale"]["specReplicasPath"]
        assert path == ".spec.grader.replicas"
        patched = merge_patch(self.runs[name], {"spec": {"grader": {"replicas": replicas}}})
        GagarRun.model_validate(patched)
        assert crd_errors(patched, self.crd) == [], shlex.join(argv)
        self.runs[name] = patched

    def cluster_only(self, argv: list[str]) -> None:
        text = shlex.join(argv)
        if argv[1] in ("get", "describe", "wait", "edit"):
            assert re.search(r"\bgr\b|gr/", text), f"{text}: use the CRD's short name"
            assert "gr" in self.crd["spec"]["names"]["shortNames"]
        for name in re.findall(r"\bgr[/ ]([a-z][a-z0-9-]*)", text):
            assert name in self.runs, f"{text}: {name} is not an example run"
        for cond in re.findall(r"--for=condition=(\w+)", text):
            assert cond in CONDITIONS
        if argv[1] == "delete":
            assert argv[2:] == ["crd", self.crd["metadata"]["name"]]

    def gagar(self, argv: list[str]) -> None:
        proc = subprocess.run(
            [sys.executable, "-m", "gagar.cli", *argv[1:]], cwd=ROOT, capture_output=True, text=True
        )
        assert proc.returncode == 0, (argv, proc.stderr)

    def kind(self, argv: list[str]) -> None:
        """kind needs a container engine (none here): the commands' shape is checked."""
        assert argv[1:3] in (["create", "cluster"], ["delete", "cluster"], ["get", "kubeconfig"])
        assert argv[3] == "--name"

    def scenario_tests(self, argv: list[str]) -> None:
        """``GAGAR_TEST_KUBECONFIG=... pytest FILE``: the file exists and reads that variable."""
        assert argv[1:4] == [".venv/bin/python", "-m", "pytest"], shlex.join(argv)
        test_file = ROOT / argv[4]
        assert test_file.is_file() and "GAGAR_TEST_KUBECONFIG" in test_file.read_text()

    def promtool(self, argv: list[str]) -> None:
        run([system_tool("promtool"), *argv[1:]])


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_documented_command_checks_out(path: Path) -> None:
    checker = Checker()
    for argv in commands(path):
        checker.check(argv)
    assert len(checker.checked) >= 2


def test_operations_page_covers_the_brief() -> None:
    text = (ROOT / "docs/operations.md").read_text()
    for needle in ("helm install", "kubectl apply --server-side -k manifests/", "kubectl get gr",
                   "grader", "suspend", "kubectl apply --server-side -f charts/gagar/crds/"):  # fmt: skip
        assert needle in text
    for alert in alerts(Windows()):
        assert f"`{alert.name}`" in text
    for build in DASHBOARDS:
        assert build().title in text


def test_patches_that_break_the_spec_are_caught() -> None:
    """The patch check is not vacuous: both replicas and autoscaling is rejected."""
    checker = Checker()
    bad = '{"spec":{"grader":{"autoscaling":{"minReplicas":1,"maxReplicas":2}}}}'
    with pytest.raises(Exception, match="replicas"):
        checker.check(
            shlex.split(f"kubectl patch gr qwen3-swe-1node -n gagar --type merge -p '{bad}'")
        )


def test_trainer_changes_need_a_suspended_run() -> None:
    """Patches are checked as updates: the CRD's transition rule refuses a running trainer's
    change, as the API server would."""
    checker = Checker()
    bad = '{"spec":{"trainer":{"image":"x:2"}}}'
    with pytest.raises(AssertionError, match="kubectl patch"):
        checker.check(
            shlex.split(f"kubectl patch gr qwen3-swe-1node -n gagar --type merge -p '{bad}'")
        )


def test_unknown_commands_fail() -> None:
    with pytest.raises(AssertionError):
        Checker().check(["kubectl", "exec", "-it", "x", "--", "sh"])
    with pytest.raises(AssertionError):
        Checker().check(["docker", "run", "x"])
