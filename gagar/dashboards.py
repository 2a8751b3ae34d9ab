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
    Row,
    by_stage,
    dashboard_json,
    dashboard_text,
    gauge,
    hist_mean,
    quantile,
    queries,
    rate,
    ratio,
)

__all__ = ["DASHBOARDS", "dashboard_json", "dashboard_text", "queries"]


def overview() -> Dashboard:
    cond = f"{metric('gagar_run_condition')}{{{SEL}}} == 1"
    return Dashboard(
        uid="gagar-overview",
        title="gagar / Run overview",
        description="Progress and conditions of GagarRuns.",
        rows=[
            Row(
                title="Progress",
                panels=[
                    Panel(title="Training step", targets=[gauge("gagar_trainer_step")]),
                    Panel(title="Policy version", targets=[gauge("gagar_policy_version")]),
                    Panel(title="Checkpoint step", targets=[gauge("gagar_checkpoint_step")]),
                    Panel(
                        title="Rollout staleness",
                        targets=[gauge("gagar_rollout_staleness_versions")],
                        description="Policy versions between the trajectories trained on and the trainer.",
                    ),
                    Panel(
                        title="Step duration",
                        targets=[
                            quantile(0.5, "gagar_trainer_step_duration_seconds"),
                            quantile(0.95, "gagar_trainer_step_duration_seconds"),
                        ],
                        unit="s",
                    ),
                    Panel(
                        title="Stage duration p95",
                        targets=[
                            quantile(0.95, "gagar_trainer_stage_duration_seconds", f"{BY}, stage")
                        ],
                        unit="s",
                    ),
                ],
            ),
            Row(
                title="Conditions",
                panels=[
                    Panel(
                        title="Conditions (1 = has this status)",
                        targets=[(cond, "{{run}} {{condition}}={{status}}")],
                        kind="table",
                    ),
                    Panel(
                        title="Runs by phase",
                        targets=[gauge("gagar_operator_runs", "{{phase}}", "")],
                    ),
                ],
            ),
        ],
    )


