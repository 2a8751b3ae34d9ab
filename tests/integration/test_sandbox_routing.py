"""Task environments on sandbox pods: each session goes to its environment's executor pool.

Two real executor servers (``gagar sandbox serve``'s, in this process) stand for the default pool
and the ``web`` environment's; the clients resolve both pools' names to this machine, as a
headless Service resolves to its pods."""

from __future__ import annotations

import io
import json
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from gagar import SANDBOX_POOLS_FILE
from gagar.driver.cluster import environment_pool_urls, resolve
from gagar.driver.worker import ClusterProvider
from gagar.manifest import ConfigError
from gagar.sandbox.client import HttpPoolFactory
from gagar.sandbox.local import LocalFactory, check_isolation
from gagar.sandbox.routing import RoutingFactory, pool_factory, read_pools
from gagar.sandbox.server import make_server
from gagar.sandbox.types import Limits, SandboxError
from tests.unit.test_builders import example

LIMITS = Limits(wall_time_s=10, cpu_time_s=5, memory_bytes=512 << 20)


def _serve() -> tuple[object, str]:
    server = make_server(LocalFactory(limits=LIMITS), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, tuple[object, str]]]:
    check_isolation()
    out = {"default": _serve(), "web": _serve()}
    yield out
    for server, _ in out.values():
        server.shutdown()  # type: ignore[attr-defined]
        server.registry.close_all()  # type: ignore[attr-defined]
        server.server_close()  # type: ignore[attr-defined]


def _pool(url: str) -> HttpPoolFactory:
    port = urlsplit(url).port
    return HttpPoolFactory(f"http://pool:{port}", resolve=lambda host, p: ["127.0.0.1"])


def _sessions(servers: dict[str, tuple[object, str]]) -> dict[str, int]:
    return {k: len(s.registry.sessions) for k, (s, _) in servers.items()}  # type: ignore[attr-defined]


def _tarball(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_a_session_goes_to_its_environments_pool_and_the_rest_to_the_default(
    servers: dict[str, tuple[object, str]],
) -> None:
    routing = RoutingFactory(_pool(servers["default"][1]), {"web": _pool(servers["web"][1])})
    try:
        with routing.create(files={"m.py": "X = 1\n"}, environment="web") as s:
            assert s.exec("python3 -c 'import m; print(m.X)'").stdout == "1\n"
            assert _sessions(servers) == {"default": 0, "web": 1}
        with routing.create(files={}) as s:
            assert s.exec("true").ok
            assert _sessions(servers) == {"default": 1, "web": 0}
        tarball = _tarball({"test_a.py": "def test_a():\n    assert True\n"})
        with routing.verification_session(tarball, environment="web") as s:
            assert s.list_files() == ["test_a.py"]
            assert _sessions(servers) == {"default": 0, "web": 1}
        with pytest.raises(
            SandboxError, match=r"no executor pool for environment 'gpu' \(this run's: web\)"
        ):
            routing.create(files={}, environment="gpu")
        assert _sessions(servers) == {"default": 0, "web": 0}
    finally:
        routing.close()


def test_one_pool_without_environments_still_refuses_a_named_one(
    servers: dict[str, tuple[object, str]],
) -> None:
    """No environments on pods: the default pool alone, which refuses a session that names one
    (it runs one image), as before."""
    factory = pool_factory(servers["default"][1], {})
    assert isinstance(factory, HttpPoolFactory)
    with pytest.raises(SandboxError, match="has no environment 'web'"):
        factory.create(files={}, environment="web")
    assert isinstance(pool_factory(servers["default"][1], {"web": "http://w:8090"}), RoutingFactory)


def _config(tmp_path: Path, pools: object | None) -> Path:
    if pools is not None:
        (tmp_path / SANDBOX_POOLS_FILE).write_text(json.dumps(pools))
    return tmp_path


def test_the_trainer_reads_each_environments_pool_from_the_runs_config(tmp_path: Path) -> None:
    envs = [{"name": "web", "image": "r/web:1"}, {"name": "db", "image": "r/db:1"}]
    run = example("single-gpu", **{"sandbox.environments": envs})
    pools = {"web": "http://r-sandbox-web:8090", "db": "http://r-sandbox-db:8090"}
    env = {"GAGAR_RUN_DIR": str(tmp_path), "GAGAR_SANDBOX_URL": "http://r-sandbox:8090",
           "GAGAR_ROLLOUT_URL": "http://r-rollout:8000"}  # fmt: skip
    cluster = resolve(env, run, _config(tmp_path, pools))
    assert dict(cluster.sandbox_pools) == pools
    closers: list = []
    factory = ClusterProvider(cluster).sandboxes(run, closers)
    assert isinstance(factory, RoutingFactory) and sorted(factory.pools) == ["db", "web"]
    assert closers == [factory.close]
    factory.close()
    with pytest.raises(ConfigError, match="environments db: no executor pool"):
        environment_pool_urls(_config(tmp_path, {"web": pools["web"]}), run)
    with pytest.raises(ConfigError, match="not a map"):
        environment_pool_urls(_config(tmp_path, ["web"]), run)
    assert environment_pool_urls(None, example("single-gpu")) == {}  # no environments: none read
    assert read_pools(tmp_path / "absent") == {}


def test_the_graders_pool_sends_a_tasks_tests_to_its_environments_pool(
    servers: dict[str, tuple[object, str]], tmp_path: Path
) -> None:
    """``gagar grader serve --sandbox=pool --config-dir=...``: the agentic grader's run_tests of
    a task of ``web`` run in web's pool, read from the same ``sandbox-pools.json``."""
    from gagar.grader.cli import _pool_factory

    config = _config(tmp_path / "config", None)
    config.mkdir()
    _config(config, {"web": servers["web"][1]})
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "m.py").write_text("X = 1\n")
    open_session = _pool_factory(servers["default"][1], None, config)
    session = open_session(tmp_path / "ws", environment="web")
    try:
        assert _sessions(servers) == {"default": 0, "web": 1}
    finally:
        session.close()
