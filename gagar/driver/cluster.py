"""What the cluster trainer reads from its pod, and how it reaches the rest of the run.

The operator (``gagar.operator.builders.trainer``) mounts the run's ConfigMap at ``--config-dir``,
whose ``run.json`` is the whole GagarRun as the operator validated it, and sets the environment:

=============================  =================================================================
``GAGAR_RUN_DIR``              the checkpoint volume: checkpoints, ``metrics.jsonl``, published
                               policy versions (``published/``, which rollout replicas boot from,
                               fetched through ``GAGAR_WEIGHTS_URL``)
``GAGAR_CHECKPOINT_URI``       how status names that directory (``pvc://<claim>``)
``GAGAR_ROLLOUT_URL``          the rollout pool's Service (or ``spec.rollout.endpoint``)
``GAGAR_ROLLOUT_SERVICE``      the Service whose EndpointSlices list every replica (weight sync)
``GAGAR_ROLLOUT_REPLICA_URLS`` fixed replica URLs (comma-separated) instead of discovery
``GAGAR_WEIGHT_TRANSPORT``     the rollout pool's weight-transfer transport
``GAGAR_WEIGHTS_URL``          where rank 0 serves the published versions to the rollout pool
                               (it listens on the URL's port); unset: the replicas read them
                               from ``published/`` themselves (a volume they share)
``GAGAR_GRADER_URL``           the grader pool's Service; unset grades in the trainer
``GAGAR_SANDBOX_URL``          the sandbox pool's headless Service (``sandbox.backend: pods``)
``GAGAR_SANDBOX_WARMPOOL``     the SandboxWarmPool each session claims from (``agent-sandbox``)
``GAGAR_MODEL_DIR``            the base policy's HF folder in the pod (a mounted ``pvc://`` path)
``GAGAR_PROGRESS_CONFIGMAP``   ``<run>-progress``, patched with step, versions and checkpoints
``GAGAR_NAMESPACE``            the run's namespace
``GAGAR_METRICS_PORT``         where rank 0 serves ``/metrics`` (unset: ``observability.metricsPort``)
``GAGAR_EXIT_PERMANENT``       the exit code that fails the run at once (configuration errors)
=============================  =================================================================

With task environments on sandbox pods, ``sandbox-pools.json`` in the config dir names each
environment's executor pool; the trainer sends a session of environment E to E's pool
(``gagar.sandbox.routing``). A task that names its own image (SWE-bench's ``image_name``) goes
to that image's pool, which the operator makes once the trainer lists the image under
``sandboxImages`` in ``<run>-progress`` (``SANDBOX_IMAGES_KEY``; the file is read again for it,
``Cluster.config_dir``).

Everything here that can be wrong about the configuration raises ``ConfigError``, which the
trainer turns into ``GAGAR_EXIT_PERMANENT``; the rest (a pool not up yet, an API error) is
transient and left to the operator's restarts.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gagar import SANDBOX_POOLS_FILE
from gagar import env as names
from gagar.env import EXIT_PERMANENT
from gagar.manifest import ConfigError
from gagar.spec import GagarRun

log = logging.getLogger("gagar.trainer")


SAFETENSORS_TRANSPORT = (
    "gagar-cpu"  # gagar's safetensors transport (vLLM backend gagar_safetensors)
)
SANDBOX_IMAGES_KEY = "sandboxImages"  # gagar.operator.builders.images.IMAGES_KEY
# How long a task image's first session waits for its pool: the operator's reconcile, the kubelet
# refreshing the mounted sandbox-pools.json (about a minute) and the pods pulling the image.
IMAGE_POOL_WAIT_S = 300.0
_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


# Set by gagar.driver.launch for its workers: a worker that gives up for good writes its reason
# there before it exits, so the launcher knows even when torchrun saw another rank fail first
# (a peer whose collective broke when this rank went away) and stopped this one.
PERMANENT_MARKER = names.PERMANENT_MARKER


def exit_permanent(env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    try:
        return int(env.get(names.EXIT_PERMANENT_VAR, EXIT_PERMANENT))
    except ValueError:
        return EXIT_PERMANENT


def give_up(reason: str) -> int:
    """Log why the run cannot go on, leave the launcher's marker, return the permanent code."""
    code = exit_permanent()
    log.error("the run cannot go on (exit %d, not retried): %s", code, reason)
    marker = os.environ.get(PERMANENT_MARKER)
    if marker:
        Path(marker).write_text(reason)
    return code


