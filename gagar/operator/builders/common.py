"""Shared pieces of every child manifest: names, labels, owner references, the build context.

Child names are deterministic (``<run>-<component>[-<suffix>]``) so that server-side apply is
idempotent across operator restarts: applying the same name twice updates, never duplicates.
Pure: no I/O, no clock, no environment.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from gagar import API_GROUP, API_VERSION, KIND, env
from gagar.spec import GagarRun

Manifest = dict[str, Any]
State = Literal["active", "terminal"]

# Optional API groups whose CRDs change what is built (the handler discovers them; tests pass them).
MONITORING = "monitoring.coreos.com"
KEDA = "keda.sh"
JOBSET = "jobset.x-k8s.io"
KUEUE = "kueue.x-k8s.io"
AGENT_SANDBOX = "extensions.agents.x-k8s.io"  # SandboxTemplate, SandboxWarmPool, SandboxClaim
OPTIONAL_CRDS = (MONITORING, KEDA, JOBSET, KUEUE, AGENT_SANDBOX)

CONFIG_MOUNT = "/etc/gagar/config"
CHECKPOINT_MOUNT = "/gagar/checkpoints"
# The rollout pod's own disk (an emptyDir): the policy version it boots from, fetched from the
# trainer's weight server by its init container, and each update's file while it loads.
WEIGHTS_MOUNT = "/gagar/weights"
BOOT_DIR = f"{WEIGHTS_MOUNT}/boot"
WEIGHTS_PORT = 8600  # rank 0's weight server (``rollout.engines.weight_http``)
ATTEMPT_ANNOTATION = "gagar.dev/attempt"
# The failure policy's memory, on the Job too (it outlives a lost status): restarts in a row and
# the newest checkpoint's step when the last restart happened (a newer one refills the budget).
IN_A_ROW_ANNOTATION = "gagar.dev/restarts-in-a-row"
RESUMED_ANNOTATION = "gagar.dev/restart-checkpoint-step"
# Hash of the trainer workload's immutable spec: a change is seen before the API server refuses it.
TEMPLATE_ANNOTATION = "gagar.dev/template-hash"
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"
# Where gagar's images are named by default (the GagarRun's image defaults, the chart's operator
# image); `make images PUSH=<prefix>` pushes them to another registry, and the operator's
# `--image-registry` (the chart's image.registry) makes the runs' pods pull them from there.
DEFAULT_REGISTRY = "ghcr.io/gagar-dev"


@dataclass(frozen=True)
class Scraper:
    """The Prometheus allowed to scrape a run's pods (the chart's ``prometheus.namespace`` and
    ``prometheus.podLabels``, the operator's ``--prometheus-namespace``/``--prometheus-label``):
    its pods' labels in its namespace, and no other pod of the cluster."""

    namespace: str = "monitoring"
    labels: tuple[tuple[str, str], ...] = (("app.kubernetes.io/name", "prometheus"),)

    def peer(self) -> dict[str, Any]:
        """A NetworkPolicy peer selecting exactly these pods."""
        return {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.namespace}},
            "podSelector": {"matchLabels": dict(self.labels)},
        }


