"""Prometheus alerting rules for gagar runs, built from the metric catalogue.

Each alert is a *signal* (a PromQL expression with one series per run) compared with a threshold,
so a test can check separately that the signal has data and that the comparison fires. The time
windows are parameters: production rules use minutes and hours, the Prometheus test uses seconds
with the same expressions, so it can drive a real server into every alert within a minute.
The generated file is plain Prometheus rules (``promtool check rules``) and the chart's
PrometheusRule embeds it, with the thresholds of the ``tunable`` alerts replaced by the chart's
``prometheusRule.thresholds`` (their defaults are these). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from gagar.metrics import CATALOGUE

BY = "namespace, run"


def metric(name: str, suffix: str = "") -> str:
    """A catalogue metric's exposed series name: fails for names not in the catalogue."""
    d = CATALOGUE[name]
    if suffix and d.kind != "histogram":
        raise ValueError(f"{name} is a {d.kind}, it has no {suffix} series")
    if suffix not in ("", "_bucket", "_sum", "_count"):
        raise ValueError(f"unknown histogram suffix {suffix!r}")
    return name + suffix


@dataclass(frozen=True)
class Windows:
    """Time windows of the rules (PromQL durations)."""

    short: str = "15m"
    """Recent behaviour (rates, the current mean length)."""
    long: str = "6h"
    """Baseline the recent behaviour is compared with."""
    resolution: str = "5m"
    """Step of the baseline subqueries."""
    stall: str = "30m"
    """No step completed in this long means the run is stalled."""
    hold: str = "10m"
    """How long a condition must hold before the alert fires (``for``)."""
    quality: str = "1h"
    """The grader's quality ratios: a step adds a few groups' counts, so they pool over longer."""


@dataclass(frozen=True, kw_only=True)
class Alert:
    name: str
    signal: str
    op: str
    threshold: str
    severity: str
    summary: str
    description: str

    tunable: bool = False
    """The chart's ``prometheusRule.thresholds.<name>`` replaces ``threshold`` (the expression's
    trailing number: the PrometheusRule template rewrites it)."""

    @property
    def expr(self) -> str:
        return f"{self.signal} {self.op} {self.threshold}"


# No grader-quality alert on fewer groups or pairs than this in its window: a single group's
# three pairs say little, and a run that grades nothing (no traffic) has nothing to alert on.
MIN_EVIDENCE = 10


def _share(num: str, den: str, w: str) -> str:
    """Counter ``num`` over counter ``den`` pooled over ``w``, per run; no series unless ``den``
    grew by ``MIN_EVIDENCE`` in ``w``."""
    n, d = metric(num), metric(den)
    share = f"sum by ({BY}) (rate({n}[{w}])) / sum by ({BY}) (rate({d}[{w}]))"
    return f"({share} and on ({BY}) sum by ({BY}) (increase({d}[{w}])) >= {MIN_EVIDENCE})"


def quality_alerts(w: Windows) -> list[Alert]:
    """The grader's quality while training (``gagar.grader.quality``), each from the trainer's
    own counters, so they hold wherever the grader ran; thresholds tunable in the chart."""
    return [
        Alert(
            name="GagarGraderUsableRateLow",
            signal=_share(
                "gagar_grader_usable_groups_total", "gagar_graded_groups_total", w.quality
            ),
            op="<",
            threshold="0.8",
            severity="warning",
            summary="Few usable grader rankings on run {{ $labels.run }}",
            description="Only {{ $value | humanizePercentage }} of the groups graded over "
            f"{w.quality} got the grader's own ranking; the rest fell back (heuristic or plain "
            "GRPO): the agentic grader is not grading. See its fallbacks by reason.",
            tunable=True,
        ),
        Alert(
            name="GagarGraderHeuristicAgreementLow",
            signal=_share(
                "gagar_grader_heuristic_agreeing_pairs_total",
                "gagar_grader_heuristic_pairs_total",
                w.quality,
            ),
            op="<",
            threshold="0.5",
            severity="warning",
            summary="Grader disagrees with the heuristic on run {{ $labels.run }}",
            description="The agentic grader's rankings over "
            f"{w.quality} order only {{{{ $value | humanizePercentage }}}} of the pairs of passes "
            "as the heuristic does: compare a few graded groups (grading_episodes.jsonl) before "
            "trusting its redistribution.",
            tunable=True,
        ),
        Alert(
            name="GagarGraderAuditInconsistent",
            signal=_share(
                "gagar_grader_audit_consistent_pairs_total",
                "gagar_grader_audit_pairs_total",
                w.quality,
            ),
            op="<",
            threshold="0.7",
            severity="warning",
            summary="Grader rankings depend on candidate order on run {{ $labels.run }}",
            description="Groups graded again with the candidates relabelled (spec.grader."
            f"auditFraction) kept only {{{{ $value | humanizePercentage }}}} of their pairs' order "
            f"over {w.quality}: the grader ranks by slot, not by content.",
            tunable=True,
        ),
    ]


def _mean_length(w: str) -> str:
    tokens = metric("gagar_response_tokens", "_sum")
    count = metric("gagar_response_tokens", "_count")
    return f"(sum by ({BY}) (rate({tokens}[{w}])) / sum by ({BY}) (rate({count}[{w}])))"


