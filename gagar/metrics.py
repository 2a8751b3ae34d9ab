"""The metric catalogue (docs/design.md §4): every Prometheus metric gagar exports, declared once.

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


@dataclass(frozen=True)
class MetricDef:
    name: str
    kind: Kind
    doc: str
    component: Component
    labels: tuple[str, ...] = ("run",)
    buckets: tuple[float, ...] | None = None
    enums: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Known values of small-enum labels, created at start-up (see ``Metrics.prime``)."""


def _defs() -> list[MetricDef]:
    t: Component = "trainer"
    r: Component = "rollout"
    g: Component = "grader"
    s: Component = "sandbox"
    o: Component = "operator"
    h: Kind = "histogram"
    c: Kind = "counter"
    G: Kind = "gauge"
    return [
        # trainer: progress and time
        MetricDef("gagar_trainer_step", G, "Training step last completed.", t),
        MetricDef(
            "gagar_trainer_step_duration_seconds",
            h,
            "Wall time of a training step.",
            t,
            buckets=DURATION_BUCKETS,
        ),
        MetricDef(
            "gagar_trainer_stage_duration_seconds",
            h,
            "Wall time per stage of a step (rollout, grading_wait, update, sync, checkpoint, other; they add up to the step's duration).",
            t,
            ("run", "stage"),
            DURATION_BUCKETS,
            enums=(("stage", STAGES),),
        ),
        MetricDef(
            "gagar_policy_version", G, "Policy version last published to the rollout engines.", t
        ),
        MetricDef(
            "gagar_rollout_staleness_versions",
            G,
            "Policy versions between the trajectories trained on and the trainer.",
            t,
        ),
        MetricDef(
            "gagar_tokens_per_second",
            G,
            "Throughput of the last step by stage (rollout = generated, training = trained tokens).",
            t,
            ("run", "stage"),
            enums=(("stage", THROUGHPUT_STAGES),),
        ),
        MetricDef("gagar_checkpoint_step", G, "Step of the newest complete checkpoint.", t),
        # trainer: rewards and advantages
        MetricDef(
            "gagar_pass_rate_ratio", G, "Share of valid trajectories whose hidden tests pass.", t
        ),
        MetricDef(
            "gagar_eligible_groups_ratio",
            G,
            "Share of sampled groups that were informative (≥1 pass, ≥1 fail, ≥2 valid).",
            t,
        ),
        MetricDef(
            "gagar_sampling_rounds_total", c, "Generation rounds run by dynamic sampling.", t
        ),
        MetricDef(
            "gagar_quota_shortfall_total",
            c,
            "Steps that trained on fewer eligible groups than the quota.",
            t,
        ),
        MetricDef(
            "gagar_invalid_trajectories_total",
            c,
            "Trajectories dropped for infrastructure failures, by reason.",
            t,
            ("run", "reason"),
            enums=(("reason", INVALID_REASONS),),
        ),
        MetricDef(
            "gagar_advantage",
            h,
            "Per-trajectory advantage, before and after redistribution.",
            t,
            ("run", "stage"),
            ADVANTAGE_BUCKETS,
            enums=(("stage", ADV_STAGES),),
        ),
        MetricDef(
            "gagar_advantage_mean",
            G,
            "Mean advantage over trained trajectories, before/after redistribution.",
            t,
            ("run", "stage"),
            enums=(("stage", ADV_STAGES),),
        ),
        MetricDef(
            "gagar_advantage_std",
            G,
            "Std of advantages over trained trajectories, before/after redistribution.",
            t,
            ("run", "stage"),
            enums=(("stage", ADV_STAGES),),
        ),
        MetricDef(
            "gagar_advantage_abs_max",
            G,
            "Largest |advantage|, before/after redistribution.",
            t,
            ("run", "stage"),
            enums=(("stage", ADV_STAGES),),
        ),
        MetricDef(
            "gagar_lambda",
            h,
            "Redistribution rescale factor λ per redistributed group.",
            t,
            buckets=FACTOR_BUCKETS,
        ),
        MetricDef("gagar_lambda_mean", G, "Mean λ over redistributed groups of the step.", t),
        MetricDef(
            "gagar_quality_factor",
            h,
            "Quality factors assigned to passes.",
            t,
            buckets=FACTOR_BUCKETS,
        ),
        MetricDef(
            "gagar_grader_fallbacks_total",
            c,
            "Groups whose redistribution was skipped, by reason.",
            t,
            ("run", "reason"),
            enums=(("reason", TRAINER_FALLBACKS),),
        ),
        MetricDef(
            "gagar_graded_groups_total",
            c,
            "Groups the trainer had graded (the denominator of the grader fallback rate).",
            t,
        ),
        MetricDef(
            "gagar_hacks_total", c, "Passes the grader confirmed as hacks (reward zeroed).", t
        ),
        MetricDef("gagar_bloated_passes_ratio", G, "Share of passes the grader put below T1.", t),
        # trainer: optimization
        MetricDef("gagar_loss", G, "Policy loss of the step.", t),
        MetricDef("gagar_kl", G, "KL to the reference policy (estimator as configured).", t),
        MetricDef("gagar_entropy", G, "Mean token entropy of the policy on trained tokens.", t),
        MetricDef(
            "gagar_clip_ratio", G, "Share of trained tokens whose ratio was clipped (any clip).", t
        ),
        MetricDef(
            "gagar_clip_low_ratio", G, "Share of trained tokens clipped at 1 − ε_low (A < 0).", t
        ),
        MetricDef(
            "gagar_clip_high_ratio", G, "Share of trained tokens clipped at 1 + ε_high (A > 0).", t
        ),
        MetricDef("gagar_clip_dual_ratio", G, "Share of trained tokens bounded by dual-clip.", t),
        MetricDef(
            "gagar_importance_ratio_mean",
            G,
            "Mean PPO ratio π/π_behaviour over the step's trained tokens.",
            t,
        ),
        MetricDef(
            "gagar_importance_ratio_max",
            G,
            "Largest PPO ratio π/π_behaviour over the step's trained tokens.",
            t,
        ),
        MetricDef(
            "gagar_learning_rate", G, "Learning rate of the step (after warm-up/schedule).", t
        ),
        MetricDef("gagar_grad_norm", G, "Global gradient norm before clipping.", t),
        MetricDef(
            "gagar_gradient_variance",
            G,
            "Trace of the covariance of micro-batch gradients, Σ‖g_m − ḡ‖²/(M−1).",
            t,
        ),
        MetricDef("gagar_gradient_mean_norm", G, "Norm of the mean micro-batch gradient ‖ḡ‖.", t),
        MetricDef(
            "gagar_gradient_variance_scaled",
            G,
            "tr Cov / ‖ḡ‖²: about M − 1 for nearly orthogonal micro-batch gradients whatever the "
            "algorithm (kept for old dashboards; gagar_gradient_noise_scale measures).",
            t,
        ),
        MetricDef(
            "gagar_gradient_noise_scale",
            G,
            "Gradient noise scale B = tr Σ / ‖G‖² in tokens (McCandlish et al. 2018), unbiased "
            "from micro-batch and full-batch squared norms; absent when ‖G‖² comes out ≤ 0.",
            t,
        ),
        MetricDef(
            "gagar_gradient_noise_trace",
            G,
            "tr Σ per token, the noise scale's numerator (average over steps before dividing).",
            t,
        ),
        MetricDef(
            "gagar_gradient_signal_sq",
            G,
            "Unbiased ‖G‖², the noise scale's denominator (one step's value can be ≤ 0).",
            t,
        ),
        MetricDef("gagar_tokens_trained_total", c, "Policy-generated tokens trained on.", t),
        # trainer: behaviour
        MetricDef(
            "gagar_response_tokens", h, "Generated tokens per trajectory.", t, buckets=TOKEN_BUCKETS
        ),
        MetricDef("gagar_turns", h, "Agent turns per trajectory.", t, buckets=TURN_BUCKETS),
        MetricDef(
            "gagar_redundant_actions_total",
            c,
            "Tool calls flagged redundant, erroneous or churn, by kind.",
            t,
            ("run", "kind"),
            enums=(("kind", FLAG_KINDS),),
        ),
        # rollout
        MetricDef(
            "gagar_rollout_requests_total",
            c,
            "Engine requests by outcome.",
            r,
            ("run", "pool", "outcome"),
            enums=(("outcome", ENGINE_OUTCOMES),),
        ),
        MetricDef(
            "gagar_rollout_request_duration_seconds",
            h,
            "Engine request latency.",
            r,
            ("run", "pool"),
            DURATION_BUCKETS,
        ),
        MetricDef(
            "gagar_rollout_trajectories_total",
            c,
            "Finished trajectories by exit reason.",
            r,
            ("run", "reason"),
            enums=(("reason", EXIT_REASONS),),
        ),
        MetricDef(
            "gagar_weight_sync_duration_seconds",
            h,
            "Time to push a policy version to the engines.",
            r,
            ("run", "pool"),
            DURATION_BUCKETS,
        ),
        # grader (the grader service; ``pool`` is the grader pool)
        MetricDef(
            "gagar_grader_requests_total",
            c,
            "Grading requests by grader and outcome.",
            g,
            ("run", "pool", "grader", "outcome"),
            enums=(("grader", GRADER_KINDS), ("outcome", GRADER_OUTCOMES)),
        ),
        MetricDef(
            "gagar_grader_request_duration_seconds",
            h,
            "Grading latency per group.",
            g,
            ("run", "pool", "grader"),
            DURATION_BUCKETS,
            enums=(("grader", GRADER_KINDS),),
        ),
        MetricDef(
            "gagar_grader_queue_depth",
            G,
            "Groups waiting in the grader service queue.",
            g,
            ("run", "pool"),
        ),
        MetricDef(
            "gagar_grader_queue_wait_seconds",
            h,
            "Time a group waited in the grader service queue.",
            g,
            ("run", "pool"),
            DURATION_BUCKETS,
        ),
        MetricDef("gagar_grader_in_flight", G, "Groups being graded now.", g, ("run", "pool")),
        MetricDef(
            "gagar_grader_timeouts_total",
            c,
            "Groups whose grading passed the deadline.",
            g,
            ("run", "pool"),
        ),
        MetricDef(
            "gagar_grader_ranking_fallbacks_total",
            c,
            "Rankings the grader service answered as fallbacks, by reason.",
            g,
            ("run", "pool", "reason"),
            enums=(("reason", GRADER_FALLBACK_REASONS),),
        ),
        MetricDef(
            "gagar_grader_tokens_total",
            c,
            "Tokens of the grader's model, by kind.",
            g,
            ("run", "pool", "kind"),
            enums=(("kind", TOKEN_KINDS),),
        ),
        MetricDef(
            "gagar_grader_confirmed_hacks_total",
            c,
            "Passes the grader service confirmed as hacks.",
            g,
            ("run", "pool"),
        ),
        # sandbox
        MetricDef(
            "gagar_sandbox_executions_total",
            c,
            "Sandboxed executions by outcome.",
            s,
            ("run", "pool", "outcome"),
            enums=(("outcome", SANDBOX_OUTCOMES),),
        ),
        MetricDef(
            "gagar_sandbox_execution_duration_seconds",
            h,
            "Wall time of sandboxed executions.",
            s,
            ("run", "pool"),
            DURATION_BUCKETS,
        ),
        MetricDef(
            "gagar_sandbox_timeouts_total",
            c,
            "Executions killed at the wall-clock limit.",
            s,
            ("run", "pool"),
        ),
        MetricDef(
            "gagar_sandbox_oom_kills_total",
            c,
            "Executions that hit the memory limit.",
            s,
            ("run", "pool"),
        ),
        MetricDef(
            "gagar_sandbox_limit_hits_total",
            c,
            "Executions ended by a resource limit, by limit.",
            s,
            ("run", "pool", "kind"),
            enums=(("kind", SANDBOX_LIMITS),),
        ),
        MetricDef("gagar_sandbox_sessions_active", G, "Open sandbox sessions.", s, ("run", "pool")),
        MetricDef(
            "gagar_sandbox_isolation",
            G,
            "1 for the isolation mode the sandbox server runs (auto resolved at start), else 0.",
            s,
            ("run", "pool", "mode"),
            enums=(("mode", SANDBOX_ISOLATIONS),),
        ),
        MetricDef(
            "gagar_sandbox_sessions_max",
            G,
            "Sessions a sandbox server accepts (more are refused with 503).",
            s,
            ("run", "pool"),
        ),
        # operator
        MetricDef(
            "gagar_operator_reconciles_total",
            c,
            "Reconciliations by result.",
            o,
            ("result",),
            enums=(("result", RECONCILE_RESULTS),),
        ),
        MetricDef(
            "gagar_operator_reconcile_duration_seconds",
            h,
            "Reconciliation latency.",
            o,
            (),
            DURATION_BUCKETS,
        ),
        MetricDef(
            "gagar_operator_reconcile_errors_total",
            c,
            "Reconciliations that failed, by reason (transient API errors are retried).",
            o,
            ("reason",),
            enums=(("reason", RECONCILE_ERRORS),),
        ),
        MetricDef(
            "gagar_operator_api_requests_total",
            c,
            "Kubernetes API requests of the operator, by verb and outcome.",
            o,
            ("verb", "outcome"),
            enums=(("verb", API_VERBS), ("outcome", API_OUTCOMES)),
        ),
        MetricDef(
            "gagar_operator_api_request_duration_seconds",
            h,
            "Latency of the operator's Kubernetes API requests.",
            o,
            ("verb",),
            DURATION_BUCKETS,
            enums=(("verb", API_VERBS),),
        ),
        MetricDef(
            "gagar_operator_queue_depth",
            G,
            "Runs with a reconcile in progress or waiting for one (the operator's work queue).",
            o,
            (),
        ),
        MetricDef(
            "gagar_operator_runs",
            G,
            "GagarRuns by phase.",
            o,
            ("phase",),
            enums=(("phase", PHASES),),
        ),
        MetricDef(
            "gagar_run_condition",
            G,
            "1 when the condition has the status, per run.",
            o,
            ("run", "namespace", "condition", "status"),
        ),
    ]


CATALOGUE: dict[str, MetricDef] = {d.name: d for d in _defs()}
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
