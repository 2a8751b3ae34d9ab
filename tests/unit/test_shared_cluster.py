"""``gagar render`` of every example is a good citizen of a shared cluster: its checkpoints
outlive the run, vLLM's port (whose weight-transfer API replaces the policy) is closed to every
pod but this run's trainer and the one Prometheus the operator names, the trainer has a
NetworkPolicy, every pool a PodDisruptionBudget, every container resource requests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gagar.operator.builders import BuildContext, build_all
from gagar.operator.builders.common import Scraper
from gagar.operator.builders.pools import VLLM_PORT
from tests.support.tools import helm_template
from tests.unit.test_builders import ROOT, UID, by_kind, example

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def render(path: Path) -> list[dict[str, Any]]:
    proc = subprocess.run(
        # on a cluster with every integration an example may ask for (JobSet, KEDA, ...)
        [
            sys.executable,
            "-m",
            "gagar.cli",
            "render",
            str(path),
            "--uid",
            UID,
            "--capabilities",
            "keda,jobset,kueue,monitoring,agent-sandbox",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [o for o in yaml.safe_load_all(proc.stdout) if o]


def pod_specs(objs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for o in objs:
        template = o.get("spec", {}).get("template")
        if o["kind"] in ("Deployment", "Job") and template:
            out.append((o["metadata"]["name"], template["spec"]))
    return out


def admitted(policy: dict[str, Any], port: int) -> list[dict[str, Any]]:
    """The peers an ingress policy admits to ``port`` (``{}``: any source)."""
    peers: list[dict[str, Any]] = []
    for rule in policy["spec"].get("ingress", []):
        ports = [p["port"] for p in rule.get("ports", [])]
        if not ports or port in ports:
            peers += rule.get("from") or [{}]
    return peers


@pytest.fixture(scope="module", params=EXAMPLES, ids=lambda p: p.stem)
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(request.param)


def test_checkpoint_pvcs_are_not_owned_by_the_run(rendered: list[dict[str, Any]]) -> None:
    for pvc in by_kind(rendered, "PersistentVolumeClaim"):
        assert "ownerReferences" not in pvc["metadata"], pvc["metadata"]["name"]


def test_no_policy_admits_every_namespace_or_every_source(rendered: list[dict[str, Any]]) -> None:
    for policy in by_kind(rendered, "NetworkPolicy"):
        for rule in policy["spec"].get("ingress", []):
            assert rule.get("from"), f"{policy['metadata']['name']}: a rule for any source"
            for peer in rule["from"]:
                assert peer.get("namespaceSelector") != {}, policy["metadata"]["name"]


def test_vllm_port_only_for_the_trainer_and_the_named_prometheus(
    rendered: list[dict[str, Any]],
) -> None:
    rollout = [p for p in by_kind(rendered, "NetworkPolicy") if p["metadata"]["name"].endswith(
        "-rollout")]  # fmt: skip
    if not by_kind(rendered, "Deployment"):
        pytest.skip("no pools")
    (policy,) = rollout
    run = policy["metadata"]["labels"]["gagar.dev/run"]
    trainer = {"podSelector": {"matchLabels": {
        "gagar.dev/run": run, "app.kubernetes.io/component": "trainer"}}}  # fmt: skip
    peers = admitted(policy, VLLM_PORT)
    assert all(p in (trainer, Scraper().peer()) for p in peers), peers
    assert trainer in peers


def test_the_trainer_has_a_network_policy(rendered: list[dict[str, Any]]) -> None:
    jobs = [j["spec"]["template"] for j in by_kind(rendered, "Job")] + [
        r["template"]["spec"]["template"]  # a JobSet's (flash-moe) replicated Job
        for js in by_kind(rendered, "JobSet")
        for r in js["spec"]["replicatedJobs"]
    ]
    (template,) = jobs
    labels = template["metadata"]["labels"]
    selecting = [
        p
        for p in by_kind(rendered, "NetworkPolicy")
        if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    ]
    assert len(selecting) == 1
    assert "Ingress" in selecting[0]["spec"]["policyTypes"]


def test_every_pool_has_a_disruption_budget(rendered: list[dict[str, Any]]) -> None:
    budgets = [
        b["spec"]["selector"]["matchLabels"] for b in by_kind(rendered, "PodDisruptionBudget")
    ]
    for dep in by_kind(rendered, "Deployment"):
        assert dep["spec"]["selector"]["matchLabels"] in budgets, dep["metadata"]["name"]


def test_every_container_requests_cpu_and_memory(rendered: list[dict[str, Any]]) -> None:
    for owner, pod in pod_specs(rendered):
        for c in [*pod["containers"], *pod.get("initContainers", [])]:
            requests = (c.get("resources") or {}).get("requests") or {}
            assert {"cpu", "memory"} <= set(requests), f"{owner}/{c['name']}: {requests}"


def test_a_default_never_exceeds_a_limit() -> None:
    """A spec naming only a memory limit below the default request keeps a valid pod (its
    request is the limit, as Kubernetes defaults it)."""
    run = example("local", **{"grader.resources": {"limits": {"memory": "256Mi"}}})
    objs = build_all(run, BuildContext(uid=UID))
    (grader,) = [d for d in by_kind(objs, "Deployment") if d["metadata"]["name"] == "local-grader"]
    res = grader["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert "memory" not in res["requests"] and res["limits"] == {"memory": "256Mi"}


def test_the_scraper_is_the_one_the_operator_names() -> None:
    scraper = Scraper(namespace="obs", labels=(("app", "prom"),))
    objs = build_all(example("single-gpu"), BuildContext(uid=UID, scraper=scraper))
    for policy in by_kind(objs, "NetworkPolicy"):
        scrapers = [
            p for r in policy["spec"]["ingress"] for p in r["from"] if "namespaceSelector" in p
        ]
        assert scrapers == [{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "obs"}},
            "podSelector": {"matchLabels": {"app": "prom"}},
        }], policy["metadata"]["name"]  # fmt: skip


def test_the_engine_api_key_comes_from_the_run_token() -> None:
    objs = build_all(example("local", authTokenSecret="run-token"), BuildContext(uid=UID))
    (rollout,) = [
        d for d in by_kind(objs, "Deployment") if d["metadata"]["name"].endswith("-rollout")
    ]
    env = {e["name"]: e for e in rollout["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["VLLM_API_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": "run-token", "key": "token"}
    }
    plain = build_all(example("local"), BuildContext(uid=UID))
    for dep in by_kind(plain, "Deployment"):
        for c in dep["spec"]["template"]["spec"]["containers"]:
            assert "VLLM_API_KEY" not in {e["name"] for e in c.get("env", [])}


def test_render_and_the_chart_name_the_prometheus() -> None:
    """The chart's ``prometheus.*`` values reach the operator's flags, and the flags the policies."""
    objs = [
        o for o in helm_template("--set", "prometheus.namespace=obs") if o["kind"] == "Deployment"
    ]
    args = objs[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--prometheus-namespace=obs" in args
    assert "--prometheus-label=app.kubernetes.io/name=prometheus" in args
    proc = subprocess.run(
        [sys.executable, "-m", "gagar.cli", "render", str(ROOT / "examples/local.yaml"),
         "--prometheus-namespace=obs", "--prometheus-label=app=prom"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    policies = by_kind(list(yaml.safe_load_all(proc.stdout)), "NetworkPolicy")
    peers = [p for pol in policies for r in pol["spec"]["ingress"] for p in r["from"]]
    assert Scraper("obs", (("app", "prom"),)).peer() in peers
    assert Scraper().peer() not in peers


def test_several_operator_replicas_elect_a_leader() -> None:
    """``operator.replicas`` above 1: the replicas elect a leader on a Lease they may write,
    in the release namespace only; one replica: no election (no Lease renewals)."""
    from gagar.cli import build_parser

    objs = helm_template("--set", "operator.replicas=2")
    (dep,) = by_kind(objs, "Deployment")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    parsed = build_parser().parse_args(args)
    assert parsed.leader_election_lease == "gagar"
    (role,) = [r for r in by_kind(objs, "Role") if r["metadata"]["name"] == "gagar-leader-election"]
    assert role["rules"][0]["resources"] == ["leases"]
    single = helm_template()
    (one,) = by_kind(single, "Deployment")
    assert not any(
        "leader-election" in a for a in one["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    assert one["spec"]["strategy"]["type"] == "Recreate"
