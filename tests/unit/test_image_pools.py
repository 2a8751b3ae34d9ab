"""Executor pools of task images on demand: the trainer's list checked as untrusted input
(builders.images.demand), named within a DNS label by hash, built as the default pool's hardened
pod with the image, listed in sandbox-pools.json, and routed to (sandbox.routing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gagar import SANDBOX_POOLS_FILE
from gagar.operator.builders import BuildContext, build_all
from gagar.operator.builders.images import IMAGE_POOL_KEY, demand, image_pool_name
from gagar.sandbox.routing import IMAGE_KEY, RoutingFactory, read_pools
from gagar.sandbox.types import SandboxError, SessionRequest
from tests.unit.test_builders import example, one

RUN = "qwen3-swe-1node"
ASTROPY = "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"
DJANGO = "docker.io/swebench/sweb.eval.x86_64.django_1776_django-11099:v1"
PINNED = "registry.example:5000/team/gym@sha256:" + "ab" * 32
POOL_KINDS = ("Deployment", "Service", "NetworkPolicy", "PodDisruptionBudget")


def built(*images: str, **changes: Any) -> list[dict[str, Any]]:
    return build_all(example("single-gpu", **changes), BuildContext(task_images=images))


def image_objects(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["metadata"]["name"].startswith(f"{RUN}-sandbox-i")]


# ------------------------------------------------------------------ the trainer's list
def test_the_first_wanted_images_are_kept_once_each_in_a_stable_order() -> None:
    raw = json.dumps([DJANGO, ASTROPY, DJANGO, PINNED])
    assert demand(raw, cap=8).images == tuple(sorted((DJANGO, ASTROPY, PINNED)))
    assert demand(raw, cap=2).images == tuple(sorted((DJANGO, ASTROPY)))  # the first two
    again = json.dumps([ASTROPY, DJANGO, PINNED])  # reordered by use: the same pools, built
    assert build_all(example("single-gpu"), BuildContext(task_images=demand(raw, 8).images)) == (
        build_all(example("single-gpu"), BuildContext(task_images=demand(again, 8).images))
    )  # alike, so the operator applies nothing again
    assert demand(raw, cap=8).refused == ()
    assert demand(None, cap=8).images == demand("", cap=8).images == ()


@pytest.mark.parametrize(
    "bad",
    [
        "http://registry.example/x:1",  # a scheme
        "x:1 --privileged",  # whitespace
        "x:1\nkind: Pod",  # a newline
        "team/UPPER:1",  # a path component in capitals
        "-leading/dash:1",
        "x" * 256,  # past 255 characters
        "",
        7,
    ],
)
def test_an_entry_that_is_not_an_image_reference_is_refused_with_its_index(bad: Any) -> None:
    out = demand(json.dumps([ASTROPY, bad]), cap=8)
    assert out.images == (ASTROPY,)
    assert len(out.refused) == 1 and out.refused[0].startswith("sandboxImages[1] is not an image")


@pytest.mark.parametrize("raw", ["{not json", '{"a": 1}', '"one:1"'])
def test_a_list_that_is_not_one_is_refused_whole(raw: str) -> None:
    out = demand(raw, cap=8)
    assert out.images == () and len(out.refused) == 1 and "sandboxImages" in out.refused[0]


def test_past_the_cap_the_first_images_get_pools_and_the_rest_wait() -> None:
    images = [f"r/task-{i}:1" for i in range(5)]
    out = demand(json.dumps(images), cap=2)
    assert out.images == tuple(images[:2])
    assert out.refused == (
        "5 task images wanted, at most 2 pools a run (the operator's --max-image-pools): 3 wait",
    )


# ------------------------------------------------------------------ names
def test_an_images_pool_is_named_by_its_hash_within_a_dns_label() -> None:
    run = example("single-gpu")
    a, b = image_pool_name(run, ASTROPY), image_pool_name(run, DJANGO)
    assert a != b and a == image_pool_name(run, ASTROPY)
    assert a.startswith(f"{RUN}-sandbox-i") and len(a) <= 63
    long = run.model_copy(update={"metadata": run.metadata.model_copy(update={"name": "r" * 60})})
    other = run.model_copy(
        update={"metadata": run.metadata.model_copy(update={"name": "r" * 59 + "s"})}
    )
    names = {image_pool_name(long, ASTROPY), image_pool_name(other, ASTROPY)}
    assert len(names) == 2 and all(len(n) <= 63 for n in names)
    objs = build_all(long, BuildContext(task_images=(ASTROPY,)))
    assert one(objs, "Service", image_pool_name(long, ASTROPY))  # built under that name


# ------------------------------------------------------------------ builders
def test_each_wanted_image_gets_a_small_pool_of_its_image() -> None:
    objs = built(ASTROPY, DJANGO)
    for ref in (ASTROPY, DJANGO):
        pool = image_pool_name(example("single-gpu"), ref)
        for kind in POOL_KINDS:
            assert one(objs, kind, pool)["metadata"]["annotations"]["gagar.dev/image"] == ref
        dep = one(objs, "Deployment", pool)
        assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == ref
        assert dep["spec"]["replicas"] == 2  # not poolSize (32): one task's sessions
    assert len(image_objects(objs)) == 2 * len(POOL_KINDS)
    assert image_objects(built()) == []


def test_an_images_pod_is_the_default_pod_with_its_image_and_pool_label() -> None:
    """The same hardening as the default pool: identity, capabilities, read-only root, no
    token, volumes, runtime class; only the image and the metrics' pool label differ."""
    objs = built(ASTROPY, **{"sandbox.isolation": "pod", "sandbox.runtimeClassName": "gvisor"})
    pool = image_pool_name(example("single-gpu"), ASTROPY)
    default = one(objs, "Deployment", f"{RUN}-sandbox")["spec"]["template"]["spec"]
    mine = one(objs, "Deployment", pool)["spec"]["template"]["spec"]
    assert mine["containers"][0].pop("image") == ASTROPY
    default["containers"][0].pop("image")
    assert mine["containers"][0]["args"].pop().startswith("--pool=sandbox/image-")
    default["containers"][0]["args"].pop()
    assert mine == default
    policy = one(objs, "NetworkPolicy", pool)["spec"]
    assert policy["egress"] == [] and policy["policyTypes"] == ["Ingress", "Egress"]


