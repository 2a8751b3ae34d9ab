"""Task environments on sandbox pods: a pool per environment image (builders), held to the
default pool's hardening and image policy (trust), counted in PoolsReady (status)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gagar import SANDBOX_POOLS_FILE
from gagar.operator.builders import BuildContext, build_all
from gagar.operator.builders.trust import TrustPolicy, trust_problems
from gagar.operator.observe import Observed, PoolObserved, TrainerObserved
from gagar.operator.status import compute_status, get_condition
from tests.unit.test_builders import example, one

RUN = "qwen3-swe-1node"  # single-gpu's name: backend pods, isolation from the example
ENVS = [
    {"name": "web", "image": "registry.example/sandbox-web:1"},
    # gagar's own sandbox image (a family whose packages it holds): moved by --image-registry;
    # a made-up name under gagar's registry would be an image without a recipe (test_images)
    {"name": "db", "image": "ghcr.io/gagar-dev/gagar-sandbox:0.1.0"},
]
POOL_KINDS = ("Deployment", "Service", "NetworkPolicy", "PodDisruptionBudget")


def with_envs(envs: list[dict[str, Any]] = ENVS, **changes: Any) -> Any:
    return example("single-gpu", **{"sandbox.environments": envs, **changes})


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pod_labels(objs: list[dict[str, Any]], name: str) -> dict[str, str]:
    return one(objs, "Deployment", name)["spec"]["template"]["metadata"]["labels"]


def test_each_environment_gets_a_pool_of_its_image_beside_the_default_one() -> None:
    objs = build_all(with_envs(), BuildContext(uid="u"))
    for pool in (f"{RUN}-sandbox", f"{RUN}-sandbox-web", f"{RUN}-sandbox-db"):
        for kind in POOL_KINDS:
            one(objs, kind, pool)
    image = {
        p: one(objs, "Deployment", f"{RUN}-sandbox{p}")["spec"]["template"]["spec"]["containers"][
            0
        ]["image"]
        for p in ("", "-web", "-db")
    }
    assert image == {
        "": "ghcr.io/gagar-dev/gagar-sandbox:0.1.0",
        "-web": "registry.example/sandbox-web:1",
        "-db": "ghcr.io/gagar-dev/gagar-sandbox:0.1.0",
    }
    assert one(objs, "Deployment", f"{RUN}-sandbox-web")["spec"]["replicas"] == 32  # poolSize


def test_the_pools_selectors_pick_their_own_pods_only() -> None:
    """The default pool's Service (and PDB, policy) never selects an environment's pods, nor
    one environment's another's: a session sent to ``web`` lands on a pod of web's image."""
    objs = build_all(with_envs())
    pools = [f"{RUN}-sandbox", f"{RUN}-sandbox-web", f"{RUN}-sandbox-db"]
    for pool in pools:
        selectors = [
            one(objs, "Service", pool)["spec"]["selector"],
            one(objs, "Deployment", pool)["spec"]["selector"]["matchLabels"],
            one(objs, "PodDisruptionBudget", pool)["spec"]["selector"]["matchLabels"],
            one(objs, "NetworkPolicy", pool)["spec"]["podSelector"]["matchLabels"],
        ]
        for other in pools:
            for sel in selectors:
                assert matches(sel, pod_labels(objs, other)) == (other == pool), (pool, other)
    assert pod_labels(objs, f"{RUN}-sandbox-web")["gagar.dev/environment"] == "web"
    assert pod_labels(objs, f"{RUN}-sandbox-web")["gagar.dev/run"] == RUN  # pruned with the run


