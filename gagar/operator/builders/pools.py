"""Rollout and grader pools: Deployments + Services, with fixed replicas XOR an autoscaler.

One writer per field: when a pool is autoscaled the Deployment manifest omits ``spec.replicas``
entirely, so the operator's server-side apply never owns it and the HPA/KEDA is its only writer.
Suspended or terminal runs scale every pool to zero: KEDA pools (suspended) get the
``autoscaling.keda.sh/paused-replicas: "0"`` annotation (KEDA scales to 0 and holds); HPA pools
(an HPA cannot hold 0) and every pool of a terminal run lose their autoscaler and get
``replicas: 0`` from the operator, which is then the only writer again. A pool with ``endpoint``
builds nothing (the run uses the external server).

The rollout pod is vLLM with its RL weight-transfer API enabled (``VLLM_SERVER_DEV_MODE=1``,
``--weight-transfer-config``), booting from the newest safetensors the trainer published (falling
back to the base model), so new autoscaled replicas start current: its init container fetches
that version from the trainer's weight server into the pod's own disk (an ``emptyDir``), and
each weight update makes vLLM's workers fetch the new version from there too. The pod mounts no
checkpoint volume, so it may run on any node, and the volume may be ReadWriteOnce.
"""

from __future__ import annotations

import shlex
from typing import Any

from gagar import env
from gagar.operator.builders.access import claims_sandboxes
from gagar.operator.builders.common import (
    BOOT_DIR,
    CONFIG_MOUNT,
    KEDA,
    SHM_MOUNT,
    WEIGHTS_MOUNT,
    BuildContext,
    Manifest,
    auth_volume,
    common_env,
    config_volume,
    container_security,
    image,
    metadata,
    metrics_port,
    name,
    obj,
    pod_security,
    requests_with_defaults,
    selector,
    shm_volume,
    weights_url,
)
from gagar.operator.builders.overlay import pod_template
from gagar.operator.builders.sandbox import SANDBOX_PORT
from gagar.rollout.engines.vllm_args import VllmArgs, vllm_args
from gagar.spec import (
    GRADER_SERVED_NAME,
    HUB_MODELS,
    Autoscaling,
    GagarRun,
    GraderSpec,
    ResourceRequirements,
    RolloutSpec,
)

VLLM_PORT = 8000
GRADER_PORT = 8080
KEDA_PAUSED = "autoscaling.keda.sh/paused-replicas"
BASE_MODEL_MOUNT = "/gagar/base-model"


def quantity(x: float) -> str:
    """A Kubernetes quantity for a float (``4.0`` → ``"4"``, ``2.5`` → ``"2500m"``)."""
    return str(int(x)) if float(x).is_integer() else f"{round(x * 1000)}m"


# vLLM's name of a transport where it differs from the spec's: gagar's CPU-capable transport is
# the ``gagar_safetensors`` backend that gagar's vLLM plugin registers.
VLLM_BACKEND = {"gagar-cpu": "gagar_safetensors"}


def transport(run: GagarRun) -> str:
    """The weight-transfer transport: ``auto`` is gagar's safetensors transport on CPU and GPU
    replicas alike, the one the cluster trainer implements (the spec refuses the others)."""
    chosen = run.spec.rollout.weight_sync.transport
    return "gagar-cpu" if chosen == "auto" else chosen


def vllm_backend(run: GagarRun) -> str:
    """The ``backend`` of vLLM's ``--weight-transfer-config`` for the run's transport."""
    chosen = transport(run)
    return VLLM_BACKEND.get(chosen, chosen)


