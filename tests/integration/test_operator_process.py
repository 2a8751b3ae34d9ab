"""``gagar operator`` as a separate process (kopf's own login from KUBECONFIG) against the
emulator: it reconciles a run and serves its metrics from the catalogue on its port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gagar.crd import build_crd
from tests.integration.test_operator_scenarios import manifest
from tests.kube_emulator import KubeEmulator
from tests.support.tools import stop

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(bool(os.environ.get("GAGAR_TEST_KUBECONFIG")), reason="emulator only")
def test_gagar_operator_process(tmp_path: Path) -> None:
    with KubeEmulator(deployment_delay=0.05) as kube:
        kube.create(build_crd())
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        port, health = free_port(), free_port()
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        cmd = [
            sys.executable,
            "-m",
            "gagar.cli",
            "operator",
            "--namespace",
            "default",
            "--standalone",
            "--metrics-port",
            str(port),
            "--health-port",
            str(health),
        ]
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        try:
            run = manifest("local")
            name = run["metadata"]["name"]
            kube.create(run)

            def phase() -> str | None:
                return (kube.get("gagar.dev/v1alpha1", "GagarRun", name).get("status") or {}).get(
                    "phase"
                )

            kube.wait_for(lambda: phase() == "Running" or proc.poll() is not None, timeout=60)
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert kube.find("batch/v1", "Job", f"{name}-trainer") is not None
            # poll for everything asserted: the Ready condition's gauge is exported after the
            # status write that made the phase Running, so it can lag behind the phase
            wanted = (
                'gagar_operator_runs{phase="Running"} 1.0',
                'gagar_operator_reconciles_total{result="ok"}',
                f'gagar_run_condition{{condition="Ready",namespace="default",run="{name}",status="True"}} 1.0',
            )
            deadline, text = time.monotonic() + 30, ""
            while not all(w in text for w in wanted):
                assert time.monotonic() < deadline, [w for w in wanted if w not in text]
                time.sleep(0.2)
                try:
                    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
                except httpx.HTTPError:
                    pass
            assert httpx.get(f"http://127.0.0.1:{health}/healthz", timeout=5).status_code == 200
        finally:
            stop(proc)


@pytest.mark.skipif(bool(os.environ.get("GAGAR_TEST_KUBECONFIG")), reason="emulator only")
def test_two_replicas_one_leader_and_a_takeover(tmp_path: Path) -> None:
    """Two ``gagar operator`` processes elect a leader on a Lease: only the leader reconciles;
    both answer their liveness and readiness probes (the follower too: the chart would restart
    a follower that does not); the leader killed (SIGKILL) right after a run is created, the
    other takes the Lease over, still answers its probes, and reconciles that run, with exactly
    one trainer Job."""
    with KubeEmulator(deployment_delay=0.05) as kube:
        kube.create(build_crd())
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}

        def start(health: int) -> subprocess.Popen[str]:
            cmd = [sys.executable, "-m", "gagar.cli", "operator", "--namespace", "default",
                   "--standalone", "--leader-election-lease", "gagar-operator",
                   "--leader-election-namespace", "default", "--leader-election-seconds", "3",
                   "--metrics-port", str(free_port()), "--health-port", str(health)]  # fmt: skip
            return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, text=True)  # fmt: skip

        def probes(port: int) -> list[int]:
            """The HTTP status of the chart's liveness and readiness probes (0: no answer)."""
            codes = []
            for path in ("/healthz", "/readyz"):
                try:
                    codes.append(httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5).status_code)
                except httpx.HTTPError:
                    codes.append(0)
            return codes

        def holder() -> str:
            lease = kube.find("coordination.k8s.io/v1", "Lease", "gagar-operator")
            return ((lease or {}).get("spec") or {}).get("holderIdentity") or ""

        def phase(name: str) -> str | None:
            run = kube.get("gagar.dev/v1alpha1", "GagarRun", name)
            return (run.get("status") or {}).get("phase")

        ports = free_port(), free_port()
        first = start(ports[0])
        second = None
        try:
            kube.wait_for(lambda: holder() != "", timeout=60)
            leader = holder()
            second = start(ports[1])
            one = manifest("local")
            kube.create(one)
            kube.wait_for(lambda: phase(one["metadata"]["name"]) == "Running", timeout=60)
            assert holder() == leader  # the second replica waits
            for port in ports:  # leader and follower alike
                kube.wait_for(lambda p=port: probes(p) == [200, 200], timeout=60)
            two = manifest("local")
            kube.create(two)
            first.kill()  # mid-reconcile of the new run, at the latest before its status
            first.wait(timeout=10)
            kube.wait_for(lambda: holder() not in ("", leader), timeout=60)
            name = two["metadata"]["name"]
            kube.wait_for(lambda: phase(name) == "Running", timeout=60)
            jobs = [
                j
                for j in kube.list("batch/v1", "Job")
                if j["metadata"]["name"] == f"{name}-trainer"
            ]
            assert len(jobs) == 1
            assert second.poll() is None
            assert probes(ports[1]) == [200, 200]
        finally:
            for proc in (first, second):
                if proc is not None and proc.poll() is None:
                    stop(proc)
