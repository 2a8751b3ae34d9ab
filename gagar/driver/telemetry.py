"""The trainer's rollout-side metrics (catalogue component ``rollout``): engine requests, finished
trajectories and weight sync, recorded where the driver talks to the rollout pool.

``pool`` is ``rollout`` (the pool the engine client talks to); ``run`` is the run's name, as on
every trainer series. Kept apart from the loop so that the loop only calls ``metered`` and
``record_step``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gagar.metrics import Metrics

if TYPE_CHECKING:
    from gagar.driver.record import StepRecord
    from gagar.driver.rollouts import GroupResult

POOL = "rollout"


class MeteredEngine:
    """An ``Engine`` that counts its requests by outcome and times them."""

    def __init__(self, engine: Any, metrics: Metrics, run: str) -> None:
        self.engine, self.metrics, self.run = engine, metrics, run
        metrics.prime("trainer", "rollout", gauges=False, run=run, pool=POOL)

    async def generate(self, prompt_ids: list[int], params: Any) -> Any:
        start, outcome = time.perf_counter(), "error"
        try:
            out = await self.engine.generate(prompt_ids, params)
            outcome = "ok"
            return out
        finally:
            labels = {"run": self.run, "pool": POOL}
            self.metrics.counter("gagar_rollout_requests_total").labels(
                **labels, outcome=outcome
            ).inc()
            self.metrics.histogram("gagar_rollout_request_duration_seconds").labels(
                **labels
            ).observe(time.perf_counter() - start)


def metered(engine: Any, metrics: Metrics, run: str) -> Any:
    return engine if isinstance(engine, MeteredEngine) else MeteredEngine(engine, metrics, run)


def record_step(metrics: Metrics, run: str, groups: list[GroupResult], record: StepRecord) -> None:
    """A step's finished trajectories by exit reason, its weight sync and its graded groups."""
    for g in groups:
        for r in g.rollouts:
            reason = r.trajectory.exit_reason or "submitted"
            metrics.counter("gagar_rollout_trajectories_total").labels(run=run, reason=reason).inc()
    metrics.histogram("gagar_weight_sync_duration_seconds").labels(run=run, pool=POOL).observe(
        record.sync_seconds
    )
    graded = sum(record.grading.graded_by.values())
    metrics.counter("gagar_graded_groups_total").labels(run=run).inc(graded)
