"""A local cluster to try gagar on: the emulator, the GagarRun CRD and the operator, for kubectl
and helm as they are (``make dev-cluster``, ``python -m tests.kube_emulator DIR --dev``).

It writes ``DIR/kubeconfig`` (the cluster admin's token over HTTPS, a certificate made for
127.0.0.1 at start: kubectl and helm send a token only over TLS), creates the CRD from
``gagar.crd``, and starts the operator as its own process, ``gagar operator`` with
``KUBECONFIG=DIR/kubeconfig`` (the path a real cluster's operator takes, logging to
``DIR/operator.log``), then serves until Ctrl-C or SIGTERM. The cluster lives in memory: it
goes when the command stops.

What it is not: no container runs. The emulator schedules pods, marks them running and reports
Deployments ready, and a Job finishes only when a test says so; ``kubectl logs`` answers a text
that says so. The chart's operator Deployment (``helm install``) is such a pod too: the
operator that reconciles is the one started here. It skips the NetworkPolicy probe (two pods
per namespace that would never run).
"""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx

from .emulator import KubeEmulator

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_operator(kubeconfig: pathlib.Path, log: pathlib.Path) -> tuple[subprocess.Popen, int]:
    """``gagar operator`` against ``kubeconfig``, all namespaces; (the process, its health port)."""
    health = _free_port()
    cmd = [sys.executable, "-m", "gagar.cli", "operator", "--standalone",
           "--no-network-policy-probe", "--metrics-port", str(_free_port()),
           "--health-port", str(health)]  # fmt: skip
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    with log.open("w") as out:  # a session of its own: Ctrl-C reaches us, we stop it in order
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    return proc, health


def wait_ready(proc: subprocess.Popen, health: int, timeout: float = 60.0) -> bool:
    """True once the operator answers its readiness probe; False if it exits or times out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{health}/readyz", timeout=1).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


def banner(kubeconfig: pathlib.Path, url: str, log: pathlib.Path) -> str:
    return f"""\
gagar dev cluster: the Kubernetes API emulator at {url}, the GagarRun CRD, the operator
(its log: {log}). Nothing runs in its pods; Ctrl-C stops it and forgets everything.

  export KUBECONFIG={kubeconfig}
  export PATH={ROOT / ".tools" / "bin"}:$PATH  # the kubectl and helm of make install
  kubectl create namespace demo
  kubectl apply -n demo -f examples/local.yaml
  kubectl get gagarruns -n demo

The rest (helm install, scale, describe, delete): docs/dev-cluster.md.
"""


def main(directory: pathlib.Path, tls_port: int) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ready").unlink(missing_ok=True)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    emulator = KubeEmulator(bookmark_interval=0.5, deployment_delay=0.05, tls_port=tls_port)
    try:
        emulator.start()
    except OSError as e:
        print(f"cannot serve on port {tls_port} ({e.strerror}): another dev cluster? "
              "Stop it, or pick another port (make dev-cluster DEV_PORT=16444)")  # fmt: skip
        return 1
    try:
        return serve(emulator, directory, done)
    finally:
        emulator.stop()
        (directory / "ready").unlink(missing_ok=True)


def serve(kube: KubeEmulator, directory: pathlib.Path, done: threading.Event) -> int:
    """The CRD, the kubeconfig, the operator; until ``done`` or the operator's exit."""
    from gagar.crd import build_crd  # the CRD the chart and `gagar crd` ship

    kube.create(build_crd())
    kubeconfig, log = (directory / "kubeconfig").resolve(), directory / "operator.log"
    kube.write_kubeconfig(kubeconfig, tls=True)
    proc, health = start_operator(kubeconfig, log)
    try:
        if not wait_ready(proc, health):
            print(f"the operator did not start; its log ({log}):\n{log.read_text()}")
            return 1
        print(banner(kubeconfig, kube.tls_url, log), flush=True)
        (directory / "ready").write_text(kube.tls_url)
        while not done.wait(0.5):
            if proc.poll() is not None:
                print(f"the operator exited ({proc.returncode}); its log: {log}")
                return 1
        return 0
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
