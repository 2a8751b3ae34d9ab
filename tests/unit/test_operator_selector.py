"""The operator's run selector (``--run-selector``, the chart's ``runSelector``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gagar.operator.handlers import parse_selector, selects
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
