"""gagar's Grafana dashboards, built from the metric catalogue so that names cannot drift.

Every query goes through the helpers of ``gagar.grafana``, which fail for a name the catalogue
does not have; a test checks that every catalogue metric appears on some dashboard and that every
query returns series from a real Prometheus scraping a real exporter. Pure: no I/O.
"""

from __future__ import annotations

from gagar.alerts import metric
from gagar.grafana import (
    BY,
    RATE,
    SEL,
    Dashboard,
    Panel,
    by_stage,
    dashboard_json,
    dashboard_text,
    gauge,
    hist_mean,
    quantile,
    queries,
    rate,
)

__all__ = ["DASHBOARDS", "dashboard_json", "dashboard_text", "queries"]


def overview() -> Dashboard:
    cond = f"{metric('gagar_run_condition')}{{{SEL}}} == 1"
    return Dashboard(
        "gagar-overview",
        "gagar / Run overview",
        "Progress and conditions of GagarRuns.",
        [
            (
                "Progress",
                [
                    Panel("Training step", [gauge("gagar_trainer_step")]),
                    Panel("Policy version", [gauge("gagar_policy_version")]),
                    Panel("Checkpoint step", [gauge("gagar_checkpoint_step")]),
                    Panel(
                        "Rollout staleness",
                        [gauge("gagar_rollout_staleness_versions")],
                        description="Policy versions between the trajectories trained on and the trainer.",
                    ),
                    Panel(
                        "Step duration",
                        [
                            quantile(0.5, "gagar_trainer_step_duration_seconds"),
                            quantile(0.95, "gagar_trainer_step_duration_seconds"),
                        ],
                        "s",
                    ),
                    Panel(
                        "Stage duration p95",
                        [quantile(0.95, "gagar_trainer_stage_duration_seconds", f"{BY}, stage")],
                        "s",
                    ),
                ],
            ),
            (
                "Conditions",
                [
                    Panel(
                        "Conditions (1 = has this status)",
                        [(cond, "{{run}} {{condition}}={{status}}")],
                        kind="table",
                    ),
                    Panel("Runs by phase", [gauge("gagar_operator_runs", "{{phase}}", "")]),
                ],
            ),
        ],
    )