@dataclass(frozen=True)
class Cluster:
    """Where the trainer finds the rest of the run (see the module docstring for each source)."""

    run_dir: Path
    checkpoint_uri: str
    rollout_url: str
    rollout_service: str | None = None
    rollout_replicas: tuple[str, ...] = ()
    grader_url: str | None = None
    sandbox_url: str | None = None
    sandbox_pools: Mapping[str, str] = field(default_factory=dict)  # environment -> its pool
    sandbox_warmpool: str | None = None
    model_dir: Path | None = None
    progress_configmap: str | None = None
    namespace: str | None = None
    metrics_port: int = 9400
    weights_url: str | None = None
    config_dir: Path | None = None  # the run's ConfigMap: sandbox-pools.json is read again there


def resolve(env: Mapping[str, str], run: GagarRun, config_dir: Path | None = None) -> Cluster:
    """The run's endpoints and directories from the pod's environment and the run's config dir
    (``ConfigError`` if unusable).

    What the trainer does not implement (pipeline or context parallelism, object-store
    checkpoints, NCCL weight transfer) the spec refuses, so ``kubectl apply`` fails on it."""
    transport = env.get(names.WEIGHT_TRANSPORT, SAFETENSORS_TRANSPORT)
    if transport != SAFETENSORS_TRANSPORT:  # an operator older than the spec's refusal
        raise ConfigError(
            f"{names.WEIGHT_TRANSPORT} is {transport!r}: the trainer syncs weights through "
            f"{SAFETENSORS_TRANSPORT} only"
        )
    rollout = env.get(names.ROLLOUT_URL) or run.spec.rollout.endpoint
    if not rollout:
        raise ConfigError(f"{names.ROLLOUT_URL} is not set and spec.rollout.endpoint is empty")
    sandbox = env.get(names.SANDBOX_URL) or None
    warmpool = env.get(names.SANDBOX_WARMPOOL) or None
    if run.spec.sandbox.isolation == "agent-sandbox":
        if warmpool is None:
            raise ConfigError(
                f"spec.sandbox.isolation is 'agent-sandbox' but {names.SANDBOX_WARMPOOL} is not set"
            )
    elif run.spec.sandbox.backend == "pods" and sandbox is None:
        raise ConfigError(f"spec.sandbox.backend is 'pods' but {names.SANDBOX_URL} is not set")
    if names.RUN_DIR not in env:
        raise ConfigError(f"{names.RUN_DIR} is not set: where is the checkpoint volume mounted?")
    try:
        port = int(env.get(names.METRICS_PORT, run.spec.observability.metrics_port))
    except ValueError as err:
        raise ConfigError(f"{names.METRICS_PORT}: {err}") from err
    replicas = tuple(
        u.strip() for u in env.get(names.ROLLOUT_REPLICA_URLS, "").split(",") if u.strip()
    )
    model_dir = env.get(names.MODEL_DIR)
    return Cluster(
        run_dir=Path(env[names.RUN_DIR]),
        checkpoint_uri=env.get(names.CHECKPOINT_URI) or Path(env[names.RUN_DIR]).as_uri(),
        rollout_url=rollout,
        rollout_service=env.get(names.ROLLOUT_SERVICE) or None,
        rollout_replicas=replicas,
        grader_url=env.get(names.GRADER_URL) or None,
        sandbox_url=sandbox,
        sandbox_pools=environment_pool_urls(config_dir, run),
        sandbox_warmpool=warmpool,
        model_dir=Path(model_dir) if model_dir else None,
        progress_configmap=env.get(names.PROGRESS_CONFIGMAP) or None,
        namespace=env.get(names.NAMESPACE) or run.metadata.namespace,
        metrics_port=port,
        weights_url=env.get(names.WEIGHTS_URL) or None,
        config_dir=config_dir,
    )


