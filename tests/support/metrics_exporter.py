"""A process exporting every catalogue metric for the Prometheus test (tests only).

It creates all metrics with ``gagar.metrics.Metrics`` and serves them with
``prometheus_client.start_http_server`` on loopback, then updates them through the same API the
trainer, rollout, grader, sandbox and operator use (``labels(...).set/inc/observe``), every
0.2 s, in one of two regimes read from stdin: ``healthy`` (steps advance, stable lengths and
gradient variance, no grader fallbacks, pools ready) and ``degraded`` (steps stop, lengths and
gradient variance jump, most gradings fall back, pools not ready). It prints its port first.

Stand-in until the trainer exists: the lead replaces it with a real ``gagar train`` run.

    python -m tests.support.metrics_exporter --run demo --namespace gagar-test
"""

from __future__ import annotations

import argparse
import random
import select
import sys
import time
from dataclasses import dataclass

from prometheus_client import start_http_server

from gagar.metrics import Metrics

TICK = 0.2


@dataclass
class Regime:
    healthy: bool = True
    step: int = 0


def trainer_tick(m: Metrics, run: str, r: Regime, rng: random.Random) -> None:
    if r.healthy:
        r.step += 1
    m["gagar_trainer_step"].labels(run=run).set(r.step)
    m["gagar_policy_version"].labels(run=run).set(r.step)
    m["gagar_checkpoint_step"].labels(run=run).set(r.step - r.step % 10)
    m["gagar_rollout_staleness_versions"].labels(run=run).set(rng.choice((0, 1)))
    m["gagar_trainer_step_duration_seconds"].labels(run=run).observe(rng.uniform(20, 40))
    for stage in ("rollout", "grading", "training", "sync", "checkpoint"):
        m["gagar_trainer_stage_duration_seconds"].labels(run=run, stage=stage).observe(
            rng.uniform(1, 10)
        )
    for stage in ("rollout", "training"):
        m["gagar_tokens_per_second"].labels(run=run, stage=stage).set(rng.uniform(900, 1100))
    rewards_tick(m, run, r, rng)
    optimization_tick(m, run, r, rng)


def rewards_tick(m: Metrics, run: str, r: Regime, rng: random.Random) -> None:
    m["gagar_reward_mean"].labels(run=run).set(rng.uniform(0.3, 0.5))
    m["gagar_pass_rate_ratio"].labels(run=run).set(rng.uniform(0.3, 0.5))
    m["gagar_eligible_groups_ratio"].labels(run=run).set(rng.uniform(0.5, 0.7))
    m["gagar_sampling_rounds_total"].labels(run=run).inc()
    m["gagar_quota_shortfall_total"].labels(run=run).inc(rng.choice((0, 1)))
    m["gagar_invalid_trajectories_total"].labels(run=run, reason="sandbox_error").inc(
        rng.choice((0, 1))
    )
    for stage in ("before", "after"):
        for _ in range(4):
            m["gagar_advantage"].labels(run=run, stage=stage).observe(rng.gauss(0, 1))
        m["gagar_advantage_mean"].labels(run=run, stage=stage).set(0.0)
        m["gagar_advantage_std"].labels(run=run, stage=stage).set(rng.uniform(0.8, 1.2))
        m["gagar_advantage_abs_max"].labels(run=run, stage=stage).set(rng.uniform(1.5, 2.5))
    m["gagar_lambda"].labels(run=run).observe(rng.uniform(1.0, 1.5))
    m["gagar_lambda_mean"].labels(run=run).set(rng.uniform(1.0, 1.5))
    for _ in range(4):
        m["gagar_quality_factor"].labels(run=run).observe(rng.choice((1.0, 0.9, 0.85, 0.4, 0.2)))
    # grading: every tick grades 4 groups; degraded, 3 of them fall back
    m["gagar_grader_requests_total"].labels(
        run=run, pool="grader", grader="agentic", outcome="ok"
    ).inc(4)
    fallbacks = m["gagar_grader_fallbacks_total"].labels(run=run, reason="grader_timeout")
    fallbacks.inc(0 if r.healthy else 3)
    m["gagar_hacks_total"].labels(run=run).inc(rng.choice((0, 1)))
    m["gagar_bloated_passes_ratio"].labels(run=run).set(rng.uniform(0.05, 0.15))


