"""What a run asks of the cluster's optional integrations, and what the cluster lacks (pure).

A spec can ask for kinds that only an optional API group serves: a KEDA ScaledObject
(``autoscaling.backend: keda``), Prometheus Operator monitors (``observability.monitors:
enabled``), a Kueue queue (``trainer.queueName``), a JobSet (``trainer.useJobSet``), agent-sandbox
(``sandbox.isolation: agent-sandbox``). ``crds`` is what the operator may use: the groups both
installed and enabled (``--integration``, the chart's ``integrations.*``). A run asking for a
group outside it is Stalled with a reason naming the field and the chart value, never quietly
run without it (a pool that never scales, a queue that never holds the trainer); the builders
never emit a kind whose group is not in ``crds``, so ``gagar render --capabilities`` shows what
the operator creates (``blocking`` is what both ask). A suspend or an end is applied without
KEDA, monitors or Kueue, so the pods always go away; a trainer an older operator ran as a Job
keeps running without JobSet.
"""

from __future__ import annotations

from gagar.operator.builders.common import AGENT_SANDBOX, JOBSET, KEDA, KUEUE, MONITORING
from gagar.spec import GagarRun

CHART_VALUE = {
    KEDA: "integrations.keda",
    KUEUE: "integrations.kueue",
    MONITORING: "integrations.prometheusOperator",
    JOBSET: "integrations.jobset",
    AGENT_SANDBOX: "integrations.agentSandbox",
}
REASON = {
    KEDA: "AutoscalerUnavailable",
    MONITORING: "MonitoringUnavailable",
    KUEUE: "QueueUnavailable",
    JOBSET: "JobSetUnavailable",
    AGENT_SANDBOX: "SandboxUnavailable",
}
WAY_OUT = {
    KEDA: "install and enable KEDA, or use backend: hpa (with a metrics adapter) or replicas",
    MONITORING: "install the Prometheus Operator and enable the integration, or set "
    "monitors: auto (created only where its CRDs are) or disabled",
    KUEUE: "install and enable Kueue, or remove queueName",
    JOBSET: "install and enable JobSet, or set useJobSet: false to run the trainer as an "
    "indexed Job",
    AGENT_SANDBOX: "install agent-sandbox with its extensions (kubernetes-sigs/agent-sandbox) "
    "and enable the integration, or set spec.sandbox.isolation to auto (a pool of executor pods)",
}
# What a suspend or an end still applies without: the builders leave these kinds out and stop
# the pods by themselves (a JobSet or agent-sandbox run has created nothing to stop).
LEFT_OUT_WHEN_STOPPING = frozenset({KEDA, MONITORING, KUEUE})


def asked(run: GagarRun) -> list[tuple[str, str, str]]:
    """(API group, field path, what it asks) of each optional integration the run needs."""
    out = []
    if run.spec.trainer.use_job_set:
        out.append((JOBSET, "spec.trainer.useJobSet", "is true"))
    if run.spec.sandbox.isolation == "agent-sandbox":
        out.append((AGENT_SANDBOX, "spec.sandbox.isolation", "is agent-sandbox"))
    for component in ("rollout", "grader"):
        pool = getattr(run.spec, component)
        auto = pool.autoscaling
        if pool.endpoint is None and auto is not None and auto.backend == "keda":
            field = f"spec.{component}.autoscaling.backend"
            out.append((KEDA, field, "is keda (a ScaledObject scales the pool)"))
    if run.spec.observability.monitors == "enabled":
        out.append((MONITORING, "spec.observability.monitors", "is enabled"))
    if run.spec.trainer.queue_name:
        out.append((KUEUE, "spec.trainer.queueName", "names a Kueue LocalQueue"))
    return out


def missing(
    run: GagarRun,
    installed: frozenset[str],
    integrations: frozenset[str],
    skip: frozenset[str] = frozenset(),
) -> tuple[str, str] | None:
    """(reason, message) of the first integration the run asks for and may not use: not
    enabled in the operator's configuration (``integrations``), or not ``installed``; groups in
    ``skip`` aside. Kueue needs installing only: with the operator's integration off, Kueue's
    own Job webhook still holds a Job that carries its queue label (docs/operations.md)."""
    for group, field, what in asked(run):
        enabled = group in integrations or group == KUEUE
        if group in skip or (group in installed and enabled):
            continue
        if enabled:
            why = f"the {group} API is not installed in the cluster"
        else:
            why = (
                f"the operator's {group} integration is off (chart value {CHART_VALUE[group]}, "
                f"operator flag --integration {group})"
            )
        reason = REASON[group]
        return reason, f"{reason}: {field} {what} but {why}; {WAY_OUT[group]}"
    return None


def blocking(
    run: GagarRun,
    installed: frozenset[str],
    integrations: frozenset[str],
    stopping: bool = False,
    trainer_is_job: bool = False,
) -> tuple[str, str] | None:
    """What stops the operator from applying the run at all (it is Stalled): ``missing``, but a
    suspended or ended run (``stopping``) is applied without KEDA, monitors or Kueue, so that
    its pods go away, and a trainer already running as a Job (``trainer_is_job``: an older
    operator fell back to one) keeps running without JobSet."""
    skip = (LEFT_OUT_WHEN_STOPPING if stopping else frozenset()) | (
        frozenset({JOBSET}) if trainer_is_job else frozenset()
    )
    return missing(run, installed, integrations, skip)
