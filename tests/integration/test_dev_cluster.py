"""``make dev-cluster`` (``python -m tests.kube_emulator DIR --dev``) for kubectl and helm as
they are: the real binaries, the kubeconfig it writes, no ``--validate=false``.

One cluster for the module, as a newcomer has one: docs/dev-cluster.md's commands run against
it in order (a ``# refused: TEXT`` line must fail saying TEXT), and each step a newcomer takes is
held to what it must show: a namespace created (a protobuf body), an example applied with
kubectl's default validation, a misspelt field refused, the printer columns, ``explain``,
``scale``, ``describe``, ``logs``, ``delete``, and ``helm install`` of the chart.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".tools" / "bin"
DOC = ROOT / "docs" / "dev-cluster.md"
pytestmark = pytest.mark.skipif(
    not (TOOLS / "kubectl").exists() or not (TOOLS / "helm").exists(),
    reason="kubectl and helm not installed (make install)",
)


@dataclass
class Cluster:
    dir: Path
    env: dict[str, str]

    def sh(self, command: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=self.env, capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip
        if check:
            assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        return done

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.sh(" ".join(["kubectl", *args]), check)

    def wait(self, command: str, pattern: str, timeout: float = 60) -> str:
        deadline, out = time.monotonic() + timeout, ""
        while time.monotonic() < deadline:
            out = self.sh(command, check=False).stdout
            if re.search(pattern, out):
                return out
            time.sleep(0.5)
        raise AssertionError(f"{command}: {pattern!r} not in {out!r}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("dev-cluster")
    directory = home / "cluster"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.kube_emulator", str(directory), "--dev"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (directory / "ready").exists():
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "the dev cluster did not start in 120 s"
            time.sleep(0.2)
        env = {
            **os.environ,
            "PATH": f"{TOOLS}:{os.environ['PATH']}",
            "KUBECONFIG": str(directory / "kubeconfig"),
            "KUBECACHEDIR": str(home / "kube-cache"),
            "HELM_CACHE_HOME": str(home / "helm-cache"),
            "HELM_CONFIG_HOME": str(home / "helm-config"),
            "HELM_DATA_HOME": str(home / "helm-data"),
        }
        yield Cluster(directory, env)
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0  # SIGTERM (or Ctrl-C) stops it cleanly


def test_the_kubeconfig_is_a_token_over_https(cluster: Cluster) -> None:
    text = (cluster.dir / "kubeconfig").read_text()
    assert "server: https://127.0.0.1:" in text and "token:" in text
    assert "kube-system" in cluster.kubectl("get", "namespaces").stdout


def test_a_second_cluster_on_the_same_port_says_so(cluster: Cluster, tmp_path: Path) -> None:
    port = (cluster.dir / "ready").read_text().rsplit(":", 1)[1]
    done = subprocess.run(
        [sys.executable, "-m", "tests.kube_emulator", str(tmp_path), "--dev", "--port", port],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1 and f"cannot serve on port {port}" in done.stdout, done


def test_kubectl_create_namespace(cluster: Cluster) -> None:
    """A typed client's create: a protobuf body (``Content-Type: application/vnd.kubernetes.
    protobuf``), read as the server reads it."""
    assert "namespace/proto created" in cluster.kubectl("create", "namespace", "proto").stdout
    phase = cluster.kubectl("get", "namespace", "proto", "-o", "jsonpath='{.status.phase}'")
    assert phase.stdout == "Active"


def test_a_run_applied_with_default_validation_shows_its_columns(cluster: Cluster) -> None:
    cluster.kubectl("create", "namespace", "apply")
    out = cluster.kubectl("apply", "-n", "apply", "-f", "examples/local.yaml").stdout
    assert "gagarrun.gagar.dev/local created" in out
    table = cluster.wait("kubectl get gr -n apply", r"local\s+Running")
    header, row = table.splitlines()
    assert header.split() == ["NAME", "PHASE", "MODE", "STEP", "TOTAL", "RESTARTS", "READY", "AGE"]
    assert row.split()[:7] == ["local", "Running", "gagar", "0", "20", "0", "True"]
    # a JSON merge patch (a strategic one is refused for custom kinds); "configured", not
    # "unchanged": the defaults the CRD fills into list items differ from the file's lists
    again = cluster.kubectl("apply", "-n", "apply", "-f", "examples/local.yaml").stdout
    assert "gagarrun.gagar.dev/local configured" in again


def test_kubectl_get_watch_shows_the_columns_as_the_run_changes(cluster: Cluster) -> None:
    cluster.kubectl("create", "namespace", "watch")
    watch = subprocess.Popen(
        ["bash", "-c", "kubectl get gr -n watch -w"], cwd=ROOT, env=cluster.env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        time.sleep(2)  # the watch is open before the run exists
        cluster.kubectl("apply", "-n", "watch", "-f", "examples/local.yaml")
        cluster.wait("kubectl get gr local -n watch", r"Running")
        time.sleep(1)
    finally:
        watch.terminate()
    out = watch.communicate(timeout=30)[0]
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["NAME", "PHASE", "MODE"], out
    assert any(line.split()[:2] == ["local", "Running"] for line in lines[1:]), out


def test_a_misspelt_field_is_refused_not_dropped(cluster: Cluster) -> None:
    cluster.kubectl("create", "namespace", "typo")
    done = cluster.sh(
        "sed 's/^  trainer:/  trainr:/' examples/local.yaml | kubectl apply -n typo -f -", False
    )
    assert done.returncode != 0
    assert 'strict decoding error: unknown field "spec.trainr"' in done.stderr, done.stderr
    assert "No resources found" in cluster.kubectl("get", "gr", "-n", "typo").stderr
    warned = cluster.sh("sed 's/^  trainer:/  trainr:/' examples/local.yaml "
                        "| kubectl apply -n typo --validate=warn -f -", False)  # fmt: skip
    assert 'unknown field "spec.trainr"' in warned.stderr, warned.stderr


def test_kubectl_explain_prints_the_field_reference(cluster: Cluster) -> None:
    out = cluster.kubectl("explain", "gagarrun.spec.trainer").stdout
    assert out.startswith("GROUP:      gagar.dev\nKIND:       GagarRun\nVERSION:    v1alpha1")
    assert "FIELD: trainer <Object>" in out and "checkpoint\t<Object>" in out
    replicas = cluster.kubectl("explain", "gagarrun.spec.grader.replicas").stdout
    assert "FIELD: replicas <integer>" in replicas
    pod = cluster.kubectl("explain", "pods.spec.containers.image").stdout
    assert "FIELD: image <string>" in pod


def test_scale_describe_logs_and_delete(cluster: Cluster) -> None:
    cluster.kubectl("create", "namespace", "life")
    cluster.kubectl("apply", "-n", "life", "-f", "examples/local.yaml")
    cluster.wait("kubectl get gr local -n life", r"Running")
    assert "scaled" in cluster.kubectl("scale", "gr", "local", "-n", "life", "--replicas=3").stdout
    grader = "kubectl get gr local -n life -o jsonpath='{.status.pools.grader.replicas}'"
    assert cluster.wait(grader, r"^3$") == "3"
    described = cluster.kubectl("describe", "gagarrun", "local", "-n", "life").stdout
    assert re.search(r"Normal\s+Running\s+.*gagar-operator", described.split("Events:")[1])
    logs = cluster.kubectl("logs", "-n", "life", "job/local-trainer").stdout
    assert "container trainer" in logs and "no process runs here" in logs
    assert "deleted" in cluster.kubectl("delete", "gagarrun", "local", "-n", "life").stdout
    cluster.wait("kubectl get jobs,deployments -n life 2>&1", r"No resources found")


def test_helm_install_and_uninstall_the_chart(cluster: Cluster) -> None:
    done = cluster.sh("helm install gagar charts/gagar -n helm-test --create-namespace")
    assert "STATUS: deployed" in done.stdout
    assert "deployed" in cluster.sh("helm list -n helm-test").stdout
    cluster.kubectl("get", "deployment", "gagar", "-n", "helm-test")
    secrets = cluster.kubectl("get", "secrets", "-n", "helm-test").stdout
    assert "sh.helm.release.v1.gagar.v1" in secrets  # helm's release storage (protobuf bodies)
    cluster.sh("helm upgrade gagar charts/gagar -n helm-test --set operator.logLevel=debug")
    assert "2" in cluster.sh("helm history gagar -n helm-test").stdout.splitlines()[-1].split()[0]
    cluster.sh("helm uninstall gagar -n helm-test")
    gone = cluster.kubectl("get", "deploy,secrets", "-n", "helm-test")
    assert "No resources found" in gone.stderr


def doc_commands() -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.DOTALL)
    lines = [line.strip() for block in blocks for line in block.splitlines() if line.strip()]
    return [line for line in lines if not line.startswith(("make ", "export "))]


def test_the_docs_commands_run_in_order(cluster: Cluster) -> None:
    """docs/dev-cluster.md from ``make dev-cluster`` on (the fixture's cluster stands in for it
    and its two exports)."""
    commands = doc_commands()
    assert any(c.startswith("helm install") for c in commands) and len(commands) > 10
    for command in commands:
        refused = re.search(r"# refused: (.*)$", command)
        done = cluster.sh(command, check=refused is None)
        if refused:
            assert done.returncode != 0 and refused.group(1) in done.stderr, (command, done)
        if command.startswith("kubectl apply -n demo"):
            cluster.wait("kubectl get gr local -n demo", r"Running")