@dataclass(frozen=True)
class BuildContext:
    """Inputs besides the run that decide the manifests (all observed by the handler, passed in).

    ``uid``: the GagarRun's uid for owner references. ``crds``: API groups of optional CRDs
    installed in the cluster. ``attempt``: trainer attempt (restarts so far); a new attempt means
    a new Job. ``in_a_row`` and ``resumed_from``: the failure policy's restarts in a row and the
    checkpoint step of the last restart (``status.restartsInARow``, ``restartCheckpointStep``).
    ``state``: ``terminal`` once the run completed or failed (accelerators released).
    ``hold_trainer``: the sandbox pods cannot isolate commands here, so the trainer is suspended
    (not started, or its pods stopped) instead of holding accelerators for rollouts that fail.
    ``scraper``: the one Prometheus the NetworkPolicies let scrape the pods' metrics ports.
    ``image_registry``: the registry gagar's images were pushed to (``image``).
    """

    uid: str = PLACEHOLDER_UID
    crds: frozenset[str] = field(default_factory=frozenset)
    attempt: int = 0
    in_a_row: int = 0
    resumed_from: int | None = None
    state: State = "active"
    hold_trainer: bool = False  # sandbox pods refuse to start: the trainer waits, suspended
    scraper: Scraper = field(default_factory=Scraper)
    image_registry: str = ""  # --image-registry: where gagar's images are pulled from instead
    # resources the namespace's ResourceQuotas track as limits (``limits.cpu``: ``cpu``)
    quota_limits: frozenset[str] = field(default_factory=frozenset)
    # the task images whose executor pools the trainer wants, checked (``builders.images.demand``)
    task_images: tuple[str, ...] = ()


def name(run: GagarRun, component: str, suffix: str = "") -> str:
    """Deterministic child name."""
    base = f"{run.metadata.name}-{component}"
    return f"{base}-{suffix}" if suffix else base


def labels(run: GagarRun, component: str) -> dict[str, str]:
    """Recommended labels plus ``gagar.dev/run`` (the operator's watch and prune selector)."""
    return {
        "app.kubernetes.io/name": "gagar",
        "app.kubernetes.io/instance": run.metadata.name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": "gagar-operator",
        "gagar.dev/run": run.metadata.name,
    }


def selector(run: GagarRun, component: str) -> dict[str, str]:
    """The immutable subset of labels used in selectors (never changes for a run)."""
    return {"gagar.dev/run": run.metadata.name, "app.kubernetes.io/component": component}


def owner_reference(run: GagarRun, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "name": run.metadata.name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(
    run: GagarRun, ctx: BuildContext, obj_name: str, component: str, **extra: Any
) -> dict[str, Any]:
    """Metadata of a namespaced child: name, namespace, labels, owner reference."""
    meta: dict[str, Any] = {"name": obj_name}
    if run.metadata.namespace:
        meta["namespace"] = run.metadata.namespace
    meta["labels"] = labels(run, component)
    meta["ownerReferences"] = [owner_reference(run, ctx.uid)]
    meta.update({k: v for k, v in extra.items() if v})
    return meta


def obj(api_version: str, kind: str, meta: dict[str, Any], **body: Any) -> Manifest:
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, **body}


def resources(req: Any) -> dict[str, Any]:
    """A container ``resources`` block from a ``ResourceRequirements`` (empty parts omitted)."""
    out: dict[str, Any] = {}
    if req.requests:
        out["requests"] = dict(req.requests)
    if req.limits:
        out["limits"] = dict(req.limits)
    return out


QUOTA_LIMITED = ("cpu", "memory")  # what a ResourceQuota's ``limits.*`` makes every container state


def quota_limited(hard: dict[str, Any]) -> frozenset[str]:
    """The resources a ResourceQuota's ``spec.hard`` tracks as limits: quota admission then
    refuses a pod in which any container, init containers and sidecars too, has no limit."""
    return frozenset(r for r in QUOTA_LIMITED if f"limits.{r}" in hard)


def with_quota_limits(objs: list[Manifest], limited: frozenset[str]) -> list[Manifest]:
    """``objs`` with a limit of each ``limited`` resource on every container of every pod that
    states none: its request (every container requests cpu and memory), so that a namespace
    whose ResourceQuota tracks ``limits.cpu``/``limits.memory`` admits the pods, as it does when
    it tracks requests. A container that needs headroom above its request says so in its
    ``resources.limits``."""
    return [_limited(o, limited) for o in objs] if limited else objs


def _limited(node: Any, limited: frozenset[str]) -> Any:
    if isinstance(node, list):
        return [_limited(x, limited) for x in node]
    if not isinstance(node, dict):
        return node
    if isinstance(node.get("containers"), list):  # a pod spec
        out = dict(node)
        for key in ("initContainers", "containers"):
            if key in node:
                out[key] = [_container_limits(c, limited) for c in node[key]]
        return out
    return {k: _limited(v, limited) for k, v in node.items()}


