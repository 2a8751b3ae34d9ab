"""Lint the metric catalogue's names and labels, and check it registers and exposes cleanly."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gagar.metrics import ALLOWED_LABELS, CATALOGUE, Metrics

UNIT_WORDS = {"seconds", "bytes", "ratio", "total", "versions"}
# words that imply a unit and therefore need one of the base-unit suffixes
TIME_OR_SIZE = re.compile(r"(duration|latency|_time(_|$)|elapsed|memory)")


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_name_is_clean(name: str) -> None:
    d = CATALOGUE[name]
    assert re.fullmatch(r"gagar_[a-z][a-z0-9_]*", name), "prefix gagar_, snake case, no colons"
    assert "__" not in name and not name.endswith("_")
    assert (d.kind == "counter") == name.endswith("_total"), (
        "counters and only counters end in _total"
    )
    if TIME_OR_SIZE.search(name):
        assert name.endswith(("_seconds", "_bytes")), "durations and sizes carry their base unit"
    for bad in ("_ms", "_milliseconds", "_minutes", "_kb", "_mb", "_percent"):
        assert bad not in name, "base units only"
    assert set(d.labels) <= ALLOWED_LABELS, (
        f"labels outside the allow-list: {set(d.labels) - ALLOWED_LABELS}"
    )
    assert d.doc.strip()


def test_ratios_are_gauges() -> None:
    for name, d in CATALOGUE.items():
        if name.endswith("_ratio"):
            assert d.kind == "gauge"


def test_all_metrics_register_and_expose() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics["gagar_loss"].labels(run="r").set(0.5)
    metrics["gagar_grader_fallbacks_total"].labels(run="r", reason="timeout").inc()
    metrics["gagar_advantage"].labels(run="r", stage="after").observe(0.3)
    text = generate_latest(registry).decode()
    assert 'gagar_loss{run="r"} 0.5' in text
    assert 'gagar_grader_fallbacks_total{reason="timeout",run="r"} 1.0' in text
    assert "gagar_advantage_bucket" in text


def test_components_get_only_their_metrics() -> None:
    grader = Metrics(CollectorRegistry(), "grader")
    assert "gagar_grader_queue_depth" in grader
    assert "gagar_loss" not in grader
    with pytest.raises(KeyError, match="not in the catalogue"):
        grader["gagar_loss"]
