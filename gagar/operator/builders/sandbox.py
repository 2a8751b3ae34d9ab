"""The sandbox pool: hardened executor pods and the NetworkPolicy that cuts them off.

What the pod spec guards against: privilege (non-root uid, no privilege escalation, every
capability dropped, seccomp ``RuntimeDefault``), persistence and tampering (read-only root; only
emptyDir workspaces are writable), credential theft (no service-account token mounted), and
exfiltration or lateral movement (deny-all egress, ingress only from this run's trainer and grader
pods). An optional ``runtimeClassName`` (e.g. gVisor) adds a kernel boundary. What it does not
guard against: kernel exploits without such a runtime class, and resource exhaustion beyond the
executor's own limits and the pod's resources. Only built for ``sandbox.backend: pods``.

``spec.sandbox.isolation`` decides the executor's identity: ``bubblewrap`` runs it as non-root
with no capability (bubblewrap makes a user namespace; the node must allow that), ``pod`` and
``auto`` run it as root with only the capabilities that giving each session a uid of its own
needs (``POD_MODE_CAPS``; Pod Security ``baseline``), since there the pod is the boundary and
the sessions' uids are what keeps them apart. No mode asks for an unmasked ``/proc``. The
executor's refusal (exit 3, "no isolation works here") becomes the container's termination
message, which the operator reads into the run's conditions.

``isolation: agent-sandbox`` replaces the Deployment, its Service and its disruption budget by a
SandboxTemplate (the same hardened pod, its executor in ``auto``) and a SandboxWarmPool of
``poolSize`` Sandboxes of it (kubernetes-sigs/agent-sandbox, ``extensions.agents.x-k8s.io``),
built only when the CRDs are installed and the operator's integration is on (the handler reports
the run ``SandboxUnavailable`` otherwise). The trainer and grader claim one Sandbox per session
(``gagar.sandbox.agent``). The template's NetworkPolicy is ``Unmanaged``: agent-sandbox's default
policy admits its router and lets the pods reach the Internet; the run's own deny-all policy
(below), which selects the claimed pods by the template's labels, is what applies.
"""

from __future__ import annotations

from typing import Any

from gagar.operator.builders.common import (
    AGENT_SANDBOX,
    BuildContext,
    Manifest,
    auth_volume,
    common_env,
    config_volume,
    image,
    metadata,
    metrics_port,
    name,
    obj,
    requests_with_defaults,
    selector,
)
from gagar.operator.builders.overlay import pod_template
from gagar.spec import GagarRun

SANDBOX_PORT = 8090
# Requests of an executor pod whose spec names none (a test run is a pytest process or two).
SANDBOX_DEFAULT_REQUESTS = {"cpu": "500m", "memory": "1Gi"}
SANDBOX_UID = 65534
# What the executor needs to lease uids: switch to them (setuid/setgid, setpcap for setpriv's
# bounding-set drop), hand them their workspace (chown), clean up after them (fowner,
# dac_override) and kill what they leave (kill). Nothing that mounts, traces or configures.
POD_MODE_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETPCAP", "SETUID"]
WORKSPACE_ROOT = "/workspace"  # the workspace emptyDir: every session's directory lies under it


def serve_args(run: GagarRun) -> list[str]:
    """``gagar sandbox serve`` on every interface (the trainer and grader reach the pod by its IP);
    ``/metrics`` also on the metrics port, the only port Prometheus may reach (NetworkPolicy)."""
    return [
        "sandbox",
        "serve",
        "--host=0.0.0.0",
        f"--port={SANDBOX_PORT}",
        f"--workspace-root={WORKSPACE_ROOT}",
        f"--metrics-port={run.spec.observability.metrics_port}",
        f"--isolation={executor_isolation(run)}",
    ]


def executor_isolation(run: GagarRun) -> str:
    """The executor's own ``--isolation``: a claimed Sandbox's pod is one session's, and its
    executor takes the strongest mode that works there (``auto``)."""
    mode = run.spec.sandbox.isolation
    return "auto" if mode == "agent-sandbox" else mode


