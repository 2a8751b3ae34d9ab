"""The Helm chart's values, as pydantic models: the source of ``charts/gagar/values.schema.json``.

Helm validates every install's values against that schema, so a typo in a values file
(``serviceMonitor.enable``) is an error at ``helm install`` time instead of a silently ignored key.
The chart README's values table is generated from the same schema. Field names are camelCase
(Helm convention); every model forbids unknown keys. Pure: no I/O.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any, Literal

from pydantic import BaseModel, Field

from gagar.alerts import Windows, alerts
from gagar.spec import CONFIG_MODEL, Quantity

OPERATOR_IMAGE = "ghcr.io/gagar-dev/gagar-operator"
NAMESPACE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class Values(BaseModel):
    """Base of every values model: camelCase keys, no unknown keys, attribute docstrings."""

    model_config = CONFIG_MODEL


class Image(Values):
    """A container image."""

    repository: str = OPERATOR_IMAGE
    """Image repository."""
    tag: str = ""
    """Image tag; empty uses the chart's appVersion."""
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """Kubernetes imagePullPolicy."""


class Images(Values):
    """Where gagar's images are pulled from."""

    registry: str = Field(default="", max_length=253, pattern=r"^([^:/@]+(:[0-9]+)?(/[^:@]+)*)?$")
    """Registry prefix gagar's images were pushed to (``make images PUSH=<prefix>``, e.g.
    ``registry.example.com/ml``; empty: ``ghcr.io/gagar-dev``, where nothing is published). The
    operator then runs ``<prefix>/gagar-operator:<tag>`` (unless ``operator.image.repository``
    names another image), and ``--image-registry`` makes every run that keeps a default image
    (``spec.trainer.image``, ``spec.rollout.image``, ``spec.grader.image``,
    ``spec.sandbox.image``) pull ``<prefix>/gagar-<component>:<tag>``."""


class Resources(Values):
    """Compute resources of the operator container."""

    requests: dict[str, Quantity] = Field(
        default_factory=lambda: {"cpu": "100m", "memory": "256Mi"}
    )
    """Requested resources."""
    limits: dict[str, Quantity] = Field(default_factory=lambda: {"memory": "512Mi"})
    """Resource limits."""


class ServiceAccount(Values):
    """The operator's ServiceAccount."""

    create: bool = True
    """Create the ServiceAccount."""
    name: str = ""
    """Name; empty uses the release's full name."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations, e.g. for workload identity."""


class Rbac(Values):
    """The operator's RBAC: least privilege, no access to Secrets."""

    create: bool = True
    """Create the (Cluster)Role and its binding; false when RBAC is managed elsewhere."""


class Integrations(Values):
    """Optional CRDs the operator may manage; each, when enabled, adds its RBAC rules and passes
    ``--integration`` to the operator, which leaves a disabled group alone even when installed."""

    keda: bool = False
    """Grant access to KEDA ``scaledobjects`` (pools with ``autoscaling.backend: keda``)."""
    jobset: bool = False
    """Grant access to JobSet ``jobsets`` (trainers with ``useJobSet: true``)."""
    kueue: bool = False
    """Grant access to Kueue ``workloads`` (trainers with ``queueName``): Kueue alone then
    suspends and admits the trainer, and ``spec.suspend`` deactivates its Workload."""
    prometheus_operator: bool = False
    """Grant access to ``servicemonitors``/``podmonitors`` the operator creates per run."""
    agent_sandbox: bool = False
    """Grant access to agent-sandbox's ``sandboxtemplates``/``sandboxwarmpools`` (runs with
    ``sandbox.isolation: agent-sandbox``), and what their trainers' and graders' Roles grant:
    ``sandboxclaims`` and reading ``sandboxes``."""


class ServiceMonitorValues(Values):
    """A ServiceMonitor for the operator's own ``/metrics`` (needs the Prometheus Operator)."""

    enabled: bool = False
    """Create the ServiceMonitor."""
    interval: str = Field(default="30s", pattern=r"^[0-9]+(ms|s|m|h)$")
    """Scrape interval."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra labels, e.g. the ``release`` label your Prometheus selects monitors by."""