def rl_health() -> Dashboard:
    adv = "gagar_advantage"
    return Dashboard(
        "gagar-rl-health",
        "gagar / RL health",
        "Rewards, advantages before and after redistribution, grading, optimization and behaviour.",
        [
            (
                "Rewards",
                [
                    Panel("Pass rate", [gauge("gagar_pass_rate_ratio")], "percentunit"),
                    Panel("Eligible groups", [gauge("gagar_eligible_groups_ratio")], "percentunit"),
                    Panel(
                        "Dynamic sampling",
                        [
                            rate("gagar_sampling_rounds_total", legend="rounds {{run}}"),
                            rate("gagar_quota_shortfall_total", legend="shortfall {{run}}"),
                        ],
                        "ops",
                    ),
                    Panel(
                        "Invalid trajectories by reason",
                        [rate("gagar_invalid_trajectories_total", f"{BY}, reason", "{{reason}}")],
                        "ops",
                    ),
                ],
            ),
            (
                "Advantages",
                [
                    Panel("Advantage mean (before/after)", [by_stage("gagar_advantage_mean")]),
                    Panel("Advantage std (before/after)", [by_stage("gagar_advantage_std")]),
                    Panel("Advantage |max| (before/after)", [by_stage("gagar_advantage_abs_max")]),
                    Panel(
                        "Advantage quantiles (before/after)",
                        [quantile(0.1, adv, f"{BY}, stage"), quantile(0.9, adv, f"{BY}, stage")],
                    ),
                ],
            ),
            (
                "Grading and redistribution",
                [
                    Panel(
                        "λ",
                        [gauge("gagar_lambda_mean", "mean {{run}}"), quantile(0.9, "gagar_lambda")],
                        description="Rescale factor of redistributed groups (capped at λ_max).",
                    ),
                    Panel(
                        "Quality factors",
                        [
                            quantile(0.1, "gagar_quality_factor"),
                            hist_mean("gagar_quality_factor"),
                        ],
                    ),
                    Panel(
                        "Grader fallbacks by reason",
                        [rate("gagar_grader_fallbacks_total", f"{BY}, reason", "{{reason}}")],
                        "ops",
                    ),
                    Panel(
                        "Graded groups",
                        [rate("gagar_graded_groups_total")],
                        "ops",
                        description="Groups the trainer had graded (denominator of the fallback rate).",
                    ),
                    Panel("Confirmed hacks", [rate("gagar_hacks_total")], "ops"),
                    Panel("Bloated passes", [gauge("gagar_bloated_passes_ratio")], "percentunit"),
                ],
            ),
            (
                "Optimization",
                [
                    Panel(
                        "Gradient variance",
                        [gauge("gagar_gradient_variance")],
                        description="Trace of the covariance of micro-batch gradients.",
                    ),
                    Panel(
                        "Gradient variance, scale-free",
                        [gauge("gagar_gradient_variance_scaled")],
                        description="tr Cov / ‖ḡ‖²: about M − 1 whatever the algorithm when the "
                        "micro-batch gradients are nearly orthogonal (kept for comparison with "
                        "older runs; the noise scale measures).",
                    ),
                    Panel(
                        "Gradient noise scale",
                        [
                            gauge("gagar_gradient_noise_scale", "step {{run}}"),
                            (
                                f"avg_over_time({gauge('gagar_gradient_noise_trace')[0]}[30m]) / "
                                f"avg_over_time({gauge('gagar_gradient_signal_sq')[0]}[30m])",
                                "30 min pooled {{run}}",
                            ),
                        ],
                        description="B = tr Σ / ‖G‖² in tokens (McCandlish et al. 2018): the batch "
                        "at which gradient noise equals signal; independent of the micro-batch "
                        "count and of the advantages' scale.",
                    ),
                    Panel(
                        "Gradient norms",
                        [
                            gauge("gagar_grad_norm", "global {{run}}"),
                            gauge("gagar_gradient_mean_norm", "mean micro-batch {{run}}"),
                        ],
                    ),
                    Panel("Loss", [gauge("gagar_loss")]),
                    Panel(
                        "KL and entropy",
                        [
                            gauge("gagar_kl", "KL {{run}}"),
                            gauge("gagar_entropy", "entropy {{run}}"),
                        ],
                    ),
                    Panel(
                        "Clip ratio (any, low, high, dual)",
                        [
                            gauge("gagar_clip_ratio", "any {{run}}"),
                            gauge("gagar_clip_low_ratio", "low {{run}}"),
                            gauge("gagar_clip_high_ratio", "high {{run}}"),
                            gauge("gagar_clip_dual_ratio", "dual {{run}}"),
                        ],
                        "percentunit",
                    ),
                    Panel(
                        "Importance ratio π/π_behaviour",
                        [
                            gauge("gagar_importance_ratio_mean", "mean {{run}}"),
                            gauge("gagar_importance_ratio_max", "max {{run}}"),
                        ],
                    ),
                    Panel("Learning rate", [gauge("gagar_learning_rate")]),
                ],
            ),
            (
                "Behaviour",
                [
                    Panel(
                        "Response tokens per trajectory",
                        [
                            quantile(0.5, "gagar_response_tokens"),
                            quantile(0.9, "gagar_response_tokens"),
                            hist_mean("gagar_response_tokens"),
                        ],
                    ),
                    Panel(
                        "Turns per trajectory",
                        [quantile(0.5, "gagar_turns"), quantile(0.9, "gagar_turns")],
                    ),
                    Panel(
                        "Redundant actions by kind",
                        [rate("gagar_redundant_actions_total", f"{BY}, kind", "{{kind}}")],
                        "ops",
                    ),
                ],
            ),
        ],
    )


