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

Task environments (``spec.sandbox.environments``, each an ``image``) get a pool each beside the
default one: the same hardened pod with the environment's image, its own Deployment, headless
Service, NetworkPolicy and disruption budget, named ``<run>-sandbox-<environment>`` (cut and given
a hash suffix past 63 characters: a Service name is a DNS label). Their pods carry the component
``sandbox-env`` and ``gagar.dev/environment``, so the default pool's selector (component
``sandbox``) never picks them, nor one environment's selector another's pods. Their executors
label their series ``pool="sandbox/<environment>"`` (``--pool``; the default pool's
``sandbox``). The trainer finds them through the run's ConfigMap (``builders.config``).
``agent-sandbox`` has one warm pool: the spec refuses environments there. Task images' pools,
made on demand, are ``builders.images``'.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from gagar.operator.builders.common import (
    AGENT_SANDBOX,
    BuildContext,
    Manifest,
    auth_volume,
    common_env,
    config_volume,
    image,
    labels,
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
ENVIRONMENT_LABEL = "gagar.dev/environment"
ENVIRONMENT_COMPONENT = "sandbox-env"  # not "sandbox": the default pool's selector must miss them
MAX_NAME = 63  # a Service's name is a DNS label


@dataclass(frozen=True)
class Pool:
    """One executor pool: the default one, a task environment's (``environment``) or a task
    image's (``builders.images``). ``metrics_pool``: the ``pool`` label of its executors' series
    and its key in ``status.pools`` (``sandbox``, ``sandbox/<environment>``), so one pool's
    executions, limits and capacity are told apart from another's (a dashboard's
    ``pool=~"sandbox.*"`` takes all). ``replicas``: ``poolSize`` where None."""

    name: str
    image: str
    selector: dict[str, str]
    labels: dict[str, str]  # of its objects and its pods
    environment: str | None = None
    metrics_pool: str = "sandbox"
    replicas: int | None = None
    annotations: dict[str, str] = field(default_factory=dict)  # of its objects


def default_pool(run: GagarRun) -> Pool:
    sb = run.spec.sandbox
    return Pool(name(run, "sandbox"), sb.image, selector(run, "sandbox"), labels(run, "sandbox"))


def environment_pool_name(run: GagarRun, environment: str) -> str:
    """``<run>-sandbox-<environment>``; past 63 characters its first 57, then a hash of the
    whole (two long names that share their start stay apart)."""
    full = name(run, "sandbox", environment)
    if len(full) <= MAX_NAME:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:5]
    return f"{full[: MAX_NAME - 6].rstrip('-')}-{digest}"


def environment_pools(run: GagarRun) -> list[Pool]:
    """A pool per task environment (``backend: pods``: each names its image)."""
    if run.spec.sandbox.backend != "pods":
        return []
    out = []
    for env in run.spec.sandbox.environments:
        own = {ENVIRONMENT_LABEL: env.name}
        sel = {**selector(run, ENVIRONMENT_COMPONENT), **own}
        lab = {**labels(run, ENVIRONMENT_COMPONENT), **own}
        ref = env.image or run.spec.sandbox.image  # the spec requires an image on pods
        pool_name = environment_pool_name(run, env.name)
        out.append(Pool(pool_name, ref, sel, lab, env.name, metrics_pool=f"sandbox/{env.name}"))
    return out


def pool_url(pool_name: str) -> str:
    """Where the trainer and grader reach a pool: its headless Service."""
    return f"http://{pool_name}:{SANDBOX_PORT}"