class DashboardValues(Values):
    """Grafana dashboards shipped as ConfigMaps for the Grafana sidecar."""

    enabled: bool = False
    """Create one ConfigMap per dashboard."""
    label: str = "grafana_dashboard"
    """Label key the Grafana sidecar watches."""
    label_value: str = "1"
    """Value of that label."""
    namespace: str = ""
    """Namespace of the ConfigMaps; empty uses the release namespace."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations, e.g. ``grafana_folder: gagar``."""


def _tunable(alert: str) -> Any:
    """The field of a tunable alert's threshold: a share, keyed by the alert's name, defaulting
    to the threshold the alert catalogue gives it."""
    (a,) = [a for a in alerts(Windows()) if a.name == alert and a.tunable]
    return Field(default=float(a.threshold), ge=0, le=1, alias=alert)


class AlertThresholds(Values):
    """Thresholds of the tunable alerts, keyed by the alert's name (docs/observability.md)."""

    grader_usable_rate_low: float = _tunable("GagarGraderUsableRateLow")
    """Fires below this share of graded groups ranked by the grader itself (1 h, ≥ 10 groups)."""
    grader_heuristic_agreement_low: float = _tunable("GagarGraderHeuristicAgreementLow")
    """Fires below this share of pairs of passes the agentic grader orders like the heuristic
    (1 h, ≥ 10 pairs)."""
    grader_audit_inconsistent: float = _tunable("GagarGraderAuditInconsistent")
    """Fires below this share of pairs a relabelled audit grading orders as the first grading
    (1 h, ≥ 10 pairs)."""


class PrometheusRuleValues(Values):
    """PrometheusRule alerts (length explosion, grader fallbacks and quality, gradient variance,
    stalls, pools)."""

    enabled: bool = False
    """Create the PrometheusRule (needs the Prometheus Operator)."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra labels, e.g. the ``release`` label your Prometheus selects rules by."""
    thresholds: AlertThresholds = Field(default_factory=AlertThresholds)
    """Thresholds of the grader-quality alerts."""


class AuthSecretValues(Values):
    """A Secret with a random shared token for the run's services (``spec.authTokenSecret``)."""

    create: bool = False
    """Create the Secret in the release namespace (kept across upgrades; a run in that namespace
    names it in ``spec.authTokenSecret``)."""
    name: str = Field(default="gagar-auth", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """Name of the Secret (its key ``token`` holds the token)."""


class PrometheusValues(Values):
    """The Prometheus allowed to scrape runs' pods: their NetworkPolicies admit its pods (these
    labels, in this namespace) to the metrics ports and vLLM's port, and no other pod."""

    namespace: str = Field(default="monitoring", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """Namespace of the Prometheus pods (``--prometheus-namespace``)."""
    pod_labels: dict[str, str] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "prometheus"}, min_length=1
    )
    """Labels of the Prometheus pods (``--prometheus-label``)."""


