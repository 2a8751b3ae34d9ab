"""The operator's own metrics: Kubernetes API requests by verb and outcome with their latency,
reconcile errors by reason, and the work queue depth, against the API emulator."""

from __future__ import annotations

import kopf
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gagar.crd import build_crd
from gagar.metrics import Metrics
from gagar.operator.handlers import Reconciler
from gagar.operator.kube import RUN_API, Kube, KubeError
from gagar.operator.telemetry import ApiObserver, api_outcome
from tests.integration.test_operator_scenarios import manifest
from tests.kube_emulator import KubeEmulator
from tests.support.exposition import value


def test_api_outcomes_are_a_small_enum() -> None:
    got = {s: api_outcome(s) for s in (200, 201, 0, 400, 403, 404, 409, 410, 422, 429, 500, 503)}
    assert got == {
        200: "ok",
        201: "ok",
        0: "unreachable",
        400: "invalid",
        403: "forbidden",
        404: "not_found",
        409: "conflict",
        410: "invalid",
        422: "invalid",
        429: "throttled",
        500: "server_error",
        503: "server_error",
    }


def test_api_requests_errors_and_queue_depth() -> None:
    metrics = Metrics(CollectorRegistry(), "operator")
    metrics.prime()
    with KubeEmulator() as emulator:
        emulator.create(build_crd())
        client = emulator.api_client()
        kube = Kube(client, observe=ApiObserver(metrics))
        run = {**manifest("local"), "apiVersion": RUN_API}
        run["metadata"]["namespace"] = "default"
        kube.create(run)
        with pytest.raises(KubeError):
            kube.create(run)  # 409: it exists
        assert kube.get(RUN_API, "GagarRun", "default", "nope") is None  # 404
        reconciler = Reconciler(kube, metrics)
        assert reconciler.queue_depth() == 0
        reconciler.reconcile(run)
        client.close()
        kube_down = Kube(emulator.api_client(), observe=ApiObserver(metrics))
    # the server is gone: the reconcile's first request gets no answer
    with pytest.raises(kopf.TemporaryError):
        Reconciler(kube_down, metrics).reconcile(run)
    text = generate_latest(metrics.registry).decode()
    requests = "gagar_operator_api_requests_total"
    # the run, and the weight-sync Secret its first reconcile creates (never read back)
    assert value(text, requests, verb="POST", outcome="ok") == 2
    assert value(text, requests, verb="POST", outcome="conflict") == 1
    assert value(text, requests, verb="GET", outcome="not_found") >= 1  # and absent children
    assert value(text, requests, verb="GET", outcome="unreachable") == 1
    assert value(text, requests, verb="PATCH", outcome="ok") >= 1  # the reconcile's applies
    assert value(text, "gagar_operator_api_request_duration_seconds_count", verb="GET") >= 3
    errors = "gagar_operator_reconcile_errors_total"
    assert value(text, errors, reason="api_transient") == 1
    assert value(text, errors, reason="api_permanent") == 0
    assert value(text, "gagar_operator_reconciles_total", result="ok") == 1
    assert value(text, "gagar_operator_queue_depth") == 0