def test_the_pools_selectors_pick_their_own_pods_only() -> None:
    objs = build_all(
        example("single-gpu", **{"sandbox.environments": [{"name": "web", "image": "r/w:1"}]}),
        BuildContext(task_images=(ASTROPY, DJANGO)),
    )
    deps = [o for o in objs if o["kind"] == "Deployment" and "-sandbox" in o["metadata"]["name"]]
    assert len(deps) == 4  # default, web, two images
    for owner in deps:
        for kind in ("Service", "PodDisruptionBudget", "NetworkPolicy"):
            o = one(objs, kind, owner["metadata"]["name"])["spec"]
            sel = o.get("selector") or o["podSelector"]
            sel = sel.get("matchLabels", sel)
            for other in deps:
                pod = other["spec"]["template"]["metadata"]["labels"]
                picks = all(pod.get(k) == v for k, v in sel.items())
                assert picks == (other is owner), (kind, owner["metadata"]["name"])


def test_the_config_map_lists_each_images_pool_beside_the_environments() -> None:
    run = example("single-gpu", **{"sandbox.environments": [{"name": "web", "image": "r/w:1"}]})
    objs = build_all(run, BuildContext(task_images=(ASTROPY,)))
    pools = json.loads(one(objs, "ConfigMap", f"{RUN}-config")["data"][SANDBOX_POOLS_FILE])
    assert pools == {
        "web": f"http://{RUN}-sandbox-web:8090",
        f"image:{ASTROPY}": f"http://{image_pool_name(run, ASTROPY)}:8090",
    }