def _identity(run: GagarRun) -> dict[str, Any]:
    """Who the executor is: non-root for bubblewrap, root with ``POD_MODE_CAPS`` otherwise."""
    if run.spec.sandbox.isolation == "bubblewrap":
        user = {"runAsNonRoot": True, "runAsUser": SANDBOX_UID, "runAsGroup": SANDBOX_UID}
        return {"user": user, "caps": {"drop": ["ALL"]}}
    user = {"runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0}
    return {"user": user, "caps": {"drop": ["ALL"], "add": POD_MODE_CAPS}}


def _container(run: GagarRun, ctx: BuildContext) -> dict[str, Any]:
    sb = run.spec.sandbox
    _, cfg_mount = config_volume(run)
    return {
        "name": "executor",
        "image": image(sb.image, ctx),
        "command": ["gagar"],
        "args": serve_args(run),
        "env": common_env(run, "sandbox"),
        "ports": [{"name": "executor", "containerPort": SANDBOX_PORT}, metrics_port(run)],
        "readinessProbe": {"tcpSocket": {"port": "executor"}, "periodSeconds": 10},
        "terminationMessagePolicy": "FallbackToLogsOnError",  # the refusal, for the operator
        "resources": requests_with_defaults(sb.resources, SANDBOX_DEFAULT_REQUESTS),
        "volumeMounts": [
            cfg_mount,
            {"name": "workspace", "mountPath": WORKSPACE_ROOT},
            {"name": "tmp", "mountPath": "/tmp"},
            *auth_volume(run)[1],
        ],
        "securityContext": {
            **_identity(run)["user"],
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": _identity(run)["caps"],
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


def _pod(run: GagarRun, ctx: BuildContext) -> dict[str, Any]:
    cfg_vol, _ = config_volume(run)
    pod: dict[str, Any] = {
        "serviceAccountName": name(run, "sandbox"),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            **_identity(run)["user"],
            "fsGroup": SANDBOX_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(run, ctx)],
        "volumes": [
            cfg_vol,
            {"name": "workspace", "emptyDir": {"sizeLimit": "4Gi"}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
            *auth_volume(run)[0],
        ],
    }
    if run.spec.sandbox.runtime_class_name:
        pod["runtimeClassName"] = run.spec.sandbox.runtime_class_name
    return pod


def build_sandbox_deployment(run: GagarRun, ctx: BuildContext) -> Manifest:
    """Warm pool of ``poolSize`` executor pods (0 while suspended or after the run ended)."""
    stopped = run.spec.suspend or ctx.state == "terminal"
    spec = {
        "replicas": 0 if stopped else run.spec.sandbox.pool_size,
        "selector": {"matchLabels": selector(run, "sandbox")},
        "template": pod_template(run, "sandbox", _pod(run, ctx)),
    }
    meta = metadata(run, ctx, name(run, "sandbox"), "sandbox")
    return obj("apps/v1", "Deployment", meta, spec=spec)


def build_sandbox_service(run: GagarRun, ctx: BuildContext) -> Manifest:
    """Headless: a session is pinned to one pod (its workspace), so clients address pods by IP."""
    spec = {
        "clusterIP": "None",
        "selector": selector(run, "sandbox"),
        "ports": [
            {"name": "executor", "port": SANDBOX_PORT, "targetPort": "executor"},
            {
                "name": "metrics",
                "port": run.spec.observability.metrics_port,
                "targetPort": "metrics",
            },
        ],
    }
    return obj("v1", "Service", metadata(run, ctx, name(run, "sandbox"), "sandbox"), spec=spec)


def build_sandbox_network_policy(run: GagarRun, ctx: BuildContext) -> Manifest:
    """Deny all egress (no DNS either); ingress to the executor only from this run's trainer and
    grader pods, and to the metrics port (counters only, no session data) only for the
    Prometheus the operator names (``ctx.scraper``)."""
    peers = [{"podSelector": {"matchLabels": selector(run, c)}} for c in ("trainer", "grader")]
    metrics = {"protocol": "TCP", "port": run.spec.observability.metrics_port}
    spec = {
        "podSelector": {"matchLabels": selector(run, "sandbox")},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [
            {"from": peers, "ports": [{"protocol": "TCP", "port": SANDBOX_PORT}]},
            {"from": [ctx.scraper.peer()], "ports": [metrics]},
        ],
        "egress": [],
    }
    meta = metadata(run, ctx, name(run, "sandbox"), "sandbox")
    return obj("networking.k8s.io/v1", "NetworkPolicy", meta, spec=spec)


def build_sandbox_disruption_budget(run: GagarRun, ctx: BuildContext) -> Manifest:
    """A drain takes at most a tenth of the pool (rounded up: at least one pod) at a time: every
    evicted executor ends the sessions it holds, and the trainer's rollouts wait on them. A pod
    that is not ready may always go, so the budget never blocks a drain for good."""
    spec = {
        "maxUnavailable": "10%",
        "selector": {"matchLabels": selector(run, "sandbox")},
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }
    meta = metadata(run, ctx, name(run, "sandbox"), "sandbox")
    return obj("policy/v1", "PodDisruptionBudget", meta, spec=spec)


AGENT_SANDBOX_API = f"{AGENT_SANDBOX}/v1beta1"


def build_sandbox_template(run: GagarRun, ctx: BuildContext) -> Manifest:
    """The executor pod as an agent-sandbox SandboxTemplate (claims may inject neither env nor
    volumes: agent-sandbox's defaults, written out)."""
    spec = {
        "podTemplate": pod_template(run, "sandbox", _pod(run, ctx)),
        "networkPolicyManagement": "Unmanaged",
        "envVarsInjectionPolicy": "Disallowed",
        "volumeClaimTemplatesPolicy": "Disallowed",
    }
    meta = metadata(run, ctx, name(run, "sandbox"), "sandbox")
    return obj(AGENT_SANDBOX_API, "SandboxTemplate", meta, spec=spec)


def build_sandbox_warm_pool(run: GagarRun, ctx: BuildContext) -> Manifest:
    """``poolSize`` Sandboxes started ahead of their claims (0 while suspended or ended)."""
    stopped = run.spec.suspend or ctx.state == "terminal"
    spec = {
        "replicas": 0 if stopped else run.spec.sandbox.pool_size,
        "sandboxTemplateRef": {"name": name(run, "sandbox")},
    }
    meta = metadata(run, ctx, name(run, "sandbox"), "sandbox")
    return obj(AGENT_SANDBOX_API, "SandboxWarmPool", meta, spec=spec)


def build_sandbox(run: GagarRun, ctx: BuildContext) -> list[Manifest]:
    if run.spec.sandbox.backend != "pods":
        return []
    if run.spec.sandbox.isolation == "agent-sandbox":
        if AGENT_SANDBOX not in ctx.crds:
            return []  # the handler refuses the run (SandboxUnavailable) before applying
        return [
            build_sandbox_template(run, ctx),
            build_sandbox_warm_pool(run, ctx),
            build_sandbox_network_policy(run, ctx),
        ]
    return [
        build_sandbox_deployment(run, ctx),
        build_sandbox_service(run, ctx),
        build_sandbox_network_policy(run, ctx),
        build_sandbox_disruption_budget(run, ctx),
    ]
