"""Dashboards and alert rules as built from the catalogue: names, structure, layout, windows."""

from __future__ import annotations

import json
import re

import pytest

from gagar.alerts import Windows, alerts, metric, rule_groups
from gagar.chart_files import chart_files
from gagar.dashboards import DASHBOARDS, dashboard_json, queries
from gagar.metrics import CATALOGUE

SERIES = re.compile(r"\bgagar_[a-z0-9_]+")


def test_metric_rejects_names_outside_the_catalogue() -> None:
    with pytest.raises(KeyError):
        metric("gagar_not_a_metric")
    with pytest.raises(ValueError, match="no _bucket"):
        metric("gagar_loss", "_bucket")
    with pytest.raises(ValueError, match="suffix"):
        metric("gagar_turns", "_max")
    assert metric("gagar_turns", "_bucket") == "gagar_turns_bucket"


def exposed_names() -> set[str]:
    names = set()
    for name, d in CATALOGUE.items():
        if d.kind == "histogram":
            names |= {name + s for s in ("_bucket", "_sum", "_count")}
        else:
            names.add(name)
    return names


def test_every_series_in_queries_and_rules_is_exported() -> None:
    exported = exposed_names()
    exprs = [q for build in DASHBOARDS for q in queries(build())]
    exprs += [a.expr for a in alerts(Windows())]
    for expr in exprs:
        unknown = set(SERIES.findall(expr)) - exported
        assert not unknown, f"{expr} uses series no component exports: {unknown}"


@pytest.mark.parametrize("build", DASHBOARDS, ids=lambda b: b.__name__)
def test_dashboard_structure(build) -> None:
    d = dashboard_json(build())
    panels = d["panels"]
    assert [p["id"] for p in panels] == list(range(1, len(panels) + 1))
    cells = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        cell = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & cell, f"panel {p['title']} overlaps another"
        cells |= cell
        if p["type"] != "row":
            assert p["targets"] and p["datasource"]["uid"] == "${datasource}"
            assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
    names = [v["name"] for v in d["templating"]["list"]]
    assert names == ["datasource", "namespace", "run"]


def test_dashboard_uids_are_unique_and_files_exist() -> None:
    uids = [build().uid for build in DASHBOARDS]
    assert len(set(uids)) == len(uids)
    files = chart_files()
    for uid in uids:
        text = files[f"charts/gagar/dashboards/{uid}.json"]()
        assert json.loads(text)["uid"] == uid


def test_queries_filter_by_the_run_variables() -> None:
    for build in DASHBOARDS:
        for q in queries(build()):
            if "gagar_operator_" not in q:
                assert 'run=~"$run"' in q and 'namespace=~"$namespace"' in q, q


def test_rule_windows_are_parameters() -> None:
    fast = Windows(short="5s", long="60s", resolution="1s", stall="5s", hold="2s")
    text = json.dumps(rule_groups(fast))
    assert "15m" not in text and "6h" not in text and "30m" not in text
    assert all(r["for"] == "2s" for r in rule_groups(fast)["groups"][0]["rules"])
    prod = json.dumps(rule_groups())
    assert "[15m]" in prod and "[6h:5m]" in prod and "[30m]" in prod


def test_every_alert_groups_by_run_and_has_docs() -> None:
    for a in alerts(Windows()):
        assert "by (namespace, run)" in a.signal
        assert a.severity in ("warning", "critical")
        assert "{{ $labels.run }}" in a.summary
        assert a.expr == f"{a.signal} {a.op} {a.threshold}"
    assert {a.name for a in alerts(Windows())} == {
        "GagarLengthExplosion",
        "GagarGraderFallbackRate",
        "GagarGradientVarianceSpike",
        "GagarGradientSignalLost",
        "GagarStalledStep",
        "GagarPoolNotReady",
        "GagarGraderUsableRateLow",
        "GagarGraderHeuristicAgreementLow",
        "GagarGraderAuditInconsistent",
    }
