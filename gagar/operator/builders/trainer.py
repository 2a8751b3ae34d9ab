"""The trainer: an indexed Job (one pod per node) plus a headless rendezvous Service, or a JobSet.

Rank 0 also serves the policy versions it publishes to the run's rollout pool (its weight server,
``WEIGHTS_PORT``, reached by its pod's name under the headless Service), so the checkpoint volume
is the trainer's alone.

Every pod runs ``torchrun`` with static rendezvous: node rank = the Job's completion index, master
= index 0 reached through the headless Service (``<run>-trainer-0.<run>-trainer-rdzv``). Restarts
are whole-trainer restarts from the last checkpoint (SPMD ranks cannot continue without a lost
peer, and a rank recreated alone would find a rendezvous its peers finished long ago, leaving them
blocked in a collective until the NCCL timeout): the Job itself never retries (``backoffLimit: 0``),
so any failed pod, an evicted or preempted one included, fails the Job at once and the Job
controller stops the other ranks; the operator then recreates it after an exponential backoff,
counting ``failurePolicy.maxRestarts`` restarts in a row (the Job carries the attempt number in
``gagar.dev/attempt`` and the failure policy's memory in two more annotations). A JobSet restarts
natively with ``failurePolicy.maxRestarts`` (every Job of the set, at once, on any Job failure).
Pod failure policy: exit code ``EXIT_PERMANENT`` (the trainer found its configuration unusable)
fails the Job with reason ``PodFailurePolicy``, which fails the run (and a JobSet, by its
``failurePolicy.rules``) at once instead of spending restarts on it.

The container runs ``python -m gagar.driver.launch`` with torchrun's arguments rather than
``torchrun``: torchrun exits 1 whatever its workers exit with, and the launcher passes
``EXIT_PERMANENT`` through. The environment tells the trainer (``gagar.driver.worker``) where
the rest of the run is: the rollout, grader and sandbox Services, the checkpoint volume, the
base model's mount (``gagar.driver.cluster`` lists every variable).
"""

from __future__ import annotations

from typing import Any

from gagar import env
from gagar.env import EXIT_PERMANENT
from gagar.operator.builders.common import (
    ATTEMPT_ANNOTATION,
    CHECKPOINT_MOUNT,
    IN_A_ROW_ANNOTATION,
    JOBSET_REPLICATED_JOB,
    KUEUE,
    RESUMED_ANNOTATION,
    SHM_MOUNT,
    TEMPLATE_ANNOTATION,
    WEIGHTS_PORT,
    BuildContext,
    Manifest,
    auth_volume,
    checkpoint_claim,
    checkpoint_volume,
    common_env,
    config_volume,
    container_security,
    image,
    labels,
    master_host,
    metadata,
    metrics_port,
    name,
    obj,
    pod_security,
    requests_with_defaults,
    selector,
    shm_volume,
    spec_hash,
    uses_jobset,
    weights_url,
)
from gagar.operator.builders.overlay import pod_template
from gagar.operator.builders.pools import GRADER_PORT, VLLM_PORT, base_model, transport
from gagar.operator.builders.sandbox import SANDBOX_PORT
from gagar.spec import GagarRun

RDZV_PORT = 29500
# Requests of a trainer pod whose spec names none (the driver, its data loader, the tokenizer).
TRAINER_DEFAULT_REQUESTS = {"cpu": "2", "memory": "8Gi"}
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# The trainer's entry point inside its image (torchrun runs it as a module on every rank), and
# the launcher the container runs (torchrun's launcher, keeping EXIT_PERMANENT).
TRAINER_MODULE = "gagar.driver.worker"
LAUNCHER_MODULE = "gagar.driver.launch"


