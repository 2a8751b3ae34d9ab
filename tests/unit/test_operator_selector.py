"""The operator's run selector (``--run-selector``, the chart's ``runSelector``)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import kopf
import pytest

from gagar.operator.handlers import MANAGED, configure_settings, parse_selector, selects
from tests.support.tools import ROOT


@pytest.mark.parametrize(
    ("selector", "labels", "want"),
    [
        ("", {}, True),
        ("team=a", {"team": "a"}, True),
        ("team==a", {"team": "b"}, False),
        ("team!=a", {}, True),
        ("team=a,!canary", {"team": "a", "canary": "yes"}, False),
        ("team", {"team": ""}, True),
        ("team", {}, False),
    ],
)
def test_equality_selectors_match_as_the_api_server(
    selector: str, labels: dict[str, str], want: bool
) -> None:
    assert selects(selector, labels) is want


def test_set_based_terms_are_refused() -> None:
    with pytest.raises(ValueError, match="set-based"):
        parse_selector("team in (a,b)")
    out = subprocess.run(
        [sys.executable, "-m", "gagar.cli", "operator", "--run-selector", "team in (a)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "set-based" in out.stderr


def test_the_declared_kopf_filters_watches_on_the_server() -> None:
    """The watches' label selectors are kopf's ``settings.watching.label_selectors``, which kopf
    has since 1.45: the operator extra may not allow an older kopf (AttributeError at start)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (kopf_req,) = [r for r in extras["optional-dependencies"]["operator"] if r.startswith("kopf")]
    least = re.fullmatch(r"kopf>=(\d+)\.(\d+)(\.\d+)?", kopf_req)
    assert least and (int(least[1]), int(least[2])) >= (1, 45), kopf_req
    settings = kopf.OperatorSettings()
    configure_settings(settings, "team=a")
    selectors = settings.watching.label_selectors  # what kopf's watch request sends
    managed = ",".join(f"{k}={v}" for k, v in sorted(MANAGED.items()))
    assert selectors.collect(kopf.Resource("batch", "v1", "jobs")) == [managed]
    assert selectors.collect(kopf.Resource("gagar.dev", "v1alpha1", "gagarruns")) == ["team=a"]