def serve_args(run: GagarRun, pool: Pool) -> list[str]:
    """``gagar sandbox serve`` on every interface (the trainer and grader reach the pod by its IP);
    ``/metrics`` also on the metrics port, the only port Prometheus may reach (NetworkPolicy),
    labelled with the pool's own ``pool`` (every pool's ``GAGAR_COMPONENT`` is ``sandbox``)."""
    return [
        "sandbox",
        "serve",
        "--host=0.0.0.0",
        f"--port={SANDBOX_PORT}",
        f"--workspace-root={WORKSPACE_ROOT}",
        f"--metrics-port={run.spec.observability.metrics_port}",
        f"--isolation={executor_isolation(run)}",
        f"--pool={pool.metrics_pool}",
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


def _container(run: GagarRun, ctx: BuildContext, pool: Pool) -> dict[str, Any]:
    sb = run.spec.sandbox
    _, cfg_mount = config_volume(run)
    return {
        "name": "executor",
        "image": image(pool.image, ctx),
        "command": ["gagar"],
        "args": serve_args(run, pool),
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


def _pod(run: GagarRun, ctx: BuildContext, pool: Pool) -> dict[str, Any]:
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
        "containers": [_container(run, ctx, pool)],
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


def _meta(run: GagarRun, ctx: BuildContext, pool: Pool) -> dict[str, Any]:
    meta = metadata(run, ctx, pool.name, "sandbox")
    if pool.annotations:
        meta["annotations"] = {**meta.get("annotations", {}), **pool.annotations}
    return {**meta, "labels": dict(pool.labels)}


def _template(run: GagarRun, ctx: BuildContext, pool: Pool) -> dict[str, Any]:
    """The hardened pod with the pool's image, labelled as the pool (the overlay's scheduling
    and labels as the default pool's: ``spec.sandbox.podTemplate``)."""
    tpl = pod_template(run, "sandbox", _pod(run, ctx, pool))
    pod_labels = {**tpl["metadata"]["labels"], **pool.labels}
    return {**tpl, "metadata": {**tpl["metadata"], "labels": pod_labels}}


def build_sandbox_deployment(run: GagarRun, ctx: BuildContext, pool: Pool) -> Manifest:
    """Warm pool of ``poolSize`` executor pods (0 while suspended or after the run ended)."""
    stopped = run.spec.suspend or ctx.state == "terminal"
    spec = {
        "replicas": 0 if stopped else (pool.replicas or run.spec.sandbox.pool_size),
        "selector": {"matchLabels": dict(pool.selector)},
        "template": _template(run, ctx, pool),
    }
    return obj("apps/v1", "Deployment", _meta(run, ctx, pool), spec=spec)


def build_sandbox_service(run: GagarRun, ctx: BuildContext, pool: Pool) -> Manifest:
    """Headless: a session is pinned to one pod (its workspace), so clients address pods by IP."""
    spec = {
        "clusterIP": "None",
        "selector": dict(pool.selector),
        "ports": [
            {"name": "executor", "port": SANDBOX_PORT, "targetPort": "executor"},
            {
                "name": "metrics",
                "port": run.spec.observability.metrics_port,
                "targetPort": "metrics",
            },
        ],
    }
    return obj("v1", "Service", _meta(run, ctx, pool), spec=spec)


def build_sandbox_network_policy(run: GagarRun, ctx: BuildContext, pool: Pool) -> Manifest:
    """Deny all egress (no DNS either); ingress to the executor only from this run's trainer and
    grader pods, and to the metrics port (counters only, no session data) only for the
    Prometheus the operator names (``ctx.scraper``)."""
    peers = [{"podSelector": {"matchLabels": selector(run, c)}} for c in ("trainer", "grader")]
    metrics = {"protocol": "TCP", "port": run.spec.observability.metrics_port}
    spec = {
        "podSelector": {"matchLabels": dict(pool.selector)},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [
            {"from": peers, "ports": [{"protocol": "TCP", "port": SANDBOX_PORT}]},
            {"from": [ctx.scraper.peer()], "ports": [metrics]},
        ],
        "egress": [],
    }
    return obj("networking.k8s.io/v1", "NetworkPolicy", _meta(run, ctx, pool), spec=spec)


def build_sandbox_disruption_budget(run: GagarRun, ctx: BuildContext, pool: Pool) -> Manifest:
    """A drain takes at most a tenth of the pool (rounded up: at least one pod) at a time: every
    evicted executor ends the sessions it holds, and the trainer's rollouts wait on them. A pod
    that is not ready may always go, so the budget never blocks a drain for good."""
    spec = {
        "maxUnavailable": "10%",
        "selector": {"matchLabels": dict(pool.selector)},
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }
    return obj("policy/v1", "PodDisruptionBudget", _meta(run, ctx, pool), spec=spec)


def build_executor_pool(run: GagarRun, ctx: BuildContext, pool: Pool) -> list[Manifest]:
    """Deployment, headless Service, NetworkPolicy and disruption budget of one pool."""
    return [
        build_sandbox_deployment(run, ctx, pool),
        build_sandbox_service(run, ctx, pool),
        build_sandbox_network_policy(run, ctx, pool),
        build_sandbox_disruption_budget(run, ctx, pool),
    ]


AGENT_SANDBOX_API = f"{AGENT_SANDBOX}/v1beta1"


def build_sandbox_template(run: GagarRun, ctx: BuildContext) -> Manifest:
    """The executor pod as an agent-sandbox SandboxTemplate (claims may inject neither env nor
    volumes: agent-sandbox's defaults, written out)."""
    spec = {
        "podTemplate": pod_template(run, "sandbox", _pod(run, ctx, default_pool(run))),
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
    if run.spec.sandbox.isolation == "agent-sandbox":  # no environments (the spec refuses them)
        if AGENT_SANDBOX not in ctx.crds:
            return []  # the handler refuses the run (SandboxUnavailable) before applying
        return [
            build_sandbox_template(run, ctx),
            build_sandbox_warm_pool(run, ctx),
            build_sandbox_network_policy(run, ctx, default_pool(run)),
        ]
    pools = [default_pool(run), *environment_pools(run)]
    return [m for pool in pools for m in build_executor_pool(run, ctx, pool)]
