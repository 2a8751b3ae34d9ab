"""``gagar sandbox serve`` and its client implement the same protocol as local sessions."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import threading

import pytest

from gagar.sandbox import Session
from gagar.sandbox.client import HttpFactory
from gagar.sandbox.local import LocalFactory, check_isolation
from gagar.sandbox.server import make_server
from gagar.sandbox.types import Limits, SandboxError
from tests.support.exposition import missing, value

LIMITS = Limits(wall_time_s=10, cpu_time_s=5, memory_bytes=512 << 20)


@pytest.fixture(scope="module")
def base_url():
    check_isolation()
    server = make_server(LocalFactory(limits=LIMITS), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.registry.close_all()
    server.server_close()


def test_remote_session_round_trip(base_url: str) -> None:
    factory = HttpFactory(base_url)
    assert factory.healthy()
    with factory.create(files={"m.py": "X = 1\n"}) as s:
        assert isinstance(s, Session)
        r = s.exec("python3 -c 'import m; print(m.X)'")
        assert r.ok and r.stdout == "1\n"
        s.write_file("m.py", b"X = 2\n")
        assert s.read_file("m.py") == b"X = 2\n"
        assert "+X = 2" in s.diff()
        assert s.list_files() == ["m.py"]
        with tarfile.open(fileobj=io.BytesIO(s.archive())) as tar:
            assert tar.getnames() == ["m.py"]
        s.reset()
        assert s.diff() == ""
        with pytest.raises(SandboxError, match="leaves the workspace"):
            s.read_file("../../etc/passwd")
        with pytest.raises(SandboxError, match="no such file"):
            s.read_file("missing.py")
        assert s.exec("sleep 5", timeout=0.5).timed_out


def test_pool_sessions_get_the_runs_limits_not_the_pods(base_url: str) -> None:
    """The trainer's and grader's pool clients send ``spec.sandbox.limits`` with every session
    (the executor pod's own defaults, LIMITS here, apply only to sessions created without)."""
    from gagar.sandbox.client import HttpPoolFactory
    from gagar.spec import SandboxLimits

    spec = SandboxLimits(wall_seconds=1.0, cpu_seconds=1)
    pool = HttpPoolFactory(base_url, resolve=lambda host, port: ["127.0.0.1"])
    strict = HttpPoolFactory(
        base_url, limits=Limits(**spec.executor_limits()), resolve=lambda host, port: ["127.0.0.1"]
    )
    try:
        with strict.create(files={}) as s:
            assert s.exec("sleep 3").timed_out
        with pool.create(files={}) as s:
            assert s.exec("sleep 3").ok
    finally:
        pool.close()
        strict.close()


def test_remote_session_from_tarball_and_limits(base_url: str) -> None:
    with LocalFactory().create(files={"a/b.txt": "tar"}) as local:
        blob = local.archive()
    factory = HttpFactory(base_url)
    with factory.create(tarball=blob, limits=Limits(wall_time_s=1)) as s:
        assert s.exec("cat a/b.txt").stdout == "tar"
        assert s.exec("sleep 3").timed_out  # the session's own limits apply


def test_metrics_follow_the_catalogue_from_start_up() -> None:
    import httpx

    server = make_server(
        LocalFactory(limits=LIMITS), "127.0.0.1", 0, labels={"run": "demo", "pool": "sandbox"}
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        first = httpx.get(f"{url}/metrics").text
        assert missing(first, "sandbox") == []
        assert value(first, "gagar_sandbox_sessions_max", run="demo", pool="sandbox") == 64
        with HttpFactory(url).create(files={}) as s:
            s.exec("true")
            s.exec("exit 1")
            s.exec("sleep 5", timeout=0.3)
            s.exec("python3 -c 'x = bytearray(900 << 20); print(len(x))'")
            text = httpx.get(f"{url}/metrics").text
    finally:
        server.shutdown()
        server.registry.close_all()
        server.server_close()
    m = {"run": "demo", "pool": "sandbox"}
    total = "gagar_sandbox_executions_total"
    assert [value(text, total, outcome=o, **m) for o in ("ok", "failed", "timeout", "limit")] == [
        1,
        1,
        1,
        1,
    ]
    assert value(text, "gagar_sandbox_timeouts_total", **m) == 1
    assert value(text, "gagar_sandbox_oom_kills_total", **m) == 1
    assert value(text, "gagar_sandbox_limit_hits_total", kind="memory", **m) == 1
    assert value(text, "gagar_sandbox_limit_hits_total", kind="wall_time", **m) == 1
    assert value(text, "gagar_sandbox_execution_duration_seconds_count", **m) == 4
    assert value(text, "gagar_sandbox_sessions_active", **m) == 1


def test_binary_files_travel(base_url: str) -> None:
    blob = bytes(range(256))
    with HttpFactory(base_url).create(files={"bin.dat": blob, "t.txt": "text"}) as s:
        assert s.read_file("bin.dat") == blob and s.read_file("t.txt") == b"text"
        s.write_file("out.dat", blob[::-1])
        assert s.exec("wc -c < out.dat").stdout.strip() == "256"


def test_bad_requests_are_refused(base_url: str) -> None:
    import httpx

    assert httpx.post(f"{base_url}/v1/sessions", json={"nope": 1}).status_code == 400
    assert (
        httpx.post(f"{base_url}/v1/sessions/unknown/exec", json={"cmd": "true"}).status_code == 404
    )
    with pytest.raises(SandboxError):
        HttpFactory(base_url).create(limits=None, files={"../x": "y"})


def test_unreachable_server_is_an_infrastructure_error() -> None:
    import httpx

    from gagar.sandbox.client import HttpSession

    with httpx.Client(base_url="http://127.0.0.1:9", timeout=2) as client:
        r = HttpSession(client, "gone").exec("true")
    assert r.infra_error and "unreachable" in r.infra_error and not r.ok


def test_cli_exec_prints_one_json_object(tmp_path) -> None:
    (tmp_path / "data.txt").write_text("from workspace")
    cmd = [sys.executable, "-m", "gagar.cli", "sandbox", "exec", "--timeout", "5"]
    cmd += ["--workspace", str(tmp_path), "--", "sh", "-c", "cat data.txt; exit 3"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert result["exit_code"] == 3 and result["stdout"] == "from workspace"
    assert result["infra_error"] is None


def test_cli_exec_timeout_and_memory() -> None:
    cmd = [sys.executable, "-m", "gagar.cli", "sandbox", "exec", "--timeout", "1"]
    cmd += ["--memory", str(128 << 20), "--", "sleep", "10"]
    result = json.loads(subprocess.run(cmd, capture_output=True, text=True).stdout)
    assert result["timed_out"] and result["limit_hit"] == "wall_time"


def test_cli_rejects_bad_limits_and_missing_command(tmp_path) -> None:
    base = [sys.executable, "-m", "gagar.cli", "sandbox", "exec"]
    out = subprocess.run([*base, "--memory", "1000", "--", "true"], capture_output=True, text=True)
    assert out.returncode == 2 and "memory_bytes" in out.stderr and out.stdout == ""
    out = subprocess.run([*base, "--"], capture_output=True, text=True)
    assert out.returncode == 2 and "no command" in out.stderr
    out = subprocess.run(
        [*base, "--workspace", str(tmp_path / "nope"), "--", "true"], capture_output=True, text=True
    )
    assert out.returncode != 0 and "not a directory" in out.stderr


def test_cli_unsafe_mode_says_so_loudly() -> None:
    cmd = [sys.executable, "-m", "gagar.cli", "sandbox", "exec", "--unsafe-no-isolation"]
    out = subprocess.run([*cmd, "--", "echo", "x"], capture_output=True, text=True)
    assert "isolation is OFF" in out.stderr and json.loads(out.stdout)["stdout"] == "x\n"


def test_cli_serve_starts_and_answers(tmp_path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gagar.cli", "sandbox", "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        url = line.strip().rsplit(" ", 1)[1]
        with HttpFactory(url).create(files={"f": "1"}) as s:
            assert s.exec("cat f").stdout == "1"
    finally:
        proc.terminate()
        proc.wait(10)


def test_serve_keeps_sessions_under_the_workspace_root(tmp_path) -> None:
    """A sandbox pod's root filesystem is read-only: sessions must live on its workspace volume."""
    from gagar.cli import build_parser
    from gagar.sandbox.cli import _factory

    root = tmp_path / "workspace"
    root.mkdir()
    args = build_parser().parse_args(
        ["sandbox", "serve", "--host=0.0.0.0", f"--workspace-root={root}"]
    )
    check_isolation()
    with _factory(args, root=args.workspace_root).create(files={"a.py": "X = 1\n"}) as s:
        assert s.dir.parent == root
    missing = ["sandbox", "serve", f"--workspace-root={tmp_path / 'none'}"]
    assert args.func(build_parser().parse_args(missing)) == 2


def test_verification_sessions_are_the_servers_stations() -> None:
    """The cluster's verification (``HttpPoolFactory.verification_session``) runs in the
    executor's stations: the second candidate's test run is forked from the first's server."""
    from gagar.sandbox.client import HttpPoolFactory, _call
    from gagar.sandbox.workspace import files_tarball

    check_isolation()
    local = LocalFactory(limits=LIMITS)
    server = make_server(local, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    pool = HttpPoolFactory(url, limits=LIMITS, resolve=lambda host, port: ["127.0.0.1"])
    try:
        for name in ("a", "b"):
            with pool.verification_session(files_tarball({f"{name}.py": ""}), ("unittest",)) as s:
                assert s.list_files() == [f"{name}.py"]
                r = s.exec(["python", "-I", "-B", "-c", "import sys; print(sys.flags.isolated)"])
                assert r.ok and r.warm and r.stdout == "1\n", (r.describe(), r.stderr)
        assert (local.stations.made, local.stations.reused) == (1, 1)
        with pytest.raises(SandboxError, match="preload"):
            pool.verification_session(files_tarball({}), ("os; import x",))
        with pytest.raises(SandboxError, match="needs a tarball"):
            _call(HttpFactory(url).client, "POST", "/v1/sessions", {"verification": True})
    finally:
        pool.close()
        server.shutdown()
        server.registry.close_all()  # the idle station too
        server.server_close()
    with local.verification_session(files_tarball({})):
        pass
    assert local.stations.made == 2  # the server's stop closed the idle one
    local.stations.close()
