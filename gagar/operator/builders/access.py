"""ServiceAccounts and least-privilege RBAC of a run's pods.

Only the trainer talks to the API: it reads its ConfigMap, writes its progress ConfigMap (by name;
``resourceNames`` pins both) and lists EndpointSlices to find every rollout replica for weight
sync. With ``sandbox.isolation: agent-sandbox`` the trainer, and an agentic grader pool, also
claim Sandboxes: create, watch and delete SandboxClaims, read Sandboxes (their pod IPs); the
grader then gets a Role and a token for that alone. Rollout and sandbox pods get no Role and no
mounted token. No Role grants anything on
``gagar.dev``: only the operator patches a GagarRun (its status).
"""

from __future__ import annotations

from gagar.operator.builders.common import BuildContext, Manifest, metadata, name, obj
from gagar.operator.builders.overlay import service_account_annotations
from gagar.spec import GagarRun

RBAC = "rbac.authorization.k8s.io/v1"


def components(run: GagarRun) -> list[str]:
    """Components with pods (and so a ServiceAccount) in this run."""
    out = ["trainer"]
    out += [
        c
        for c, pool in (("rollout", run.spec.rollout), ("grader", run.spec.grader))
        if pool.endpoint is None
    ]
    return out + (["sandbox"] if run.spec.sandbox.backend == "pods" else [])


CLAIM_RULES = [
    {
        "apiGroups": ["extensions.agents.x-k8s.io"],
        "resources": ["sandboxclaims"],
        "verbs": ["create", "get", "list", "watch", "delete"],
    },
    {"apiGroups": ["agents.x-k8s.io"], "resources": ["sandboxes"], "verbs": ["get"]},
]


def claims_sandboxes(run: GagarRun, component: str) -> bool:
    """Whether ``component``'s pods claim agent-sandbox Sandboxes (one per session)."""
    if run.spec.sandbox.isolation != "agent-sandbox":
        return False
    if component == "grader":
        return run.spec.grader.kind == "agentic" and run.spec.grader.endpoint is None
    return component == "trainer"


def build_service_account(run: GagarRun, ctx: BuildContext, component: str) -> Manifest:
    annotations = service_account_annotations(run, component)
    meta = metadata(run, ctx, name(run, component), component, annotations=annotations)
    token = component == "trainer" or claims_sandboxes(run, component)
    return obj("v1", "ServiceAccount", meta, automountServiceAccountToken=token)


def build_trainer_role(run: GagarRun, ctx: BuildContext) -> Manifest:
    rules = [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "verbs": ["get"],
            "resourceNames": [name(run, "config"), name(run, "progress")],
        },
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "verbs": ["patch", "update"],
            "resourceNames": [name(run, "progress")],
        },
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        },
        *(CLAIM_RULES if claims_sandboxes(run, "trainer") else []),
    ]
    return obj(RBAC, "Role", metadata(run, ctx, name(run, "trainer"), "trainer"), rules=rules)


def build_role_binding(run: GagarRun, ctx: BuildContext, component: str) -> Manifest:
    subject = {"kind": "ServiceAccount", "name": name(run, component)}
    if run.metadata.namespace:
        subject["namespace"] = run.metadata.namespace
    return obj(
        RBAC,
        "RoleBinding",
        metadata(run, ctx, name(run, component), component),
        roleRef={
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": name(run, component),
        },
        subjects=[subject],
    )


def build_trainer_role_binding(run: GagarRun, ctx: BuildContext) -> Manifest:
    return build_role_binding(run, ctx, "trainer")


def build_access(run: GagarRun, ctx: BuildContext) -> list[Manifest]:
    accounts = [build_service_account(run, ctx, c) for c in components(run)]
    out = [*accounts, build_trainer_role(run, ctx), build_trainer_role_binding(run, ctx)]
    if claims_sandboxes(run, "grader"):
        meta = metadata(run, ctx, name(run, "grader"), "grader")
        out += [obj(RBAC, "Role", meta, rules=CLAIM_RULES), build_role_binding(run, ctx, "grader")]
    return out
