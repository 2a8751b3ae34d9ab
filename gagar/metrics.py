"""The metric catalogue (docs/design.md §4): every Prometheus metric gagar exports, declared once,
as one row (``MetricDef``, keyword fields only) of the table ``METRICS``.

Naming: prefix ``gagar_``, base units as suffixes (``_seconds``, ``_bytes``, ``_ratio`` for 0–1),
``_total`` on counters, no colons; labels only from ``ALLOWED_LABELS`` (no task or trajectory ids:
cardinality stays bounded). Components create the metrics they export into a registry with
``Metrics(registry, component)``; dashboards and alerts reference these names, and a test lints them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gagar import env

Kind = Literal["counter", "gauge", "histogram"]
Component = Literal["trainer", "rollout", "grader", "sandbox", "operator"]

ALLOWED_LABELS = frozenset(
    {
        "run",
        "namespace",
        "pool",
        "stage",
        "reason",
        "outcome",
        "grader",
        "phase",
        "condition",
        "status",
        "result",
        "kind",
        "tier",
        "verb",
        "mode",
    }
)
# The values of the small-enum labels that a component knows before any event: it creates these
# series at start-up (``Metrics.prime``), so /metrics lists every metric of the component at once
# and rates start from 0 instead of appearing with the first event.
SANDBOX_OUTCOMES = ("ok", "failed", "timeout", "limit", "infra")
SANDBOX_LIMITS = ("wall_time", "cpu_time", "memory", "processes", "file_size")
SANDBOX_ISOLATIONS = ("bubblewrap", "pod", "none")  # gagar.sandbox.isolation.REPORTED
GRADER_OUTCOMES = ("ok", "fallback", "invalid", "rejected", "unavailable", "error")
GRADER_KINDS = ("heuristic", "agentic", "none")
GRADER_FALLBACK_REASONS = ("unusable_ranking", "timeout", "grader_error", "nonpositive_mass")
TOKEN_KINDS = ("prompt", "completion")
ENGINE_OUTCOMES = ("ok", "error")
# A trajectory's verdict: from a verification run of its own, or shared by an identical twin's.
VERIFICATION_OUTCOMES = ("run", "shared")
STAGES = ("rollout", "grading_wait", "update", "sync", "checkpoint", "other")
ADV_STAGES = ("before", "after")
THROUGHPUT_STAGES = ("rollout", "training")
INVALID_REASONS = ("engine_error", "sandbox_error", "verify_error")
TRAINER_FALLBACKS = (
    "ineligible",
    "unusable",
    "nonpositive_mass",
    "heuristic_after_timeout",
    "heuristic_after_grader_error",
)
FLAG_KINDS = ("redundant", "tool_error", "churn")
EXIT_REASONS = (
    "submitted",
    "max_turns",
    "max_tokens",
    "context_overflow",
    "engine_error",
    "sandbox_error",
)
API_VERBS = ("GET", "POST", "PATCH", "PUT", "DELETE")
API_OUTCOMES = (
    "ok",
    "not_found",
    "conflict",
    "invalid",
    "forbidden",
    "throttled",
    "server_error",
    "unreachable",
)
RECONCILE_RESULTS = ("ok", "invalid", "gone", "error")
PHASES = ("Pending", "Running", "Suspended", "Succeeded", "Failed", "Stalled")
RECONCILE_ERRORS = ("api_transient", "api_permanent", "internal")

ADVANTAGE_BUCKETS = (-4.0, -2.0, -1.0, -0.5, -0.25, -0.1, 0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0)
FACTOR_BUCKETS = (0.2, 0.4, 0.6, 0.8, 0.9, 1.0, 1.25, 1.5)
TOKEN_BUCKETS = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
TURN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
DURATION_BUCKETS = (
    0.01,
    0.05,
    0.1,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
)


@dataclass(frozen=True, kw_only=True)
class MetricDef:
    """One row of the catalogue: a metric, the component that exports it, its labels."""

    name: str
    kind: Kind
    component: Component
    doc: str
    labels: tuple[str, ...] = ("run",)
    buckets: tuple[float, ...] | None = None
    enums: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Known values of small-enum labels, created at start-up (see ``Metrics.prime``)."""


