"""Reading a component's /metrics text: samples by name and labels, and which catalogue metrics
of a component it lists (tests only)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gagar.metrics import CATALOGUE, Component


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    """The sample ``name`` whose labels include ``labels`` (exactly one must match)."""
    found = [v for (n, ls), v in samples(text).items() if n == name and set(labels.items()) <= ls]
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
    return found[0]


def missing(text: str, component: Component) -> list[str]:
    """Catalogue metrics of ``component`` with no sample in ``text``."""
    names = {n for n, _ in samples(text)}
    wanted = [name for name, d in CATALOGUE.items() if d.component == component]
    series = {
        name: name + "_count" if CATALOGUE[name].kind == "histogram" else name for name in wanted
    }
    return [name for name in wanted if series[name] not in names]


def label_sets(text: str) -> dict[str, set[frozenset[tuple[str, str]]]]:
    """Per catalogue metric: the label sets of its samples (histograms by their ``_count``)."""
    out: dict[str, set[frozenset[tuple[str, str]]]] = {}
    for (name, labels), _ in samples(text).items():
        base = name.removesuffix("_count") if name.endswith("_count") else name
        if base in CATALOGUE and (CATALOGUE[base].kind == "histogram") == name.endswith("_count"):
            out.setdefault(base, set()).add(labels)
    return out
