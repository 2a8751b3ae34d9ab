"""pytest fixtures; import them into a test module or a conftest:

    from tests.kube_emulator.fixtures import kube, kube_client  # noqa: F401

``kube`` is a started :class:`KubeEmulator` (fresh per test, stopped after it); ``kube_client``
is a ``kubernetes.client.ApiClient`` pointing at it. ``cluster`` is a :class:`RealCluster` on
``GAGAR_TEST_KUBECONFIG`` when that is set, else a fresh emulator: scenario tests that use only
the shared object API run on both; guard emulator-only controls with ``cluster.emulated``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from .cluster import RealCluster
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


@pytest.fixture
def cluster() -> Iterator[KubeEmulator | RealCluster]:
    kubeconfig = os.environ.get("GAGAR_TEST_KUBECONFIG")
    if kubeconfig:
        yield RealCluster(kubeconfig)
        return
    with KubeEmulator() as emulator:
        yield emulator
