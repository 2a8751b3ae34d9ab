"""Both aiohttp services (``gagar sandbox serve``, ``gagar grader serve``) against slow, idle,
numerous and malformed clients on 127.0.0.1 (``gagar.serving``): headers sent a byte at a time,
idle keep-alive connections, more connections than the cap, a slow body, a non-UTF-8
``Authorization`` header, a failing handler. Every probe is bounded in count and time."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from gagar.grader.protocol import HeuristicGrader
from gagar.grader.service import GraderService, ServiceConfig, run
from gagar.sandbox.local import LocalFactory, check_isolation
from gagar.sandbox.server import Server, ServerConfig

Start = Callable[..., tuple[str, int]]


def _wait_ready(port: int) -> None:
    for _ in range(200):
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.05)


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Start]:
    servers: list[Server] = []

    def start(**options) -> tuple[str, int]:
        check_isolation()
        factory = LocalFactory(root=str(tmp_path))
        server = Server(factory, ServerConfig(host="127.0.0.1", port=0, **options))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        _wait_ready(server.server_address[1])
        return "127.0.0.1", server.server_address[1]

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def grader() -> Iterator[Start]:
    stops: list[tuple[asyncio.AbstractEventLoop, asyncio.Event, threading.Thread]] = []

    def start(**options) -> tuple[str, int]:
        service = GraderService(HeuristicGrader(), ServiceConfig(drain_seconds=1, **options))
        sock = socket.create_server(("127.0.0.1", 0))
        ready = threading.Event()
        box: dict = {}

        async def main() -> None:
            box["loop"], box["stop"] = asyncio.get_running_loop(), asyncio.Event()
            ready.set()
            await run(service, sock, box["stop"])

        thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
        thread.start()
        ready.wait(10)
        stops.append((box["loop"], box["stop"], thread))
        _wait_ready(sock.getsockname()[1])
        return "127.0.0.1", sock.getsockname()[1]

    yield start
    for loop, stop, thread in stops:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)


SERVICES = ["sandbox", "grader"]


@pytest.fixture(params=SERVICES)
def service(request) -> Start:
    return request.getfixturevalue(request.param)


def _closed_within(s: socket.socket, dribble: bytes, seconds: float) -> float | None:
    """Send ``dribble`` a byte every 0.2 s; the time the server closed the connection (EOF or
    reset), or None when it still held it after ``seconds``."""
    start = time.monotonic()
    s.settimeout(0.2)
    for i in range(int(seconds / 0.2)):
        try:
            s.send(dribble[i % len(dribble) : i % len(dribble) + 1])
            if s.recv(65536) == b"":
                return time.monotonic() - start
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - start
    return None


def test_slow_headers_are_cut_off(service: Start) -> None:
    host, port = service(header_timeout_s=1.0)
    conns = [socket.create_connection((host, port), timeout=5) for _ in range(20)]
    try:
        for s in conns:
            s.sendall(b"GET /healthz HTTP/1.1\r\n")
        # every connection keeps dribbling header bytes; each is closed about 1 s after opening
        closed = [_closed_within(s, b"X-Slow: aaaa\r\n", 6.0) for s in conns]
    finally:
        for s in conns:
            s.close()
    assert None not in closed, f"held past 6 s: {closed.count(None)} of 20"
    assert max(c for c in closed if c is not None) < 4


def test_an_idle_keep_alive_connection_is_closed(service: Start) -> None:
    host, port = service(header_timeout_s=1.0)
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        start = time.monotonic()
        assert s.recv(65536) == b""  # no further request: the server hangs up
        assert time.monotonic() - start < 4


def test_connections_past_the_cap_get_503(service: Start) -> None:
    host, port = service(max_connections=5, header_timeout_s=30.0)
    time.sleep(1.0)  # the fixture's readiness probe has hung up and left its slot
    held = [socket.create_connection((host, port), timeout=5) for _ in range(5)]
    try:
        for s in held:
            s.sendall(b"GET /healthz HTTP/1.1\r\n")  # headers never finished: each stays open
        time.sleep(0.5)
        with socket.create_connection((host, port), timeout=5) as extra:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            reply = extra.recv(65536)
        assert reply.startswith(b"HTTP/1.1 503") and b"too many connections" in reply
    finally:
        for s in held:
            s.close()
    for _ in range(50):  # the slots come back once the held connections are gone
        if httpx.get(f"http://{host}:{port}/healthz", timeout=5).status_code == 200:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the service never served again after the held connections closed")


def test_a_burst_past_the_cap_never_holds_more(service: Start) -> None:
    host, port = service(max_connections=8, header_timeout_s=30.0)
    time.sleep(1.0)
    conns = [socket.create_connection((host, port), timeout=5) for _ in range(40)]
    try:
        for s in conns:
            s.sendall(b"GET /healthz HTTP/1.1\r\n")
        time.sleep(1.0)
        busy = 0
        for s in conns:
            s.settimeout(0.05)
            try:
                busy += s.recv(65536).startswith(b"HTTP/1.1 503")
            except TimeoutError:
                pass
        # the cap holds, however the accepts of one burst interleave (one fewer is held while
        # an earlier connection's clean-up still runs: the count errs on the safe side)
        assert 32 <= busy <= 33
    finally:
        for s in conns:
            s.close()


@pytest.mark.parametrize("value", [b"Bearer \xff\xfe", b"\xc3", b"Bearer tok\x80en"])
def test_a_non_utf8_token_is_401_without_a_traceback(
    service: Start, value: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    host, port = service(token="token")
    for path in (b"/v1/grade", b"/v1/sessions"):
        request = b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(request + b"Authorization: " + value + b"\r\n\r\n{}")
            reply = s.recv(65536)
        assert reply.split(b" ", 2)[1] == b"401", reply[:200]
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


def test_grader_slow_body_is_cut_off(grader: Start) -> None:
    host, port = grader(body_timeout_s=1.0)
    start = time.monotonic()
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(b"POST /v1/grade HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        reply = s.recv(65536)
    assert reply.split(b" ", 2)[1] == b"408" and time.monotonic() - start < 5


def test_grader_failure_is_one_log_line_and_a_json_500(
    grader: Start, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(self, _request):
        raise KeyError("boom")

    monkeypatch.setattr(GraderService, "_healthz", broken)
    host, port = grader()
    caplog.clear()  # the fixture's readiness probe failed the same way
    with caplog.at_level(logging.ERROR):
        r = httpx.get(f"http://{host}:{port}/healthz", timeout=5)
    assert r.status_code == 500 and r.json() == {"error": "internal error: KeyError"}
    lines = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert len(lines) == 1 and lines[0].exc_info is None
    assert "GET /healthz failed: KeyError" in lines[0].getMessage()
