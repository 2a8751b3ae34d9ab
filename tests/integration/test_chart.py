"""The Helm chart, checked with the real helm binary: lint, render, Kubernetes schemas, RBAC, gating.

Rendered objects of built-in kinds go through ``kubernetes-validate`` (strict, Kubernetes 1.32);
Prometheus Operator kinds are not in its bundle, so they get a structural check, and the
PrometheusRule's groups go through ``promtool check rules``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gagar.chart_values import ChartValues, default_values, values_schema
from gagar.dashboards import DASHBOARDS
from tests.support.tools import CHART, ROOT, helm_template, run, system_tool, tool

K8S_VERSION = "1.32.0"
EXAMPLES = sorted((CHART / "ci").glob("*-values.yaml"))
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def rules_of(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for o in objs if o["kind"] in ("Role", "ClusterRole") for r in o["rules"]]


def test_examples_exist() -> None:
    assert {p.name for p in EXAMPLES} >= {"cpu-values.yaml", "gpu-values.yaml"}


@pytest.mark.parametrize("values", [None, *EXAMPLES], ids=lambda p: p.name if p else "defaults")
def test_lint_strict(values: Path | None) -> None:
    extra = ["-f", values] if values else []
    out = run([tool("helm"), "lint", "--strict", CHART, *extra]).stdout
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("serviceMonitor.enable=true", "Additional property enable is not allowed"),
        ("watchNamespaces[0]=Not_A_Namespace", "Does not match pattern"),
        ("operator.logLevel=loud", "operator.logLevel"),
        ("operator.metricsPort=80", "Must be greater than or equal to 1024"),
        ("podSecurity.maxImagePools=-1", "Must be greater than or equal to 0"),
    ],
)
def test_schema_rejects_bad_values(setting: str, message: str) -> None:
    proc = run([tool("helm"), "lint", "--strict", CHART, "--set", setting], check=False)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr


@pytest.mark.parametrize("values", EXAMPLES, ids=lambda p: p.name)
def test_render_passes_kubernetes_validate(values: Path) -> None:
    objs = helm_template("-f", str(values), crds=True)
    kinds = {o["kind"] for o in objs}
    assert {"CustomResourceDefinition", "Deployment", "ServiceAccount", "Service"} <= kinds
    for obj in objs:
        if obj["kind"] in CRD_KINDS:
            check_monitoring_object(obj, objs)
        else:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def check_monitoring_object(obj: dict[str, Any], objs: list[dict[str, Any]]) -> None:
    """Structural check of Prometheus Operator objects (their schemas are not bundled)."""
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    assert obj["metadata"]["name"] and obj["metadata"]["namespace"]
    if obj["kind"] == "ServiceMonitor":
        service = by_kind(objs, "Service")[0]
        selector = obj["spec"]["selector"]["matchLabels"]
        assert selector.items() <= service["metadata"]["labels"].items()
        ports = {p["name"] for p in service["spec"]["ports"]}
        assert {e["port"] for e in obj["spec"]["endpoints"]} <= ports
    else:
        assert [g["name"] for g in obj["spec"]["groups"]] == ["gagar"]
        assert all(r["alert"] and r["expr"] for r in obj["spec"]["groups"][0]["rules"])


def test_prometheus_rule_passes_promtool(tmp_path: Path) -> None:
    rule = by_kind(helm_template("--set", "prometheusRule.enabled=true"), "PrometheusRule")[0]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    out = run([system_tool("promtool"), "check", "rules", path]).stdout
    # every rule of the chart's PrometheusRule, as many as the spec holds (one per alert)
    rules = sum(len(group["rules"]) for group in rule["spec"]["groups"])
    assert rules >= 5 and f"SUCCESS: {rules} rules found" in out


def test_operator_deployment_is_hardened() -> None:
    dep = by_kind(helm_template(), "Deployment")[0]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "ghcr.io/gagar-dev/gagar-operator:0.1.0"
    assert c["command"] == ["gagar"] and c["args"][0] == "operator"
    assert "--standalone" in c["args"] and not any(a.startswith("--namespace") for a in c["args"])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert c["livenessProbe"]["httpGet"]["port"] == "health"
    assert c["readinessProbe"]["httpGet"]["port"] == "health"
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": 9401, "health": 8080}
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"


def test_image_tag_override() -> None:
    dep = by_kind(helm_template("--set", "operator.image.tag=dev"), "Deployment")[0]
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":dev")


# ---------------------------------------------------------------- RBAC
@pytest.mark.parametrize("values", [None, *EXAMPLES], ids=lambda p: p.name if p else "defaults")
def test_rbac_least_privilege(values: Path | None) -> None:
    rules = rules_of(helm_template(*(["-f", str(values)] if values else [])))
    assert rules
    for rule in rules:
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[key], f"wildcard in {rule}"
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule
        if "secrets" in rule["resources"]:  # a run's weight-sync token: made, never read
            assert rule["resources"] == ["secrets"] and rule["verbs"] == ["create"], rule
        assert "nonResourceURLs" not in rule
    reads_only = {"pods", "namespaces", "customresourcedefinitions"}
    for rule in rules:
        if reads_only & set(rule["resources"]):
            assert not WRITE_VERBS & set(rule["verbs"]), rule


def granted(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def test_rbac_covers_what_the_operator_manages() -> None:
    have = granted(rules_of(helm_template()))
    for group, resource in [
        ("batch", "jobs"),
        ("apps", "deployments"),
        ("", "services"),
        ("", "configmaps"),
        ("", "serviceaccounts"),
        ("", "persistentvolumeclaims"),
        ("rbac.authorization.k8s.io", "roles"),
        ("rbac.authorization.k8s.io", "rolebindings"),
        ("networking.k8s.io", "networkpolicies"),
        ("policy", "poddisruptionbudgets"),
        ("autoscaling", "horizontalpodautoscalers"),
    ]:
        assert {
            (group, resource, v) for v in ("get", "list", "watch", "create", "patch", "delete")
        } <= have
    assert ("apps", "deployments/scale", "patch") in have
    assert ("gagar.dev", "gagarruns/status", "patch") in have
    assert ("", "pods", "list") in have and ("", "events", "create") in have


def test_cluster_scope_by_default() -> None:
    objs = helm_template()
    assert len(by_kind(objs, "ClusterRole")) == 1 and len(by_kind(objs, "ClusterRoleBinding")) == 1
    assert not by_kind(objs, "Role") and not by_kind(objs, "RoleBinding")
    binding = by_kind(objs, "ClusterRoleBinding")[0]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gagar", "namespace": "gagar-system"}
    ]


def test_namespaced_scope_when_namespaces_are_listed() -> None:
    objs = helm_template("--set", "watchNamespaces={team-a,team-b}")
    assert not by_kind(objs, "ClusterRole") and not by_kind(objs, "ClusterRoleBinding")
    assert sorted(o["metadata"]["namespace"] for o in by_kind(objs, "Role")) == ["team-a", "team-b"]
    for binding in by_kind(objs, "RoleBinding"):
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"][0]["namespace"] == "gagar-system"
    args = by_kind(objs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    assert not {"namespaces", "customresourcedefinitions"} & {
        r for _, r, _ in granted(rules_of(objs))
    }


def test_run_selector_reaches_the_operator() -> None:
    """runSelector becomes --run-selector (the operator's server-side filter of the runs' watch);
    unset, no flag."""

    def args(*flags: str) -> list[str]:
        objs = helm_template(*flags)
        return by_kind(objs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]

    assert "--run-selector=team=a" in args("--set", "runSelector=team=a")
    assert not [a for a in args() if a.startswith("--run-selector")]


def test_max_image_pools_reaches_the_operators_trust_policy() -> None:
    """podSecurity.maxImagePools becomes --max-image-pools (the cap of a run's task-image pools);
    at the operator's own default, no flag (the kustomize base stays the chart's)."""
    from gagar.operator.builders.trust import TrustPolicy
    from gagar.operator.cli import trust_policy

    def args(*flags: str) -> list[str]:
        objs = helm_template(*flags)
        return by_kind(objs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]

    assert ChartValues().pod_security.max_image_pools == TrustPolicy.max_image_pools
    assert not [a for a in args() if a.startswith("--max-image-pools")]
    rendered = args("--set", "podSecurity.maxImagePools=3")
    assert "--max-image-pools=3" in rendered
    assert trust_policy(operator_parser().parse_args(rendered)).max_image_pools == 3
    assert "--max-image-pools=0" in args("--set", "podSecurity.maxImagePools=0")


def test_rbac_create_false_renders_no_rbac() -> None:
    objs = helm_template("--set", "rbac.create=false")
    assert not rules_of(objs) and not by_kind(objs, "ClusterRoleBinding")


@pytest.mark.parametrize(
    ("flag", "group", "resource"),
    [
        ("keda", "keda.sh", "scaledobjects"),
        ("jobset", "jobset.x-k8s.io", "jobsets"),
        ("prometheusOperator", "monitoring.coreos.com", "servicemonitors"),
    ],
)
def test_integration_rules_are_gated(flag: str, group: str, resource: str) -> None:
    off = {(g, r) for g, r, _ in granted(rules_of(helm_template()))}
    on = {
        (g, r) for g, r, _ in granted(rules_of(helm_template("--set", f"integrations.{flag}=true")))
    }
    assert (group, resource) not in off
    assert (group, resource) in on


# ---------------------------------------------------------------- gating
def test_monitoring_objects_are_off_by_default() -> None:
    objs = helm_template()
    assert not by_kind(objs, "ServiceMonitor") and not by_kind(objs, "PrometheusRule")
    assert not by_kind(objs, "ConfigMap")


def test_service_monitor_gated() -> None:
    objs = helm_template(
        "--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.labels.release=kps"
    )
    (sm,) = by_kind(objs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kps"
    assert not by_kind(objs, "PrometheusRule") and not by_kind(objs, "ConfigMap")


def test_prometheus_rule_gated_and_verbatim() -> None:
    objs = helm_template("--set", "prometheusRule.enabled=true")
    (rule,) = by_kind(objs, "PrometheusRule")
    generated = yaml.safe_load((CHART / "rules/gagar-alerts.yaml").read_text())
    assert rule["spec"] == generated
    assert not by_kind(objs, "ServiceMonitor") and not by_kind(objs, "ConfigMap")


def test_dashboards_gated_labelled_and_verbatim() -> None:
    objs = helm_template(
        "--set", "dashboards.enabled=true",
        "--set", "dashboards.label=my_dash",
        "--set", "dashboards.labelValue=yes",
        "--set", "dashboards.namespace=monitoring",
    )  # fmt: skip
    maps = by_kind(objs, "ConfigMap")
    assert len(maps) == len(DASHBOARDS)
    for cm in maps:
        assert cm["metadata"]["labels"]["my_dash"] == "yes"
        assert cm["metadata"]["namespace"] == "monitoring"
        ((name, text),) = cm["data"].items()
        assert json.loads(text) == json.loads((CHART / "dashboards" / name).read_text())
    assert not by_kind(objs, "ServiceMonitor") and not by_kind(objs, "PrometheusRule")


# ---------------------------------------------------------------- values model and schema
def test_values_yaml_is_the_model_defaults() -> None:
    assert yaml.safe_load((CHART / "values.yaml").read_text()) == default_values()
    jsonschema.Draft7Validator(values_schema()).validate(default_values())


def test_example_values_parse_with_the_model() -> None:
    for path in EXAMPLES:
        ChartValues.model_validate(yaml.safe_load(path.read_text()))


def test_chart_versions_match_the_package() -> None:
    from gagar import __version__

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__


# ---------------------------------------------------------------- kustomize base
def kustomize() -> list[dict[str, Any]]:
    from tests.support.tools import docs

    return docs(run([tool("kubectl"), "kustomize", ROOT / "manifests"]).stdout)


def test_kustomize_base_renders_and_validates() -> None:
    objs = kustomize()
    assert {o["kind"] for o in objs} == {
        "Namespace",
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Service",
        "Deployment",
    }
    for obj in objs:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        if obj["kind"] not in (
            "Namespace",
            "CustomResourceDefinition",
            "ClusterRole",
            "ClusterRoleBinding",
        ):
            assert obj["metadata"]["namespace"] == "gagar-system"


def test_kustomize_base_matches_the_chart() -> None:
    plain, chart = kustomize(), helm_template(crds=True)
    assert rules_of(plain) == rules_of(chart)
    container = by_kind(plain, "Deployment")[0]["spec"]["template"]["spec"]
    expected = by_kind(chart, "Deployment")[0]["spec"]["template"]["spec"]
    assert container == expected
    # the CRD itself is generated into both places and drift-checked; kustomize re-prints floats
    # (1e-06) in a form PyYAML reads as strings, so compare identity here, not every default
    crd = by_kind(plain, "CustomResourceDefinition")[0]
    assert crd["spec"]["names"] == by_kind(chart, "CustomResourceDefinition")[0]["spec"]["names"]


# ---------------------------------------------------------------- contract with the operator
# These run once the operator (gagar.operator.cli / builders) is merged next to the chart.
def operator_parser():
    from gagar.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    if "operator" not in sub.choices:
        pytest.skip("the `gagar operator` command is not on this branch yet")
    return parser


@pytest.mark.parametrize("namespaces", [[], ["team-a"], ["team-a", "team-b"]])
def test_operator_cli_accepts_the_rendered_args(namespaces: list[str]) -> None:
    parser = operator_parser()
    extra = ["--set", "watchNamespaces={" + ",".join(namespaces) + "}"] if namespaces else []
    (c,) = by_kind(helm_template(*extra), "Deployment")[0]["spec"]["template"]["spec"]["containers"]
    args = parser.parse_args(c["args"])
    watched = args.namespace if isinstance(args.namespace, list) else [args.namespace]
    assert sorted(n for n in watched if n) == sorted(namespaces), (
        "every listed namespace is watched"
    )
    assert args.metrics_port == 9401 and args.standalone


def covers(have: set[tuple[str, str, str]], group: str, resource: str, verbs: set[str]) -> bool:
    return all((group, resource, v) in have for v in verbs)


def test_operator_holds_every_permission_it_grants_and_every_kind_it_creates() -> None:
    """RBAC forbids granting what one lacks: the trainer Role's rules must be the operator's too."""
    builders = pytest.importorskip("gagar.operator.builders")
    if not hasattr(builders, "build_all"):
        pytest.skip("the operator builders are not on this branch yet")
    from gagar.manifest import load_files

    have = granted(
        rules_of(
            helm_template(
                *[
                    f"--set=integrations.{k}=true"
                    for k in ("keda", "jobset", "prometheusOperator", "agentSandbox")
                ]
            )
        )
    )
    runs = [
        r
        for _, _, r in load_files([str(p) for p in sorted((ROOT / "examples").glob("*.yaml"))]).runs
    ]
    pods = next(r for r in runs if r.spec.sandbox.backend == "pods")
    sandbox = pods.spec.sandbox.model_copy(update={"isolation": "agent-sandbox"})
    runs.append(pods.model_copy(update={"spec": pods.spec.model_copy(update={"sandbox": sandbox})}))
    for run_ in runs:  # and a run claiming agent-sandbox Sandboxes (trainer and grader Roles)
        for child in builders.build_all(run_):
            for rule in child.get("rules", []) if child["kind"] == "Role" else []:
                for g in rule["apiGroups"]:
                    for r in rule["resources"]:
                        assert covers(have, g, r, set(rule["verbs"])), (
                            child["metadata"]["name"],
                            rule,
                        )
    for api_version, kind in builders.CHILD_KINDS:
        group = api_version.rpartition("/")[0]
        plural = kind.lower() + ("es" if kind.endswith("s") else "s")
        plural = {"networkpolicys": "networkpolicies"}.get(plural, plural)
        assert covers(have, group, plural, {"get", "list", "watch", "create", "patch", "delete"}), (
            kind
        )


def test_works_as_a_subchart_with_global_values(tmp_path: Path) -> None:
    import shutil

    shutil.copytree(CHART, tmp_path / "charts/gagar")
    (tmp_path / "Chart.yaml").write_text(
        "apiVersion: v2\nname: platform\nversion: 1.0.0\n"
        "dependencies:\n  - name: gagar\n    version: 0.1.0\n"
    )
    (tmp_path / "values.yaml").write_text(
        "global:\n  imageRegistry: example.com\ngagar:\n  watchNamespaces: [ml]\n"
    )
    run([tool("helm"), "lint", "--strict", tmp_path])
    out = run([tool("helm"), "template", "p", tmp_path]).stdout
    assert "kind: Role\n" in out and "kind: ClusterRole\n" not in out