def _container_limits(c: dict[str, Any], limited: frozenset[str]) -> dict[str, Any]:
    res = c.get("resources") or {}
    req, lim = res.get("requests") or {}, res.get("limits") or {}
    extra = {r: req[r] for r in limited if r not in lim and r in req}
    return {**c, "resources": {**res, "limits": {**lim, **extra}}} if extra else c


def requests_with_defaults(req: Any, defaults: dict[str, str]) -> dict[str, Any]:
    """``resources(req)`` with a request for every resource of ``defaults`` the spec names
    neither as a request nor as a limit (a limit alone makes its request, and a default above a
    limit would make the pod invalid), and the GPU limit repeated as a request: every container
    states what the scheduler must reserve, so none lands where it is OOM-killed or starved."""
    out = resources(req)
    gpus = {k: v for k, v in req.limits.items() if k == "nvidia.com/gpu"}
    unset = {k: v for k, v in defaults.items() if k not in req.limits}
    out["requests"] = {**unset, **gpus, **req.requests}
    return out


AUTH_MOUNT = "/var/run/gagar/auth"
AUTH_COMPONENTS = ("trainer", "grader", "sandbox")  # the services and their one caller


def common_env(run: GagarRun, component: str) -> list[dict[str, Any]]:
    """Environment every gagar container gets: who it is and where its config (and, with
    ``spec.authTokenSecret``, the services' shared token) lies. The trainer's Job template is
    immutable, so what may change during a run (log level, metrics port) is not in its
    environment: the trainer reads it from its ConfigMap when it starts."""
    settings = [
        {"name": env.LOG_LEVEL, "value": run.spec.observability.log_level},
        {"name": env.METRICS_PORT, "value": str(run.spec.observability.metrics_port)},
    ]
    out: list[dict[str, Any]] = [
        {"name": env.RUN, "value": run.metadata.name},
        {"name": env.COMPONENT, "value": component},
        {"name": env.CONFIG_DIR, "value": CONFIG_MOUNT},
        *(settings if component != "trainer" else []),
        {
            "name": env.NAMESPACE,
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        },
    ]
    if run.spec.auth_token_secret and component in AUTH_COMPONENTS:
        out.append({"name": env.AUTH_TOKEN_FILE, "value": f"{AUTH_MOUNT}/token"})
    if component in WEIGHT_SYNC_COMPONENTS:
        ref = {"secretKeyRef": {"name": weight_sync_secret_name(run), "key": "token"}}
        out.append({"name": env.WEIGHT_SYNC_TOKEN, "valueFrom": ref})
    return out


WEIGHT_SYNC_COMPONENTS = ("trainer", "rollout")  # vLLM's control routes and their one caller


def weight_sync_secret_name(run: GagarRun) -> str:
    return name(run, "weight-sync")


def build_weight_sync_secret(run: GagarRun, ctx: BuildContext, token: str) -> Manifest:
    """The run's token for vLLM's weight-update routes (``rollout.engines.vllm_auth``): the
    rollout pods require it, the trainer sends it. Not in ``build_all``: the handler draws
    ``token`` at random and creates the Secret once (re-applying would rotate it under running
    pods); the owner reference deletes it with the run."""
    meta = metadata(run, ctx, weight_sync_secret_name(run), "weight-sync")
    data = {"token": base64.b64encode(token.encode()).decode()}  # what the server stores
    return obj("v1", "Secret", meta, type="Opaque", data=data)