class OperatorValues(Values):
    """The operator Deployment."""

    image: Image = Field(default_factory=Image)
    """Operator image."""
    replicas: int = Field(default=1, ge=1, le=5)
    """Operator replicas. More than one elect a leader on a Lease in the release namespace
    (``--leader-election-lease``; only the leader reconciles, another takes over within 15 s
    of its loss), at the cost of the Lease's renewals (about 50 requests a minute)."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Log level (passed as ``GAGAR_LOG_LEVEL``)."""
    metrics_port: int = Field(default=9401, ge=1024, le=65535)
    """Port of the operator's ``/metrics`` (``--metrics-port``; a run's components serve theirs
    on ``spec.observability.metricsPort``, 9400)."""
    health_port: int = Field(default=8080, ge=1024, le=65535)
    """Port of the probes every replica answers (``--health-port``): ``/healthz`` for liveness,
    ``/readyz`` for readiness; a follower is healthy and ready while its lease loop runs."""
    resources: Resources = Field(default_factory=Resources)
    """Resources of the operator container."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node selector of the operator pod."""
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    """Tolerations of the operator pod."""
    affinity: dict[str, Any] = Field(default_factory=dict)
    """Affinity of the operator pod."""
    pod_annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations of the operator pod."""
    priority_class_name: str = ""
    """PriorityClass of the operator pod."""
    network_policy_probe: bool = True
    """Probe each namespace with runs, once, for NetworkPolicy enforcement (two small pods for
    a few seconds): the runs' ``NetworkPoliciesEnforced`` condition says whether the CNI
    enforces the policies that fence sandbox egress and the weight-update port. False:
    ``--no-network-policy-probe``, the condition says NotChecked."""


class PodSecurityValues(Values):
    """What creating a GagarRun entitles (docs/security.md): the Pod Security level of the parts
    of a pod a run supplies, the sandbox's named exception, the Secrets runs may read."""

    runs: Literal["restricted", "baseline", "privileged"] = "restricted"
    """Pod Security Standards level of the runs' ``podTemplate`` parts (``--pod-security``):
    ``restricted`` refuses root, privileged or ``SYS_ADMIN`` init containers, seccomp
    ``Unconfined``, added capabilities; the namespace's own Pod Security label may lower it."""
    sandbox_baseline: bool = True
    """The sandbox executor's declared need: root with uid-switching capabilities (Pod Security
    ``baseline``) in ``isolation`` ``pod``, ``auto`` and ``agent-sandbox``. False
    (``--no-sandbox-baseline``): only ``isolation: bubblewrap`` (non-root) is accepted."""
    run_secrets: list[str] = Field(default_factory=list)
    """Names of the Secrets runs may reference (``env``, ``envFrom``, ``volumes``,
    ``spec.authTokenSecret``; ``--run-secret``); any other reference is refused. With
    ``authSecret.create`` the chart adds ``authSecret.name``."""
    run_secret_label: str = Field(default="", pattern=r"^([^=]+=[^=]*)?$")
    """``key=value`` (e.g. ``gagar.dev/allow-runs=true``): a Secret carrying it may be referenced
    too (``--run-secret-label``); the operator then gets ``get`` on Secrets to read the label."""
    max_image_pools: int = Field(default=8, ge=0)
    """Executor pools of task images (a dataset row's own image, SWE-bench's ``image_name``) one
    run may have at once (``--max-image-pools``): its trainer lists the images it wants and the
    operator keeps a pool of at most 2 pods for each of the first this many; the rest wait, and
    a ``TaskImagesRefused`` Event says so. 0: no task image pools."""


class ChartValues(Values):
    """Values of the gagar chart."""

    watch_namespaces: list[str] = Field(default_factory=list)
    """Namespaces whose GagarRuns the operator reconciles. Empty: every namespace, with a
    ClusterRole; otherwise one Role per listed namespace and no cluster-wide access."""
    run_selector: str = ""
    """Equality-based label selector of the GagarRuns this operator reconciles (``team=a``,
    ``!canary``; empty: all of them in the watched namespaces). The API server filters the watch,
    so several operators can share a cluster's runs."""
    image: Images = Field(default_factory=Images)
    """gagar's images."""
    operator: OperatorValues = Field(default_factory=OperatorValues)
    """The operator Deployment."""
    image_pull_secrets: list[str] = Field(default_factory=list)
    """Names of Secrets to pull the operator image with."""
    service_account: ServiceAccount = Field(default_factory=ServiceAccount)
    """The operator's ServiceAccount."""
    rbac: Rbac = Field(default_factory=Rbac)
    """RBAC of the operator."""
    integrations: Integrations = Field(default_factory=Integrations)
    """Optional CRDs the operator may manage."""
    service_monitor: ServiceMonitorValues = Field(default_factory=ServiceMonitorValues)
    """ServiceMonitor for the operator."""
    dashboards: DashboardValues = Field(default_factory=DashboardValues)
    """Grafana dashboards."""
    prometheus_rule: PrometheusRuleValues = Field(default_factory=PrometheusRuleValues)
    """PrometheusRule alerts."""
    prometheus: PrometheusValues = Field(default_factory=PrometheusValues)
    """The Prometheus that may scrape runs' pods (every other pod is refused)."""
    auth_secret: AuthSecretValues = Field(default_factory=AuthSecretValues)
    """Shared-token Secret for the services of runs (sandbox executors, grader service)."""
    pod_security: PodSecurityValues = Field(default_factory=PodSecurityValues)
    """What creating a GagarRun entitles: Pod Security of runs' pods, Secrets runs may read."""


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """Replace every ``$ref`` by its definition and drop pydantic's titles (Helm's validator
    resolves references, but a self-contained schema reads better in the README generator)."""
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].split("/")[-1]]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    out = {k: _inline(v, defs) for k, v in node.items() if k not in ("title", "$defs")}
    if "description" in out:
        out["description"] = " ".join(out["description"].split()).replace("``", "`")
    return out


