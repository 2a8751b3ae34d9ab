"""The real ``kubectl`` against the emulator: the GagarRun printer columns, events in ``describe``,
a server-side dry-run delete that deletes nothing, and no rights without credentials."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.kube_emulator import KubeEmulator

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = ROOT / ".tools" / "bin" / "kubectl"
pytestmark = pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl not installed (make install)")


def _kubectl(
    kube: KubeEmulator, *args: str, kubeconfig: Path | None = None
) -> subprocess.CompletedProcess:
    config = str(kubeconfig or kube.tls_kubeconfig_path)
    return subprocess.run(
        [str(KUBECTL), "--kubeconfig", config, "-n", "default", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.fixture
def run_name():
    with KubeEmulator() as kube:
        kube.load_yaml(ROOT / "manifests" / "crd" / "gagarruns.gagar.dev.yaml")
        doc = yaml.safe_load((ROOT / "examples" / "local.yaml").read_text())
        doc["metadata"]["namespace"] = "default"
        created = kube.create(doc)
        kube.patch("gagar.dev/v1alpha1", "GagarRun", doc["metadata"]["name"], lambda o: {
            "status": {"phase": "Running", "step": 7, "conditions": [
                {"type": "Ready", "status": "True", "reason": "Training", "message": "ok"}]}},
            "default", subresource="status")  # fmt: skip
        yield kube, created


def test_kubectl_get_shows_the_printer_columns(run_name):
    kube, run = run_name
    out = _kubectl(kube, "get", "gagarruns")
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()
    assert header.split() == ["NAME", "PHASE", "MODE", "STEP", "TOTAL", "RESTARTS", "READY", "AGE"]
    assert row.split()[:5] == [run["metadata"]["name"], "Running", "gagar", "7", "20"]
    wide = _kubectl(kube, "get", "gr", "-o", "wide").stdout.splitlines()
    assert "REASON" in wide[0].split() and "Training" in wide[1].split()


def test_kubectl_describe_lists_the_runs_events(run_name):
    kube, run = run_name
    meta = run["metadata"]
    kube.create({
        "apiVersion": "v1", "kind": "Event", "type": "Warning", "reason": "TrainerRestarted",
        "message": "restarted from step 5", "count": 1,
        "metadata": {"name": f"{meta['name']}.1", "namespace": "default"},
        "involvedObject": {"apiVersion": "gagar.dev/v1alpha1", "kind": "GagarRun",
                           "name": meta["name"], "namespace": "default", "uid": meta["uid"]},
    })  # fmt: skip
    out = _kubectl(kube, "describe", "gagarrun", meta["name"])
    assert out.returncode == 0, out.stderr
    events = out.stdout.split("Events:")[1]
    assert "TrainerRestarted" in events and "restarted from step 5" in events


def test_kubectl_server_dry_run_delete_keeps_the_run(run_name):
    kube, run = run_name
    out = _kubectl(kube, "delete", "gagarrun", run["metadata"]["name"], "--dry-run=server")
    assert out.returncode == 0 and "server dry run" in out.stdout, out.stderr
    assert kube.find("gagar.dev/v1alpha1", "GagarRun", run["metadata"]["name"], "default")


def test_kubectl_without_credentials_is_forbidden(run_name):
    """Over plain HTTP kubectl sends no token: anonymous, it may do nothing, not even discovery
    (``system:discovery`` is bound to authenticated users only), as on a real server."""
    kube, _ = run_name
    out = _kubectl(kube, "get", "gagarruns", kubeconfig=kube.kubeconfig_path)
    assert out.returncode != 0 and "Error from server (Forbidden)" in out.stderr, out.stderr
    anonymous = [r for r in kube.requests_for() if r.get("user") == "system:anonymous"]
    assert anonymous and {r["code"] for r in anonymous} == {403}, anonymous
