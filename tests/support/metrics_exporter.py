"""A process exporting every catalogue metric, to drive the alerts into firing (tests only).

The dashboards are checked against the real components (``gagar train``, ``gagar sandbox serve``,
``gagar grader serve``, ``gagar operator``); this exporter only makes the *alerts* fire on demand.
Its series are derived from the catalogue: every metric of every component, with each label set
``gagar.metrics.series_labels`` makes from the run's labels, the definition's enums and a few
values of the free labels (``EXTRA``); every 0.2 s each counter grows, each gauge takes a value and
each histogram gets observations. On top of that, the signals the alerts watch follow one of two
regimes read from stdin: ``healthy`` (steps advance, stable lengths, gradient variance and noise
scale, no grader fallbacks, the grader agreeing with the heuristic and its audits, pools ready)
and ``degraded`` (steps stop, lengths and gradient variance jump, the gradient signal all but
vanishes, most graded groups fall back, the grader disagrees with the heuristic and with itself
relabelled, pools not ready). It prints its port first.

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

from gagar.metrics import CATALOGUE, Metrics, series_labels

TICK = 0.2
EXTRA = {
    "stage": (
        "rollout",
        "grading_wait",
        "update",
        "sync",
        "checkpoint",
        "other",
        "before",
        "after",
    ),
    "reason": ("grader_timeout",),
    "kind": ("redundant",),
    "phase": ("Running",),
    "result": ("ok",),
}
# the grader's quality: (alike, compared) counters; degraded, 1 of every 4 alike
QUALITY = (
    ("gagar_grader_usable_groups_total", "gagar_graded_groups_total"),
    ("gagar_grader_heuristic_agreeing_pairs_total", "gagar_grader_heuristic_pairs_total"),
    ("gagar_grader_audit_consistent_pairs_total", "gagar_grader_audit_pairs_total"),
)
# the alerts' signals: set by ``signals`` below, not by the generic tick
DRIVEN = {
    "gagar_trainer_step",
    "gagar_response_tokens",
    "gagar_gradient_variance",
    "gagar_gradient_noise_trace",
    "gagar_gradient_signal_sq",
    "gagar_grader_fallbacks_total",
    "gagar_graded_groups_total",
    "gagar_run_condition",
    *(n for pair in QUALITY for n in pair),
}


@dataclass
class Regime:
    healthy: bool = True
    step: int = 0


def label_sets(name: str, run: str, namespace: str) -> list[dict[str, str]]:
    d = CATALOGUE[name]
    fixed = {"run": run, "namespace": namespace, "pool": d.component}
    extra = {k: v for k, v in EXTRA.items() if k in d.labels and k not in dict(d.enums)}
    combos = [{}]
    for label, values in extra.items():
        combos = [{**c, label: v} for c in combos for v in values]
    return [
        {**base, **c}
        for c in combos
        for base in series_labels(d, {**fixed, **c})
        if base or not d.labels
    ]


def generic_tick(m: Metrics, run: str, namespace: str, rng: random.Random) -> None:
    for name, d in CATALOGUE.items():
        if name in DRIVEN:
            continue
        for labels in label_sets(name, run, namespace):
            series = m[name].labels(**labels) if labels else m[name]
            if d.kind == "counter":
                series.inc(rng.choice((0, 1, 2)))
            elif d.kind == "gauge":
                series.set(rng.uniform(0.5, 1.5))
            else:
                for _ in range(4):
                    series.observe(rng.uniform(0.1, 2.0))


def signals(m: Metrics, run: str, namespace: str, r: Regime, rng: random.Random) -> None:
    if r.healthy:
        r.step += 1
    m["gagar_trainer_step"].labels(run=run).set(r.step)
    length = 400 if r.healthy else 4000
    for _ in range(8):
        m["gagar_response_tokens"].labels(run=run).observe(length * rng.uniform(0.8, 1.2))
    scale = 1.0 if r.healthy else 20.0
    m["gagar_gradient_variance"].labels(run=run).set(rng.uniform(0.9, 1.1) * scale)
    # the noise scale's parts: degraded, the noise grows and the signal all but vanishes (the
    # short window's B is then thousands of times the long window's, where healthy steps remain)
    m["gagar_gradient_noise_trace"].labels(run=run).set(rng.uniform(0.9, 1.1) * scale)
    signal_sq = 1.0 if r.healthy else 0.01
    m["gagar_gradient_signal_sq"].labels(run=run).set(rng.uniform(0.9, 1.1) * signal_sq)
    for alike, compared in QUALITY:  # degraded: 3 of 4 fall back, disagree, change order
        m[compared].labels(run=run).inc(4)
        m[alike].labels(run=run).inc(4 if r.healthy else 1)
    m["gagar_grader_fallbacks_total"].labels(run=run, reason="timeout").inc(0 if r.healthy else 3)
    ready = "True" if r.healthy else "False"
    for condition in ("Ready", "PoolsReady", "TrainerReady"):
        for status in ("True", "False", "Unknown"):
            m["gagar_run_condition"].labels(
                run=run, namespace=namespace, condition=condition, status=status
            ).set(1 if status == ready else 0)


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
        generic_tick(metrics, args.run, args.namespace, rng)
        signals(metrics, args.run, args.namespace, regime, rng)
        time.sleep(TICK)


if __name__ == "__main__":
    main()