def values_schema() -> dict[str, Any]:
    """JSON Schema (draft 7) of the chart's values."""
    raw = ChartValues.model_json_schema(by_alias=True, mode="validation")
    schema = _inline(raw, raw.get("$defs", {}))
    schema["properties"]["watchNamespaces"]["items"]["pattern"] = NAMESPACE
    # Helm passes a parent chart's `global` values to subcharts; accept them when gagar is one.
    schema["properties"]["global"] = {
        "type": "object",
        "description": "Global values of a parent chart.",
    }
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "gagar chart values",
        **schema,
    }


def default_values() -> dict[str, Any]:
    """The defaults, as the values.yaml holds them."""
    return ChartValues().model_dump(mode="json", by_alias=True)


def _yaml_scalar(value: Any) -> str:
    """JSON scalars and flow collections are valid YAML, and unambiguous (``"1"`` stays a string)."""
    return json.dumps(value)


def _values_lines(model: type[Values], data: dict[str, Any], indent: int) -> list[str]:
    lines: list[str] = []
    pad = " " * indent
    for name, field in model.model_fields.items():
        key = field.alias or name
        if field.description:
            lines += [f"{pad}# {line}" for line in _wrap(field.description, 98 - indent)]
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, Values):
            lines.append(f"{pad}{key}:")
            lines += _values_lines(sub, data[key], indent + 2)
        else:
            lines.append(f"{pad}{key}: {_yaml_scalar(data[key])}")
    return lines


def _wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(" ".join(text.split()).replace("``", "`"), width)


def values_yaml() -> str:
    """values.yaml: every default, each key preceded by its description."""
    header = (
        "# Default values of the gagar chart. Generated from gagar/chart_values.py: do not edit.\n"
    )
    return header + "\n".join(_values_lines(ChartValues, default_values(), 0)) + "\n"


def _rows(node: dict[str, Any], data: dict[str, Any], prefix: str) -> list[tuple[str, ...]]:
    rows = []
    for key, sub in node.get("properties", {}).items():
        path = f"{prefix}{key}"
        if sub.get("type") == "object" and "properties" in sub:
            rows += _rows(sub, data[key], f"{path}.")
            continue
        kind = sub.get("type", "")
        if "enum" in sub:
            kind = " \\| ".join(f"`{v}`" for v in sub["enum"])
        doc = sub.get("description", "").replace("|", "\\|")
        rows.append((path, kind, _yaml_scalar(data.get(key, {})), doc))
    return rows


def values_table() -> str:
    """The README's values table (Markdown), one row per leaf of the schema."""
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for path, kind, default, doc in _rows(values_schema(), default_values(), ""):
        lines.append(f"| `{path}` | {kind} | `{default}` | {doc} |")
    return "\n".join(lines) + "\n"
