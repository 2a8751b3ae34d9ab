"""podTemplate is merged into the operator's pods by key, never duplicating what the operator owns,
and the pods it renders are ones a real API server accepts."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from gagar.operator.builders import BuildContext, build_all
from gagar.operator.builders.overlay import merge_by_key
from gagar.spec import RESERVED_CONTAINERS, RESERVED_ENV, RESERVED_MOUNT_PATHS, RESERVED_VOLUMES
from tests.kube_emulator.builtin import pod_spec_errors
from tests.unit.test_builders import example

K8S_VERSION = "1.32.0"
OVERRIDES = {
    "env": [{"name": "HF_HOME", "value": "/cache"}, {"name": "LOG_FORMAT", "value": "json"}],
    "volumes": [{"name": "cache", "emptyDir": {"sizeLimit": "10Gi"}}],
    "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
    "securityContext": {"fsGroup": 2000},
    "topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule"}
    ],
    "initContainers": [
        {"name": "warm-cache", "image": "busybox:1.36", "command": ["sh", "-c", "ls /cache"],
         "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]},
        {"name": "log-shipper", "image": "fluent/fluent-bit:3.1", "restartPolicy": "Always",
         "env": [{"name": "FLB_LOG_LEVEL", "value": "info"}],
         "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}},
    ],
}  # fmt: skip
COMPONENTS = ("trainer", "rollout", "grader")


def _pods(run_name: str, **changes: Any) -> dict[str, dict[str, Any]]:
    run = example(run_name, **changes)
    out = {}
    for obj in build_all(run, BuildContext(uid="u-1")):
        if obj["kind"] in ("Job", "Deployment"):
            out[obj["metadata"]["name"]] = obj
    return out


def test_merge_by_key_keeps_the_first_entry_of_each_key() -> None:
    base = [{"name": "A", "value": "op"}, {"name": "B", "value": "op"}]
    extra = [{"name": "B", "value": "user"}, {"name": "C", "value": "user"}]
    merged = merge_by_key(base, extra, lambda e: e["name"])
    assert merged == [*base, {"name": "C", "value": "user"}]


@pytest.mark.parametrize("run_name", ["single-gpu", "flash-moe", "local"])
def test_the_operators_own_names_are_the_reserved_ones(run_name: str) -> None:
    """What validation refuses in a podTemplate covers every env name, mount path, volume and
    container the builders render (with an auth token too), so a user's entry never collides."""
    bare = {f"{c}.podTemplate": None for c in (*COMPONENTS, "sandbox")}
    for obj in _pods(run_name, authTokenSecret="gagar-token", **bare).values():
        spec = obj["spec"]["template"]["spec"]
        for c in spec["containers"]:
            own_env = {e["name"] for e in c.get("env", []) if not e["name"].startswith("GAGAR_")}
            assert own_env <= RESERVED_ENV, (obj["metadata"]["name"], own_env - RESERVED_ENV)
            assert c["name"] in RESERVED_CONTAINERS
            paths = {m["mountPath"] for m in c.get("volumeMounts", [])}
            if c["name"] != "executor":  # sandbox pods take no user volumes or mounts
                assert paths <= RESERVED_MOUNT_PATHS, paths - RESERVED_MOUNT_PATHS
                assert {v["name"] for v in spec.get("volumes", [])} <= RESERVED_VOLUMES


@pytest.mark.parametrize("run_name", ["single-gpu", "flash-moe"])
def test_overridden_pods_are_valid_for_kubernetes(run_name: str) -> None:
    pods = _pods(run_name, **{f"{c}.podTemplate": OVERRIDES for c in COMPONENTS})
    seen = 0
    for name, obj in pods.items():
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        spec = obj["spec"]["template"]["spec"]
        assert pod_spec_errors(spec, "spec.template.spec") == [], name
        if name.endswith("-sandbox"):
            assert "initContainers" not in spec and spec["securityContext"]["fsGroup"] != 2000
            continue
        seen += 1
        own = ["fetch-weights"] if name.endswith("-rollout") else []  # the operator's first
        assert [c["name"] for c in spec["initContainers"]] == [*own, "warm-cache", "log-shipper"]
        assert spec["securityContext"]["fsGroup"] == 2000
        for c in spec["containers"]:
            names = [e["name"] for e in c["env"]]
            assert len(names) == len(set(names)) and {"HF_HOME", "LOG_FORMAT"} <= set(names)
            assert {"name": "cache", "mountPath": "/cache", "readOnly": False} in c["volumeMounts"]
    assert seen >= 3


def test_an_overlay_applied_twice_renders_the_same_pod() -> None:
    """Keyed merges are idempotent: the builders' output is a fixed point of the overlay."""
    once = _pods("single-gpu", **{"trainer.podTemplate": OVERRIDES})
    twice = _pods("single-gpu", **{"trainer.podTemplate": OVERRIDES})
    assert once == twice