def base_model(
    location: str | None,
) -> tuple[str | None, list[dict[str, Any]], list[dict[str, Any]]]:
    """(path inside the pod, volumes, mounts) of a model location; ``pvc://claim/sub`` is mounted."""
    if location is None or not location.startswith("pvc://"):
        return location, [], []
    claim, _, sub = location.removeprefix("pvc://").partition("/")
    volume = {"name": "base-model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
    mount = {"name": "base-model", "mountPath": BASE_MODEL_MOUNT, "readOnly": True}
    return f"{BASE_MODEL_MOUNT}/{sub}".rstrip("/"), [volume], [mount]


def load_format(model: str | None) -> str | None:
    """Object-store models are streamed by vLLM's Run:ai model streamer."""
    return "runai_streamer" if model and model.startswith(("s3://", "gs://")) else None


def rollout_dtype(run: GagarRun) -> str:
    """The policy's dtype in vLLM: the trainer's on GPU replicas (``auto``: vLLM's own choice,
    bfloat16 where the GPU has it); float32 on CPU replicas, where the trainer keeps float32
    parameters (exact log-probs for the importance ratio)."""
    return run.spec.model.dtype if run.spec.rollout.resources.gpus > 0 else "float32"


def keda_pool(pool: RolloutSpec | GraderSpec, ctx: BuildContext) -> bool:
    """The pool is scaled by a ScaledObject: it asks for KEDA and the operator may use KEDA
    (without it the run is Stalled, and a suspend scales the pool to zero as an HPA pool's)."""
    auto = pool.autoscaling
    return auto is not None and auto.backend == "keda" and KEDA in ctx.crds


def _replicas(run: GagarRun, pool: RolloutSpec | GraderSpec, ctx: BuildContext) -> int | None:
    """``spec.replicas`` the operator writes, or None when an autoscaler owns it."""
    stopped = run.spec.suspend or ctx.state == "terminal"
    if pool.autoscaling is None:
        return 0 if stopped else pool.replicas
    if ctx.state == "terminal" or (stopped and not keda_pool(pool, ctx)):
        return 0
    return None


def _deployment(
    run: GagarRun, ctx: BuildContext, component: str, pod: dict[str, Any], replicas: int | None
) -> Manifest:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": selector(run, component)},
        "template": pod_template(run, component, pod),
    }
    if replicas is not None:
        spec = {"replicas": replicas, **spec}
    return obj(
        "apps/v1", "Deployment", metadata(run, ctx, name(run, component), component), spec=spec
    )


def vllm_command(model: str | None, published: bool = True) -> list[str]:
    """Shell entry of a vLLM server; its options follow as the container's ``args`` (``"$@"``).
    The policy (``published``) boots from the version its init container fetched (``BOOT_DIR``),
    else from the base model (nothing published yet); without a base model the init container
    waits for the first version, so an empty ``BOOT_DIR`` then is an error."""
    if not published:
        script = f'exec vllm serve {shlex.quote(model or "")} "$@"'
    else:
        fallback = (
            f"M={shlex.quote(model)}" if model else 'echo "no policy version in $M" >&2; exit 1'
        )
        script = (
            f'M={BOOT_DIR}; [ -f "$M/config.json" ] || {{ {fallback}; }}; exec vllm serve "$M" "$@"'
        )
    return ["/bin/sh", "-c", script, "vllm"]  # "vllm" is $0, the args are "$@"


FETCH_DEFAULT_REQUESTS = {"cpu": "250m", "memory": "256Mi"}  # a streaming HTTP download


def fetch_weights_container(run: GagarRun, ctx: BuildContext, model: str | None) -> dict[str, Any]:
    """The rollout pod's init container: the newest version the trainer serves into
    ``BOOT_DIR`` (``gagar rollout fetch-weights``), or nothing when the pod boots from ``model``."""
    args = ["rollout", "fetch-weights", f"--url={weights_url(run, ctx)}", f"--dest={BOOT_DIR}"]
    if model:
        args.append(f"--base-model={model}")
    return {
        "name": "fetch-weights",
        "image": image(run.spec.rollout.image, ctx),
        "command": ["gagar"],
        "args": args,
        "env": common_env(run, "rollout"),
        "resources": {"requests": FETCH_DEFAULT_REQUESTS},
        "volumeMounts": [WEIGHTS_VOLUME_MOUNT],
        "securityContext": container_security(),
    }


