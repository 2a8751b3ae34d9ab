"""The trainer's half of task images: a row's image reaches its sessions (on sandbox pods), the
images asked for are published in ``<run>-progress`` at once, and a session waits a bounded time
for its image's pool (docs/design.md, "Task images")."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gagar import SANDBOX_POOLS_FILE
from gagar.driver.cluster import SANDBOX_IMAGES_KEY, Cluster, progress_data
from gagar.driver.worker import ClusterProvider, missed_images, publish_images
from gagar.operator.builders.images import IMAGES_KEY
from gagar.rollout.envs.task import parse_task
from gagar.rollout.envs.verify import open_session, placement
from gagar.sandbox.routing import ImageWait, RoutingFactory, pool_factory
from gagar.sandbox.types import SandboxInfraError, SessionRequest, VerificationFactory

IMAGE = "swebench/sweb.eval.x86_64.acme_1776_calc-1:latest"
ROW = {
    "instance_id": "acme__calc-1",
    "problem_statement": "add is wrong",
    "files": {"calc.py": "def add(a, b):\n    return a - b\n"},
    "FAIL_TO_PASS": '["test_calc.py::test_add"]',
    "image_name": IMAGE,
}


class Recorder(VerificationFactory):
    """A factory that keeps the requests it was given (a session is the request itself)."""

    def __init__(self, fail: list[Exception] | None = None) -> None:
        self.requests: list[SessionRequest] = []
        self.fail = fail or []

    def open(self, request: SessionRequest) -> Any:
        if self.fail:
            raise self.fail.pop(0)
        self.requests.append(request)
        return request


class Routing(Recorder):
    runs_task_images = True


def test_a_rows_image_name_is_its_image_and_an_environment_wins() -> None:
    task = parse_task(ROW)
    assert task.image == IMAGE and task.sandbox_image == IMAGE
    assert task.metadata["image_name"] == IMAGE  # kept where it always was
    assert parse_task({**ROW, "environment": "web"}).sandbox_image is None
    with pytest.raises(ValueError, match="image"):
        parse_task({**ROW, "image_name": "not an image\nkind: Pod"})


def test_the_sessions_of_a_task_ask_for_its_image_where_images_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    task = parse_task(ROW)
    pods = Routing()
    open_session(task, pods)
    assert pods.requests[0].image == IMAGE and pods.requests[0].environment is None
    assert placement(task, pods) == (None, IMAGE)
    local = Recorder()  # the local backend runs no containers: the task runs as before, said so
    with caplog.at_level(logging.WARNING, logger="gagar.rollout"):
        open_session(task, local)
    assert local.requests[0].image is None
    assert "is not used: Recorder runs no task images" in caplog.text


def test_a_new_image_is_published_at_once_and_with_every_progress_report() -> None:
    factory = pool_factory("http://sandbox:8090", {}, config_dir=Path("/nonexistent"))
    assert isinstance(factory, RoutingFactory)
    provider = ClusterProvider(Cluster(Path("/run"), "pvc://x", "http://rollout"))
    provider.images = factory.images
    reports: list[dict[str, str]] = []
    reporter: Any = type("R", (), {"report": lambda self, data: reports.append(data)})()
    publish_images(provider, reporter)
    factory.images.use("a:1")
    factory.images.use("b:1")
    factory.images.use("a:1")  # no new image: published with the step's report, not now
    assert reports == [{IMAGES_KEY: '["a:1"]'}, {IMAGES_KEY: '["b:1", "a:1"]'}]
    data = progress_data(3, 3, None, None, "t", factory.images.wanted())
    assert json.loads(data[SANDBOX_IMAGES_KEY]) == ["a:1", "b:1"]
    assert SANDBOX_IMAGES_KEY not in progress_data(3, 3, None, None, "t")  # no routing: kept


def test_a_session_waits_for_its_images_pool_to_be_listed_and_ready() -> None:
    pool = Recorder(fail=[SandboxInfraError("no sandbox executor behind 'x'")])
    listed = threading.Event()

    def refresh(known: Any) -> dict[str, Any]:
        if listed.is_set():
            return {f"image:{IMAGE}": pool}
        listed.set()  # listed at the second look
        return {}

    factory = RoutingFactory(Recorder(), {}, refresh, ImageWait(5.0, 0.01))
    session = factory.create(files={}, image=IMAGE)
    assert session.image is None and pool.requests == [session]
    pool.fail = [SandboxInfraError("connection refused")]  # served once: a failure is at once
    with pytest.raises(SandboxInfraError, match="connection refused within 5s"):
        factory.create(files={}, image=IMAGE)


def test_an_image_without_a_pool_in_time_is_an_infrastructure_failure(tmp_path: Path) -> None:
    (tmp_path / SANDBOX_POOLS_FILE).write_text("{}")
    factory = pool_factory("http://s:8090", {}, config_dir=tmp_path, wait=ImageWait(0.05, 0.01))
    with pytest.raises(
        SandboxInfraError, match=r"no executor pool for the task image .* within 0s"
    ):
        factory.create(files={}, image=IMAGE)
    assert factory.images.wanted() == [IMAGE]  # type: ignore[union-attr]
    line = missed_images(factory.images)  # type: ignore[union-attr]
    assert line is not None and line.startswith("1 session(s) found no ready executor pool")
    assert line.endswith(f"{IMAGE} (1)") and "invalid.sandbox_error" in line
    assert missed_images(factory.images) is None  # type: ignore[union-attr]  # taken: per step


def test_a_pools_file_read_half_written_is_waited_out_not_a_failed_test(tmp_path: Path) -> None:
    (tmp_path / SANDBOX_POOLS_FILE).write_text("")
    factory = pool_factory("http://s:8090", {}, config_dir=tmp_path, wait=ImageWait(0.05, 0.01))
    with pytest.raises(SandboxInfraError, match="Expecting value"):
        factory.create(files={}, image=IMAGE)


def test_the_sessions_of_an_image_wait_for_its_pool_together_not_each_in_turn() -> None:
    """A group's n sessions (each made ahead, then again when that failed) share one wait:
    once it is over, the next session tries once; as long again later, one waits anew."""
    factory = RoutingFactory(Recorder(), {}, lambda known: {}, ImageWait(0.3, 0.01))
    started = time.monotonic()
    with pytest.raises(SandboxInfraError):
        factory.create(files={}, image=IMAGE)
    assert 0.3 <= time.monotonic() - started < 1.0
    started = time.monotonic()
    with pytest.raises(SandboxInfraError):
        factory.create(files={}, image=IMAGE)
    assert time.monotonic() - started < 0.1
    time.sleep(0.45)  # past twice the wait since it began: a new wait
    started = time.monotonic()
    with pytest.raises(SandboxInfraError):
        factory.create(files={}, image=IMAGE)
    assert time.monotonic() - started >= 0.3


def test_the_cluster_trainer_reads_the_runs_config_again_for_a_task_images_pool(
    tmp_path: Path,
) -> None:
    from gagar.driver.cluster import resolve
    from tests.unit.test_builders import example

    run = example("single-gpu")  # sandbox pods, no task environments
    env = {"GAGAR_RUN_DIR": str(tmp_path), "GAGAR_SANDBOX_URL": "http://r-sandbox:8090",
           "GAGAR_ROLLOUT_URL": "http://r-rollout:8000"}  # fmt: skip
    provider = ClusterProvider(resolve(env, run, tmp_path))
    factory = provider.sandboxes(run, [])
    assert isinstance(factory, RoutingFactory) and provider.images is factory.images
    (tmp_path / SANDBOX_POOLS_FILE).write_text(json.dumps({f"image:{IMAGE}": "http://p:8090"}))
    assert factory._image_pool(IMAGE) is factory.pools[f"image:{IMAGE}"]
    assert factory.wait.seconds > 0