def auth_volume(run: GagarRun) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts) of the shared-token Secret (key ``token``); empty without one."""
    secret = run.spec.auth_token_secret
    if not secret:
        return [], []
    volume = {
        "name": "auth",
        "secret": {
            "secretName": secret,
            "defaultMode": 0o440,
            "items": [{"key": "token", "path": "token"}],
        },
    }
    return [volume], [{"name": "auth", "mountPath": AUTH_MOUNT, "readOnly": True}]


SHM_MOUNT = {"name": "dshm", "mountPath": "/dev/shm"}


def shm_volume(size: str) -> dict[str, Any]:
    """The pod's ``/dev/shm``: memory-backed, limited to ``size`` (mounted as ``SHM_MOUNT``)."""
    return {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": size}}


def spec_hash(spec: dict[str, Any]) -> str:
    """A short stable hash of a manifest part."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def config_volume(run: GagarRun) -> tuple[dict[str, Any], dict[str, Any]]:
    """(volume, mount) of the run's ConfigMap of validated sub-specs."""
    volume = {"name": "config", "configMap": {"name": name(run, "config")}}
    return volume, {"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True}


def checkpoint_claim(run: GagarRun) -> str:
    """The PVC holding checkpoints and published weights."""
    ckpt = run.spec.trainer.checkpoint
    return ckpt.existing_claim or name(run, "checkpoints")


def checkpoint_access_mode(run: GagarRun) -> str:
    """``spec.trainer.checkpoint.accessMode``; ``Auto`` is ReadWriteMany for a multi-node
    trainer (its pods on several nodes mount it), else ReadWriteOnce, what a default StorageClass
    provisions: the trainer alone mounts the volume, the rollout pool fetches the published
    weights from the trainer (``weights_url``)."""
    chosen = run.spec.trainer.checkpoint.access_mode
    if chosen != "Auto":
        return chosen
    return "ReadWriteMany" if run.spec.trainer.nodes > 1 else "ReadWriteOnce"


def checkpoint_volume(
    run: GagarRun, read_only: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts) of the checkpoint PVC."""
    pvc: dict[str, Any] = {"claimName": checkpoint_claim(run)}
    if read_only:
        pvc["readOnly"] = True
    volume = {"name": "checkpoints", "persistentVolumeClaim": pvc}
    mount = {"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT, "readOnly": read_only}
    return [volume], [mount]


JOBSET_REPLICATED_JOB = "node"


def uses_jobset(run: GagarRun, ctx: BuildContext) -> bool:
    """A JobSet only when the spec asks for one and its CRD is installed."""
    return run.spec.trainer.use_job_set and JOBSET in ctx.crds


def master_host(run: GagarRun, ctx: BuildContext) -> str:
    """DNS name of rank 0's pod behind the trainer's headless Service."""
    rdzv = name(run, "trainer", "rdzv")
    if uses_jobset(run, ctx):
        return f"{name(run, 'trainer')}-{JOBSET_REPLICATED_JOB}-0-0.{rdzv}"
    return f"{name(run, 'trainer')}-0.{rdzv}"


def weights_url(run: GagarRun, ctx: BuildContext) -> str | None:
    """Where rank 0 serves the published policy versions to the run's rollout pool (its pod's
    name behind the headless Service); None without an in-cluster pool."""
    if run.spec.rollout.endpoint is not None:
        return None
    return f"http://{master_host(run, ctx)}:{WEIGHTS_PORT}"


def image(ref: str, ctx: BuildContext) -> str:
    """``ref`` pulled from ``ctx.image_registry`` when it names one of gagar's images in
    ``DEFAULT_REGISTRY`` (a run's default images), else as given."""
    if ctx.image_registry and ref.startswith(f"{DEFAULT_REGISTRY}/"):
        return ctx.image_registry.rstrip("/") + ref.removeprefix(DEFAULT_REGISTRY)
    return ref


def metrics_port(run: GagarRun) -> dict[str, Any]:
    return {"name": "metrics", "containerPort": run.spec.observability.metrics_port}


def pod_security() -> dict[str, Any]:
    """Pod security context of gagar's own (non-sandbox) pods: non-root, default seccomp."""
    return {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "fsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