def _pools_not_ready() -> str:
    """PoolsReady not True, except for runs whose pools are down on purpose (suspended,
    complete or failed: the pools were scaled to zero)."""
    cond = metric("gagar_run_condition")
    not_ready = f'max by ({BY}) ({cond}{{condition="PoolsReady",status!="True"}})'
    stopped = f'{cond}{{condition=~"Suspended|Complete|Failed",status="True"}} == 1'
    return f"({not_ready} unless on ({BY}) max by ({BY}) ({stopped}))"


def alerts(w: Windows) -> list[Alert]:
    """The alert catalogue (docs/design.md §4): what goes wrong in GAGAR/GRPO runs, per run."""
    mean = _mean_length(w.short)
    variance = metric("gagar_gradient_variance")
    trace, signal = metric("gagar_gradient_noise_trace"), metric("gagar_gradient_signal_sq")

    def noise(window: str) -> str:  # B pooled over the window: one step's ‖G‖² is too noisy
        return (
            f"max by ({BY}) (avg_over_time({trace}[{window}]) / avg_over_time({signal}[{window}]))"
        )

    fallbacks = metric("gagar_grader_fallbacks_total")
    # both sides from the trainer (one target, the same run and namespace labels): the groups it
    # had graded, wherever the grader ran (a pool, an endpoint, in process)
    requests = metric("gagar_graded_groups_total")
    return [
        Alert(
            name="GagarLengthExplosion",
            signal=f"{mean} / quantile_over_time(0.5, {mean}[{w.long}:{w.resolution}])",
            op=">",
            threshold="2",
            severity="warning",
            summary="Response length of run {{ $labels.run }} more than doubled",
            description="Mean generated tokens per trajectory over the last "
            f"{w.short} is {{{{ $value | humanize }}}}× its median over {w.long}. Down-weighting "
            "without the λ rescale, or a length penalty that is off, lets lengths blow up.",
        ),
        Alert(
            name="GagarGraderFallbackRate",
            signal=f"sum by ({BY}) (rate({fallbacks}[{w.short}])) / clamp_min(sum by ({BY}) "
            f"(rate({requests}[{w.short}])), 1e-9)",
            op=">",
            threshold="0.2",
            severity="warning",
            summary="Grader fallbacks on run {{ $labels.run }}",
            description="{{ $value | humanizePercentage }} of graded groups fell back (timeout, error or "
            "malformed ranking): those groups train without redistribution.",
        ),
        Alert(
            name="GagarGradientVarianceSpike",
            signal=f"max by ({BY}) ({variance}) / clamp_min(max by ({BY}) "
            f"(quantile_over_time(0.5, {variance}[{w.long}])), 1e-12)",
            op=">",
            threshold="4",
            severity="warning",
            summary="Gradient variance spike on run {{ $labels.run }}",
            description="Micro-batch gradient variance is {{ $value | humanize }}× its median over "
            f"{w.long}; training may be about to diverge.",
        ),
        Alert(
            name="GagarGradientSignalLost",
            signal=f"{noise(w.short)} / clamp_min({noise(w.long)}, 1e-12)",
            op=">",
            threshold="10",
            severity="warning",
            summary="Gradient signal lost on run {{ $labels.run }}",
            description="The gradient noise scale (tr Σ and ‖G‖² pooled over "
            f"{w.short}) is {{{{ $value | humanize }}}}× its value pooled over "
            f"{w.long}: the step's batch is far below the noise scale, so updates are mostly "
            "noise (advantages collapsing to zero, or a stuck policy).",
        ),
        Alert(
            name="GagarStalledStep",
            signal=f"max by ({BY}) (changes({metric('gagar_trainer_step')}[{w.stall}]))",
            op="==",
            threshold="0",
            severity="critical",
            summary="Run {{ $labels.run }} made no training step",
            description=f"No training step completed in {w.stall} (plus {w.hold} pending): check the "
            "trainer pods, the rollout pool and the grader queue.",
        ),
        Alert(
            name="GagarPoolNotReady",
            signal=_pools_not_ready(),
            op="==",
            threshold="1",
            severity="warning",
            summary="Pools of run {{ $labels.run }} are not ready",
            description="The rollout, grader or sandbox pool of the run has fewer ready replicas than "
            "it needs; see `kubectl describe gr {{ $labels.run }}`.",
        ),
        *quality_alerts(w),
    ]


def rule_groups(w: Windows | None = None) -> dict[str, Any]:
    """The rules file: one group of alerting rules."""
    w = w or Windows()
    rules = [
        {
            "alert": a.name,
            "expr": a.expr,
            "for": w.hold,
            "labels": {"severity": a.severity},
            "annotations": {"summary": a.summary, "description": a.description},
        }
        for a in alerts(w)
    ]
    return {"groups": [{"name": "gagar", "rules": rules}]}


def rules_yaml(w: Windows | None = None) -> str:
    return yaml.safe_dump(rule_groups(w), sort_keys=False, width=120, allow_unicode=True)
