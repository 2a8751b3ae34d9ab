"""The grader service's metrics: the catalogue's grader series, recorded per request.

One ``GraderMetrics`` per service, labelled with the service's ``run`` and ``pool``
(``gagar.metrics.component_labels``: flags, else ``GAGAR_RUN``/``GAGAR_COMPONENT``), so the KEDA
trigger's ``gagar_grader_queue_depth{run=...}`` and the dashboards find the pool; every series
exists from start-up, at zero. ``grader`` is the grader that produced the ranking, ``none`` when no
grader did (the request was invalid, rejected, cut by a shutdown or failed).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry

from gagar.metrics import Metrics, component_labels
from gagar.wire import Ranking


class GraderMetrics:
    """The catalogue's grader metrics of one grader service."""

    def __init__(
        self, registry: CollectorRegistry, run: str | None = None, pool: str | None = None
    ) -> None:
        self.labels = component_labels("grader", run, pool)
        self.metrics = Metrics(registry, "grader")
        self.metrics.prime(run=self.labels["run"], pool=self.labels["pool"])

    def _m(self, name: str, **extra: str):
        return self.metrics[name].labels(**self.labels, **extra)

    def queue_depth(self, depth: Callable[[], int]) -> None:
        self._m("gagar_grader_queue_depth").set_function(depth)

    def in_flight(self, delta: int) -> None:
        self._m("gagar_grader_in_flight").inc(delta)

    def waited(self, seconds: float) -> None:
        self._m("gagar_grader_queue_wait_seconds").observe(seconds)

    def refused(self, outcome: str) -> None:
        """A request no grader answered: invalid, rejected (queue full), unavailable, error."""
        self._m("gagar_grader_requests_total", grader="none", outcome=outcome).inc()

    def record(self, ranking: Ranking) -> None:
        grader = ranking.grader
        outcome = "fallback" if ranking.fallback else "ok"
        self._m("gagar_grader_requests_total", grader=grader, outcome=outcome).inc()
        self._m("gagar_grader_request_duration_seconds", grader=grader).observe(
            ranking.latency_seconds
        )
        if ranking.fallback:
            self._m("gagar_grader_ranking_fallbacks_total", reason=ranking.fallback).inc()
        if ranking.fallback == "timeout":
            self._m("gagar_grader_timeouts_total").inc()
        self._m("gagar_grader_tokens_total", kind="prompt").inc(ranking.usage.prompt_tokens)
        self._m("gagar_grader_tokens_total", kind="completion").inc(ranking.usage.completion_tokens)
        self._m("gagar_grader_confirmed_hacks_total").inc(len(ranking.hacks))
