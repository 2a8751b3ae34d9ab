"""pytest fixtures; import them into a test module or a conftest:

    from tests.kube_emulator.fixtures import kube, kube_client  # noqa: F401

``kube`` is a started :class:`KubeEmulator` (fresh per test, stopped after it); ``kube_client``
is a ``kubernetes.client.ApiClient`` pointing at it. When ``GAGAR_TEST_KUBECONFIG`` is set, tests
that can also run against a real cluster should use that file instead of ``kube.kubeconfig_path``;
the emulator-only controls (faults, job outcomes) have no real-cluster equivalent.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .emulator import KubeEmulator


@pytest.fixture
def kube() -> Iterator[KubeEmulator]:
    with KubeEmulator() as emulator:
        yield emulator


@pytest.fixture
def kube_client(kube: KubeEmulator) -> Iterator[Any]:
    client = kube.api_client()
    try:
        yield client
    finally:
        client.close()
