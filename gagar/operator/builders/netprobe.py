"""The NetworkPolicy enforcement probe: does this namespace's CNI enforce NetworkPolicies?

A run's NetworkPolicies fence the rollout pool's weight-update port (which also takes a token)
and the sandboxes' egress; a cluster whose CNI ignores policies (EKS's VPC CNI without its
network-policy agent, GKE Standard without Dataplane V2 or network policy enforcement) applies
them and enforces nothing. Asking the API cannot tell, so the operator tries, once per namespace:

* a probe server (a one-pod Job) answering ``ok`` on two ports, behind a Service;
* a NetworkPolicy selecting it that admits the probe client on ``CONTROL_PORT`` only, so
  ``FENCED_PORT`` is fenced;
* a probe client (a one-pod Job) that waits until the control port answers (the server is up and
  the network works), then connects to the fenced port: refused or timed out, it exits 0
  (enforced); answered, 1 (not enforced); the control port never answered, 2 (no verdict).

Pure (spec-free, like the other builders): ``probe_manifests`` builds the objects,
``probe_verdict`` reads the client's pod. Both Jobs end by themselves (deadline and TTL) even if
the operator dies mid-probe. Costs two small pods for about ten seconds per namespace.
"""

from __future__ import annotations

from typing import Any, Literal

from gagar.operator.builders.common import Manifest, container_security, pod_security

PREFIX = "gagar-netpol-probe"
PROBE_LABEL = "gagar.dev/probe"
FENCED_PORT, CONTROL_PORT = 8080, 8081
NO_VERDICT = 2  # the client's exit code when even the control port never answered
DEADLINE_S = 300  # the Jobs' activeDeadlineSeconds: nothing outlives a dead operator for long
RESOURCES = {
    "requests": {"cpu": "10m", "memory": "32Mi"},
    "limits": {"cpu": "100m", "memory": "64Mi"},
}

SERVER = f"""
import socket, threading
def serve(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", port))
    s.listen(8)
    while True:
        c, _ = s.accept()
        c.sendall(b"ok")
        c.close()
threading.Thread(target=serve, args=({CONTROL_PORT},), daemon=True).start()
serve({FENCED_PORT})
"""

CLIENT = f"""
import socket, sys, time
def reach(port, timeout):
    try:
        with socket.create_connection(("{PREFIX}", port), timeout=timeout) as c:
            return c.recv(2) == b"ok"
    except OSError:
        return False
deadline = time.monotonic() + 180
while not reach({CONTROL_PORT}, 3):
    if time.monotonic() > deadline:
        print("the control port never answered: no verdict")
        sys.exit({NO_VERDICT})
    time.sleep(1)
open_ = reach({FENCED_PORT}, 5)
print("fenced port answered: not enforced" if open_ else "fenced port refused: enforced")
sys.exit(1 if open_ else 0)
"""

Verdict = tuple[Literal["True", "False", "Unknown"], str, str]  # (status, reason, message)

NOT_ENFORCED = (
    "the cluster's network plugin does not enforce NetworkPolicies in namespace {ns}: a probe "
    "reached a port a NetworkPolicy fences. The run's policies (the rollout pool's weight-update "
    "port, the sandboxes' egress) are applied but not enforced: sandboxed code can reach the "
    "network. Enable enforcement (EKS: the VPC CNI's network policy agent, "
    "enableNetworkPolicy=true; GKE Standard: Dataplane V2 or --enable-network-policy; or "
    "Calico/Cilium), see docs/security.md"
)


def _labels(role: str) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": "gagar-operator", PROBE_LABEL: f"netpol-{role}"}


def _meta(name: str, namespace: str, role: str) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": _labels(role)}


def _job(namespace: str, role: str, image: str, script: str) -> Manifest:
    container: dict[str, Any] = {
        "name": role,
        "image": image,
        "command": ["python", "-c", script],
        "resources": RESOURCES,
        "securityContext": container_security(),
    }
    if role == "server":
        container["ports"] = [{"containerPort": FENCED_PORT}, {"containerPort": CONTROL_PORT}]
    pod = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": pod_security(),
        "containers": [container],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(f"{PREFIX}-{role}", namespace, role),
        "spec": {
            "completionMode": "Indexed",  # one pod, named by its index, as the trainer's
            "completions": 1,
            "parallelism": 1,
            "backoffLimit": 0,
            "activeDeadlineSeconds": DEADLINE_S,
            "ttlSecondsAfterFinished": 60,
            "template": {"metadata": {"labels": _labels(role)}, "spec": pod},
        },
    }


def probe_manifests(namespace: str, image: str) -> list[Manifest]:
    """The policy first (enforced before the server is up), then server, Service, client."""
    client = {"podSelector": {"matchLabels": _labels("client")}}
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(PREFIX, namespace, "policy"),
        "spec": {
            "podSelector": {"matchLabels": _labels("server")},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [client], "ports": [{"port": CONTROL_PORT, "protocol": "TCP"}]}],
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(PREFIX, namespace, "service"),
        "spec": {
            "selector": _labels("server"),
            "ports": [
                {"name": "fenced", "port": FENCED_PORT, "protocol": "TCP"},
                {"name": "control", "port": CONTROL_PORT, "protocol": "TCP"},
            ],
        },
    }
    return [
        policy,
        _job(namespace, "server", image, SERVER),
        service,
        _job(namespace, "client", image, CLIENT),
    ]


def _exit_code(pod: dict[str, Any]) -> int | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated")
        if terminated is not None:
            return int(terminated.get("exitCode", -1))
    return None


def probe_verdict(namespace: str, pods: list[dict[str, Any]]) -> Verdict | None:
    """The verdict of the client's pods, or None while none has ended."""
    for pod in pods:
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Succeeded":
            return (
                "True",
                "Enforced",
                f"a port a NetworkPolicy fences in {namespace} refused a probe",
            )
        code = _exit_code(pod) if phase == "Failed" else None
        if code == 1:
            return ("False", "NotEnforced", NOT_ENFORCED.format(ns=namespace))
        if phase == "Failed":
            why = "the probe pod could not reach even the port the policy admits"
            return ("Unknown", "ProbeInconclusive", f"{why} (exit code {code}) in {namespace}")
    return None