def test_an_environments_pod_is_the_default_pod_with_its_image() -> None:
    """The same hardening (identity, capabilities, read-only root, no token, volumes), service
    account and runtime class: only the image and the labels differ."""
    run = with_envs(**{"sandbox.isolation": "pod", "sandbox.runtimeClassName": "gvisor"})
    objs = build_all(run)
    default = one(objs, "Deployment", f"{RUN}-sandbox")["spec"]["template"]["spec"]
    web = one(objs, "Deployment", f"{RUN}-sandbox-web")["spec"]["template"]["spec"]
    assert web["containers"][0].pop("image") == "registry.example/sandbox-web:1"
    default["containers"][0].pop("image")
    assert web["containers"][0]["args"].pop() == "--pool=sandbox/web"  # its metrics' pool
    assert default["containers"][0]["args"].pop() == "--pool=sandbox"
    assert web == default
    assert web["runtimeClassName"] == "gvisor" and web["automountServiceAccountToken"] is False
    policy = one(objs, "NetworkPolicy", f"{RUN}-sandbox-web")["spec"]
    assert policy["egress"] == [] and policy["policyTypes"] == ["Ingress", "Egress"]
    peers = {
        tuple(sorted(p["podSelector"]["matchLabels"].items())) for p in policy["ingress"][0]["from"]
    }
    assert peers == {
        (("app.kubernetes.io/component", c), ("gagar.dev/run", RUN)) for c in ("trainer", "grader")
    }


def test_an_environments_image_is_pulled_as_the_sandbox_image_is() -> None:
    """--image-registry moves gagar's own images (the default registry's), an environment's
    too; an image elsewhere is pulled as given, as spec.sandbox.image is."""
    objs = build_all(with_envs(), BuildContext(image_registry="mirror.local/gagar"))

    def image(pool: str) -> str:
        return one(objs, "Deployment", pool)["spec"]["template"]["spec"]["containers"][0]["image"]

    assert image(f"{RUN}-sandbox") == "mirror.local/gagar/gagar-sandbox:0.1.0"
    assert image(f"{RUN}-sandbox-db") == "mirror.local/gagar/gagar-sandbox:0.1.0"
    assert image(f"{RUN}-sandbox-web") == "registry.example/sandbox-web:1"


def test_long_names_are_cut_to_a_dns_label_with_a_hash() -> None:
    a, b = "a" * 60 + "x", "a" * 60 + "y"
    run = example("single-gpu", **{"sandbox.environments": [
        {"name": a, "image": "r/a:1"}, {"name": b, "image": "r/b:1"}
    ]})  # fmt: skip
    run = run.model_copy(update={"metadata": run.metadata.model_copy(update={"name": "r" * 42})})
    objs = build_all(run)
    services = {o["metadata"]["name"] for o in objs if o["kind"] == "Service"}
    pools = {n for n in services if n.startswith("r" * 42 + "-sandbox-")}
    assert len(pools) == 2 and all(len(n) <= 63 for n in services), services
    for n in pools:
        assert n[-6] == "-" and n[-5:].isalnum()
    config = one(objs, "ConfigMap", "r" * 42 + "-config")["data"][SANDBOX_POOLS_FILE]
    assert sorted(json.loads(config)) == [a, b]
    assert {u.removeprefix("http://").split(":")[0] for u in json.loads(config).values()} == pools


def test_the_config_map_says_where_each_environments_pool_is() -> None:
    data = one(build_all(with_envs()), "ConfigMap", f"{RUN}-config")["data"]
    assert json.loads(data[SANDBOX_POOLS_FILE]) == {
        "web": f"http://{RUN}-sandbox-web:8090",
        "db": f"http://{RUN}-sandbox-db:8090",
    }
    assert (
        SANDBOX_POOLS_FILE
        not in one(build_all(example("single-gpu")), "ConfigMap", f"{RUN}-config")["data"]
    )


def test_removing_an_environment_drops_its_pool_and_suspend_stops_them_all() -> None:
    kept = build_all(with_envs(ENVS[:1]))
    names = {(o["kind"], o["metadata"]["name"]) for o in kept}
    assert ("Deployment", f"{RUN}-sandbox-web") in names
    assert not any(n.startswith(f"{RUN}-sandbox-db") for _, n in names)
    stopped = build_all(with_envs(suspend=True))
    assert one(stopped, "Deployment", f"{RUN}-sandbox-db")["spec"]["replicas"] == 0
    ended = build_all(with_envs(), BuildContext(state="terminal"))
    assert one(ended, "Deployment", f"{RUN}-sandbox-web")["spec"]["replicas"] == 0


def test_monitors_scrape_the_environments_pools_too() -> None:
    objs = build_all(with_envs(), BuildContext(crds=frozenset({"monitoring.coreos.com"})))
    monitor = one(objs, "ServiceMonitor", f"{RUN}-sandbox-env")["spec"]
    web = one(objs, "Service", f"{RUN}-sandbox-web")
    assert matches(monitor["selector"]["matchLabels"], web["metadata"]["labels"])
    default = one(objs, "ServiceMonitor", f"{RUN}-sandbox")["spec"]["selector"]["matchLabels"]
    assert not matches(default, web["metadata"]["labels"])  # scraped once


