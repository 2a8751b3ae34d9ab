"""``gagar operator``: run the kopf operator against the configured cluster, with /metrics.

One way in for both the operator's own client and kopf's watches: the kubernetes client's
configuration loaders (the in-cluster ServiceAccount, else a kubeconfig, whose ``exec`` plugins
(EKS ``aws eks get-token``, GKE ``gke-gcloud-auth-plugin``) and OIDC tokens the loader resolves).
kopf logs in with what the loader produced (``connection_info``), again whenever the server
answers 401, so a short-lived exec token is fetched anew.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import kopf
from prometheus_client import CollectorRegistry, start_http_server

from gagar import env
from gagar.metrics import Metrics
from gagar.operator.handlers import OperatorConfig, Reconciler, configure_settings, register
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
    kube: Kube, metrics: Metrics, config: OperatorConfig, kubeconfig: str | None = None
) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    register(registry, Reconciler(kube, metrics, config))
    add_login(registry, kubeconfig)

    @kopf.on.startup(registry=registry)
    def _settings(settings: kopf.OperatorSettings, **_: object) -> None:
        configure_settings(settings, config.run_selector)

    return registry


def run_operator(
    namespaces: list[str],
    standalone: bool,
    port: int,
    health_port: int,
    config: OperatorConfig | None = None,
) -> int:
    """Serve /metrics on ``port`` and /healthz on ``health_port``; run kopf until interrupted."""
    level = os.environ.get(env.LOG_LEVEL, "info").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    prom = CollectorRegistry()
    metrics = Metrics(prom, "operator")
    metrics.prime()  # every unlabelled-by-run series (API verbs and outcomes, error reasons) at 0
    start_http_server(port, registry=prom)
    config = config or OperatorConfig()
    kube = Kube(api_client(), observe=ApiObserver(metrics))
    registry = build_registry(kube, metrics, config)
    kopf.run(
        registry=registry,
        standalone=standalone,
        namespaces=namespaces,
        clusterwide=not namespaces,
        liveness_endpoint=f"http://0.0.0.0:{health_port}/healthz",
    )
    return 0