def torchrun_args(run: GagarRun, ctx: BuildContext) -> list[str]:
    t = run.spec.trainer
    return [
        f"--nnodes={t.nodes}",
        f"--nproc-per-node={t.processes_per_node}",
        "--node-rank=$(NODE_RANK)",
        f"--master-addr={master_host(run, ctx)}",
        f"--master-port={RDZV_PORT}",
        "-m",
        TRAINER_MODULE,
        "--config-dir=/etc/gagar/config",
    ]


def _trainer_env(run: GagarRun, ctx: BuildContext) -> list[dict[str, Any]]:
    index = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    return [
        *common_env(run, "trainer"),
        {"name": "NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": index}}},
        {"name": env.PROGRESS_CONFIGMAP, "value": name(run, "progress")},
        {"name": env.EXIT_PERMANENT_VAR, "value": str(EXIT_PERMANENT)},
        *({"name": k, "value": v} for k, v in endpoint_env(run, ctx).items()),
    ]


def endpoint_env(run: GagarRun, ctx: BuildContext) -> dict[str, str]:
    """Where the trainer finds the run's other parts (Services in the run's namespace), and
    where it serves its published weights to the rollout pool."""
    spec = run.spec
    out: dict[str, str] = {env.WEIGHT_TRANSPORT: transport(run)}
    if url := weights_url(run, ctx):
        out[env.WEIGHTS_URL] = url
    claim = checkpoint_claim(run)
    out.update({env.RUN_DIR: CHECKPOINT_MOUNT, env.CHECKPOINT_URI: f"pvc://{claim}"})
    if spec.rollout.endpoint is None:
        out[env.ROLLOUT_URL] = f"http://{name(run, 'rollout')}:{VLLM_PORT}"
        out[env.ROLLOUT_SERVICE] = name(run, "rollout")
    else:
        out[env.ROLLOUT_URL] = spec.rollout.endpoint
    if spec.grader.endpoint is None:  # a grader pool; with an endpoint the trainer grades itself
        out[env.GRADER_URL] = f"http://{name(run, 'grader')}:{GRADER_PORT}"
    if spec.sandbox.isolation == "agent-sandbox":  # a Sandbox claimed per session
        out[env.SANDBOX_WARMPOOL] = name(run, "sandbox")
    elif spec.sandbox.backend == "pods":
        out[env.SANDBOX_URL] = f"http://{name(run, 'sandbox')}:{SANDBOX_PORT}"
    model_dir, _, _ = base_model(spec.model.path)
    if model_dir is not None and spec.model.path != model_dir:  # a pvc:// model, mounted
        out[env.MODEL_DIR] = model_dir
    return out


def _trainer_pod(run: GagarRun, ctx: BuildContext) -> dict[str, Any]:
    cfg_vol, cfg_mount = config_volume(run)
    ckpt_vols, ckpt_mounts = checkpoint_volume(run, read_only=False)
    _, model_vols, model_mounts = base_model(run.spec.model.path)
    shm = shm_volume(run.spec.trainer.shm_size)
    auth_vols, auth_mounts = auth_volume(run)
    mounts = [cfg_mount, *ckpt_mounts, *model_mounts, SHM_MOUNT]
    mounts += auth_mounts
    container = {
        "name": "trainer",
        "image": image(run.spec.trainer.image, ctx),
        "command": ["python", "-m", LAUNCHER_MODULE],
        "args": torchrun_args(run, ctx),
        "env": _trainer_env(run, ctx),
        "ports": _trainer_ports(run, ctx),
        "resources": requests_with_defaults(run.spec.trainer.resources, TRAINER_DEFAULT_REQUESTS),
        "volumeMounts": mounts,
        "securityContext": container_security(),
    }
    spec: dict[str, Any] = {
        "serviceAccountName": name(run, "trainer"),
        "restartPolicy": "Never",
        "securityContext": pod_security(),
        "containers": [container],
        "volumes": [cfg_vol, *ckpt_vols, *model_vols, shm, *auth_vols],
    }
    if not uses_jobset(run, ctx):
        spec["subdomain"] = name(run, "trainer", "rdzv")
    return pod_template(run, "trainer", spec)