def environment_pool_urls(config_dir: Path | None, run: GagarRun) -> dict[str, str]:
    """Each of the run's task environments' executor pool on sandbox pods (name -> URL, from the
    operator's ``sandbox-pools.json``); ``ConfigError`` where one has none."""
    from gagar.sandbox.routing import read_pools
    from gagar.sandbox.types import SandboxError

    envs = [e.name for e in run.spec.sandbox.environments]
    if run.spec.sandbox.backend != "pods" or not envs:
        return {}
    try:
        pools = read_pools(config_dir) if config_dir is not None else {}
    except SandboxError as err:
        raise ConfigError(str(err)) from None
    if missing := [e for e in envs if e not in pools]:
        raise ConfigError(
            f"spec.sandbox.environments {', '.join(missing)}: no executor pool named in "
            f"{SANDBOX_POOLS_FILE} of the run's config (an operator older than task "
            "environments on sandbox pods?)"
        )
    return {e: pools[e] for e in envs}


# ---------------------------------------------------------------- Kubernetes API (optional)


def kube_api() -> Any | None:
    """An API client from the pod's service account, or None (with the reason logged)."""
    try:
        from kubernetes import client, config
    except ImportError:
        log.info(
            "the kubernetes client is not installed: no progress reports, no replica discovery"
        )
        return None
    try:
        config.load_incluster_config()
    except config.ConfigException as err:
        log.info("not running in a cluster (%s): no progress reports, no replica discovery", err)
        return None
    return client.ApiClient()


def namespace_of(cluster: Cluster) -> str | None:
    if cluster.namespace:
        return cluster.namespace
    return _SA_NAMESPACE.read_text().strip() if _SA_NAMESPACE.exists() else None


def progress_data(
    step: int,
    policy_version: int,
    rollout_version: int | None,
    checkpoint: tuple[int, str, str] | None,
    start_time: str,
    images: list[str] | None = None,
) -> dict[str, str]:
    """The ``<run>-progress`` data the operator parses (``builders.config.PROGRESS_KEYS``);
    ``checkpoint`` is (step, uri, time); ``images``: the task images wanted, most recent first
    (None: the run routes none, and the key is left as it is)."""
    data = {"step": str(step), "policyVersion": str(policy_version), "startTime": start_time}
    if images is not None:
        data.update(images_data(images))
    if rollout_version is not None:
        data["rolloutPolicyVersion"] = str(rollout_version)
    if checkpoint is not None:
        data.update(
            checkpointStep=str(checkpoint[0]),
            checkpointUri=checkpoint[1],
            checkpointTime=checkpoint[2],
        )
    return data


def images_data(images: list[str]) -> dict[str, str]:
    """``<run>-progress``'s list of the task images whose executor pools the trainer wants."""
    return {SANDBOX_IMAGES_KEY: json.dumps(images)}


class ProgressReporter:
    """Patches ``data`` of ``<run>-progress`` (pods never patch the GagarRun; the operator folds
    this ConfigMap into status). Best effort: a failed patch is logged, training goes on."""

    def __init__(self, core: Any, name: str, namespace: str) -> None:
        self.core, self.name, self.namespace = core, name, namespace

    @classmethod
    def from_cluster(cls, cluster: Cluster, api: Any | None) -> ProgressReporter | None:
        if cluster.progress_configmap is None:
            log.info("%s is not set: progress is not reported", names.PROGRESS_CONFIGMAP)
            return None
        namespace = namespace_of(cluster)
        if api is None or namespace is None:
            log.info(
                "no in-cluster API access: progress is not reported to %s",
                cluster.progress_configmap,
            )
            return None
        from kubernetes import client

        return cls(client.CoreV1Api(api), cluster.progress_configmap, namespace)

    def report(self, data: dict[str, str]) -> None:
        try:
            self.core.patch_namespaced_config_map(self.name, self.namespace, {"data": data})
        except Exception as err:  # progress is status only: never stop training for it
            log.warning("cannot patch ConfigMap %s/%s: %s", self.namespace, self.name, err)


def replica_urls(slices: list[dict[str, Any]], port_name: str = "http") -> list[str]:
    """Ready endpoints of EndpointSlices (API JSON) as ``http://addr:port``, sorted, unique."""
    urls = set()
    for s in slices:
        ports = [p.get("port") for p in s.get("ports") or [] if p.get("name") == port_name]
        if not ports:
            continue
        for ep in s.get("endpoints") or []:
            if (ep.get("conditions") or {}).get("ready") is False:
                continue
            for addr in ep.get("addresses") or []:
                host = f"[{addr}]" if ":" in addr else addr
                urls.add(f"http://{host}:{ports[0]}")
    return sorted(urls)