def test_no_image_pools_where_they_cannot_run() -> None:
    """And the reason the operator's Warning Event gives the trainer's list there."""
    from gagar.operator.builders.images import no_image_pools

    assert image_objects(built(ASTROPY, **{"sandbox.isolation": "agent-sandbox"})) == []
    claims = example("single-gpu", **{"sandbox.isolation": "agent-sandbox"})
    assert "agent-sandbox claims from one warm pool" in (no_image_pools(claims) or "")
    assert "sandbox pods only" in (no_image_pools(example("local")) or "")
    assert no_image_pools(example("single-gpu")) is None
    run = example("local")
    assert not [
        o
        for o in build_all(run, BuildContext(task_images=(ASTROPY,)))
        if "-sandbox-i" in o["metadata"]["name"]
    ]


def test_suspend_stops_the_image_pools_and_monitors_scrape_them() -> None:
    pool = image_pool_name(example("single-gpu"), ASTROPY)
    assert one(built(ASTROPY, suspend=True), "Deployment", pool)["spec"]["replicas"] == 0
    ctx = BuildContext(crds=frozenset({"monitoring.coreos.com"}), task_images=(ASTROPY,))
    objs = build_all(example("single-gpu"), ctx)
    monitor = one(objs, "ServiceMonitor", f"{RUN}-sandbox-img")["spec"]["selector"]["matchLabels"]
    labels = one(objs, "Service", pool)["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in monitor.items())


# ------------------------------------------------------------------ routing
class Fake:
    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: list[SessionRequest] = []

    def open(self, request: SessionRequest) -> Any:
        self.seen.append(request)
        return self.name


def test_the_routing_key_is_the_one_the_operator_writes(tmp_path: Path) -> None:
    assert IMAGE_KEY == IMAGE_POOL_KEY
    objs = built(ASTROPY)
    data = one(objs, "ConfigMap", f"{RUN}-config")["data"]
    (tmp_path / SANDBOX_POOLS_FILE).write_text(data[SANDBOX_POOLS_FILE])
    assert f"{IMAGE_KEY}{ASTROPY}" in read_pools(tmp_path)


def test_a_task_image_goes_to_its_pool_and_waits_for_one_it_lacks() -> None:
    default, astropy, django = Fake("default"), Fake("astropy"), Fake("django")
    later: dict[str, Any] = {}
    asked: list[set[str]] = []

    def refresh(known: Any) -> dict[str, Any]:
        asked.append(set(known))
        return {k: v for k, v in later.items() if k not in known}

    routing = RoutingFactory(default, {IMAGE_KEY + ASTROPY: astropy}, refresh)  # type: ignore[arg-type,dict-item]
    assert routing.create(files={}, image=ASTROPY) == "astropy"
    assert astropy.seen[0].image is None  # the pool runs the image: the name is taken off
    assert routing.create(files={}) == "default"
    with pytest.raises(SandboxError, match=r"no executor pool for the task image .*django"):
        routing.create(files={}, image=DJANGO)
    later[IMAGE_KEY + DJANGO] = django  # the operator made it; the ConfigMap says so now
    assert routing.create(files={}, image=DJANGO) == "django"
    assert asked == [{IMAGE_KEY + ASTROPY}] * 2  # only on a miss, naming what it has
    with pytest.raises(SandboxError, match=r"no executor pool for environment 'web'.*none"):
        routing.create(files={}, environment="web")


def test_a_task_image_is_refused_where_it_cannot_run() -> None:
    with pytest.raises(SandboxError, match="environment or a task image"):
        SessionRequest(files={}, environment="web", image=ASTROPY)
    with pytest.raises(SandboxError, match="cannot run the task image"):
        SessionRequest(files={}, image=ASTROPY).for_one_image("pool p", None)


def test_the_pools_of_a_run_find_an_image_pool_the_config_map_lists_later(tmp_path: Path) -> None:
    """``pool_factory(config_dir=)``: an image without a pool re-reads sandbox-pools.json (the
    kubelet refreshes the mounted ConfigMap once the operator made the pool)."""
    from gagar.sandbox.client import HttpPoolFactory
    from gagar.sandbox.routing import pool_factory

    file = tmp_path / SANDBOX_POOLS_FILE
    file.write_text(json.dumps({"web": "http://r-sandbox-web:8090"}))
    routing = pool_factory("http://r-sandbox:8090", read_pools(tmp_path), config_dir=tmp_path)
    assert isinstance(routing, RoutingFactory)
    with pytest.raises(SandboxError, match="no executor pool for the task image"):
        routing.create(files={}, image=ASTROPY)
    file.write_text(json.dumps({"web": "http://r-sandbox-web:8090",
                                IMAGE_KEY + ASTROPY: "http://r-sandbox-i1:8090"}))  # fmt: skip
    web = routing.pools["web"]
    pool = routing._image_pool(ASTROPY)
    assert isinstance(pool, HttpPoolFactory) and pool.host == "r-sandbox-i1"
    assert routing.pools["web"] is web  # a known pool is kept, not made again


def test_the_cap_is_the_operators_a_whole_number() -> None:
    from gagar.cli import build_parser
    from gagar.operator.cli import trust_policy

    args = build_parser().parse_args(["operator", "--max-image-pools=3"])
    assert trust_policy(args).max_image_pools == 3
    assert trust_policy(build_parser().parse_args(["operator"])).max_image_pools == 8
    with pytest.raises(SystemExit):
        build_parser().parse_args(["operator", "--max-image-pools=-1"])
    assert demand(json.dumps([ASTROPY]), cap=0).images == ()


def test_the_local_backend_refuses_a_task_image(tmp_path: Path) -> None:
    """A row's image is a container: on one machine nothing runs it, so its session is refused
    instead of running in the wrong Python."""
    from gagar.sandbox.local import LocalFactory

    factory = LocalFactory(root=str(tmp_path), check=False)
    with pytest.raises(SandboxError, match="runs on sandbox pods only"):
        factory.create(files={}, image=ASTROPY)


def test_status_lists_the_image_pools_and_pools_ready_never_waits_for_them() -> None:
    from gagar.operator.builders.images import image_pool_key
    from gagar.operator.observe import Observed, PoolObserved, TrainerObserved
    from gagar.operator.status import compute_status, get_condition

    key = image_pool_key(ASTROPY)
    pools = {
        "rollout": PoolObserved(2, 2, 2),
        "grader": PoolObserved(1, 1, 1),
        "sandbox": PoolObserved(32, 32, 32),
        key: PoolObserved(2, 2, 0),  # its image still pulling
    }
    obs = Observed(generation=1, trainer=TrainerObserved(active=1, ready=1), pools=pools)
    out = compute_status(example("single-gpu").spec, obs, None, "2026-01-01T00:00:00Z").status
    assert key.startswith("sandbox/image-") and out.pools[key].replicas == 2
    assert out.pools[key].ready_replicas == 0
    ready = get_condition(out, "PoolsReady")
    assert ready is not None and ready.status == "True"


def test_the_images_asked_for_are_listed_most_recent_first_found_or_not() -> None:
    """What the trainer publishes as sandboxImages: a miss asks for a pool, a use keeps the
    image at the front, and one unused for longest falls off past the limit."""
    from gagar.sandbox.routing import RecentImages

    routing = RoutingFactory(Fake("default"), {IMAGE_KEY + ASTROPY: Fake("a")})  # type: ignore[arg-type,dict-item]
    with pytest.raises(SandboxError):
        routing.create(files={}, image=DJANGO)
    routing.create(files={}, image=ASTROPY)
    assert routing.images.wanted() == [ASTROPY, DJANGO]
    assert demand(json.dumps(routing.images.wanted()), cap=1).images == (ASTROPY,)
    recent = RecentImages(limit=2)
    for ref in (ASTROPY, DJANGO, ASTROPY, PINNED):
        recent.use(ref)
    assert recent.wanted() == [PINNED, ASTROPY]
