"""Each promise of ``gagar.sandbox`` against code that tries to break it.

Limits are small so the suite is fast. After every test, the session's uid owns no process on the
host, and a fresh session still runs a command (the fixture checks both). Every test runs in both
isolation modes, ``bwrap`` and ``pod`` (no namespaces), and in ``warm`` (bubblewrap, its Python
commands forked from the session's warm runner, ``gagar/sandbox/warm.py``); the few promises the
``pod`` mode leaves to the pod's runtime class (docs/security.md) are skipped there with that
reason.
"""

from __future__ import annotations

import io
import os
import random
import socket
import tarfile
import time
from pathlib import Path

import pytest

from gagar.sandbox import cgroup, podjail, runner
from gagar.sandbox.local import LocalFactory, check_isolation
from gagar.sandbox.types import Limits, SandboxError

LIMITS = Limits(
    wall_time_s=6,
    cpu_time_s=2,
    memory_bytes=256 << 20,
    processes=32,
    open_files=64,
    file_size_bytes=1 << 20,
    output_bytes=64 << 10,
)


def _procs_of(uid: int) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if Path(f"/proc/{pid}").stat().st_uid == uid:
                    out.append(int(pid))
            except FileNotFoundError:
                continue
    return out


def _live(pids: list[int]) -> set[int]:
    """``pids`` less the zombies (exited, waiting to be reaped) and the ones gone meanwhile."""
    out = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if state != "Z":
            out.add(pid)
    return out


def _zombie_children() -> list[int]:
    me, out = os.getpid(), []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if fields[0] == "Z" and int(fields[1]) == me:
            out.append(int(pid))
    return out


@pytest.fixture(scope="module", params=["bwrap", "warm", "pod"])
def factory(request: pytest.FixtureRequest) -> LocalFactory:
    """``warm``: bubblewrap, with Python commands forked from the session's fork server."""
    # the suite fails loudly (never skips) where isolation is missing
    check_isolation() if request.param != "pod" else podjail.check()
    mode = "pod" if request.param == "pod" else "bwrap"
    return LocalFactory(limits=LIMITS, isolation=mode, warm=request.param == "warm")


def bwrap_only(session, why: str) -> None:
    if session._factory.isolation == "pod":
        pytest.skip(f"pod mode: {why} is the runtime class's (docs/security.md)")


@pytest.fixture
def session(factory: LocalFactory):
    s = factory.create(files={"pkg/mod.py": "X = 1\n", "README": "hello\n"})
    uid = s.uid
    assert s.exec(["python3", "-c", "pass"]).warm is factory.warm  # the mode is the one asked
    yield s
    s.close()
    assert uid is None or _procs_of(uid) == [], "a sandboxed process survived its session"
    with factory.create(files={"a.txt": "ok"}) as fresh:  # the next session still works
        assert fresh.exec("cat a.txt").stdout == "ok"


def test_fork_bomb_is_bounded(session) -> None:
    r = session.exec("python3 -c 'import os\nwhile True: os.fork()'")
    assert not r.ok and r.infra_error is None
    if r.warm:  # each fork copies pages of a server that imported pytest: memory may go first
        assert r.limit_hit in ("processes", "memory"), r
    else:
        assert r.limit_hit in ("processes", "wall_time", "cpu_time")
    if not r.warm and session._factory.use_cgroup and Path("/sys/fs/cgroup/pids").exists():
        # the pids cgroup is the exact bound and fires first (RLIMIT_NPROC, which counts every
        # process of the uid, is a backstop above it): the executor saw it, not just EAGAIN
        assert r.limit_hit == "processes", r
    assert r.duration_s < LIMITS.wall_time_s + 3
    assert session.exec("echo alive").stdout == "alive\n"


def test_shell_fork_bomb_is_bounded(session) -> None:
    r = session.exec(":(){ :|:& };:", timeout=3)
    assert r.infra_error is None and r.duration_s < 6


def test_memory_bomb_is_stopped(session) -> None:
    # a generous wall: on a loaded machine (load 10 on 2 cores) the 6 s wall came first
    r = session.exec("python3 -c 'x=[]\nwhile True: x.append(bytearray(10**7))'", timeout=60)
    assert not r.ok and r.infra_error is None
    if session._factory.use_cgroup and Path("/sys/fs/cgroup/memory").exists():
        assert r.limit_hit == "memory"


def test_one_huge_allocation_fails(session) -> None:
    r = session.exec("python3 -c 'x = bytearray(8 * 2**30)'")
    assert not r.ok and r.infra_error is None


def test_infinite_loop_hits_cpu_limit(session) -> None:
    r = session.exec("python3 -c 'while True: pass'", timeout=60)  # CPU is shared: generous wall
    assert r.limit_hit == "cpu_time" and not r.ok and not r.timed_out
    assert r.cpu_time_s >= 0.9 * LIMITS.cpu_time_s  # what the executor measured, no signal claimed


