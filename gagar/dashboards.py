"""Grafana dashboards for gagar, built from the metric catalogue so that names cannot drift.

Every query goes through ``gagar.alerts.metric``, which fails for a name the catalogue does not
have; a test checks that every catalogue metric appears on some dashboard and that every query
returns series from a real Prometheus scraping a real exporter. Dashboards use two variables,
``$namespace`` and ``$run``, and Grafana's ``$__rate_interval``. Pure: no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gagar.alerts import metric

SEL = 'namespace=~"$namespace", run=~"$run"'
RATE = "$__rate_interval"
BY = "namespace, run"


@dataclass(frozen=True)
class Panel:
    title: str
    targets: list[tuple[str, str]]  # (PromQL, legend)
    unit: str = "short"
    description: str = ""
    kind: str = "timeseries"


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    rows: list[tuple[str, list[Panel]]] = field(default_factory=list)


# ---------------------------------------------------------------- query helpers
def gauge(name: str, legend: str = "{{run}}", sel: str = SEL) -> tuple[str, str]:
    return f"{metric(name)}{{{sel}}}", legend


def rate(name: str, by: str = BY, legend: str = "{{run}}", sel: str = SEL) -> tuple[str, str]:
    return f"sum by ({by}) (rate({metric(name)}{{{sel}}}[{RATE}]))", legend


def _legend(prefix: str, by: str) -> str:
    """Legend naming the innermost grouping label (``run`` unless grouped further)."""
    return f"{prefix} {{{{{by.split(', ')[-1]}}}}}"


def quantile(q: float, name: str, by: str = BY, sel: str = SEL) -> tuple[str, str]:
    bucket = metric(name, "_bucket")
    expr = f"histogram_quantile({q}, sum by ({by}, le) (rate({bucket}{{{sel}}}[{RATE}])))"
    return expr, _legend(f"p{round(q * 100)}", by)


def hist_mean(name: str, by: str = BY, sel: str = SEL) -> tuple[str, str]:
    s, c = metric(name, "_sum"), metric(name, "_count")
    expr = (
        f"sum by ({by}) (rate({s}{{{sel}}}[{RATE}])) / sum by ({by}) (rate({c}{{{sel}}}[{RATE}]))"
    )
    return expr, _legend("mean", by)


def by_stage(name: str) -> tuple[str, str]:
    return gauge(name, "{{stage}} {{run}}")


# ---------------------------------------------------------------- dashboards
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
                    Panel("Reward (mean)", [gauge("gagar_reward_mean")]),
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
                    Panel("Clip ratio", [gauge("gagar_clip_ratio")], "percentunit"),
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
        "Grader pool replicas, queue depth, requests and latency.",
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
                        ],
                        "ops",
                    ),
                    Panel(
                        "Sessions",
                        [
                            gauge("gagar_sandbox_sessions_active", "active {{pool}}"),
                            gauge("gagar_sandbox_warm_pool_size", "warm {{pool}}"),
                        ],
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
                ],
            ),
        ],
    )


DASHBOARDS = (overview, rl_health, throughput, pools, sandboxes, operator)


# ---------------------------------------------------------------- Grafana JSON
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _panel_json(p: Panel, pid: int, pos: dict[str, int]) -> dict[str, Any]:
    targets: list[dict[str, Any]] = [
        {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
        for i, (expr, legend) in enumerate(p.targets)
    ]
    if p.kind == "table":
        for t in targets:
            t.update({"instant": True, "format": "table"})
    return {
        "id": pid,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": DATASOURCE,
        "gridPos": pos,
        "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": targets,
    }


def _layout(d: Dashboard) -> list[dict[str, Any]]:
    panels, pid, y = [], 1, 0
    for title, row in d.rows:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        pid, y = pid + 1, y + 1
        for i, p in enumerate(row):
            panels.append(
                _panel_json(p, pid, {"h": 8, "w": 12, "x": 12 * (i % 2), "y": y + 8 * (i // 2)})
            )
            pid += 1
        y += 8 * ((len(row) + 1) // 2)
    return panels


def _variable(name: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": name},
        "definition": query,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
        "refresh": 2,
        "sort": 1,
    }


def dashboard_json(d: Dashboard) -> dict[str, Any]:
    step = metric("gagar_trainer_step")
    return {
        "uid": d.uid,
        "title": d.title,
        "description": d.description,
        "tags": ["gagar"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "timezone": "utc",
        "annotations": {"list": []},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                    "label": "Prometheus",
                },
                _variable("namespace", f"label_values({step}, namespace)"),
                _variable("run", f'label_values({step}{{namespace=~"$namespace"}}, run)'),
            ]
        },
        "panels": _layout(d),
    }


def dashboard_text(build: Any) -> str:
    return json.dumps(dashboard_json(build()), indent=2, ensure_ascii=False) + "\n"


def queries(d: Dashboard) -> list[str]:
    """Every PromQL query of a dashboard (for tests and linting)."""
    return [expr for _, row in d.rows for p in row for expr, _ in p.targets]
