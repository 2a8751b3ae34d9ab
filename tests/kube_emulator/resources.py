"""The kinds the emulator serves, and the discovery documents that describe them (pure).

Built-in kinds come from a table; custom kinds are registered from CustomResourceDefinition
bodies. Every served version of a kind shares one storage (the API group + plural): no version
conversion happens, an object read through another version only gets its ``apiVersion`` renamed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass(frozen=True)
class ScalePaths:
    """JSON paths (``.spec.replicas`` style) of the scale subresource."""

    spec_replicas: str = ".spec.replicas"
    status_replicas: str = ".status.replicas"
    label_selector: str | None = None


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    status: bool = False
    scale: ScalePaths | None = None
    schema: dict | None = field(default=None, compare=False, hash=False)
    custom: bool = False
    columns: tuple[dict, ...] = field(default=(), compare=False, hash=False)  # printer columns

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def storage_key(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def subresources(self) -> list[str]:
        return [s for s, on in (("status", self.status), ("scale", self.scale)) if on]


def _b(
    group: str, version: str, plural: str, kind: str, namespaced: bool = True, **kw
) -> ResourceType:
    return ResourceType(group, version, plural, kind, namespaced, **kw)


BUILTINS: list[ResourceType] = [
    _b("", "v1", "namespaces", "Namespace", False, short_names=("ns",), status=True),
    _b("", "v1", "pods", "Pod", short_names=("po",), status=True),
    _b("", "v1", "services", "Service", short_names=("svc",), status=True),
    _b("", "v1", "configmaps", "ConfigMap", short_names=("cm",)),
    _b("", "v1", "secrets", "Secret"),
    _b("", "v1", "serviceaccounts", "ServiceAccount", short_names=("sa",)),
    _b(
        "",
        "v1",
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        short_names=("pvc",),
        status=True,
    ),
    _b("", "v1", "events", "Event", short_names=("ev",)),
    _b("", "v1", "resourcequotas", "ResourceQuota", short_names=("quota",), status=True),
    _b("", "v1", "nodes", "Node", False, short_names=("no",), status=True),
    _b("events.k8s.io", "v1", "events", "Event", short_names=("ev",)),
    _b(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        short_names=("deploy",),
        status=True,
        scale=ScalePaths(label_selector=".status.selector"),
    ),
    _b(
        "apps",
        "v1",
        "statefulsets",
        "StatefulSet",
        short_names=("sts",),
        status=True,
        scale=ScalePaths(label_selector=".status.selector"),
    ),
    _b("batch", "v1", "jobs", "Job", status=True),
    _b(
        "autoscaling",
        "v2",
        "horizontalpodautoscalers",
        "HorizontalPodAutoscaler",
        short_names=("hpa",),
        status=True,
    ),
    _b("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", short_names=("netpol",)),
    _b(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        short_names=("pdb",),
        status=True,
    ),
    _b("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    _b("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    _b("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    _b("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    _b(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
        short_names=("crd", "crds"),
        status=True,
    ),
    _b("coordination.k8s.io", "v1", "leases", "Lease"),
]


class CRDError(ValueError):
    """A CustomResourceDefinition the server would refuse (422 Invalid)."""


def _scale_from(spec: dict | None) -> ScalePaths | None:
    if spec is None:
        return None
    return ScalePaths(
        spec.get("specReplicasPath", ".spec.replicas"),
        spec.get("statusReplicasPath", ".status.replicas"),
        spec.get("labelSelectorPath"),
    )


def types_from_crd(crd: dict) -> list[ResourceType]:
    """The served versions of a CRD body, or :class:`CRDError` naming the first problem."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group, plural, kind = spec.get("group"), names.get("plural"), names.get("kind")
    if not group or not plural or not kind:
        raise CRDError("spec.group, spec.names.plural and spec.names.kind are required")
    if crd.get("metadata", {}).get("name") != f"{plural}.{group}":
        raise CRDError(
            f'metadata.name: Invalid value: must be spec.names.plural+"."+spec.group ({plural}.{group})'
        )
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        raise CRDError('spec.scope: Unsupported value: supported values: "Cluster", "Namespaced"')
    versions = spec.get("versions") or []
    if sum(bool(v.get("storage")) for v in versions) != 1:
        raise CRDError(
            "spec.versions: Invalid value: must have exactly one version marked as storage version"
        )
    out = []
    for v in versions:
        if not v.get("served", True):
            continue
        schema = (v.get("schema") or {}).get("openAPIV3Schema")
        if schema is None:
            raise CRDError(f"spec.versions[{v.get('name')}].schema.openAPIV3Schema: Required value")
        subs = v.get("subresources") or {}
        out.append(
            ResourceType(
                group,
                v["name"],
                plural,
                kind,
                spec["scope"] == "Namespaced",
                tuple(names.get("shortNames") or ()),
                "status" in subs,
                _scale_from(subs.get("scale")),
                schema,
                custom=True,
                columns=tuple(v.get("additionalPrinterColumns") or ()),
            )
        )
    return out


def api_resource_list(group_version: str, types: list[ResourceType]) -> dict:
    resources = []
    for t in sorted(types, key=lambda t: t.plural):
        resources.append(
            {
                "name": t.plural,
                "singularName": t.kind.lower(),
                "namespaced": t.namespaced,
                "kind": t.kind,
                "verbs": ALL_VERBS,
                "shortNames": list(t.short_names),
            }
        )
        for sub in t.subresources:
            kind = "Scale" if sub == "scale" else t.kind
            resources.append(
                {
                    "name": f"{t.plural}/{sub}",
                    "singularName": "",
                    "namespaced": t.namespaced,
                    "kind": kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }


def api_group_list(types: list[ResourceType]) -> dict:
    groups: dict[str, list[str]] = {}
    for t in types:
        if t.group and t.version not in groups.setdefault(t.group, []):
            groups[t.group].append(t.version)
    out = []
    for name, versions in sorted(groups.items()):
        entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
        out.append({"name": name, "versions": entries, "preferredVersion": entries[0]})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": out}
