"""``gagar sandbox serve`` and ``gagar grader serve`` against hostile or broken clients: the body
cap, finite bounds, the session limit, idle expiry, the backlog, slow
bodies, SIGTERM, loopback defaults and the shared token."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from gagar import auth
from gagar.sandbox.client import HttpFactory
from gagar.sandbox.local import SESSION_PREFIX, LocalFactory, check_isolation
from gagar.sandbox.server import Server, ServerConfig
from gagar.sandbox.types import Limits, SandboxError

LIMITS = Limits(wall_time_s=10, cpu_time_s=5, memory_bytes=512 << 20)


def _start(tmp_path: Path, **options) -> tuple[Server, str]:
    check_isolation()
    factory = LocalFactory(limits=LIMITS, root=str(tmp_path))
    server = Server(factory, ServerConfig(host="127.0.0.1", port=0, **options))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    for _ in range(100):
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            break
        except httpx.TransportError:
            time.sleep(0.05)
    return server, url


@pytest.fixture
def served(tmp_path: Path):
    started: list[Server] = []

    def start(**options) -> str:
        server, url = _start(tmp_path, **options)
        started.append(server)
        return url

    yield start
    for server in started:
        server.shutdown()
        server.server_close()
    assert not list(tmp_path.glob(f"{SESSION_PREFIX}*")), "a session outlived its server"


def _raw(url: str, request: bytes, wait: float = 5.0) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as s:
        s.sendall(request)
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except TimeoutError:
            pass
    return b"".join(chunks)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_negative_content_length_is_refused(served) -> None:
    url = served(max_body_bytes=1 << 20)
    head = b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n"
    reply = _raw(url, head + b"{}" * 1000)
    assert reply.split(b" ", 2)[1] == b"400"
    assert httpx.get(f"{url}/healthz").json()["sessions"] == 0


def test_body_cap_holds_without_content_length(served) -> None:
    url = served(max_body_bytes=1 << 20)

    def chunks():
        for _ in range(64):
            yield b"x" * (64 << 10)  # 4 MiB, chunked: no Content-Length to check up front

    r = httpx.post(f"{url}/v1/sessions", content=chunks())
    assert r.status_code == 413


@pytest.mark.parametrize("timeout", ["NaN", "Infinity", "-1", "1e9", "0"])
def test_exec_timeout_must_be_finite_and_bounded(served, timeout: str) -> None:
    url = served()
    sid = httpx.post(f"{url}/v1/sessions", json={}).json()["id"]
    before = _open_fds()
    for _ in range(10):
        body = '{"cmd": "true", "timeout": ' + timeout + "}"
        r = httpx.post(f"{url}/v1/sessions/{sid}/exec", content=body)
        assert r.status_code == 400, r.text
    assert _open_fds() <= before + 2  # no descriptor leaks per refused request
    assert (
        httpx.post(f"{url}/v1/sessions/{sid}/exec", json={"cmd": "true"}).json()["exit_code"] == 0
    )


def test_session_limit_is_atomic(served) -> None:
    url = served(max_sessions=4)
    with ThreadPoolExecutor(32) as pool:
        codes = list(
            pool.map(
                lambda _: httpx.post(f"{url}/v1/sessions", json={}, timeout=60).status_code,
                range(32),
            )
        )
    assert codes.count(200) == 4 and codes.count(503) == 28
    assert httpx.get(f"{url}/healthz").json()["sessions"] == 4


def test_abandoned_sessions_expire(served) -> None:
    url = served(max_sessions=2, idle_timeout_s=1.0)
    for _ in range(2):
        assert httpx.post(f"{url}/v1/sessions", json={}).status_code == 200
    assert httpx.post(f"{url}/v1/sessions", json={}).status_code == 503
    deadline = time.monotonic() + 10
    while httpx.get(f"{url}/healthz").json()["sessions"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert httpx.post(f"{url}/v1/sessions", json={}).status_code == 200


def test_a_busy_session_is_not_expired(served) -> None:
    url = served(idle_timeout_s=0.5)
    with HttpFactory(url).create(files={}) as s:
        assert s.exec("sleep 2 && echo done").stdout == "done\n"
        assert s.list_files() == []


def test_backlog_takes_a_burst_of_connections(served) -> None:
    url = served(max_sessions=16)
    with ThreadPoolExecutor(64) as pool:
        codes = list(
            pool.map(lambda _: httpx.get(f"{url}/healthz", timeout=30).status_code, range(256))
        )
    assert codes == [200] * 256


def test_slow_body_is_cut_off(served) -> None:
    url = served(body_timeout_s=1.0)
    host, port = url.removeprefix("http://").split(":")
    start = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        reply = s.recv(65536)  # the first bytes back: the answer, while the body never came
    assert reply.split(b" ", 2)[1] == b"408" and time.monotonic() - start < 5


def test_shared_token_is_required(served, tmp_path: Path, monkeypatch) -> None:
    url = served(token="s3cret")
    assert httpx.post(f"{url}/v1/sessions", json={}).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert httpx.post(f"{url}/v1/sessions", json={}, headers=wrong).status_code == 401
    assert httpx.get(f"{url}/healthz").status_code == 200  # probes stay open
    with pytest.raises(SandboxError, match="wrong token"):
        HttpFactory(url).create(files={})
    (tmp_path / "token").write_text("s3cret\n")
    monkeypatch.setenv(auth.TOKEN_FILE_ENV, str(tmp_path / "token"))
    with HttpFactory(url).create(files={}) as s:
        assert s.exec("echo ok").stdout == "ok\n"


def test_sigterm_closes_every_session(tmp_path: Path) -> None:
    check_isolation()
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gagar.cli", "sandbox", "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        url = proc.stdout.readline().strip().rsplit(" ", 1)[1]
        factory = HttpFactory(url)
        sessions = [factory.create(files={"a": "1"}) for _ in range(3)]
        assert sessions[0].exec("cat a").stdout == "1"
        assert len(list(tmp_path.glob(f"{SESSION_PREFIX}*"))) == 3
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        proc.kill()
    assert not list(tmp_path.glob(f"{SESSION_PREFIX}*"))


def test_grader_serve_defaults_to_loopback() -> None:
    from gagar.cli import build_parser

    args = build_parser().parse_args(["grader", "serve"])
    assert args.host == "127.0.0.1"
    sandbox = build_parser().parse_args(["sandbox", "serve"])
    assert sandbox.host == "127.0.0.1"


def test_grader_service_requires_the_token(tmp_path: Path, monkeypatch) -> None:
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from gagar.grader.protocol import HeuristicGrader
    from gagar.grader.service import GraderService, ServiceConfig

    async def probe() -> tuple[int, int, int]:
        service = GraderService(HeuristicGrader(), ServiceConfig(token="tok"))
        async with TestClient(TestServer(service.app())) as client:
            no = (await client.post("/v1/grade", data=b"{}")).status
            yes = (await client.post("/v1/grade", data=b"{}", headers=auth.headers("tok"))).status
            health = (await client.get("/healthz")).status
        return no, yes, health

    no, yes, health = asyncio.run(probe())
    assert (no, yes, health) == (401, 400, 200)  # with the token: past auth, to validation
    assert json.loads(json.dumps(auth.headers("tok"))) == {"Authorization": "Bearer tok"}


def _serve(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gagar.cli", "sandbox", "serve", "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    return proc, proc.stdout.readline().strip().rsplit(" ", 1)[1]


def _leftovers(session_dir: Path) -> dict[str, object]:
    """What a session left on the host: its directory, its tmpfs, its cgroups, its uid's
    processes (the uid is recorded in its owner lock)."""
    from gagar.sandbox.cgroup import _own_path

    tag = session_dir.name.removeprefix(SESSION_PREFIX) + "-"
    groups = [
        d
        for c in ("memory", "pids", "cpuacct")
        if (parent := _own_path(c)) is not None and parent.is_dir()
        for d in parent.glob(f"gagar-{tag}*")
    ]
    uid = int((session_dir / ".owner.lock").read_text() or -1) if session_dir.exists() else -1
    procs = [p for p in Path("/proc").glob("[0-9]*") if p.exists() and p.stat().st_uid == uid]
    return {
        "dir": session_dir.exists(),
        "mounted": os.path.ismount(session_dir),
        "cgroups": groups,
        "processes": len(procs),
    }


# cold: a command's own jail; warm: the session's fork server's jail and a run forked from it
SLEEPS = ["sleep 60", "python3 -c 'import time; time.sleep(60)'"]


@pytest.mark.parametrize("sleep", SLEEPS, ids=["cold", "warm"])
def test_a_restart_after_kill_9_reclaims_everything_at_once(tmp_path: Path, sleep: str) -> None:
    check_isolation()
    proc, url = _serve(tmp_path)
    try:
        session = HttpFactory(url).create(files={"a": "1"})
        running = threading.Thread(target=lambda: _swallow(session.exec, sleep), daemon=True)
        running.start()
        time.sleep(2)  # the command runs: its cgroups exist
        (session_dir,) = tmp_path.glob(f"{SESSION_PREFIX}*")
        before = _leftovers(session_dir)
        proc.kill()
        proc.wait(10)
    finally:
        proc.kill()
    left = _leftovers(session_dir)
    assert left["dir"], f"nothing left to reclaim: the test proves nothing ({before}, {left})"
    successor, _ = _serve(tmp_path)  # serving only after the sweep: checked as soon as it says so
    try:
        assert _leftovers(session_dir) == {
            "dir": False,
            "mounted": False,
            "cgroups": [],
            "processes": 0,
        }, f"left by the killed server: {left}"
    finally:
        successor.send_signal(signal.SIGTERM)
        successor.wait(60)


def _swallow(fn, *args) -> None:
    try:
        fn(*args)
    except (SandboxError, httpx.HTTPError):
        pass  # the server it ran on was killed


@pytest.mark.parametrize("sleep", SLEEPS, ids=["cold", "warm"])
def test_a_running_server_reclaims_what_a_killed_executor_left(tmp_path: Path, sleep: str) -> None:
    check_isolation()
    proc, _ = _serve(tmp_path, "--idle-timeout", "2")  # sweeps every 0.5 s
    killed = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from gagar.sandbox.local import LocalFactory;"
            f"s = LocalFactory(root={str(tmp_path)!r}).create(files={{'a': '1'}});"
            f"print(s.dir, flush=True); s.exec({sleep!r})",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        session_dir = Path(killed.stdout.readline().strip())
        time.sleep(1)
        assert _leftovers(session_dir)["dir"]
        killed.kill()
        killed.wait(10)
        clean = {"dir": False, "mounted": False, "cgroups": [], "processes": 0}
        # everything, not the folder alone: the cgroups go after it, the killed processes last
        # (a sweep every 0.5 s; generous for a machine at a load of 10 on 2 cores)
        deadline = time.monotonic() + 60
        while _leftovers(session_dir) != clean and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _leftovers(session_dir) == clean
    finally:
        killed.kill()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def _tarball(*members: tuple[str, bytes | None, str | None]) -> str:
    """A base64 tarball of (name, data, link target) members."""
    import base64
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data, target in members:
            info = tarfile.TarInfo(name)
            if target is not None:
                info.type, info.linkname = tarfile.SYMTYPE, target
                tar.addfile(info)
            else:
                info.size = len(data or b"")
                tar.addfile(info, io.BytesIO(data or b""))
    return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize(
    "members",
    [
        [("../escape", b"x", None)],
        [("link", None, "../../etc")],
        [("link", None, "/etc"), ("link/passwd", b"x", None)],
        [("d", b"a file", None), ("d/x", b"x", None)],
    ],
    ids=["dotdot", "link-dotdot", "link-absolute", "file-as-dir"],
)
def test_bad_tarball_errors_name_no_host_path(served, tmp_path: Path, members) -> None:
    url = served()
    r = httpx.post(f"{url}/v1/sessions", json={"tarball_b64": _tarball(*members)})
    error = r.json()["error"]
    assert r.status_code == 400 and error.startswith("bad tarball"), error
    assert str(tmp_path) not in error and SESSION_PREFIX not in error and "/tmp" not in error
