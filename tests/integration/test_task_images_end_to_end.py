"""Task images end to end on the emulator: a dataset row names its own image, the trainer's
session of it publishes the image in ``<run>-progress`` (through the Kubernetes API, as the
cluster trainer's ``ProgressReporter`` does), the operator makes that image's executor pool and
lists it in the run's ConfigMap, and the waiting session opens there.

A real executor server (``gagar sandbox serve``'s, in this process) stands for the image's pool:
the "kubelet" below copies the run's ``sandbox-pools.json`` into the trainer's config dir with
that server's port, and the pool's name resolves to this machine, as a headless Service resolves
to its ready pods."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gagar import SANDBOX_POOLS_FILE
from gagar.driver.cluster import Cluster, ProgressReporter
from gagar.driver.worker import ClusterProvider, publish_images
from gagar.rollout.envs.task import load_tasks
from gagar.rollout.envs.verify import open_session
from gagar.sandbox.local import LocalFactory, check_isolation
from gagar.sandbox.routing import ImageWait, RoutingFactory, pool_factory
from gagar.sandbox.server import make_server
from gagar.sandbox.types import Limits
from tests.integration.test_operator_scenarios import Env, make_env, manifest

IMAGE = "swebench/sweb.eval.x86_64.acme_1776_calc-1:latest"
ROW = {
    "instance_id": "acme__calc-1",
    "repo": "acme/calc",
    "problem_statement": "add(2, 3) returns -1",
    "files": {"calc.py": "def add(a, b):\n    return a - b\n"},
    "FAIL_TO_PASS": '["test_calc.py::test_add"]',
    "image_name": IMAGE,
}


@pytest.fixture(params=["emulator"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    yield from make_env(request.param, tmp_path)


@pytest.fixture
def image_server() -> Iterator[Any]:
    check_isolation()
    server = make_server(LocalFactory(limits=Limits(wall_time_s=10)), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.registry.close_all()
    server.server_close()


def _kubelet(env: Env, run: str, config_dir: Path, port: int, stop: threading.Event) -> None:
    """Keeps ``config_dir``'s copy of the run's ``sandbox-pools.json`` current (the URLs on the
    executor server's port), as the kubelet refreshes a mounted ConfigMap."""
    while not stop.wait(0.05):
        config = env.kube.get("v1", "ConfigMap", env.namespace, f"{run}-config") or {}
        pools = json.loads((config.get("data") or {}).get(SANDBOX_POOLS_FILE, "{}"))
        moved = {k: u.rsplit(":", 1)[0] + f":{port}" for k, u in pools.items()}
        fresh = config_dir / f".{SANDBOX_POOLS_FILE}"
        fresh.write_text(json.dumps(moved))
        fresh.replace(config_dir / SANDBOX_POOLS_FILE)  # at once, as the kubelet swaps a link


def test_a_rows_image_gets_its_pool_through_the_trainers_published_list(
    env: Env, image_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = manifest()
    name = run["metadata"]["name"]
    rows = tmp_path / "tasks.jsonl"
    rows.write_text(json.dumps(ROW) + "\n")
    [task] = load_tasks(rows)
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    port = image_server.server_address[1]
    real = socket.getaddrinfo

    def resolve(host: str, *args: Any, **kwargs: Any) -> Any:  # the pools' headless Services
        return real("127.0.0.1" if host.startswith(f"{name}-sandbox") else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    factory = pool_factory(f"http://{name}-sandbox:8090", {}, config_dir=config_dir,
                           wait=ImageWait(60.0, 0.05))  # fmt: skip
    assert isinstance(factory, RoutingFactory)
    provider = ClusterProvider(Cluster(tmp_path, "pvc://x", "http://rollout"))
    provider.images = factory.images
    core = client.CoreV1Api(env.kube.client)
    publish_images(provider, ProgressReporter(core, f"{name}-progress", env.namespace))
    stop = threading.Event()
    kubelet = threading.Thread(target=_kubelet, args=(env, name, config_dir, port, stop))
    with env.operator():
        env.create(run)
        env.wait(lambda: env.get("v1", "ConfigMap", f"{name}-progress"), what="progress")
        kubelet.start()
        try:
            session = open_session(task, factory)  # waits for the pool the operator makes
        finally:
            stop.set()
            kubelet.join()
        try:
            assert session.list_files() == ["calc.py"]
            assert len(image_server.registry.sessions) == 1
        finally:
            session.close()
            factory.close()
    progress = env.get("v1", "ConfigMap", f"{name}-progress")
    assert json.loads(progress["data"]["sandboxImages"]) == [IMAGE]
    pools = json.loads(env.get("v1", "ConfigMap", f"{name}-config")["data"][SANDBOX_POOLS_FILE])
    pool = pools[f"image:{IMAGE}"].removeprefix("http://").split(":")[0]
    deployment = env.get("apps/v1", "Deployment", pool)
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE
