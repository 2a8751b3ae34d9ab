"""Prometheus Operator objects: a PodMonitor for trainer pods, ServiceMonitors for the pools.

The scrape adds the target's ``namespace`` to every series; ``run`` and ``pool`` are set by the
processes themselves (docs/observability.md), so no relabeling is needed.

Built when ``observability.monitors`` is ``enabled`` or ``auto`` and the monitoring.coreos.com
CRDs exist (the handler discovers them and passes the API group in ``BuildContext.crds``);
``enabled`` without them Stalls the run (``builders.integrations``) and builds none.
"""

from __future__ import annotations

from gagar.operator.builders.common import (
    MONITORING,
    BuildContext,
    Manifest,
    metadata,
    name,
    obj,
    selector,
)
from gagar.operator.builders.images import IMAGE_COMPONENT, image_pools
from gagar.operator.builders.sandbox import ENVIRONMENT_COMPONENT, environment_pools
from gagar.spec import GagarRun

API = "monitoring.coreos.com/v1"


def wants_monitors(run: GagarRun, ctx: BuildContext) -> bool:
    mode = run.spec.observability.monitors
    # ``enabled`` without the CRDs: the run is Stalled (builders.integrations), none built
    return mode != "disabled" and MONITORING in ctx.crds


def build_pod_monitor(run: GagarRun, ctx: BuildContext) -> Manifest:
    spec = {
        "selector": {"matchLabels": selector(run, "trainer")},
        "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics"}],
    }
    return obj(API, "PodMonitor", metadata(run, ctx, name(run, "trainer"), "trainer"), spec=spec)


def build_service_monitor(run: GagarRun, ctx: BuildContext, component: str, port: str) -> Manifest:
    spec = {
        "selector": {"matchLabels": selector(run, component)},
        "endpoints": [{"port": port, "path": "/metrics"}],
    }
    return obj(
        API, "ServiceMonitor", metadata(run, ctx, name(run, component), component), spec=spec
    )


def build_monitors(run: GagarRun, ctx: BuildContext) -> list[Manifest]:
    if not wants_monitors(run, ctx):
        return []
    out = [build_pod_monitor(run, ctx)]
    if run.spec.rollout.endpoint is None:
        out.append(build_service_monitor(run, ctx, "rollout", "http"))
    if run.spec.grader.endpoint is None:
        out.append(build_service_monitor(run, ctx, "grader", "metrics"))
    if run.spec.sandbox.backend == "pods":
        out.append(build_service_monitor(run, ctx, "sandbox", "metrics"))
    if environment_pools(run):  # one for the Services of every task environment's pool
        out.append(build_service_monitor(run, ctx, ENVIRONMENT_COMPONENT, "metrics"))
    if image_pools(run, ctx):  # and one for those of every task image's pool
        out.append(build_service_monitor(run, ctx, IMAGE_COMPONENT, "metrics"))
    return out