def throughput() -> Dashboard:
    return Dashboard(
        "gagar-throughput",
        "gagar / Throughput",
        "Tokens, trajectories, engine requests and weight sync.",
        [
            (
                "Tokens",
                [
                    Panel("Tokens per second by stage", [by_stage("gagar_tokens_per_second")]),
                    Panel("Tokens trained", [rate("gagar_tokens_trained_total")], "ops"),
                    Panel(
                        "Trajectories by exit reason",
                        [rate("gagar_rollout_trajectories_total", f"{BY}, reason", "{{reason}}")],
                        "ops",
                    ),
                ],
            ),
            (
                "Rollout engines",
                [
                    Panel(
                        "Engine requests by outcome",
                        [
                            rate(
                                "gagar_rollout_requests_total",
                                f"{BY}, pool, outcome",
                                "{{pool}} {{outcome}}",
                            )
                        ],
                        "reqps",
                    ),
                    Panel(
                        "Engine request latency",
                        [quantile(0.95, "gagar_rollout_request_duration_seconds", f"{BY}, pool")],
                        "s",
                    ),
                    Panel(
                        "Weight sync duration",
                        [quantile(0.95, "gagar_weight_sync_duration_seconds", f"{BY}, pool")],
                        "s",
                    ),
                ],
            ),
        ],
    )


def pools() -> Dashboard:
    depth = metric("gagar_grader_queue_depth")
    return Dashboard(
        "gagar-pools",
        "gagar / Pools",
        "Pool replicas, queue depth, requests and latency.",
        [
            (
                "Grader pool",
                [
                    Panel(
                        "Grader replicas exporting metrics",
                        [(f"count by ({BY}, pool) ({depth}{{{SEL}}})", "{{pool}}")],
                        description="Replicas whose /metrics is scraped (ready replicas).",
                    ),
                    Panel(
                        "Queue depth",
                        [(f"sum by ({BY}, pool) ({depth}{{{SEL}}})", "{{pool}}")],
                    ),
                    Panel(
                        "Grading requests by outcome",
                        [
                            rate(
                                "gagar_grader_requests_total",
                                f"{BY}, grader, outcome",
                                "{{grader}} {{outcome}}",
                            )
                        ],
                        "reqps",
                    ),
                    Panel(
                        "Grading latency p95",
                        [quantile(0.95, "gagar_grader_request_duration_seconds", f"{BY}, grader")],
                        "s",
                    ),
                    Panel(
                        "Grading timeouts",
                        [rate("gagar_grader_timeouts_total", f"{BY}, pool", "{{pool}}")],
                        "ops",
                    ),
                    Panel(
                        "In flight and queue wait",
                        [
                            (
                                f"sum by ({BY}, pool) ({metric('gagar_grader_in_flight')}{{{SEL}}})",
                                "in flight {{pool}}",
                            ),
                            quantile(0.95, "gagar_grader_queue_wait_seconds", f"{BY}, pool"),
                        ],
                    ),
                    Panel(
                        "Ranking fallbacks by reason",
                        [
                            rate(
                                "gagar_grader_ranking_fallbacks_total",
                                f"{BY}, reason",
                                "{{reason}}",
                            )
                        ],
                        "ops",
                    ),
                    Panel(
                        "Grader model tokens and confirmed hacks",
                        [
                            rate("gagar_grader_tokens_total", f"{BY}, kind", "{{kind}}"),
                            rate("gagar_grader_confirmed_hacks_total", legend="hacks {{run}}"),
                        ],
                        "ops",
                    ),
                ],
            ),
            (
                "Rollout and sandbox pools",
                [
                    Panel(
                        "Rollout requests per pool",
                        [rate("gagar_rollout_requests_total", f"{BY}, pool", "{{pool}}")],
                        "reqps",
                    ),
                    Panel(
                        "Sandbox sessions per pool",
                        [
                            (
                                f"sum by ({BY}, pool) ({metric('gagar_sandbox_sessions_active')}{{{SEL}}})",
                                "active {{pool}}",
                            ),
                            (
                                f"sum by ({BY}, pool) ({metric('gagar_sandbox_sessions_max')}{{{SEL}}})",
                                "capacity {{pool}}",
                            ),
                        ],
                    ),
                ],
            ),
        ],
    )