METRICS: tuple[MetricDef, ...] = (
    # trainer: progress and time
    MetricDef(
        name="gagar_trainer_step",
        kind="gauge",
        component="trainer",
        doc="Training step last completed.",
    ),
    MetricDef(
        name="gagar_trainer_step_duration_seconds",
        kind="histogram",
        component="trainer",
        buckets=DURATION_BUCKETS,
        doc="Wall time of a training step.",
    ),
    MetricDef(
        name="gagar_trainer_stage_duration_seconds",
        kind="histogram",
        component="trainer",
        labels=("run", "stage"),
        buckets=DURATION_BUCKETS,
        enums=(("stage", STAGES),),
        doc="Wall time per stage of a step (rollout, grading_wait, update, sync, checkpoint, other; they add up to the step's duration).",
    ),
    MetricDef(
        name="gagar_policy_version",
        kind="gauge",
        component="trainer",
        doc="Policy version last published to the rollout engines.",
    ),
    MetricDef(
        name="gagar_rollout_staleness_versions",
        kind="gauge",
        component="trainer",
        doc="Policy versions between the trajectories trained on and the trainer.",
    ),
    MetricDef(
        name="gagar_tokens_per_second",
        kind="gauge",
        component="trainer",
        labels=("run", "stage"),
        enums=(("stage", THROUGHPUT_STAGES),),
        doc="Throughput of the last step by stage (rollout = generated, training = trained tokens).",
    ),
    MetricDef(
        name="gagar_checkpoint_step",
        kind="gauge",
        component="trainer",
        doc="Step of the newest complete checkpoint.",
    ),
    # trainer: rewards and advantages
    MetricDef(
        name="gagar_pass_rate_ratio",
        kind="gauge",
        component="trainer",
        doc="Share of valid trajectories whose hidden tests pass.",
    ),
    MetricDef(
        name="gagar_eligible_groups_ratio",
        kind="gauge",
        component="trainer",
        doc="Share of sampled groups that were informative (≥1 pass, ≥1 fail, ≥2 valid).",
    ),
    MetricDef(
        name="gagar_sampling_rounds_total",
        kind="counter",
        component="trainer",
        doc="Generation rounds run by dynamic sampling.",
    ),
    MetricDef(
        name="gagar_quota_shortfall_total",
        kind="counter",
        component="trainer",
        doc="Steps that trained on fewer eligible groups than the quota.",
    ),
    MetricDef(
        name="gagar_invalid_trajectories_total",
        kind="counter",
        component="trainer",
        labels=("run", "reason"),
        enums=(("reason", INVALID_REASONS),),
        doc="Trajectories dropped for infrastructure failures, by reason.",
    ),
    MetricDef(
        name="gagar_verifications_total",
        kind="counter",
        component="trainer",
        labels=("run", "outcome"),
        enums=(("outcome", VERIFICATION_OUTCOMES),),
        doc="Trajectories' verdicts: verification runs, and verdicts shared by an identical "
        "final repository of the same group.",
    ),
    MetricDef(
        name="gagar_advantage",
        kind="histogram",
        component="trainer",
        labels=("run", "stage"),
        buckets=ADVANTAGE_BUCKETS,
        enums=(("stage", ADV_STAGES),),
        doc="Per-trajectory advantage, before and after redistribution.",
    ),
    MetricDef(
        name="gagar_advantage_mean",
        kind="gauge",
        component="trainer",
        labels=("run", "stage"),
        enums=(("stage", ADV_STAGES),),
        doc="Mean advantage over trained trajectories, before/after redistribution.",
    ),
    MetricDef(
        name="gagar_advantage_std",
        kind="gauge",
        component="trainer",
        labels=("run", "stage"),
        enums=(("stage", ADV_STAGES),),
        doc="Std of advantages over trained trajectories, before/after redistribution.",
    ),
    MetricDef(
        name="gagar_advantage_abs_max",
        kind="gauge",
        component="trainer",
        labels=("run", "stage"),
        enums=(("stage", ADV_STAGES),),
        doc="Largest |advantage|, before/after redistribution.",
    ),
    MetricDef(
        name="gagar_lambda",
        kind="histogram",
        component="trainer",
        buckets=FACTOR_BUCKETS,
        doc="Redistribution rescale factor λ per redistributed group.",
    ),
    MetricDef(
        name="gagar_lambda_mean",
        kind="gauge",
        component="trainer",
        doc="Mean λ over redistributed groups of the step.",
    ),
    MetricDef(
        name="gagar_quality_factor",
        kind="histogram",
        component="trainer",
        buckets=FACTOR_BUCKETS,
        doc="Quality factors assigned to passes.",
    ),
    MetricDef(
        name="gagar_grader_fallbacks_total",
        kind="counter",
        component="trainer",
        labels=("run", "reason"),
        enums=(("reason", TRAINER_FALLBACKS),),
        doc="Groups whose redistribution was skipped, by reason.",
    ),
    MetricDef(
        name="gagar_graded_groups_total",
        kind="counter",
        component="trainer",
        doc="Groups the trainer had graded (the denominator of the grader fallback rate).",
    ),
    # trainer: the grader's quality while training (gagar.grader.quality); counts, so that
    # PromQL pools them into a ratio over any window
    MetricDef(
        name="gagar_grader_usable_groups_total",
        kind="counter",
        component="trainer",
        doc="Graded groups ranked by the grader itself, neither a fallback nor unusable "
        "(over gagar_graded_groups_total: the usable rate).",
    ),
    MetricDef(
        name="gagar_grader_heuristic_pairs_total",
        kind="counter",
        component="trainer",
        doc="Pairs of passes of the agentic grader's own rankings compared with the heuristic's "
        "ranking of the same group.",
    ),
    MetricDef(
        name="gagar_grader_heuristic_agreeing_pairs_total",
        kind="counter",
        component="trainer",
        doc="Of gagar_grader_heuristic_pairs_total, the pairs both rankings order alike (<, = or >).",
    ),
    MetricDef(
        name="gagar_grader_audited_groups_total",
        kind="counter",
        component="trainer",
        doc="Groups graded a second time with the candidates relabelled (spec.grader.auditFraction).",
    ),
    MetricDef(
        name="gagar_grader_audit_pairs_total",
        kind="counter",
        component="trainer",
        doc="Pairs of passes compared between a grading and its relabelled audit (both usable).",
    ),
    MetricDef(
        name="gagar_grader_audit_consistent_pairs_total",
        kind="counter",
        component="trainer",
        doc="Of gagar_grader_audit_pairs_total, the pairs the grading and its audit order alike.",
    ),
    MetricDef(
        name="gagar_hacks_total",
        kind="counter",
        component="trainer",
        doc="Passes the grader confirmed as hacks (reward zeroed).",
    ),
    MetricDef(
        name="gagar_bloated_passes_ratio",
        kind="gauge",
        component="trainer",
        doc="Share of passes the grader put below T1.",
    ),
    # trainer: optimization
    MetricDef(name="gagar_loss", kind="gauge", component="trainer", doc="Policy loss of the step."),
    MetricDef(
        name="gagar_kl",
        kind="gauge",
        component="trainer",
        doc="KL to the reference policy (estimator as configured).",
    ),
    MetricDef(
        name="gagar_entropy",
        kind="gauge",
        component="trainer",
        doc="Mean token entropy of the policy on trained tokens.",
    ),
    MetricDef(
        name="gagar_clip_ratio",
        kind="gauge",
        component="trainer",
        doc="Share of trained tokens whose ratio was clipped (any clip).",
    ),
    MetricDef(
        name="gagar_clip_low_ratio",
        kind="gauge",
        component="trainer",
        doc="Share of trained tokens clipped at 1 − ε_low (A < 0).",
    ),
    MetricDef(
        name="gagar_clip_high_ratio",
        kind="gauge",
        component="trainer",
        doc="Share of trained tokens clipped at 1 + ε_high (A > 0).",
    ),
    MetricDef(
        name="gagar_clip_dual_ratio",
        kind="gauge",
        component="trainer",
        doc="Share of trained tokens bounded by dual-clip.",
    ),
    MetricDef(
        name="gagar_importance_ratio_mean",
        kind="gauge",
        component="trainer",
        doc="Mean PPO ratio π/π_behaviour over the step's trained tokens.",
    ),
    MetricDef(
        name="gagar_importance_ratio_max",
        kind="gauge",
        component="trainer",
        doc="Largest PPO ratio π/π_behaviour over the step's trained tokens.",
    ),
    MetricDef(
        name="gagar_learning_rate",
        kind="gauge",
        component="trainer",
        doc="Learning rate of the step (after warm-up/schedule).",
    ),
    MetricDef(
        name="gagar_grad_norm",
        kind="gauge",
        component="trainer",
        doc="Global gradient norm before clipping.",
    ),
    MetricDef(
        name="gagar_gradient_variance",
        kind="gauge",
        component="trainer",
        doc="Trace of the covariance of the step's unit gradients, Σ‖g_m − ḡ‖²/(M−1); a unit is a "
        "micro-batch, or a run of them closed at a group's end (a group split over micro-batches).",
    ),
    MetricDef(
        name="gagar_gradient_mean_norm",
        kind="gauge",
        component="trainer",
        doc="Norm of the mean micro-batch gradient ‖ḡ‖.",
    ),
    MetricDef(
        name="gagar_gradient_variance_scaled",
        kind="gauge",
        component="trainer",
        doc="tr Cov / ‖ḡ‖²: about M − 1 for nearly orthogonal micro-batch gradients whatever the "
        "algorithm (kept for old dashboards; gagar_gradient_noise_scale measures).",
    ),
    MetricDef(
        name="gagar_gradient_noise_scale",
        kind="gauge",
        component="trainer",
        doc="Gradient noise scale B = tr Σ / ‖G‖² in tokens (McCandlish et al. 2018): the batch at "
        "which a batch of this composition has as much noise as signal; a ratio, so not unbiased "
        "itself (pool its parts over steps); absent when ‖G‖² comes out ≤ 0 or the step has fewer "
        "than two independent units (whole groups) or splits a group over data-parallel ranks.",
    ),
    MetricDef(
        name="gagar_gradient_noise_trace",
        kind="gauge",
        component="trainer",
        doc="tr Σ per token: N · tr Cov(ḡ), the step gradient's noise scaled to one of its N tokens; "
        "unbiased for every aggregation when the units (runs of micro-batches closed at group "
        "ends) are independent and a unit's expected gradient is its aggregation share of the "
        "step's; under token-mean with independent tokens, the per-token tr Σ (average over "
        "steps before dividing).",
    ),
    MetricDef(
        name="gagar_gradient_signal_sq",
        kind="gauge",
        component="trainer",
        doc="‖G‖² = ‖E ḡ‖², the noise scale's denominator, from the inner products of distinct "
        "units (unbiased under the same conditions as the trace; one step's value can be ≤ 0).",
    ),
    MetricDef(
        name="gagar_tokens_trained_total",
        kind="counter",
        component="trainer",
        doc="Policy-generated tokens trained on.",
    ),
    # trainer: behaviour
    MetricDef(
        name="gagar_response_tokens",
        kind="histogram",
        component="trainer",
        buckets=TOKEN_BUCKETS,
        doc="Generated tokens per trajectory.",
    ),
    MetricDef(
        name="gagar_turns",
        kind="histogram",
        component="trainer",
        buckets=TURN_BUCKETS,
        doc="Agent turns per trajectory.",
    ),
    MetricDef(
        name="gagar_redundant_actions_total",
        kind="counter",
        component="trainer",
        labels=("run", "kind"),
        enums=(("kind", FLAG_KINDS),),
        doc="Tool calls flagged redundant, erroneous or churn, by kind.",
    ),
    # rollout
    MetricDef(
        name="gagar_rollout_requests_total",
        kind="counter",
        component="rollout",
        labels=("run", "pool", "outcome"),
        enums=(("outcome", ENGINE_OUTCOMES),),
        doc="Engine requests by outcome.",
    ),
    MetricDef(
        name="gagar_rollout_request_duration_seconds",
        kind="histogram",
        component="rollout",
        labels=("run", "pool"),
        buckets=DURATION_BUCKETS,
        doc="Engine request latency.",
    ),
    MetricDef(
        name="gagar_rollout_trajectories_total",
        kind="counter",
        component="rollout",
        labels=("run", "reason"),
        enums=(("reason", EXIT_REASONS),),
        doc="Finished trajectories by exit reason.",
    ),
    MetricDef(
        name="gagar_weight_sync_duration_seconds",
        kind="histogram",
        component="rollout",
        labels=("run", "pool"),
        buckets=DURATION_BUCKETS,
        doc="Time to push a policy version to the engines.",
    ),
    # grader (the grader service; ``pool`` is the grader pool)
    MetricDef(
        name="gagar_grader_requests_total",
        kind="counter",
        component="grader",
        labels=("run", "pool", "grader", "outcome"),
        enums=(("grader", GRADER_KINDS), ("outcome", GRADER_OUTCOMES)),
        doc="Grading requests by grader and outcome.",
    ),
    MetricDef(
        name="gagar_grader_request_duration_seconds",
        kind="histogram",
        component="grader",
        labels=("run", "pool", "grader"),
        buckets=DURATION_BUCKETS,
        enums=(("grader", GRADER_KINDS),),
        doc="Grading latency per group.",
    ),
    MetricDef(
        name="gagar_grader_queue_depth",
        kind="gauge",
        component="grader",
        labels=("run", "pool"),
        doc="Groups waiting in the grader service queue.",
    ),
    MetricDef(
        name="gagar_grader_queue_wait_seconds",
        kind="histogram",
        component="grader",
        labels=("run", "pool"),
        buckets=DURATION_BUCKETS,
        doc="Time a group waited in the grader service queue.",
    ),
    MetricDef(
        name="gagar_grader_in_flight",
        kind="gauge",
        component="grader",
        labels=("run", "pool"),
        doc="Groups being graded now.",
    ),
    MetricDef(
        name="gagar_grader_timeouts_total",
        kind="counter",
        component="grader",
        labels=("run", "pool"),
        doc="Groups whose grading passed the deadline.",
    ),
    MetricDef(
        name="gagar_grader_ranking_fallbacks_total",
        kind="counter",
        component="grader",
        labels=("run", "pool", "reason"),
        enums=(("reason", GRADER_FALLBACK_REASONS),),
        doc="Rankings the grader service answered as fallbacks, by reason.",
    ),
    MetricDef(
        name="gagar_grader_tokens_total",
        kind="counter",
        component="grader",
        labels=("run", "pool", "kind"),
        enums=(("kind", TOKEN_KINDS),),
        doc="Tokens of the grader's model, by kind.",
    ),
    MetricDef(
        name="gagar_grader_confirmed_hacks_total",
        kind="counter",
        component="grader",
        labels=("run", "pool"),
        doc="Passes the grader service confirmed as hacks.",
    ),
    # sandbox
    MetricDef(
        name="gagar_sandbox_executions_total",
        kind="counter",
        component="sandbox",
        labels=("run", "pool", "outcome"),
        enums=(("outcome", SANDBOX_OUTCOMES),),
        doc="Sandboxed executions by outcome.",
    ),
    MetricDef(
        name="gagar_sandbox_execution_duration_seconds",
        kind="histogram",
        component="sandbox",
        labels=("run", "pool"),
        buckets=DURATION_BUCKETS,
        doc="Wall time of sandboxed executions.",
    ),
    MetricDef(
        name="gagar_sandbox_timeouts_total",
        kind="counter",
        component="sandbox",
        labels=("run", "pool"),
        doc="Executions killed at the wall-clock limit.",
    ),
    MetricDef(
        name="gagar_sandbox_oom_kills_total",
        kind="counter",
        component="sandbox",
        labels=("run", "pool"),
        doc="Executions that hit the memory limit.",
    ),
    MetricDef(
        name="gagar_sandbox_limit_hits_total",
        kind="counter",
        component="sandbox",
        labels=("run", "pool", "kind"),
        enums=(("kind", SANDBOX_LIMITS),),
        doc="Executions ended by a resource limit, by limit.",
    ),
    MetricDef(
        name="gagar_sandbox_sessions_active",
        kind="gauge",
        component="sandbox",
        labels=("run", "pool"),
        doc="Open sandbox sessions.",
    ),
    MetricDef(
        name="gagar_sandbox_isolation",
        kind="gauge",
        component="sandbox",
        labels=("run", "pool", "mode"),
        enums=(("mode", SANDBOX_ISOLATIONS),),
        doc="1 for the isolation mode the sandbox server runs (auto resolved at start), else 0.",
    ),
    MetricDef(
        name="gagar_sandbox_sessions_max",
        kind="gauge",
        component="sandbox",
        labels=("run", "pool"),
        doc="Sessions a sandbox server accepts (more are refused with 503).",
    ),
    # operator
    MetricDef(
        name="gagar_operator_reconciles_total",
        kind="counter",
        component="operator",
        labels=("result",),
        enums=(("result", RECONCILE_RESULTS),),
        doc="Reconciliations by result.",
    ),
    MetricDef(
        name="gagar_operator_reconcile_duration_seconds",
        kind="histogram",
        component="operator",
        labels=(),
        buckets=DURATION_BUCKETS,
        doc="Reconciliation latency.",
    ),
    MetricDef(
        name="gagar_operator_reconcile_errors_total",
        kind="counter",
        component="operator",
        labels=("reason",),
        enums=(("reason", RECONCILE_ERRORS),),
        doc="Reconciliations that failed, by reason (transient API errors are retried).",
    ),
    MetricDef(
        name="gagar_operator_api_requests_total",
        kind="counter",
        component="operator",
        labels=("verb", "outcome"),
        enums=(("verb", API_VERBS), ("outcome", API_OUTCOMES)),
        doc="Kubernetes API requests of the operator, by verb and outcome.",
    ),
    MetricDef(
        name="gagar_operator_api_request_duration_seconds",
        kind="histogram",
        component="operator",
        labels=("verb",),
        buckets=DURATION_BUCKETS,
        enums=(("verb", API_VERBS),),
        doc="Latency of the operator's Kubernetes API requests.",
    ),
    MetricDef(
        name="gagar_operator_queue_depth",
        kind="gauge",
        component="operator",
        labels=(),
        doc="Runs with a reconcile in progress or waiting for one (the operator's work queue).",
    ),
    MetricDef(
        name="gagar_operator_runs",
        kind="gauge",
        component="operator",
        labels=("phase",),
        enums=(("phase", PHASES),),
        doc="GagarRuns by phase.",
    ),
    MetricDef(
        name="gagar_run_condition",
        kind="gauge",
        component="operator",
        labels=("run", "namespace", "condition", "status"),
        doc="1 when the condition has the status, per run.",
    ),
)