WEIGHTS_VOLUME = {"name": "weights", "emptyDir": {}}
WEIGHTS_VOLUME_MOUNT = {"name": "weights", "mountPath": WEIGHTS_MOUNT}


def pod_vllm_args(model: str | None, served_name: str, **options: Any) -> list[str]:
    """vLLM options of a server in a pool's pod: every interface, ``VLLM_PORT``, object-store
    models streamed; ``options`` are the server's other ``VllmArgs``."""
    return vllm_args(
        VllmArgs(
            host="0.0.0.0",
            port=VLLM_PORT,
            served_name=served_name,
            load_format=load_format(model),
            **options,
        )
    )


def rollout_args(run: GagarRun, model: str | None) -> list[str]:
    """The policy server's vLLM options (the embedded server's, through ``vllm_args``)."""
    rollout = run.spec.rollout
    return pod_vllm_args(
        model,
        "policy",
        weight_transfer_backend=vllm_backend(run),
        dtype=rollout_dtype(run),
        max_model_len=rollout.agent.max_context_tokens,
        tensor_parallel_size=rollout.tensor_parallel_size,
        gpu_memory_utilization=rollout.gpu_memory_utilization,
    )


def grader_model_args(run: GagarRun, model: str | None) -> list[str]:
    """The agentic grader's model server: a fixed model answering OpenAI tool calls."""
    grader = run.spec.grader
    return pod_vllm_args(
        model,
        GRADER_SERVED_NAME,
        tensor_parallel_size=max(grader.resources.gpus, 1),
        tool_call_parser=grader.tool_call_parser,
    )


# A vLLM server loads (and may download or stream) its weights before /health answers: up to
# 30 min (180 × 10 s) before the kubelet gives up; readiness is probed only after that.
VLLM_STARTUP_FAILURES = 180
# Requests of a vLLM container whose spec names none: the scheduler must reserve host memory for
# weight loading and the tokenizer workers, or the pod lands where it is OOM-killed mid-load.
VLLM_DEFAULT_REQUESTS = {"cpu": "2", "memory": "8Gi"}


def vllm_startup_probe(port: str) -> dict[str, Any]:
    return {
        "httpGet": {"path": "/health", "port": port},
        "periodSeconds": 10,
        "failureThreshold": VLLM_STARTUP_FAILURES,
    }


# Requests of the grader service container (a Python HTTP server driving graders) when the spec
# names none.
GRADER_DEFAULT_REQUESTS = {"cpu": "500m", "memory": "1Gi"}


def vllm_resources(req: ResourceRequirements) -> dict[str, Any]:
    """The pool's resources, with ``VLLM_DEFAULT_REQUESTS`` for cpu/memory it leaves out and
    the GPU limit repeated as a request (what the scheduler reserves, stated)."""
    return requests_with_defaults(req, VLLM_DEFAULT_REQUESTS)


def api_key_env(run: GagarRun) -> list[dict[str, Any]]:
    """``VLLM_API_KEY`` (vLLM's ``--api-key``, kept out of the pod's args) from the run's token,
    ``spec.authTokenSecret``: vLLM then refuses its OpenAI API (``/v1``) without the bearer token
    the trainer sends. vLLM guards only that prefix: its weight-transfer routes take the run's
    weight-sync token instead (``common_env``, ``rollout.engines.vllm_auth``)."""
    secret = run.spec.auth_token_secret
    if not secret:
        return []
    ref = {"secretKeyRef": {"name": secret, "key": "token"}}
    return [{"name": "VLLM_API_KEY", "valueFrom": ref}]


def _vllm_container(
    run: GagarRun, ctx: BuildContext, model: str | None, mounts: list[dict[str, Any]]
) -> dict[str, Any]:
    rollout = run.spec.rollout
    return {
        "name": "vllm",
        "image": image(rollout.image, ctx),
        "command": vllm_command(model),
        "args": rollout_args(run, model),
        "env": [
            *common_env(run, "rollout"),
            {"name": "VLLM_SERVER_DEV_MODE", "value": "1"},
            # the one weight server its workers fetch from, and where to
            {"name": env.WEIGHTS_URL, "value": weights_url(run, ctx)},
            {"name": env.WEIGHTS_DIR, "value": WEIGHTS_MOUNT},
            *api_key_env(run),
        ],
        "ports": [{"name": "http", "containerPort": VLLM_PORT}],
        "startupProbe": vllm_startup_probe("http"),
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10},
        "resources": vllm_resources(rollout.resources),
        "volumeMounts": mounts,
        "securityContext": container_security(),
    }