def discover_replicas(cluster: Cluster, api: Any | None) -> list[str]:
    """Every rollout replica to load weights into: fixed URLs, else the ready endpoints of the
    pool's Service, else the rollout URL itself (``spec.rollout.endpoint``, or no API access)."""
    if cluster.rollout_replicas:
        return list(cluster.rollout_replicas)
    namespace = namespace_of(cluster)
    if cluster.rollout_service is None:
        return [cluster.rollout_url]
    if api is None or namespace is None:
        # Each control call could reach another replica through the Service: right only for one.
        log.warning(
            "cannot list the replicas of %s: syncing through the Service", cluster.rollout_service
        )
        return [cluster.rollout_url]
    from kubernetes import client

    found = client.DiscoveryV1Api(api).list_namespaced_endpoint_slice(
        namespace, label_selector=f"kubernetes.io/service-name={cluster.rollout_service}"
    )
    urls = replica_urls(api.sanitize_for_serialization(found).get("items", []))
    if not urls:  # transient: the Service answered a moment ago (the trainer waits for it first)
        raise RuntimeError(f"no ready endpoints behind Service {cluster.rollout_service}")
    return urls


class ReplicaSync:
    """Weight sync into whichever replicas the rollout pool has at each sync (autoscaled pools
    change): new replicas get vLLM's ``init_weight_transfer_engine`` first; a replica that fails
    (e.g. restarted in place) is initialised again and retried once. Old versions are pruned.
    With ``cluster.weights_url`` the replicas fetch each version from the trainer's weight server
    (``serve_weights``), else they read ``root`` themselves."""

    def __init__(
        self, cluster: Cluster, api: Any | None, root: Path, base_model: Path, keep: int = 2
    ) -> None:
        self.cluster, self.api, self.root, self.base_model, self.keep = (
            cluster,
            api,
            root,
            base_model,
            keep,
        )
        self._clients: dict[str, Any] = {}
        self.rollout_version: int | None = None

    def _client(self, url: str, fresh: bool = False) -> Any:
        from gagar.rollout.engines.weight_sync import ReplicaClient

        if fresh or url not in self._clients:
            client = ReplicaClient(url)
            client.init_weight_transfer_engine(self._sync(client).init_info())
            self._clients[url] = client
        return self._clients[url]

    def _sync(self, client: Any) -> Any:
        from gagar.rollout.engines.weight_sync import SafetensorsWeightSync

        return SafetensorsWeightSync(
            [client], self.root, self.base_model, url=self.cluster.weights_url
        )

    def publish(self, weights: Any, version: int) -> Any:
        from gagar.rollout.engines.weight_sync import publish_version

        return publish_version(weights, self.root, version, self.base_model)

    def load(self, pub: Any) -> None:
        from gagar.rollout.engines.weight_sync import WeightSyncError, prune_versions

        urls = discover_replicas(self.cluster, self.api)
        for url in urls:
            try:
                self._sync(self._client(url)).load(pub)
            except WeightSyncError as err:
                log.warning("weight sync into %s failed (%s); initialising it again", url, err)
                self._sync(self._client(url, fresh=True)).load(pub)
        self.rollout_version = _oldest([self._clients[u].weight_version() for u in urls])
        prune_versions(self.root, self.keep)

    def sync(self, weights: Any, version: int) -> None:
        self.load(self.publish(weights, version))


def serve_weights(cluster: Cluster, root: Path) -> Any | None:
    """Rank 0's weight server for the rollout pool (``weight_http``), on every interface at the
    port of ``cluster.weights_url``; None without one. The caller closes it."""
    if cluster.weights_url is None:
        return None
    from urllib.parse import urlsplit

    from gagar.rollout.engines.vllm_auth import control_token
    from gagar.rollout.engines.weight_http import WeightServer

    port = urlsplit(cluster.weights_url).port
    if port is None:
        raise ConfigError(f"{names.WEIGHTS_URL}={cluster.weights_url} names no port")
    root.mkdir(parents=True, exist_ok=True)
    server = WeightServer(root, control_token(), port=port)
    log.info("serving published policy versions on port %d", server.port)
    return server


def _oldest(versions: list[str | None]) -> int | None:
    """The oldest policy version any replica serves (None when one serves an unknown version)."""
    try:
        return min(int(v) for v in versions if v is not None) if all(versions) else None
    except ValueError:
        return None
