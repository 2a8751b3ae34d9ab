"""The sandbox server's metrics: the catalogue's ``gagar_sandbox_*`` series, recorded per result.

One ``SandboxMetrics`` per server, in a registry of its own, labelled with the server's ``run``
and ``pool`` (``gagar.metrics.component_labels``: flags, else ``GAGAR_RUN``/``GAGAR_COMPONENT``);
every series exists from start-up, at zero. What counts as what:

- ``gagar_sandbox_executions_total{outcome}``: ``infra`` (the machinery failed), ``timeout`` (the
  wall clock), ``limit`` (another resource limit), else ``ok``/``failed`` by exit code;
- ``gagar_sandbox_timeouts_total``: killed at the wall-clock limit;
- ``gagar_sandbox_oom_kills_total``: ended by the memory limit;
- ``gagar_sandbox_limit_hits_total{kind}``: every limit that ended a command, by limit;
- ``gagar_sandbox_isolation{mode}``: 1 for the isolation the server runs (``auto`` resolved).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gagar.metrics import SANDBOX_ISOLATIONS, Metrics, component_labels
from gagar.sandbox.types import ExecResult

__all__ = ["CONTENT_TYPE_LATEST", "SandboxMetrics", "outcome_of"]


def outcome_of(result: ExecResult) -> str:
    if result.infra_error:
        return "infra"
    if result.timed_out:
        return "timeout"
    if result.limit_hit:
        return "limit"
    return "ok" if result.exit_code == 0 else "failed"


class SandboxMetrics:
    """The catalogue's sandbox metrics of one server (``observe`` each result)."""

    def __init__(
        self,
        sessions: Callable[[], int],
        max_sessions: int,
        run: str | None = None,
        pool: str | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.labels = component_labels("sandbox", run, pool)
        self.metrics = Metrics(self.registry, "sandbox")
        self.metrics.prime(run=self.labels["run"], pool=self.labels["pool"])
        self._m("gagar_sandbox_sessions_active").set_function(sessions)
        self._m("gagar_sandbox_sessions_max").set(max_sessions)

    def _m(self, name: str, **extra: str) -> Any:  # a Counter, Gauge or Histogram child
        return self.metrics[name].labels(**self.labels, **extra)

    def observe(self, result: ExecResult) -> None:
        self._m("gagar_sandbox_executions_total", outcome=outcome_of(result)).inc()
        self._m("gagar_sandbox_execution_duration_seconds").observe(result.duration_s)
        if result.timed_out:
            self._m("gagar_sandbox_timeouts_total").inc()
        if result.limit_hit:
            self._m("gagar_sandbox_limit_hits_total", kind=result.limit_hit).inc()
        if result.limit_hit == "memory":
            self._m("gagar_sandbox_oom_kills_total").inc()

    def isolation(self, mode: str) -> None:
        """The isolation this server runs (1 for its mode, 0 for the others)."""
        for m in SANDBOX_ISOLATIONS:
            self._m("gagar_sandbox_isolation", mode=m).set(1 if m == mode else 0)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
