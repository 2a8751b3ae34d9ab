"""``gagar operator``: run the kopf operator against the configured cluster, with /metrics."""

from __future__ import annotations

import logging
import os

import kopf
from prometheus_client import CollectorRegistry, start_http_server

from gagar import env
from gagar.metrics import Metrics
from gagar.operator.handlers import OperatorConfig, Reconciler, configure_settings, register
from gagar.operator.kube import Kube


def api_client() -> object:
    """An ApiClient from the in-cluster service account, else from KUBECONFIG / ~/.kube/config."""
    import kubernetes

    configuration = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(client_configuration=configuration)
    return kubernetes.client.ApiClient(configuration)


def build_registry(kube: Kube, metrics: Metrics, config: OperatorConfig) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    register(registry, Reconciler(kube, metrics, config))

    @kopf.on.login(registry=registry)
    def _login(**kwargs: object) -> kopf.ConnectionInfo | None:
        # a fresh registry has none of kopf's default login handlers: in-cluster or KUBECONFIG
        return kopf.login_via_client(**kwargs)  # type: ignore[arg-type]

    @kopf.on.startup(registry=registry)
    def _settings(settings: kopf.OperatorSettings, **_: object) -> None:
        configure_settings(settings)

    return registry


def run_operator(namespaces: list[str], standalone: bool, port: int, health_port: int) -> int:
    """Serve /metrics on ``port`` and /healthz on ``health_port``; run kopf until interrupted."""
    level = os.environ.get(env.LOG_LEVEL, "info").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    prom = CollectorRegistry()
    metrics = Metrics(prom, "operator")
    start_http_server(port, registry=prom)
    registry = build_registry(Kube(api_client()), metrics, OperatorConfig())
    kopf.run(
        registry=registry,
        standalone=standalone,
        namespaces=namespaces,
        clusterwide=not namespaces,
        liveness_endpoint=f"http://0.0.0.0:{health_port}/healthz",
    )
    return 0