def optimization_tick(m: Metrics, run: str, r: Regime, rng: random.Random) -> None:
    scale = 1.0 if r.healthy else 20.0
    m["gagar_loss"].labels(run=run).set(rng.uniform(-0.1, 0.1))
    m["gagar_kl"].labels(run=run).set(rng.uniform(0.001, 0.01))
    m["gagar_entropy"].labels(run=run).set(rng.uniform(0.8, 1.0))
    m["gagar_clip_ratio"].labels(run=run).set(rng.uniform(0.0, 0.05))
    m["gagar_grad_norm"].labels(run=run).set(rng.uniform(0.5, 1.0) * scale)
    m["gagar_gradient_variance"].labels(run=run).set(rng.uniform(0.9, 1.1) * scale)
    m["gagar_gradient_mean_norm"].labels(run=run).set(rng.uniform(0.2, 0.4))
    m["gagar_tokens_trained_total"].labels(run=run).inc(2048)
    length = 400 if r.healthy else 4000
    for _ in range(8):
        m["gagar_response_tokens"].labels(run=run).observe(length * rng.uniform(0.8, 1.2))
        m["gagar_turns"].labels(run=run).observe(rng.randint(2, 10))
    m["gagar_redundant_actions_total"].labels(run=run, kind="repeat").inc(rng.choice((0, 1)))


def pools_tick(m: Metrics, run: str, rng: random.Random) -> None:
    pool = "rollout"
    m["gagar_rollout_requests_total"].labels(run=run, pool=pool, outcome="ok").inc(8)
    m["gagar_rollout_request_duration_seconds"].labels(run=run, pool=pool).observe(
        rng.uniform(0.5, 3)
    )
    m["gagar_rollout_trajectories_total"].labels(run=run, reason="submitted").inc(2)
    m["gagar_weight_sync_duration_seconds"].labels(run=run, pool=pool).observe(rng.uniform(1, 5))
    m["gagar_grader_request_duration_seconds"].labels(
        run=run, pool="grader", grader="agentic"
    ).observe(rng.uniform(5, 60))
    m["gagar_grader_queue_depth"].labels(run=run, pool="grader").set(rng.randint(0, 8))
    m["gagar_grader_timeouts_total"].labels(run=run, pool="grader").inc(rng.choice((0, 1)))
    pool = "sandbox"
    m["gagar_sandbox_executions_total"].labels(run=run, pool=pool, outcome="ok").inc(6)
    m["gagar_sandbox_execution_duration_seconds"].labels(run=run, pool=pool).observe(
        rng.uniform(0.1, 5)
    )
    m["gagar_sandbox_timeouts_total"].labels(run=run, pool=pool).inc(rng.choice((0, 1)))
    m["gagar_sandbox_oom_kills_total"].labels(run=run, pool=pool).inc(rng.choice((0, 1)))
    m["gagar_sandbox_sessions_active"].labels(run=run, pool=pool).set(rng.randint(1, 4))
    m["gagar_sandbox_warm_pool_size"].labels(run=run, pool=pool).set(rng.randint(0, 4))


def operator_tick(m: Metrics, run: str, namespace: str, r: Regime) -> None:
    m["gagar_operator_reconciles_total"].labels(result="ok").inc()
    m["gagar_operator_reconcile_duration_seconds"].observe(0.05)
    m["gagar_operator_runs"].labels(phase="Running").set(1)
    ready = "True" if r.healthy else "False"
    for condition in ("Ready", "PoolsReady", "TrainerReady"):
        for status in ("True", "False", "Unknown"):
            gauge = m["gagar_run_condition"].labels(
                run=run, namespace=namespace, condition=condition, status=status
            )
            gauge.set(1 if status == ready else 0)


def read_regime(r: Regime) -> None:
    """Switch regime on a ``healthy``/``degraded`` line from stdin (non-blocking)."""
    while select.select([sys.stdin], [], [], 0)[0]:
        line = sys.stdin.readline()
        if not line:
            raise SystemExit(0)  # the test closed stdin: stop
        r.healthy = line.strip() != "degraded"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", default="demo")
    parser.add_argument("--namespace", default="gagar-test")
    args = parser.parse_args()
    metrics, regime, rng = Metrics(), Regime(), random.Random(0)
    server, _ = start_http_server(0, addr="127.0.0.1", registry=metrics.registry)
    print(server.server_port, flush=True)
    while True:
        read_regime(regime)
        trainer_tick(metrics, args.run, regime, rng)
        pools_tick(metrics, args.run, rng)
        operator_tick(metrics, args.run, args.namespace, regime)
        time.sleep(TICK)


if __name__ == "__main__":
    main()