def build_rollout_deployment(run: GagarRun, ctx: BuildContext) -> Manifest:
    """vLLM on the policy; no checkpoint volume: the weights come from the trainer over HTTP."""
    model, model_vols, model_mounts = base_model(run.spec.model.path)
    cfg_vol, cfg_mount = config_volume(run)
    shm = shm_volume(run.spec.rollout.shm_size)
    mounts = [cfg_mount, WEIGHTS_VOLUME_MOUNT, *model_mounts, SHM_MOUNT]
    pod = {
        "serviceAccountName": name(run, "rollout"),
        "automountServiceAccountToken": False,
        "securityContext": pod_security(),
        "initContainers": [fetch_weights_container(run, ctx, model)],
        "containers": [_vllm_container(run, ctx, model, mounts)],
        "volumes": [cfg_vol, WEIGHTS_VOLUME, *model_vols, shm],
    }
    return _deployment(run, ctx, "rollout", pod, _replicas(run, run.spec.rollout, ctx))


def grader_serve_args(run: GagarRun) -> list[str]:
    """``gagar grader serve`` in the pod: the settings come from the run's ``run.json`` in the
    config dir; the flags say where this pod's parts are (its model server beside it, the
    sandbox pool)."""
    args = [
        "grader",
        "serve",
        "--host=0.0.0.0",
        f"--port={GRADER_PORT}",
        f"--metrics-port={run.spec.observability.metrics_port}",
        f"--config-dir={CONFIG_MOUNT}",
    ]
    if run.spec.grader.kind != "agentic":
        return args
    args += [f"--model-url=http://127.0.0.1:{VLLM_PORT}/v1", f"--model={GRADER_SERVED_NAME}"]
    if run.spec.sandbox.isolation == "agent-sandbox":
        return [*args, "--sandbox=agent-sandbox", f"--sandbox-warmpool={name(run, 'sandbox')}"]
    if run.spec.sandbox.backend == "pods":
        return [
            *args,
            "--sandbox=pool",
            f"--sandbox-url=http://{name(run, 'sandbox')}:{SANDBOX_PORT}",
        ]
    return [*args, "--sandbox=bwrap"]


def _grader_containers(
    run: GagarRun, ctx: BuildContext, mounts: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    grader = run.spec.grader
    service = {
        "name": "grader",
        "image": image(grader.image, ctx),
        "command": ["gagar"],
        "args": grader_serve_args(run),
        "env": common_env(run, "grader"),
        "ports": [{"name": "http", "containerPort": GRADER_PORT}, metrics_port(run)],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10},
        "volumeMounts": [*mounts[:1], *auth_volume(run)[1]],
        "securityContext": container_security(),
    }
    if grader.kind != "agentic":  # the pool's resources are the service's
        service["resources"] = requests_with_defaults(grader.resources, GRADER_DEFAULT_REQUESTS)
        return [service]
    # agentic: the pool's resources are the model server's; the service asks for its own
    service["resources"] = {"requests": GRADER_DEFAULT_REQUESTS}
    model_path, _, model_mounts = base_model(HUB_MODELS.get(grader.model or "", grader.model))
    server = {
        "name": "model",
        "image": image(run.spec.rollout.image, ctx),
        "command": vllm_command(model_path, published=False),
        "args": grader_model_args(run, model_path),
        "env": common_env(run, "grader-model"),
        "ports": [{"name": "model", "containerPort": VLLM_PORT}],
        "startupProbe": vllm_startup_probe("model"),
        "readinessProbe": {"httpGet": {"path": "/health", "port": "model"}, "periodSeconds": 10},
        "resources": vllm_resources(grader.resources),
        "volumeMounts": [*mounts[1:], *model_mounts],
        "securityContext": container_security(),
    }
    return [service, server]


