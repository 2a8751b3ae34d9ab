"""Grafana dashboards as small dataclasses, their PromQL helpers and their JSON rendering.

The helpers build every query through ``gagar.alerts.metric`` (catalogue names only) and filter
by the dashboards' ``$namespace`` and ``$run`` variables; ``dashboard_json`` lays panels out two per
row under collapsible row headers. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gagar.alerts import metric

SEL = 'namespace=~"$namespace", run=~"$run"'
RATE = "$__rate_interval"
BY = "namespace, run"


@dataclass(frozen=True, kw_only=True)
class Panel:
    title: str
    targets: list[tuple[str, str]]  # (PromQL, legend)
    unit: str = "short"
    description: str = ""
    kind: str = "timeseries"


@dataclass(frozen=True, kw_only=True)
class Row:
    """A titled row of panels, two per line."""

    title: str
    panels: list[Panel]


@dataclass(frozen=True, kw_only=True)
class Dashboard:
    uid: str
    title: str
    description: str
    rows: list[Row] = field(default_factory=list)


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


def ratio(
    num: str, den: str, window: str = RATE, legend: str = "{{run}}", sel: str = SEL
) -> tuple[str, str]:
    """Counter ``num`` over counter ``den``, each summed per run over ``window``: the share pooled
    over the window (a longer one than the rate interval for counts of a few per step); no value
    while ``den`` did not grow."""
    n, d = metric(num), metric(den)
    expr = f"sum by ({BY}) (rate({n}{{{sel}}}[{window}])) / sum by ({BY}) (rate({d}{{{sel}}}[{window}]))"
    return expr, legend


def by_stage(name: str) -> tuple[str, str]:
    return gauge(name, "{{stage}} {{run}}")


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
    for r in d.rows:
        title, row = r.title, r.panels
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


def dashboard_text(build: Callable[[], Dashboard]) -> str:
    return json.dumps(dashboard_json(build()), indent=2, ensure_ascii=False) + "\n"


def queries(d: Dashboard) -> list[str]:
    """Every PromQL query of a dashboard (for tests and linting)."""
    return [expr for row in d.rows for p in row.panels for expr, _ in p.targets]