def sandboxes() -> Dashboard:
    return Dashboard(
        "gagar-sandboxes",
        "gagar / Sandboxes",
        "Sandboxed executions, limits hit and warm pools.",
        [
            (
                "Executions",
                [
                    Panel(
                        "Executions by outcome",
                        [
                            rate(
                                "gagar_sandbox_executions_total",
                                f"{BY}, outcome",
                                "{{outcome}}",
                            )
                        ],
                        "ops",
                    ),
                    Panel(
                        "Execution duration",
                        [
                            quantile(0.5, "gagar_sandbox_execution_duration_seconds"),
                            quantile(0.95, "gagar_sandbox_execution_duration_seconds"),
                        ],
                        "s",
                    ),
                    Panel(
                        "Limits hit",
                        [
                            rate("gagar_sandbox_timeouts_total", legend="timeouts {{run}}"),
                            rate("gagar_sandbox_oom_kills_total", legend="OOM kills {{run}}"),
                            rate("gagar_sandbox_limit_hits_total", f"{BY}, kind", "{{kind}}"),
                        ],
                        "ops",
                    ),
                    Panel(
                        "Sessions",
                        [
                            gauge("gagar_sandbox_sessions_active", "active {{pool}}"),
                            gauge("gagar_sandbox_sessions_max", "capacity {{pool}}"),
                        ],
                    ),
                    Panel(
                        "Isolation mode",
                        [gauge("gagar_sandbox_isolation", "{{mode}} {{pool}}")],
                        description="The mode each sandbox server isolates commands with (auto "
                        "resolved at start): 1 for the mode in use.",
                    ),
                ],
            ),
        ],
    )


def operator() -> Dashboard:
    return Dashboard(
        "gagar-operator",
        "gagar / Operator",
        "Reconciliations of the gagar operator.",
        [
            (
                "Reconciliation",
                [
                    Panel(
                        "Reconciles by result",
                        [rate("gagar_operator_reconciles_total", "result", "{{result}}", "")],
                        "ops",
                    ),
                    Panel(
                        "Reconcile latency",
                        [
                            (
                                f"histogram_quantile(0.95, sum by (le) (rate({metric('gagar_operator_reconcile_duration_seconds', '_bucket')}[{RATE}])))",
                                "p95",
                            )
                        ],
                        "s",
                    ),
                    Panel("Runs by phase", [gauge("gagar_operator_runs", "{{phase}}", "")]),
                    Panel(
                        "Reconcile errors by reason",
                        [rate("gagar_operator_reconcile_errors_total", "reason", "{{reason}}", "")],
                        "ops",
                    ),
                    Panel(
                        "Work queue depth",
                        [gauge("gagar_operator_queue_depth", "runs waiting or reconciling", "")],
                        description="Runs with a reconcile in progress or waiting for one.",
                    ),
                ],
            ),
            (
                "Kubernetes API",
                [
                    Panel(
                        "API requests by outcome",
                        [
                            rate(
                                "gagar_operator_api_requests_total",
                                "verb, outcome",
                                "{{verb}} {{outcome}}",
                                "",
                            )
                        ],
                        "reqps",
                    ),
                    Panel(
                        "API errors",
                        [
                            rate(
                                "gagar_operator_api_requests_total",
                                "outcome",
                                "{{outcome}}",
                                'outcome!="ok"',
                            )
                        ],
                        "reqps",
                    ),
                    Panel(
                        "API latency p95",
                        [
                            (
                                f"histogram_quantile(0.95, sum by (verb, le) (rate({metric('gagar_operator_api_request_duration_seconds', '_bucket')}[{RATE}])))",
                                "{{verb}}",
                            )
                        ],
                        "s",
                    ),
                ],
            ),
        ],
    )


DASHBOARDS = (overview, rl_health, throughput, pools, sandboxes, operator)