def build_grader_deployment(run: GagarRun, ctx: BuildContext) -> Manifest:
    """Grader service (``gagar grader serve``) and, for the agentic grader, its model server beside it."""
    cfg_vol, cfg_mount = config_volume(run)
    _, model_vols, _ = base_model(
        run.spec.grader.model if run.spec.grader.kind == "agentic" else None
    )
    shm = shm_volume(run.spec.grader.shm_size)
    pod = {
        "serviceAccountName": name(run, "grader"),
        "automountServiceAccountToken": claims_sandboxes(run, "grader"),
        "securityContext": pod_security(),
        "containers": _grader_containers(run, ctx, [cfg_mount, SHM_MOUNT]),
        "volumes": [cfg_vol, shm, *model_vols, *auth_volume(run)[0]],
    }
    return _deployment(run, ctx, "grader", pod, _replicas(run, run.spec.grader, ctx))


def build_pool_service(run: GagarRun, ctx: BuildContext, component: str) -> Manifest:
    port = VLLM_PORT if component == "rollout" else GRADER_PORT
    ports = [{"name": "http", "port": port, "targetPort": "http"}]
    if component == "grader":
        mp = run.spec.observability.metrics_port
        ports.append({"name": "metrics", "port": mp, "targetPort": "metrics"})
    spec = {"selector": selector(run, component), "ports": ports}
    return obj("v1", "Service", metadata(run, ctx, name(run, component), component), spec=spec)


def queue_query(run: GagarRun, component: str) -> str:
    """PromQL of the pool's waiting work (KEDA divides it by the per-replica target)."""
    ns = f'namespace="{run.metadata.namespace}",' if run.metadata.namespace else ""
    if component == "rollout":
        return f'sum(vllm:num_requests_waiting{{{ns}service="{name(run, "rollout")}"}})'
    return f'sum(gagar_grader_queue_depth{{{ns}run="{run.metadata.name}"}})'


def build_scaled_object(
    run: GagarRun, ctx: BuildContext, component: str, auto: Autoscaling
) -> Manifest:
    """KEDA ScaledObject with a Prometheus trigger on the pool's queue."""
    paused = {KEDA_PAUSED: "0"} if run.spec.suspend else None
    meta = metadata(run, ctx, name(run, component), component, annotations=paused)
    trigger = {
        "type": "prometheus",
        "metadata": {
            "serverAddress": auto.prometheus_address,
            "query": queue_query(run, component),
            "threshold": f"{auto.target_queue_depth:g}",
        },
    }
    spec = {
        "scaleTargetRef": {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": name(run, component),
        },
        "minReplicaCount": auto.min_replicas,
        "maxReplicaCount": auto.max_replicas,
        "cooldownPeriod": auto.cooldown_seconds,
        "pollingInterval": 15,
        "triggers": [trigger],
    }
    return obj("keda.sh/v1alpha1", "ScaledObject", meta, spec=spec)


def hpa_metric(component: str) -> str:
    """The Pods metric the pool's HPA scales on, as a metrics adapter names it."""
    return "vllm_num_requests_waiting" if component == "rollout" else "gagar_grader_queue_depth"


def build_hpa(run: GagarRun, ctx: BuildContext, component: str, auto: Autoscaling) -> Manifest:
    """HPA (autoscaling/v2) on a Pods metric served by a metrics adapter (e.g. prometheus-adapter,
    which exposes ``vllm:num_requests_waiting`` as ``vllm_num_requests_waiting``)."""
    metric = hpa_metric(component)
    spec = {
        "scaleTargetRef": {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": name(run, component),
        },
        "minReplicas": auto.min_replicas,
        "maxReplicas": auto.max_replicas,
        "metrics": [
            {
                "type": "Pods",
                "pods": {
                    "metric": {"name": metric},
                    "target": {
                        "type": "AverageValue",
                        "averageValue": quantity(auto.target_queue_depth),
                    },
                },
            }
        ],
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": auto.cooldown_seconds}},
    }
    meta = metadata(run, ctx, name(run, component), component)
    return obj("autoscaling/v2", "HorizontalPodAutoscaler", meta, spec=spec)


