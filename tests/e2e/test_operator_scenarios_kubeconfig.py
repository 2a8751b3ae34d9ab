"""The operator scenarios (tests/integration/test_operator_scenarios.py) against an emulator served
by a process of its own and reached only through kubeconfigs, as a cluster is: the admin's and
the operator's ServiceAccount's. ``make test`` runs each scenario once, on an emulator in its own
process; this second run of all of them (a process start each, about two minutes of the default
suite's time on 2 cores) is an e2e test. Against a real cluster (``GAGAR_TEST_KUBECONFIG``) the
scenarios run from tests/integration, not here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration import test_operator_scenarios as scenarios
from tests.integration.test_operator_scenarios import *  # noqa: F403  (the scenarios, collected here too)

pytestmark = pytest.mark.skipif(
    scenarios.REAL is not None, reason="GAGAR_TEST_KUBECONFIG: tests/integration runs the scenarios"
)


@pytest.fixture(params=["kubeconfig"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[scenarios.Env]:
    yield from scenarios.make_env(request.param, tmp_path)
