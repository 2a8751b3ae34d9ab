"""``gagar operator``: run the kopf operator against the configured cluster, with /metrics.

One way in for both the operator's own client and kopf's watches: the kubernetes client's
configuration loaders (the in-cluster ServiceAccount, else a kubeconfig, whose ``exec`` plugins
(EKS ``aws eks get-token``, GKE ``gke-gcloud-auth-plugin``) and OIDC tokens the loader resolves).
kopf logs in with what the loader produced (``connection_info``), again whenever the server
answers 401, so a short-lived exec token is fetched anew.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kopf
from prometheus_client import CollectorRegistry, start_http_server

from gagar import env
from gagar.metrics import Metrics
from gagar.operator.handlers import OperatorConfig, Reconciler, configure_settings, register
from gagar.operator.health import Health, serve
from gagar.operator.kube import Kube
from gagar.operator.telemetry import ApiObserver


def client_configuration(kubeconfig: str | None = None) -> Any:
    """The in-cluster ServiceAccount's configuration (unless ``kubeconfig`` is given), else the
    kubeconfig's (``KUBECONFIG`` / ``~/.kube/config`` when ``kubeconfig`` is None)."""
    import kubernetes

    configuration = kubernetes.client.Configuration()
    if kubeconfig is None:
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
            return configuration
        except kubernetes.config.ConfigException:
            pass
    kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return configuration


def connection_info(configuration: Any) -> kopf.ConnectionInfo:
    """kopf's login from a kubernetes client configuration (token, client cert or basic auth)."""
    authorization = (  # the client's key name: "BearerToken" since 30.x, "authorization" before
        configuration.get_api_key_with_prefix("BearerToken")
        or configuration.get_api_key_with_prefix("authorization")
        or ""
    )
    scheme, _, token = authorization.partition(" ")
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme or None,
        token=token or None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


def api_client(kubeconfig: str | None = None) -> Any:
    import kubernetes

    return kubernetes.client.ApiClient(client_configuration(kubeconfig))


def add_login(registry: kopf.OperatorRegistry, kubeconfig: str | None = None) -> None:
    """kopf logs in as the operator's client does (a fresh registry has no login handlers)."""

    @kopf.on.login(registry=registry)
    def _login(**_: object) -> kopf.ConnectionInfo:
        return connection_info(client_configuration(kubeconfig))


def build_registry(
    kube: Kube,
    metrics: Metrics,
    config: OperatorConfig,
    kubeconfig: str | None = None,
    health: Health | None = None,
) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    register(registry, Reconciler(kube, metrics, config))
    add_login(registry, kubeconfig)

    @kopf.on.startup(registry=registry)
    def _settings(settings: kopf.OperatorSettings, **_: object) -> None:
        configure_settings(settings, config.run_selector)

    if health is not None:

        @kopf.on.startup(registry=registry)
        async def _started(**_: object) -> None:  # async: it runs in kopf's own loop
            health.kopf_started(asyncio.get_running_loop())

    return registry


@dataclass(frozen=True)
class Election:
    """Leader election on a ``coordination.k8s.io`` Lease: only the replica holding it runs
    kopf; the others wait, and take over once the holder stops renewing it (``seconds``).

    Not kopf's peering: it needs kopf's own peering CRDs (and their RBAC) in the cluster, and it
    elects no leader: replicas of equal priority all pause, a lower priority pauses for a higher.
    """

    lease: str
    namespace: str
    seconds: int = 15  # whole seconds: the Lease stores leaseDurationSeconds


def lead(election: Election, work: Callable[[], object], health: Health | None = None) -> None:
    """Run ``work`` once this process holds the Lease (kubernetes' own leader election). A
    leader that cannot renew it ends the process at once (exit 1): it must not go on acting
    while another replica may already lead; its pod restarts as a follower. Every try to
    acquire or renew the Lease, either outcome, is a beat of ``health``'s liveness."""
    import kubernetes
    from kubernetes.leaderelection import electionconfig, leaderelection
    from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

    kubernetes.client.Configuration.set_default(client_configuration())
    identity = f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
    lock = LeaseLock(election.lease, election.namespace, identity)
    # the client library wants lease > renew > 1.2 * retry and retry >= 1 s (seconds >= 3)
    renew, retry = election.seconds * 2 / 3, max(election.seconds / 6, 1.0)

    def lost() -> None:
        logging.getLogger("gagar.operator").error("%s lost the lease: exiting", identity)
        os._exit(1)

    class Beating(leaderelection.LeaderElection):
        def try_acquire_or_renew(self) -> bool:
            try:
                return bool(super().try_acquire_or_renew())
            finally:
                if health is not None:
                    health.lease_tried()

    config = electionconfig.Config(lock, election.seconds, renew, retry, work, lost)
    Beating(config).run()


def run_operator(
    namespaces: list[str],
    standalone: bool,
    port: int,
    health_port: int,
    config: OperatorConfig | None = None,
    election: Election | None = None,
) -> int:
    """Serve /metrics on ``port`` and the probes (/healthz, /readyz: ``gagar.operator.health``)
    on ``health_port`` in every replica; run kopf until interrupted, as the leader when
    ``election`` is given."""
    level = os.environ.get(env.LOG_LEVEL, "info").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    prom = CollectorRegistry()
    metrics = Metrics(prom, "operator")
    metrics.prime()  # every unlabelled-by-run series (API verbs and outcomes, error reasons) at 0
    start_http_server(port, registry=prom)
    config = config or OperatorConfig()
    # a follower's lease loop tries every retry period (at most seconds / 6): many missed tries
    health = Health(lease_stale_s=max(30.0, 2.0 * election.seconds) if election else None)
    serve(health, health_port)
    kube = Kube(api_client(), observe=ApiObserver(metrics))
    registry = build_registry(kube, metrics, config, health=health)

    def work() -> None:
        health.leading()
        kopf.run(
            registry=registry,
            standalone=standalone,
            namespaces=namespaces,
            clusterwide=not namespaces,
        )
        if election is not None:  # kopf ended on its own: stop renewing a Lease it no longer uses
            raise RuntimeError("kopf stopped while leading")

    if election is None:
        work()
    else:
        lead(election, work, health)
    return 0
