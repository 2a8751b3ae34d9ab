"""The grader-quality alerts under ``promtool test rules``: each fires on a run whose share is low
with enough groups or pairs behind it, never on a healthy run, an idle run (no traffic) or a run
with too few pairs to say; the chart's ``prometheusRule.thresholds`` move them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gagar.alerts import MIN_EVIDENCE, Windows, alerts, rules_yaml
from tests.support.tools import helm_template, run, system_tool

# alert -> (numerator, denominator) counters of its share
SHARES = {
    "GagarGraderUsableRateLow": ("gagar_grader_usable_groups_total", "gagar_graded_groups_total"),
    "GagarGraderHeuristicAgreementLow": (
        "gagar_grader_heuristic_agreeing_pairs_total",
        "gagar_grader_heuristic_pairs_total",
    ),
    "GagarGraderAuditInconsistent": (
        "gagar_grader_audit_consistent_pairs_total",
        "gagar_grader_audit_pairs_total",
    ),
}
# run -> (numerator, denominator) growth per minute, over an hour
RUNS = {
    "bad": ("1", "4"),  # a share of 0.25, 240 groups or pairs an hour
    "good": ("4", "4"),
    "idle": ("0", "0"),  # grades nothing: no alert on zero traffic
    "thin": ("0", "0.1"),  # a share of 0, but 6 groups or pairs an hour: too few to say
}


def _inputs(num: str, den: str) -> list[dict[str, str]]:
    out = []
    for name, (dn, dd) in RUNS.items():
        labels = f'run="{name}",namespace="ns"'
        out += [
            {"series": f"{num}{{{labels}}}", "values": f"0+{dn}x60"},
            {"series": f"{den}{{{labels}}}", "values": f"0+{dd}x60"},
        ]
    return out


def _annotations(alert: str, run_name: str) -> dict[str, str]:
    """The alert's annotations as Prometheus fills them in for ``run_name`` (its share in %)."""
    (a,) = [a for a in alerts(Windows()) if a.name == alert]
    num, den = (float(x) for x in RUNS[run_name])
    fill = {"{{ $labels.run }}": run_name, "{{ $value | humanizePercentage }}": f"{num / den:.0%}"}
    out = {"summary": a.summary, "description": a.description}
    for key, text in out.items():
        for template, value in fill.items():
            text = text.replace(template, value)
        out[key] = text
    return out


def _promtool_test(tmp_path: Path, rules: dict[str, Any], alert: str, firing: list[str]) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    num, den = SHARES[alert]
    exp = [
        {
            "exp_labels": {"severity": "warning", "run": r, "namespace": "ns"},
            "exp_annotations": _annotations(alert, r),
        }
        for r in firing
    ]
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": _inputs(num, den),
                "alert_rule_test": [
                    {"eval_time": "50m", "alertname": alert, "exp_alerts": exp},
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    proc = run([system_tool("promtool"), "test", "rules", tmp_path / "test.yaml"], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_quality_alerts_are_the_tunable_ones() -> None:
    assert {a.name for a in alerts(Windows()) if a.tunable} == set(SHARES)
    assert MIN_EVIDENCE > 6  # the "thin" run's hour stays below it


@pytest.mark.parametrize("alert", sorted(SHARES))
def test_fires_on_a_low_share_with_traffic_only(tmp_path: Path, alert: str) -> None:
    rules = yaml.safe_load(rules_yaml(Windows(hold="1m")))
    _promtool_test(tmp_path, rules, alert, ["bad"])


@pytest.mark.parametrize("alert", sorted(SHARES))
def test_the_charts_threshold_moves_the_alert(tmp_path: Path, alert: str) -> None:
    """Below the "bad" run's share of 0.25 it stays silent, just above it fires."""
    for value, firing in ((0.2, []), (0.3, ["bad"])):
        objs = helm_template(
            "--set", "prometheusRule.enabled=true",
            "--set-json", f"prometheusRule.thresholds.{alert}={value}",
        )  # fmt: skip
        (rule,) = [o for o in objs if o["kind"] == "PrometheusRule"]
        spec = rule["spec"]
        (expr,) = [r["expr"] for r in spec["groups"][0]["rules"] if r["alert"] == alert]
        assert expr.endswith(f"< {value}")
        for r in spec["groups"][0]["rules"]:
            r["for"] = "1m"
        _promtool_test(tmp_path, spec, alert, firing)
