"""Every operator replica answers its probes (``gagar.operator.health``): a follower while its
lease loop runs, a leader while kopf's loop answers too; and the chart probes what they serve,
also with several replicas (before, only the leader served ``/healthz``: the chart restarted
every follower about every 70 s and never counted it Ready)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from gagar.operator.health import START_GRACE_S, Health, serve
from tests.support.tools import helm_template


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in a thread, as kopf's runs beside the lease loop."""
    running = asyncio.new_event_loop()
    thread = threading.Thread(target=running.run_forever, daemon=True)
    thread.start()
    yield running
    if not running.is_closed():
        running.call_soon_threadsafe(running.stop)
        thread.join(5)
        running.close()


def test_a_follower_is_alive_and_ready_while_its_lease_loop_beats() -> None:
    clock = Clock()
    health = Health(lease_stale_s=30.0, clock=clock)
    assert health.alive() and health.ready()
    clock.now += 25
    health.lease_tried()
    clock.now += 25
    assert health.alive() and health.ready()
    clock.now += 10  # 35 s without a try: the loop hangs
    assert not health.alive() and not health.ready()


def test_a_leader_is_alive_while_kopf_starts_and_answers(loop: asyncio.AbstractEventLoop) -> None:
    clock = Clock()
    health = Health(lease_stale_s=30.0, clock=clock)
    health.leading()
    assert health.alive() and not health.ready()  # kopf starting
    clock.now += START_GRACE_S + 1
    health.lease_tried()
    assert not health.alive()  # kopf never started
    health.kopf_started(loop)
    assert health.alive() and health.ready()
    loop.call_soon_threadsafe(loop.stop)
    while loop.is_running():
        time.sleep(0.01)
    loop.close()  # kopf ended
    assert not health.alive() and not health.ready()


def test_without_election_kopf_alone_decides(loop: asyncio.AbstractEventLoop) -> None:
    clock = Clock()
    health = Health(clock=clock)
    assert health.alive() and not health.ready()
    clock.now += 3600  # no lease loop to go stale
    health.kopf_started(loop)
    assert health.alive() and health.ready()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_chart_s_probes_of_two_replicas_reach_a_follower() -> None:
    """``operator.replicas: 2`` (real helm): the liveness and readiness probes ask the health
    port for paths that a follower (lease loop running, no kopf) answers with 200."""
    (dep,) = [o for o in helm_template("--set", "operator.replicas=2") if o["kind"] == "Deployment"]
    container = dep["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert f"--health-port={ports['health']}" in container["args"]
    port = free_port()
    server = serve(Health(lease_stale_s=30.0), port, host="127.0.0.1")
    try:
        for probe in ("livenessProbe", "readinessProbe"):
            get = container[probe]["httpGet"]
            assert get["port"] in ("health", ports["health"])
            answer = httpx.get(f"http://127.0.0.1:{port}{get['path']}", timeout=5)
            assert answer.status_code == 200, (probe, get["path"])
        assert httpx.get(f"http://127.0.0.1:{port}/nothing", timeout=5).status_code == 404
    finally:
        server.shutdown()
        server.server_close()
