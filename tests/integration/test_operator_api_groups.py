"""One reconcile reads the cluster's API groups once: what it builds, what it refuses and what it
prunes agree. Against the in-process API emulator, without kopf (``Reconciler.reconcile``).

The JobSet CRD appearing while a reconcile runs (a cache that expires between two reads) once
made the operator build the trainer of a ``useJobSet`` run from the first read (no JobSet API:
a Job) and clear the refusal from the second (the API is there): a quiet fallback to a Job, which
then stayed the trainer's kind for the run's life. Seen as a flake of
``test_jobset_crd_installed_mid_run_keeps_the_running_job`` under load; here made certain.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gagar.crd import build_crd
from gagar.metrics import Metrics
from gagar.operator.builders.common import JOBSET
from gagar.operator.handlers import OperatorConfig, Reconciler
from gagar.operator.kube import RUN_API, Kube
from tests.integration.test_operator_scenarios import manifest, optional_crd
from tests.kube_emulator import KubeEmulator


class LateGroups(Kube):
    """The API group list as a watcher of a CRD being installed sees it: the first answer is from
    before the JobSet CRD was established, every later one from after."""

    def __init__(self, kube: Kube) -> None:
        super().__init__(kube.client)
        self.answers = 0

    def api_groups(self) -> set[str]:
        groups = super().api_groups()
        self.answers += 1
        return groups - {JOBSET} if self.answers == 1 else groups


def test_a_jobset_api_appearing_mid_reconcile_never_builds_a_job_for_a_jobset_run() -> None:
    with KubeEmulator() as emulator:
        emulator.create(build_crd())
        emulator.create(optional_crd(JOBSET, "JobSet", "jobsets", "v1alpha2"))
        client = emulator.api_client()
        kube = LateGroups(Kube(client))
        run = {**manifest(**{"trainer.useJobSet": True}), "apiVersion": RUN_API}
        run["metadata"]["namespace"] = "default"
        name = run["metadata"]["name"]
        kube.create(run)
        config = OperatorConfig(integrations=frozenset({JOBSET}), crd_cache_seconds=0.0)
        reconciler = Reconciler(kube, Metrics(CollectorRegistry(), "operator"), config)
        first = reconciler.reconcile(run)
        assert first is not None
        assert kube.get("batch/v1", "Job", "default", f"{name}-trainer") is None
        assert kube.answers == 1  # one read of the API groups per reconcile
        stalled = next(c for c in first.status.conditions if c.type == "Stalled")
        assert (stalled.status, stalled.reason) == ("True", "JobSetUnavailable")
        reconciler.reconcile(run)  # the API is there now: the JobSet, and still no Job
        assert kube.get(f"{JOBSET}/v1alpha2", "JobSet", "default", f"{name}-trainer") is not None
        assert kube.get("batch/v1", "Job", "default", f"{name}-trainer") is None
        client.close()