@pytest.mark.parametrize("waiter", ["perl", "python"])
def test_an_exit_status_is_not_a_signal(session, waiter: str, monkeypatch) -> None:
    """bubblewrap reports a killed child as 128+N; `exit 152` must not become SIGXCPU and a CPU
    limit, nor `exit 153` SIGXFSZ and a file size limit. Both waiters (perl where the host has
    it, else the executor's Python) report the same."""
    from gagar.sandbox import local

    if waiter == "python":
        monkeypatch.setattr(local, "_perl", lambda: None)
    elif local._perl() is None:
        pytest.skip("no perl on this host: the Python waiter is the one in use")
    for code in (152, 153, 137):
        r = session.exec(f"exit {code}")
        assert (r.exit_code, r.signal, r.limit_hit) == (code, None, None), r
    r = session.exec("kill -SEGV $$")  # a real signal is reported, from the wait status
    assert (r.exit_code, r.signal, r.limit_hit) == (None, 11, None), r
    r = session.exec("kill -XCPU $$")  # a real SIGXCPU, but no CPU limit was reached
    assert (r.signal, r.limit_hit) == (24, None), r
    r = session.exec("yes | head -1 && head -c 5M /dev/zero > big")  # default SIGPIPE, SIGXFSZ
    assert r.limit_hit == "file_size" and r.stdout == "y\n", r
    r = session.exec("exit 152")  # a file at the limit is there now: still no limit claimed
    assert (r.exit_code, r.limit_hit) == (152, None), r


def test_sleep_past_wall_clock_is_killed(session) -> None:
    r = session.exec("sleep 60", timeout=1.5)
    assert r.timed_out and r.limit_hit == "wall_time" and r.exit_code is None
    assert 1.4 < r.duration_s < 4


def test_no_network_to_host_loopback(session) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    code = (
        "import socket\n"
        f"try:\n s=socket.socket();s.settimeout(2);s.connect(('127.0.0.1',{port}));print('CONNECTED')\n"
        "except OSError as e:\n print('BLOCKED', e.errno)\n"
    )
    r = session.exec(["python3", "-c", code])
    server.setblocking(False)  # a connection that got through waits in the backlog
    with pytest.raises(BlockingIOError):
        server.accept()
    server.close()
    assert "BLOCKED" in r.stdout


def test_no_network_to_outside_address(session) -> None:
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): never routed; inside the sandbox there is no route at all.
    code = (
        "import socket\n"
        "try:\n s=socket.socket();s.settimeout(2);s.connect(('192.0.2.1',80));print('CONNECTED')\n"
        "except OSError as e:\n print('BLOCKED', e.errno)\n"
    )
    r = session.exec(["python3", "-c", code])
    if session._factory.isolation == "pod":  # no IP socket at all (the filter): EPERM
        assert r.stdout.startswith("BLOCKED 1\n")
        return
    assert r.stdout.startswith("BLOCKED 101")  # ENETUNREACH: fails at the socket, sends nothing
    assert "lo" in session.exec("ls /sys/class/net 2>/dev/null || cat /proc/net/dev").stdout


