"""Pure builders: ``GagarRun`` (+ a ``BuildContext`` of observed facts) → child manifests.

No ``os.environ``, no clock, no API calls: the handler discovers the uid, the installed CRDs, the
trainer attempt and whether the run is terminal, and passes them in. Names are deterministic, so
applying the output twice (an operator restarted mid-reconcile) never duplicates a child.
"""

from __future__ import annotations

from gagar.operator.builders.access import build_access
from gagar.operator.builders.common import (
    AGENT_SANDBOX,
    ATTEMPT_ANNOTATION,
    JOBSET,
    OPTIONAL_CRDS,
    TEMPLATE_ANNOTATION,
    BuildContext,
    Manifest,
    Scraper,
    labels,
    name,
    with_quota_limits,
)
from gagar.operator.builders.config import (
    build_checkpoint_pvc,
    build_config_map,
    build_progress_config_map,
)
from gagar.operator.builders.images import build_image_pools
from gagar.operator.builders.monitoring import build_monitors
from gagar.operator.builders.pools import build_pools
from gagar.operator.builders.sandbox import build_sandbox
from gagar.operator.builders.trainer import build_trainer, queued, uses_jobset
from gagar.spec import GagarRun

# Kinds the operator creates, as (apiVersion, kind): what it watches and prunes by label.
CHILD_KINDS = (
    ("v1", "ConfigMap"),
    ("v1", "PersistentVolumeClaim"),
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("v1", "Service"),
    ("batch/v1", "Job"),
    ("jobset.x-k8s.io/v1alpha2", "JobSet"),
    ("apps/v1", "Deployment"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"),
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("policy/v1", "PodDisruptionBudget"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("extensions.agents.x-k8s.io/v1beta1", "SandboxTemplate"),
    ("extensions.agents.x-k8s.io/v1beta1", "SandboxWarmPool"),
)


def build_all(run: GagarRun, ctx: BuildContext | None = None) -> list[Manifest]:
    """Every child of ``run`` in apply order (config and identities before the pods that use them)."""
    ctx = ctx or BuildContext()
    objs = [
        build_config_map(run, ctx),
        build_progress_config_map(run, ctx),
        *build_checkpoint_pvc(run, ctx),
        *build_access(run, ctx),
        *build_sandbox(run, ctx),
        *build_image_pools(run, ctx),
        *build_pools(run, ctx),
        *build_trainer(run, ctx),
        *build_monitors(run, ctx),
    ]
    return with_quota_limits(objs, ctx.quota_limits)


__all__ = [
    "AGENT_SANDBOX",
    "ATTEMPT_ANNOTATION",
    "CHILD_KINDS",
    "JOBSET",
    "OPTIONAL_CRDS",
    "TEMPLATE_ANNOTATION",
    "BuildContext",
    "Manifest",
    "Scraper",
    "build_all",
    "labels",
    "name",
    "queued",
    "uses_jobset",
]