def build_autoscaler(run: GagarRun, ctx: BuildContext, component: str) -> list[Manifest]:
    pool = run.spec.rollout if component == "rollout" else run.spec.grader
    auto = pool.autoscaling
    if auto is None or ctx.state == "terminal":
        return []
    if auto.backend == "keda":  # without KEDA: none (the run is Stalled, builds no kind it lacks)
        return [build_scaled_object(run, ctx, component, auto)] if keda_pool(pool, ctx) else []
    return [] if run.spec.suspend else [build_hpa(run, ctx, component, auto)]


def build_pool_network_policy(run: GagarRun, ctx: BuildContext, component: str) -> Manifest:
    """Who may reach a pool. The rollout pool runs vLLM with its weight-transfer API on
    (``VLLM_SERVER_DEV_MODE=1``: its routes take the run's weight-sync token, and a CNI that
    enforces this policy keeps everyone else from even trying), so only
    this run's trainer pods reach it (every port: NCCL weight broadcast picks its own), and the
    one Prometheus the operator names (``ctx.scraper``, never a pod of any namespace) its HTTP
    port: vLLM serves ``/metrics`` on its API port and nowhere else. The grader pool serves the
    trainer (HTTP) and its metrics port, a port of its own, to that Prometheus."""
    trainer = {"podSelector": {"matchLabels": selector(run, "trainer")}}
    scraper = ctx.scraper.peer()
    if component == "rollout":
        ingress = [{"from": [trainer]}, {"from": [scraper], "ports": [{"port": VLLM_PORT}]}]
    else:
        metrics = run.spec.observability.metrics_port
        ingress = [
            {"from": [trainer], "ports": [{"port": GRADER_PORT}]},
            {"from": [scraper], "ports": [{"port": metrics}]},
        ]
    spec = {
        "podSelector": {"matchLabels": selector(run, component)},
        "policyTypes": ["Ingress"],
        "ingress": ingress,
    }
    meta = metadata(run, ctx, name(run, component), component)
    return obj("networking.k8s.io/v1", "NetworkPolicy", meta, spec=spec)


def build_pool_disruption_budget(run: GagarRun, ctx: BuildContext, component: str) -> Manifest:
    """Voluntary disruptions (node drains, cluster upgrades) take a pool's pods one at a time,
    so that a drain never empties a pool the trainer is waiting on; a pod that is not ready (a
    vLLM still loading, a crash loop) may always be evicted, so the budget never blocks a drain
    for good. The trainer has none: a disrupted rank takes the trainer down at once and it
    resumes from its last checkpoint (docs/operations.md), and a budget forbidding that would
    hold every node drain for the whole run."""
    spec = {
        "maxUnavailable": 1,
        "selector": {"matchLabels": selector(run, component)},
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }
    meta = metadata(run, ctx, name(run, component), component)
    return obj("policy/v1", "PodDisruptionBudget", meta, spec=spec)


def _pool(run: GagarRun, ctx: BuildContext, component: str) -> list[Manifest]:
    deployment = build_rollout_deployment if component == "rollout" else build_grader_deployment
    return [
        deployment(run, ctx),
        build_pool_service(run, ctx, component),
        build_pool_network_policy(run, ctx, component),
        build_pool_disruption_budget(run, ctx, component),
        *build_autoscaler(run, ctx, component),
    ]


def build_pools(run: GagarRun, ctx: BuildContext) -> list[Manifest]:
    """Every object of the rollout and grader pools (nothing for an ``endpoint`` pool)."""
    out: list[Manifest] = []
    if run.spec.rollout.endpoint is None:
        out += _pool(run, ctx, "rollout")
    if run.spec.grader.endpoint is None:
        out += _pool(run, ctx, "grader")
    return out