CATALOGUE: dict[str, MetricDef] = {d.name: d for d in METRICS}
Metric = Counter | Gauge | Histogram
_M = TypeVar("_M", Counter, Gauge, Histogram)


class Metrics:
    """The catalogue's metrics of some components, created in one registry.

    ``Metrics(registry, "trainer")["gagar_loss"].labels(run="x").set(0.1)``
    """

    def __init__(self, registry: CollectorRegistry | None = None, *components: Component) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        wanted = set(components) or {d.component for d in CATALOGUE.values()}
        self._metrics: dict[str, Metric] = {
            d.name: _create(d, self.registry) for d in CATALOGUE.values() if d.component in wanted
        }

    def __getitem__(self, name: str) -> Metric:
        if name not in self._metrics:
            raise KeyError(f"{name} is not in the catalogue of these components")
        return self._metrics[name]

    def counter(self, name: str) -> Counter:
        return self._typed(name, Counter)

    def gauge(self, name: str) -> Gauge:
        return self._typed(name, Gauge)

    def histogram(self, name: str) -> Histogram:
        return self._typed(name, Histogram)

    def _typed(self, name: str, kind: type[_M]) -> _M:
        metric = self[name]
        if not isinstance(metric, kind):
            raise TypeError(f"{name} is a {CATALOGUE[name].kind}, not a {kind.__name__.lower()}")
        return metric

    def __contains__(self, name: str) -> bool:
        return name in self._metrics

    def names(self) -> list[str]:
        return list(self._metrics)

    def prime(self, *components: Component, gauges: bool = True, **fixed: str) -> None:
        """Create, at zero, every series whose labels are ``fixed`` plus the definition's known
        enum values (of ``components``' metrics, default all), so /metrics lists the
        component's metrics from start-up. ``gauges=False`` leaves gauges unset (a trainer's
        gauges mean nothing before its first step; counters and histograms start at zero). Metrics with a
        label that is neither fixed nor a known enum (a trainer's ``reason``) are left alone."""
        for name, metric in self._metrics.items():
            d = CATALOGUE[name]
            if (components and d.component not in components) or (d.kind == "gauge" and not gauges):
                continue
            for labels in series_labels(d, fixed):
                if labels:
                    metric.labels(**labels)