def rl_health() -> Dashboard:
    adv = "gagar_advantage"
    return Dashboard(
        uid="gagar-rl-health",
        title="gagar / RL health",
        description="Rewards, advantages before and after redistribution, grading, optimization and behaviour.",
        rows=[
            Row(
                title="Rewards",
                panels=[
                    Panel(
                        title="Pass rate",
                        targets=[gauge("gagar_pass_rate_ratio")],
                        unit="percentunit",
                    ),
                    Panel(
                        title="Eligible groups",
                        targets=[gauge("gagar_eligible_groups_ratio")],
                        unit="percentunit",
                    ),
                    Panel(
                        title="Dynamic sampling",
                        targets=[
                            rate("gagar_sampling_rounds_total", legend="rounds {{run}}"),
                            rate("gagar_quota_shortfall_total", legend="shortfall {{run}}"),
                        ],
                        unit="ops",
                    ),
                    Panel(
                        title="Invalid trajectories by reason",
                        targets=[
                            rate("gagar_invalid_trajectories_total", f"{BY}, reason", "{{reason}}")
                        ],
                        unit="ops",
                    ),
                    Panel(
                        title="Verdicts: verification runs and shared by identical repositories",
                        targets=[
                            rate("gagar_verifications_total", f"{BY}, outcome", "{{outcome}}")
                        ],
                        unit="ops",
                    ),
                ],
            ),
            Row(
                title="Advantages",
                panels=[
                    Panel(
                        title="Advantage mean (before/after)",
                        targets=[by_stage("gagar_advantage_mean")],
                    ),
                    Panel(
                        title="Advantage std (before/after)",
                        targets=[by_stage("gagar_advantage_std")],
                    ),
                    Panel(
                        title="Advantage |max| (before/after)",
                        targets=[by_stage("gagar_advantage_abs_max")],
                    ),
                    Panel(
                        title="Advantage quantiles (before/after)",
                        targets=[
                            quantile(0.1, adv, f"{BY}, stage"),
                            quantile(0.9, adv, f"{BY}, stage"),
                        ],
                    ),
                ],
            ),
            Row(
                title="Grading and redistribution",
                panels=[
                    Panel(
                        title="λ",
                        targets=[
                            gauge("gagar_lambda_mean", "mean {{run}}"),
                            quantile(0.9, "gagar_lambda"),
                        ],
                        description="Rescale factor of redistributed groups (capped at λ_max).",
                    ),
                    Panel(
                        title="Quality factors",
                        targets=[
                            quantile(0.1, "gagar_quality_factor"),
                            hist_mean("gagar_quality_factor"),
                        ],
                    ),
                    Panel(
                        title="Grader fallbacks by reason",
                        targets=[
                            rate("gagar_grader_fallbacks_total", f"{BY}, reason", "{{reason}}")
                        ],
                        unit="ops",
                    ),
                    Panel(
                        title="Graded groups",
                        targets=[rate("gagar_graded_groups_total")],
                        unit="ops",
                        description="Groups the trainer had graded (denominator of the fallback rate).",
                    ),
                    Panel(title="Confirmed hacks", targets=[rate("gagar_hacks_total")], unit="ops"),
                    Panel(
                        title="Bloated passes",
                        targets=[gauge("gagar_bloated_passes_ratio")],
                        unit="percentunit",
                    ),
                ],
            ),
            Row(
                title="Optimization",
                panels=[
                    Panel(
                        title="Gradient variance",
                        targets=[gauge("gagar_gradient_variance")],
                        description="Trace of the covariance of micro-batch gradients.",
                    ),
                    Panel(
                        title="Gradient variance, scale-free",
                        targets=[gauge("gagar_gradient_variance_scaled")],
                        description="tr Cov / ‖ḡ‖²: about M − 1 whatever the algorithm when the "
                        "micro-batch gradients are nearly orthogonal (kept for comparison with "
                        "older runs; the noise scale measures).",
                    ),
                    Panel(
                        title="Gradient noise scale",
                        targets=[
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
                        title="Gradient norms",
                        targets=[
                            gauge("gagar_grad_norm", "global {{run}}"),
                            gauge("gagar_gradient_mean_norm", "mean micro-batch {{run}}"),
                        ],
                    ),
                    Panel(title="Loss", targets=[gauge("gagar_loss")]),
                    Panel(
                        title="KL and entropy",
                        targets=[
                            gauge("gagar_kl", "KL {{run}}"),
                            gauge("gagar_entropy", "entropy {{run}}"),
                        ],
                    ),
                    Panel(
                        title="Clip ratio (any, low, high, dual)",
                        targets=[
                            gauge("gagar_clip_ratio", "any {{run}}"),
                            gauge("gagar_clip_low_ratio", "low {{run}}"),
                            gauge("gagar_clip_high_ratio", "high {{run}}"),
                            gauge("gagar_clip_dual_ratio", "dual {{run}}"),
                        ],
                        unit="percentunit",
                    ),
                    Panel(
                        title="Importance ratio π/π_behaviour",
                        targets=[
                            gauge("gagar_importance_ratio_mean", "mean {{run}}"),
                            gauge("gagar_importance_ratio_max", "max {{run}}"),
                        ],
                    ),
                    Panel(title="Learning rate", targets=[gauge("gagar_learning_rate")]),
                ],
            ),
            Row(
                title="Behaviour",
                panels=[
                    Panel(
                        title="Response tokens per trajectory",
                        targets=[
                            quantile(0.5, "gagar_response_tokens"),
                            quantile(0.9, "gagar_response_tokens"),
                            hist_mean("gagar_response_tokens"),
                        ],
                    ),
                    Panel(
                        title="Turns per trajectory",
                        targets=[quantile(0.5, "gagar_turns"), quantile(0.9, "gagar_turns")],
                    ),
                    Panel(
                        title="Redundant actions by kind",
                        targets=[rate("gagar_redundant_actions_total", f"{BY}, kind", "{{kind}}")],
                        unit="ops",
                    ),
                ],
            ),
        ],
    )


def throughput() -> Dashboard:
    return Dashboard(
        uid="gagar-throughput",
        title="gagar / Throughput",
        description="Tokens, trajectories, engine requests and weight sync.",
        rows=[
            Row(
                title="Tokens",
                panels=[
                    Panel(
                        title="Tokens per second by stage",
                        targets=[by_stage("gagar_tokens_per_second")],
                    ),
                    Panel(
                        title="Tokens trained",
                        targets=[rate("gagar_tokens_trained_total")],
                        unit="ops",
                    ),
                    Panel(
                        title="Trajectories by exit reason",
                        targets=[
                            rate("gagar_rollout_trajectories_total", f"{BY}, reason", "{{reason}}")
                        ],
                        unit="ops",
                    ),
                ],
            ),
            Row(
                title="Rollout engines",
                panels=[
                    Panel(
                        title="Engine requests by outcome",
                        targets=[
                            rate(
                                "gagar_rollout_requests_total",
                                f"{BY}, pool, outcome",
                                "{{pool}} {{outcome}}",
                            )
                        ],
                        unit="reqps",
                    ),
                    Panel(
                        title="Engine request latency",
                        targets=[
                            quantile(0.95, "gagar_rollout_request_duration_seconds", f"{BY}, pool")
                        ],
                        unit="s",
                    ),
                    Panel(
                        title="Weight sync duration",
                        targets=[
                            quantile(0.95, "gagar_weight_sync_duration_seconds", f"{BY}, pool")
                        ],
                        unit="s",
                    ),
                ],
            ),
        ],
    )


QUALITY = "1h"  # the grader-quality ratios: a step adds a few groups' pairs, pooled over an hour


def pools() -> Dashboard:
    depth = metric("gagar_grader_queue_depth")
    requests = metric("gagar_grader_requests_total")
    return Dashboard(
        uid="gagar-pools",
        title="gagar / Pools",
        description="Pool replicas, queue depth, requests and latency.",
        rows=[
            Row(
                title="Grader pool",
                panels=[
                    Panel(
                        title="Grader replicas exporting metrics",
                        targets=[(f"count by ({BY}, pool) ({depth}{{{SEL}}})", "{{pool}}")],
                        description="Replicas whose /metrics is scraped (ready replicas).",
                    ),
                    Panel(
                        title="Queue depth",
                        targets=[(f"sum by ({BY}, pool) ({depth}{{{SEL}}})", "{{pool}}")],
                    ),
                    Panel(
                        title="Grading requests by outcome",
                        targets=[
                            rate(
                                "gagar_grader_requests_total",
                                f"{BY}, grader, outcome",
                                "{{grader}} {{outcome}}",
                            )
                        ],
                        unit="reqps",
                    ),
                    Panel(
                        title="Grading latency p95",
                        targets=[
                            quantile(0.95, "gagar_grader_request_duration_seconds", f"{BY}, grader")
                        ],
                        unit="s",
                    ),
                    Panel(
                        title="Grading timeouts",
                        targets=[rate("gagar_grader_timeouts_total", f"{BY}, pool", "{{pool}}")],
                        unit="ops",
                    ),
                    Panel(
                        title="In flight and queue wait",
                        targets=[
                            (
                                f"sum by ({BY}, pool) ({metric('gagar_grader_in_flight')}{{{SEL}}})",
                                "in flight {{pool}}",
                            ),
                            quantile(0.95, "gagar_grader_queue_wait_seconds", f"{BY}, pool"),
                        ],
                    ),
                    Panel(
                        title="Ranking fallbacks by reason",
                        targets=[
                            rate(
                                "gagar_grader_ranking_fallbacks_total",
                                f"{BY}, reason",
                                "{{reason}}",
                            )
                        ],
                        unit="ops",
                    ),
                    Panel(
                        title="Grader model tokens and confirmed hacks",
                        targets=[
                            rate("gagar_grader_tokens_total", f"{BY}, kind", "{{kind}}"),
                            rate("gagar_grader_confirmed_hacks_total", legend="hacks {{run}}"),
                        ],
                        unit="ops",
                    ),
                ],
            ),
            Row(
                title="Grader quality",
                panels=[
                    Panel(
                        title="Usable rate per grader (grader pool)",
                        targets=[
                            (
                                f'sum by ({BY}, grader) (rate({requests}{{{SEL}, outcome="ok"}}[{RATE}])) '
                                f"/ ignoring (grader) group_left sum by ({BY}) "
                                f"(rate({requests}{{{SEL}}}[{RATE}]))",
                                "{{grader}} {{run}}",
                            )
                        ],
                        unit="percentunit",
                        description="Share of the pool's grading requests each grader answered "
                        "with its own ranking (outcome ok); the rest fell back, were refused or "
                        "failed.",
                    ),
                    Panel(
                        title="Usable rate (trainer, 1h)",
                        targets=[
                            ratio(
                                "gagar_grader_usable_groups_total",
                                "gagar_graded_groups_total",
                                QUALITY,
                            )
                        ],
                        unit="percentunit",
                        description="Graded groups ranked by the run's grader itself, wherever it "
                        "ran (pool, endpoint, in process). Alert: GagarGraderUsableRateLow.",
                    ),
                    Panel(
                        title="Agreement with the heuristic (1h)",
                        targets=[
                            ratio(
                                "gagar_grader_heuristic_agreeing_pairs_total",
                                "gagar_grader_heuristic_pairs_total",
                                QUALITY,
                            )
                        ],
                        unit="percentunit",
                        description="Pairs of passes the agentic grader's own rankings order like "
                        "the heuristic (<, = or >). Alert: GagarGraderHeuristicAgreementLow.",
                    ),
                    Panel(
                        title="Relabelling audit consistency (1h)",
                        targets=[
                            ratio(
                                "gagar_grader_audit_consistent_pairs_total",
                                "gagar_grader_audit_pairs_total",
                                QUALITY,
                            )
                        ],
                        unit="percentunit",
                        description="spec.grader.auditFraction of the groups graded again with the "
                        "candidates relabelled: pairs of passes both gradings order alike. "
                        "Alert: GagarGraderAuditInconsistent.",
                    ),
                    Panel(
                        title="Compared pairs and audited groups",
                        targets=[
                            rate(
                                "gagar_grader_heuristic_pairs_total",
                                legend="heuristic pairs {{run}}",
                            ),
                            rate("gagar_grader_audit_pairs_total", legend="audit pairs {{run}}"),
                            rate(
                                "gagar_grader_audited_groups_total", legend="audited groups {{run}}"
                            ),
                        ],
                        unit="ops",
                        description="How much the ratios beside rest on.",
                    ),
                ],
            ),
            Row(
                title="Rollout and sandbox pools",
                panels=[
                    Panel(
                        title="Rollout requests per pool",
                        targets=[rate("gagar_rollout_requests_total", f"{BY}, pool", "{{pool}}")],
                        unit="reqps",
                    ),
                    Panel(
                        title="Sandbox sessions per pool",
                        targets=[
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
        uid="gagar-sandboxes",
        title="gagar / Sandboxes",
        description="Sandboxed executions, limits hit and warm pools.",
        rows=[
            Row(
                title="Executions",
                panels=[
                    Panel(
                        title="Executions by outcome",
                        targets=[
                            rate(
                                "gagar_sandbox_executions_total",
                                f"{BY}, outcome",
                                "{{outcome}}",
                            )
                        ],
                        unit="ops",
                    ),
                    Panel(
                        title="Execution duration",
                        targets=[
                            quantile(0.5, "gagar_sandbox_execution_duration_seconds"),
                            quantile(0.95, "gagar_sandbox_execution_duration_seconds"),
                        ],
                        unit="s",
                    ),
                    Panel(
                        title="Limits hit",
                        targets=[
                            rate("gagar_sandbox_timeouts_total", legend="timeouts {{run}}"),
                            rate("gagar_sandbox_oom_kills_total", legend="OOM kills {{run}}"),
                            rate("gagar_sandbox_limit_hits_total", f"{BY}, kind", "{{kind}}"),
                        ],
                        unit="ops",
                    ),
                    Panel(
                        title="Sessions",
                        targets=[
                            gauge("gagar_sandbox_sessions_active", "active {{pool}}"),
                            gauge("gagar_sandbox_sessions_max", "capacity {{pool}}"),
                        ],
                    ),
                    Panel(
                        title="Isolation mode",
                        targets=[gauge("gagar_sandbox_isolation", "{{mode}} {{pool}}")],
                        description="The mode each sandbox server isolates commands with (auto "
                        "resolved at start): 1 for the mode in use.",
                    ),
                ],
            ),
        ],
    )


def operator() -> Dashboard:
    return Dashboard(
        uid="gagar-operator",
        title="gagar / Operator",
        description="Reconciliations of the gagar operator.",
        rows=[
            Row(
                title="Reconciliation",
                panels=[
                    Panel(
                        title="Reconciles by result",
                        targets=[
                            rate("gagar_operator_reconciles_total", "result", "{{result}}", "")
                        ],
                        unit="ops",
                    ),
                    Panel(
                        title="Reconcile latency",
                        targets=[
                            (
                                f"histogram_quantile(0.95, sum by (le) (rate({metric('gagar_operator_reconcile_duration_seconds', '_bucket')}[{RATE}])))",
                                "p95",
                            )
                        ],
                        unit="s",
                    ),
                    Panel(
                        title="Runs by phase",
                        targets=[gauge("gagar_operator_runs", "{{phase}}", "")],
                    ),
                    Panel(
                        title="Reconcile errors by reason",
                        targets=[
                            rate(
                                "gagar_operator_reconcile_errors_total", "reason", "{{reason}}", ""
                            )
                        ],
                        unit="ops",
                    ),
                    Panel(
                        title="Work queue depth",
                        targets=[
                            gauge("gagar_operator_queue_depth", "runs waiting or reconciling", "")
                        ],
                        description="Runs with a reconcile in progress or waiting for one.",
                    ),
                ],
            ),
            Row(
                title="Kubernetes API",
                panels=[
                    Panel(
                        title="API requests by outcome",
                        targets=[
                            rate(
                                "gagar_operator_api_requests_total",
                                "verb, outcome",
                                "{{verb}} {{outcome}}",
                                "",
                            )
                        ],
                        unit="reqps",
                    ),
                    Panel(
                        title="API errors",
                        targets=[
                            rate(
                                "gagar_operator_api_requests_total",
                                "outcome",
                                "{{outcome}}",
                                'outcome!="ok"',
                            )
                        ],
                        unit="reqps",
                    ),
                    Panel(
                        title="API latency p95",
                        targets=[
                            (
                                f"histogram_quantile(0.95, sum by (verb, le) (rate({metric('gagar_operator_api_request_duration_seconds', '_bucket')}[{RATE}])))",
                                "{{verb}}",
                            )
                        ],
                        unit="s",
                    ),
                ],
            ),
        ],
    )


DASHBOARDS = (overview, rl_health, throughput, pools, sandboxes, operator)