def _trainer_ports(run: GagarRun, ctx: BuildContext) -> list[dict[str, Any]]:
    ports = [{"name": "rdzv", "containerPort": RDZV_PORT}, metrics_port(run)]
    if weights_url(run, ctx):  # rank 0 serves the published weights (the other ranks do not)
        ports.append({"name": "weights", "containerPort": WEIGHTS_PORT})
    return ports


def _job_spec(run: GagarRun, ctx: BuildContext) -> dict[str, Any]:
    nodes = run.spec.trainer.nodes
    return {
        "completionMode": "Indexed",
        "completions": nodes,
        "parallelism": nodes,
        "backoffLimit": 0,
        **deadline(run),
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {
                        "containerName": "trainer",
                        "operator": "In",
                        "values": [EXIT_PERMANENT],
                    },
                },
            ]
        },
        "template": _trainer_pod(run, ctx),
    }


def deadline(run: GagarRun) -> dict[str, Any]:
    """``activeDeadlineSeconds`` of a trainer attempt's Job, when the spec sets one."""
    seconds = run.spec.trainer.active_deadline_seconds
    return {} if seconds is None else {"activeDeadlineSeconds": seconds}


def _workload_meta(run: GagarRun, ctx: BuildContext, **extra: Any) -> dict[str, Any]:
    """Metadata of the trainer workload, with Kueue's queue label when a queue is named."""
    meta = metadata(run, ctx, name(run, "trainer"), "trainer", **extra)
    if run.spec.trainer.queue_name:
        meta["labels"][KUEUE_QUEUE_LABEL] = run.spec.trainer.queue_name
    return meta


def queued(run: GagarRun, ctx: BuildContext) -> bool:
    """Whether Kueue owns the trainer's ``suspend``: a queue is named and the operator's Kueue
    integration is on (and Kueue installed)."""
    return bool(run.spec.trainer.queue_name) and KUEUE in ctx.crds


def suspend(run: GagarRun, ctx: BuildContext) -> dict[str, Any]:
    """``suspend`` as the operator writes it. A queued trainer: never (Kueue suspends it until
    admitted, unsuspends on admission, suspends again on preemption; the operator creates it
    suspended through a hand-off manager and suspends the run through the Workload's
    ``spec.active``, where a hold for sandboxes that cannot start goes too). Otherwise: true
    while ``spec.suspend`` or while the sandbox pods refuse to start (``ctx.hold_trainer``: the
    trainer must not hold accelerators for rollouts that fail), else not at all; left unowned,
    the server defaults it to false."""
    if queued(run, ctx):
        return {}
    return {"suspend": True} if run.spec.suspend or ctx.hold_trainer else {}


def build_trainer_job(run: GagarRun, ctx: BuildContext) -> Manifest:
    """The indexed Job (completions = parallelism = nodes)."""
    job = _job_spec(run, ctx)
    annotations = {
        ATTEMPT_ANNOTATION: str(ctx.attempt),
        IN_A_ROW_ANNOTATION: str(ctx.in_a_row),
        TEMPLATE_ANNOTATION: spec_hash(job),
    }
    if ctx.resumed_from is not None:
        annotations[RESUMED_ANNOTATION] = str(ctx.resumed_from)
    meta = _workload_meta(run, ctx, annotations=annotations)
    return obj("batch/v1", "Job", meta, spec={**suspend(run, ctx), **job})