def test_each_pools_executor_labels_its_series_with_its_own_pool() -> None:
    """Every pool's ``GAGAR_COMPONENT`` is ``sandbox``: the executor's own args, parsed by the
    real CLI, are what tell web's executions from db's and the default pool's on /metrics (the
    label the run's ``status.pools`` uses; the one ServiceMonitor per kind scrapes them all)."""
    from gagar.cli import build_parser
    from gagar.sandbox.metrics import SandboxMetrics

    objs = build_all(with_envs())
    seen = {}
    for pool in ("", "-web", "-db"):
        c = one(objs, "Deployment", f"{RUN}-sandbox{pool}")["spec"]["template"]["spec"]
        args = build_parser().parse_args(c["containers"][0]["args"])
        text = SandboxMetrics(lambda: 0, 4, run=RUN, pool=args.pool).exposition().decode()
        seen[pool] = {line.split('pool="')[1].split('"')[0] for line in text.splitlines()
                      if line.startswith("gagar_sandbox_sessions_max{")}  # fmt: skip
    assert seen == {"": {"sandbox"}, "-web": {"sandbox/web"}, "-db": {"sandbox/db"}}


def test_no_environment_pools_on_the_local_backend() -> None:
    run = example("local", **{"sandbox.environments": [{"name": "web", "lock": "/l.txt"}]})
    assert not [o for o in build_all(run) if "-sandbox" in o["metadata"]["name"]]


@pytest.mark.parametrize("level", ["restricted", "baseline"])
def test_environment_pools_are_held_to_the_sandboxs_pod_security(level: str) -> None:
    """The environment pools run the default pool's executor identity: a namespace or an
    operator that refuses it for the default pool refuses the run, environments and all."""
    run = with_envs(**{"sandbox.isolation": "pod"})
    problems = trust_problems(run, TrustPolicy(), namespace=level)  # type: ignore[arg-type]
    assert [f for f, _ in problems] == (["spec.sandbox.isolation"] if level == "restricted" else [])
    off = trust_problems(run, TrustPolicy(sandbox_baseline=False))
    assert [f for f, _ in off] == ["spec.sandbox.isolation"]


# ------------------------------------------------------------------ status
READY = {
    "rollout": PoolObserved(2, 2, 2),
    "grader": PoolObserved(1, 1, 1),
    "sandbox": PoolObserved(32, 32, 32),
}


def pools_ready(pools: dict[str, PoolObserved]) -> tuple[str, str, str]:
    obs = Observed(generation=1, trainer=TrainerObserved(active=1, ready=1), pools=pools)
    out = compute_status(with_envs().spec, obs, None, "2026-01-01T00:00:00Z")
    c = get_condition(out.status, "PoolsReady")
    assert c is not None
    return c.status, c.reason, c.message


def test_pools_ready_waits_for_every_environments_pool_and_names_it() -> None:
    web = {"sandbox/web": PoolObserved(32, 32, 32)}
    assert pools_ready({**READY, **web}) == ("False", "PoolsNotReady", "sandbox/db not created")
    lagging = {**READY, **web, "sandbox/db": PoolObserved(32, 32, 3)}
    assert pools_ready(lagging) == ("False", "PoolsNotReady", "sandbox/db 3/32 ready")
    status, reason, message = pools_ready({**READY, **web, "sandbox/db": PoolObserved(32, 32, 32)})
    assert (status, reason) == ("True", "PoolsReady") and "sandbox/web, sandbox/db" in message


def test_status_lists_each_environments_pool() -> None:
    pools = {**READY, "sandbox/web": PoolObserved(32, 32, 32), "sandbox/db": PoolObserved(4, 4, 1)}
    obs = Observed(generation=1, trainer=TrainerObserved(active=1, ready=1), pools=pools)
    status = compute_status(with_envs().spec, obs, None, "2026-01-01T00:00:00Z").status
    assert status.pools["sandbox/db"].ready_replicas == 1
    assert set(status.pools) == {"rollout", "grader", "sandbox", "sandbox/web", "sandbox/db"}
