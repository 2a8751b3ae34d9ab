"""The label matchers of PromQL expressions, checked against the series real components emit
(tests only). Enough PromQL for gagar's own queries: ``name{label op "value", ...}`` selectors."""

from __future__ import annotations

import re
from collections.abc import Iterable

SELECTOR = re.compile(r"\b(gagar_[a-z0-9_]+|vllm:[a-z0-9_:]+)\s*(\{[^}]*\})?")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')
Series = dict[str, str]


def selectors(expr: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """Every ``(metric, [(label, op, value)])`` of an expression (histogram suffixes dropped)."""
    out = []
    for name, body in SELECTOR.findall(expr):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        out.append((base, MATCHER.findall(body or "")))
    return out


def _matches(series: Series, label: str, op: str, value: str) -> bool:
    have = series.get(label, "")
    if op == "=":
        return have == value
    if op == "!=":
        return have != value
    hit = re.fullmatch(value, have) is not None
    return hit if op == "=~" else not hit


def unmatched(expr: str, series: dict[str, list[Series]]) -> list[str]:
    """The selectors of ``expr`` that no series of its metric satisfies (metric absent too)."""
    bad = []
    for name, matchers in selectors(expr):
        candidates = series.get(name, [])
        if not any(all(_matches(s, *m) for m in matchers) for s in candidates):
            bad.append(f"{name}{{{', '.join(''.join(m) for m in matchers)}}}")
    return bad


def by_metric(label_sets: Iterable[Series]) -> dict[str, list[Series]]:
    """Series from Prometheus' ``/api/v1/series`` grouped by base metric name."""
    out: dict[str, list[Series]] = {}
    for labels in label_sets:
        base = re.sub(r"_(bucket|sum|count)$", "", labels["__name__"])
        out.setdefault(base, []).append(labels)
    return out


def rendered(expr: str, namespace: str, run: str, rate_interval: str) -> str:
    """A dashboard query as Grafana sends it, with its variables set."""
    return (
        expr.replace("$namespace", namespace)
        .replace("$run", run)
        .replace("$__rate_interval", rate_interval)
    )