def test_cannot_write_outside_workspace(session, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    targets = ["/usr/evil", "/etc/evil", "/evil", "/root/evil", "/workspace/../evil", str(victim)]
    for target in targets:
        r = session.exec(["sh", "-c", f"echo pwned > '{target}'"])
        assert r.exit_code != 0, target
    assert victim.read_text() == "original"
    assert not Path("/usr/evil").exists() and not Path("/etc/evil").exists()
    r = session.exec('echo fine > inside.txt && mkdir -p "$TMPDIR/x" && echo t > "$TMPDIR/x/y"')
    assert r.ok and session.read_file("inside.txt") == b"fine\n"


def test_cannot_read_host_files_or_environment(session, tmp_path: Path, monkeypatch) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET-FILE")
    monkeypatch.setenv("GAGAR_TEST_SECRET", "TOPSECRET-ENV")
    r = session.exec(
        f"cat /etc/shadow; cat {secret}; ls -a /root; ls /work /home; env; "
        "cat /proc/1/environ; ls /proc | head -50"
    )
    assert "TOPSECRET" not in r.stdout + r.stderr
    assert "root:" not in r.stdout
    bwrap_only(session, "a PID space of its own")  # pod: visible, but environ unreadable (above)
    pids = {int(p) for p in r.stdout.split() if p.isdigit()}
    assert os.getpid() not in pids or os.getpid() < 10  # the host's processes are not visible


def test_killing_the_parent_fails(session) -> None:
    me = os.getpid()
    r = session.exec(f"kill -9 {me}; kill -9 -1; kill -9 0; echo done")
    assert r.infra_error is None
    assert os.getpid() == me  # still here
    assert session.exec("echo alive").stdout == "alive\n"


def test_stdout_flood_is_capped(session) -> None:
    r = session.exec("yes flood", timeout=1)  # fills the cap long before its timeout
    assert r.truncated and len(r.stdout) == LIMITS.output_bytes
    assert r.duration_s < 3


def test_background_processes_do_not_survive(session) -> None:
    marker = f"313.{random.randrange(10**6):06d}"  # its own: other sessions may run this test
    r = session.exec(
        f"(sleep {marker} &) ; setsid sleep {marker} & nohup sleep {marker} >/dev/null 2>&1 & "
        'python3 -c "import os,time\nif os.fork()==0:\n os.setsid()\n if os.fork()==0: time.sleep(300)" ; echo spawned'
    )
    assert r.ok and "spawned" in r.stdout
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (FileNotFoundError, ProcessLookupError):
                continue
            assert marker.encode() not in cmd, f"background process {pid} survived"
    # the fork server alone outlives a command
    assert _settles_within(session, session._warm.pids() if session._warm is not None else set())
    if session._factory.warm:  # a warm run's children: born in the server's jail
        code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(300)"
        r = session.exec(["python3", "-c", code])
        assert r.ok and r.warm
        assert session._warm.pids() != set()
        assert _settles_within(session, session._warm.pids())


def _settles_within(session, allowed: set[int], seconds: float = 2.0) -> bool:
    """Whether the session's live processes shrink to ``allowed`` within ``seconds``: a process
    the run killed may take a moment to be gone (or stay a zombie until reaped); a survivor
    stays, the sleeps of the test above run for minutes."""
    deadline = time.monotonic() + seconds
    while not _live(_procs_of(session.uid)) <= allowed and time.monotonic() < deadline:
        time.sleep(0.05)
    return _live(_procs_of(session.uid)) <= allowed


def test_symlink_escapes_are_refused_on_the_host(session, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET-LINK")
    r = session.exec(
        f"ln -s {secret} leak && ln -s / rootlink && ln -s /etc/passwd pw && mkfifo fifo"
    )
    assert r.ok
    for path in ("leak", "rootlink/etc/passwd", "pw", "fifo", "../../etc/passwd"):
        with pytest.raises(SandboxError):
            session.read_file(path)
    with pytest.raises(SandboxError):
        session.write_file("rootlink/tmp/evil", "x")
    assert not Path("/tmp/evil").exists()
    assert "TOPSECRET" not in session.diff()
    with tarfile.open(fileobj=io.BytesIO(session.archive())) as tar:
        assert "leak" not in tar.getnames()  # a link out of the workspace does not travel
    session.write_file("leak", "replaced")  # writing replaces the link itself
    assert secret.read_text() == "TOPSECRET-LINK"
    assert session.exec(f"cat {secret}").exit_code != 0


def test_file_size_limit(session) -> None:
    r = session.exec('python3 -c \'open("big","wb").write(b"x"*(5<<20))\'')
    assert not r.ok  # Python ignores SIGXFSZ: the write fails with EFBIG
    r = session.exec("head -c 5M /dev/zero > big2")  # killed by SIGXFSZ, a file left at the limit
    assert not r.ok and r.limit_hit == "file_size", r
    assert session.exec("stat -c %s big").stdout.strip() in ("0", str(1 << 20))


def test_open_files_limit(session) -> None:
    r = session.exec("python3 -c 'fs=[open(\"/dev/null\") for _ in range(1000)]'")
    assert not r.ok and "Too many open files" in r.stderr


def _session_cgroups(tag: str) -> set[str]:
    """The run groups of one session (named ``gagar-<its tag>…``), in every controller: other
    sessions' groups (this suite's, or another process's on a shared machine, whose groups sit in
    the same parent) come and go meanwhile."""
    found = set()
    for controller in ("memory", "pids", "cpuacct"):
        own = cgroup._own_path(controller)
        if own is not None:
            found |= {str(p) for p in own.glob(f"gagar-{tag}*") if p.is_dir()}
    return found


def test_runs_leave_no_zombies_and_no_cgroups(factory: LocalFactory) -> None:
    runner.reap_orphans()
    before = set(_zombie_children())  # another test's unwaited child is not this session's
    with factory.create(files={}) as s:
        for _ in range(20):
            assert s.exec(["true"]).ok
        tag = s.cgroup_tag
        assert tag and "gagar" not in tag  # the prefix names this session's groups only
    runner.reap_orphans()
    assert set(_zombie_children()) <= before
    assert _session_cgroups(tag) == set()


def test_reset_restores_base_and_removes_leftovers(session) -> None:
    session.exec("echo 'X = 2' > pkg/mod.py; echo junk > new.txt; rm README")
    assert "new.txt" in session.diff()
    session.reset()
    assert session.diff() == ""
    assert session.read_file("pkg/mod.py") == b"X = 1\n"
    assert session.exec("cat README").stdout == "hello\n"


def test_setup_failure_is_an_infrastructure_error(factory: LocalFactory) -> None:
    if factory.isolation == "pod":
        pytest.skip("pod mode binds no paths: tests/integration/test_sandbox_stock_runtime.py")
    bad = LocalFactory(limits=LIMITS, ro_paths=("/nonexistent/gagar-test-path",))
    with bad.create(files={}) as s:
        r = s.exec("exit 1")
    assert r.infra_error and "bubblewrap" in r.infra_error and not r.ok


def test_code_failure_is_not_an_infrastructure_error(session) -> None:
    r = session.exec("echo 'bwrap: fake failure' >&2; exit 1")
    assert r.exit_code == 1 and r.infra_error is None