def build_trainer_jobset(run: GagarRun, ctx: BuildContext) -> Manifest:
    """The JobSet (jobset.x-k8s.io/v1alpha2): one replicated Job, native whole-set restarts."""
    spec = {
        "failurePolicy": {
            "maxRestarts": run.spec.trainer.failure_policy.max_restarts,
            # EXIT_PERMANENT fails the Job through its podFailurePolicy (reason PodFailurePolicy):
            # the whole set fails at once instead of burning every restart on it
            "rules": [
                {
                    "name": "permanent-configuration-error",
                    "action": "FailJobSet",
                    "onJobFailureReasons": ["PodFailurePolicy"],
                },
                {  # the attempt's time is up (trainer.activeDeadlineSeconds): no restart
                    "name": "deadline-exceeded",
                    "action": "FailJobSet",
                    "onJobFailureReasons": ["DeadlineExceeded"],
                },
            ],
        },
        "successPolicy": {"operator": "All", "targetReplicatedJobs": [JOBSET_REPLICATED_JOB]},
        "network": {"enableDNSHostnames": True, "subdomain": name(run, "trainer", "rdzv")},
        "replicatedJobs": [
            {
                "name": JOBSET_REPLICATED_JOB,
                "replicas": 1,
                "template": {
                    "metadata": {"labels": labels(run, "trainer")},
                    "spec": _job_spec(run, ctx),
                },
            }
        ],
    }
    meta = _workload_meta(run, ctx, annotations={TEMPLATE_ANNOTATION: spec_hash(spec)})
    return obj("jobset.x-k8s.io/v1alpha2", "JobSet", meta, spec={**suspend(run, ctx), **spec})


def build_rdzv_service(run: GagarRun, ctx: BuildContext) -> Manifest:
    """Headless Service giving every trainer pod a stable DNS name (rendezvous before readiness)."""
    meta = metadata(run, ctx, name(run, "trainer", "rdzv"), "trainer")
    ports = [{"name": "rdzv", "port": RDZV_PORT, "targetPort": RDZV_PORT}]
    if weights_url(run, ctx):  # the rollout pods reach rank 0's by its pod's name under it
        ports.append({"name": "weights", "port": WEIGHTS_PORT, "targetPort": WEIGHTS_PORT})
    spec = {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": selector(run, "trainer"),
        "ports": ports,
    }
    return obj("v1", "Service", meta, spec=spec)


def build_trainer_network_policy(run: GagarRun, ctx: BuildContext) -> Manifest:
    """Only the run's own ranks reach a trainer pod (the rendezvous port, and every other port:
    NCCL and Gloo pick theirs), the run's rollout pods its weight server (the published weights,
    read-only, behind the run's weight-sync token), and the Prometheus the operator names its
    metrics port. Nothing else calls the trainer: it calls the pools, never the reverse. Egress
    stays open (model and dataset downloads, trackers)."""
    trainer = {"podSelector": {"matchLabels": selector(run, "trainer")}}
    metrics = {"protocol": "TCP", "port": run.spec.observability.metrics_port}
    ingress: list[dict[str, Any]] = [{"from": [trainer]}]
    if weights_url(run, ctx):
        rollout = {"podSelector": {"matchLabels": selector(run, "rollout")}}
        ingress.append({"from": [rollout], "ports": [{"protocol": "TCP", "port": WEIGHTS_PORT}]})
    ingress.append({"from": [ctx.scraper.peer()], "ports": [metrics]})
    spec = {
        "podSelector": {"matchLabels": selector(run, "trainer")},
        "policyTypes": ["Ingress"],
        "ingress": ingress,
    }
    meta = metadata(run, ctx, name(run, "trainer"), "trainer")
    return obj("networking.k8s.io/v1", "NetworkPolicy", meta, spec=spec)


def build_trainer(run: GagarRun, ctx: BuildContext) -> list[Manifest]:
    """Trainer objects: JobSet (which makes its own headless Service) or Job + Service; nothing
    for a terminal run (its finished Job stays as the record; deleting it never brings a new one
    that would hold accelerators for rollouts that never come)."""
    if ctx.state == "terminal":
        return []
    policy = build_trainer_network_policy(run, ctx)
    if uses_jobset(run, ctx):
        return [policy, build_trainer_jobset(run, ctx)]
    return [policy, build_rdzv_service(run, ctx), build_trainer_job(run, ctx)]