def series_labels(d: MetricDef, fixed: dict[str, str]) -> list[dict[str, str]]:
    """Every label set of ``d`` made of ``fixed`` values and its enums ([] when one is unknown)."""
    enums = dict(d.enums)
    combos: list[dict[str, str]] = [{}]
    for label in d.labels:
        if label in fixed:
            values: tuple[str, ...] = (fixed[label],)
        elif label in enums:
            values = enums[label]
        else:
            return []
        combos = [{**c, label: v} for c in combos for v in values]
    return combos


def component_labels(
    component: Component, run: str | None = None, pool: str | None = None
) -> dict[str, str]:
    """The ``run`` and ``pool`` labels a pool's process puts on its series: from its flags, else
    from the environment the operator gives every gagar container (``GAGAR_RUN``,
    ``GAGAR_COMPONENT``), else empty run and the component's name. ``namespace`` is not set here:
    Prometheus adds it from the scraped target (ServiceMonitor/PodMonitor), see docs/observability.md."""
    return {
        "run": run if run is not None else os.environ.get(env.RUN, ""),
        "pool": pool if pool is not None else os.environ.get(env.COMPONENT, component),
    }


def _create(d: MetricDef, registry: CollectorRegistry) -> Metric:
    if d.kind == "counter":
        return Counter(d.name.removesuffix("_total"), d.doc, d.labels, registry=registry)
    if d.kind == "gauge":
        return Gauge(d.name, d.doc, d.labels, registry=registry)
    return Histogram(
        d.name, d.doc, d.labels, registry=registry, buckets=d.buckets or Histogram.DEFAULT_BUCKETS
    )
