"""The operator's own metrics beyond reconciles: Kubernetes API requests (latency, outcome),
reconcile errors by reason and the work queue depth. Outcomes and reasons are small enums
(``gagar.metrics.API_OUTCOMES``, ``RECONCILE_ERRORS``), never messages."""

from __future__ import annotations

from collections.abc import Callable

from gagar.metrics import Metrics

_BY_STATUS = {
    0: "unreachable",
    403: "forbidden",
    404: "not_found",
    409: "conflict",
    422: "invalid",
    400: "invalid",
    429: "throttled",
}


def api_outcome(status: int) -> str:
    """``ok`` for 2xx, else the error class of an HTTP status (0: no answer)."""
    if 200 <= status <= 299:
        return "ok"
    if status >= 500:
        return "server_error"
    return _BY_STATUS.get(status, "invalid" if 400 <= status < 500 else "server_error")


class ApiObserver:
    """Called by ``Kube`` after every request with its verb, HTTP status and duration."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def __call__(self, verb: str, status: int, seconds: float) -> None:
        outcome = api_outcome(status)
        self.metrics.counter("gagar_operator_api_requests_total").labels(
            verb=verb, outcome=outcome
        ).inc()
        self.metrics.histogram("gagar_operator_api_request_duration_seconds").labels(
            verb=verb
        ).observe(seconds)


def reconcile_error(metrics: Metrics, reason: str) -> None:
    metrics.counter("gagar_operator_reconcile_errors_total").labels(reason=reason).inc()


def watch_queue(metrics: Metrics, depth: Callable[[], int]) -> None:
    metrics.gauge("gagar_operator_queue_depth").set_function(depth)
