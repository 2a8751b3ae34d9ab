"""Pure parts of the sandbox: the jail's command line, result classification, diffs, paths."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from gagar.sandbox import bwrap, classify, local, runner, workspace
from gagar.sandbox.cgroup import Stats
from gagar.sandbox.types import (
    Limits,
    SandboxError,
    SandboxUnavailable,
    SessionRequest,
    VerificationFactory,
)


def _jail(uid: int | None) -> bwrap.Jail:
    return bwrap.Jail(workspace="/w", tmp="/t", etc="/e", uid=uid, ro_paths=("/opt/py",))


def test_argv_isolates_and_limits() -> None:
    limits = Limits(cpu_time_s=3, processes=10, memory_bytes=64 << 20)
    argv = bwrap.bwrap_argv(_jail(1234), limits, ["echo", "hi"])
    for flag in (
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--die-with-parent",
        "--clearenv",
    ):
        assert flag in argv
    assert "--unshare-user" not in argv  # root drops to a real uid instead
    assert "--reuid=1234" in argv and "--no-new-privs" in argv
    assert "--cpu=3:4" in argv and "--nproc=10" in argv and f"--as={64 << 20}" in argv
    assert argv[-2:] == ["echo", "hi"]
    i = argv.index("/opt/py")
    assert argv[i - 1] == "--ro-bind"
    assert bwrap.bwrap_argv(_jail(None), limits, ["x"]).count("--unshare-user") == 1


def _outcome(**kw) -> runner.Outcome:
    o = runner.Outcome(status=[{"child-pid": 2}, {"exit-code": 0}])
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def test_classify() -> None:
    limits = Limits(cpu_time_s=2)
    assert classify.classify(_outcome(exit_code=0), limits, None, jailed=True).ok
    r = classify.classify(_outcome(exit_code=128 + 9), limits, Stats(True, False, 0.1), jailed=True)
    assert r.limit_hit == "memory"  # the cgroup's OOM kill, observed by the executor
    xcpu = _outcome(exit_code=128 + signal.SIGXCPU, cpu_time_s=2.01)
    assert classify.classify(xcpu, limits, None, jailed=True).limit_hit == "cpu_time"
    # RLIMIT_CPU fires on the tick-sampled CPU time (wait4's), which under contention runs ahead
    # of the cgroup's exact runtime: either count at the limit names it (seen in a pod-mode run)
    ahead = _outcome(exit_code=128 + signal.SIGXCPU, cpu_time_s=2.01)
    r = classify.classify(ahead, limits, Stats(False, False, 1.57), jailed=False)
    assert r.limit_hit == "cpu_time" and r.cpu_time_s == 2.01
    under = _outcome(exit_code=128 + signal.SIGXCPU, cpu_time_s=0.2)
    assert (
        classify.classify(under, limits, Stats(False, False, 0.3), jailed=False).limit_hit is None
    )
    r = classify.classify(_outcome(signal=9, timed_out=True, status=[]), limits, None, jailed=True)
    assert r.timed_out and r.limit_hit == "wall_time" and r.infra_error is None
    r = classify.classify(
        _outcome(exit_code=1, status=[{"child-pid": 2}]), limits, None, jailed=True
    )
    assert r.infra_error is not None and not r.ok
    r = classify.classify(_outcome(exit_code=1, status=[]), limits, None, jailed=False)
    assert r.infra_error is None and r.exit_code == 1


def test_the_exit_status_forges_no_observation() -> None:
    """`exit 152` is what bubblewrap reports for a SIGXCPU kill too: without the executor's own
    observations (CPU time at the limit, a file at the size limit, the cgroup's events) it is an
    exit status, never a signal or a limit."""
    limits = Limits(cpu_time_s=2)
    for code in (128 + signal.SIGXCPU, 128 + signal.SIGKILL, 128 + signal.SIGXFSZ, 255):
        r = classify.classify(_outcome(exit_code=code, cpu_time_s=0.01), limits, None, jailed=True)
        assert (r.exit_code, r.signal, r.limit_hit) == (code, None, None)
    r = classify.classify(_outcome(exit_code=153), limits, None, jailed=True, file_at_limit=True)
    assert r.limit_hit == "file_size"
    r = classify.classify(_outcome(exit_code=1, cpu_time_s=5.0), limits, None, jailed=True)
    assert r.limit_hit is None  # a clean exit after much CPU: nothing ended it
    killed = _outcome(exit_code=128 + 9, waited=[{"signal": 9}], cpu_time_s=2.0)
    r = classify.classify(killed, limits, None, jailed=True)  # the waiter saw the kill
    assert (r.exit_code, r.signal, r.limit_hit) == (None, 9, "cpu_time")
    two = _outcome(exit_code=139, waited=[{"signal": 11}, {"signal": 11}])
    r = classify.classify(two, limits, None, jailed=True)  # more than one record: not the waiter's
    assert (r.exit_code, r.signal) == (139, None)


def test_unified_diff_added_removed_binary() -> None:
    d = workspace.unified_diff(
        {"a": b"x\n", "gone": b"g\n", "bin": b"\x00"},
        {"a": b"y", "new": b"n\n", "bin": b"\x01\x00"},
    )
    assert "-x\n+y\n\\ No newline at end of file" in d
    assert "--- /dev/null\n+++ b/new" in d and "--- a/gone\n+++ /dev/null" in d
    assert "Binary files a/bin and b/bin differ" in d


def test_resolve_inside(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "link").symlink_to("/etc")
    assert workspace.resolve_inside(tmp_path, "d/x") == tmp_path / "d" / "x"
    for bad in ("../x", "d/../../x", "link/passwd", ""):
        with pytest.raises(SandboxError):
            workspace.resolve_inside(tmp_path, bad)


def test_unpack_rejects_escaping_archives(tmp_path: Path) -> None:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(SandboxError, match="bad tarball"):
        workspace.unpack(tmp_path / "w", buf.getvalue())
    with pytest.raises(SandboxError, match="bad tarball"):
        workspace.unpack(tmp_path / "w", b"not a tarball")


def test_missing_bubblewrap_refuses(monkeypatch) -> None:
    local.check_isolation.cache_clear()
    monkeypatch.setattr(local.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailable, match="refusing to run untrusted code"):
        local.check_isolation()
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        local.LocalFactory()  # a factory refuses up front
    local.check_isolation.cache_clear()


def test_bad_commands_are_refused(tmp_path: Path) -> None:
    with local.LocalFactory(root=str(tmp_path)).create(files={}) as s:
        with pytest.raises(SandboxError):
            s.exec([])
        with pytest.raises(SandboxError):
            s.exec("true", timeout=0)
    with pytest.raises(SandboxError, match="closed"):
        s.exec("true")
    assert list(tmp_path.iterdir()) == []  # closing removed the session directory


def test_sweep_stale_removes_only_old_empty_groups() -> None:
    from gagar.sandbox import cgroup

    group = cgroup.Cgroup.create(64 << 20, 8)
    if group is None:
        pytest.skip("cgroup v1 hierarchy not writable here")
    try:
        cgroup.sweep_stale(min_age_s=600)
        assert group.memory.exists() and group.pids.exists()  # young: kept
        old = time.time() - 3600
        for d in (group.memory, group.pids):
            os.utime(d, (old, old))  # only our group looks stale: others' are never touched
        assert cgroup.sweep_stale(min_age_s=600) >= 2
        assert not group.memory.exists() and not group.pids.exists()
    finally:
        group.destroy()


def test_runner_start_failure_leaks_no_descriptors() -> None:
    # which descriptors, not how many: a thread an earlier test left (an operator, a server)
    # may close one of its own meanwhile
    before = set(os.listdir("/proc/self/fd"))
    for _ in range(5):
        with pytest.raises(OSError):
            runner.run(runner.Launch(["/nonexistent/bin"], 1.0, 100, status_fd=True))
    assert set(os.listdir("/proc/self/fd")) <= before


def test_runner_captures_caps_and_times_out() -> None:
    o = runner.run(runner.Launch(["sh", "-c", "echo out; echo err >&2; exit 7"], 5.0, 100))
    assert (o.exit_code, o.stdout, o.stderr, o.timed_out) == (7, b"out\n", b"err\n", False)
    o = runner.run(runner.Launch(["sh", "-c", "head -c 5000 /dev/zero; sleep 30"], 0.5, 100))
    assert o.timed_out and o.signal == 9 and len(o.stdout) == 100 and o.truncated


def test_sessions_of_a_killed_process_are_swept_and_live_ones_kept(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = (
        "import sys, time\n"
        "from gagar.sandbox.local import LocalFactory\n"
        "s = LocalFactory(root=sys.argv[1], check=False).create(files={'a.py': 'x = 1'})\n"
        "print(s.dir, flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    dead = Path(proc.stdout.readline().strip())
    proc.send_signal(signal.SIGKILL)  # no close(): its directory stays behind
    proc.wait()
    assert (dead / "workspace" / "a.py").exists()
    legacy = tmp_path / "gagar-sbx-from-an-older-gagar"  # no owner lock at all
    legacy.mkdir()
    live = local.LocalFactory(root=str(tmp_path), check=False).create(files={"b.py": "y = 2"})
    try:
        # a free owner lock is a dead session: a new factory reclaims it at once, whatever its
        # age; a directory without a lock may be being set up, and waits for min_age_s
        assert not dead.exists() and legacy.exists()
        assert local.sweep_stale_sessions(str(tmp_path), min_age_s=0) == 1
        assert not legacy.exists()
        assert (live.dir / "workspace" / "b.py").exists(), "a live session is never swept"
    finally:
        live.close()
    assert not any(tmp_path.iterdir())


def test_a_session_request_is_checked_as_it_is_made() -> None:
    """What no factory can make is refused before any factory sees it."""
    with pytest.raises(SandboxError, match="not both"):
        SessionRequest(files={}, tarball=b"")
    with pytest.raises(SandboxError, match="needs a tarball"):
        SessionRequest(files={}, verification=True)
    with pytest.raises(SandboxError, match="the pool p has no environment 'e'"):
        SessionRequest(environment="e").for_one_image("the pool p", None)
    own = Limits(wall_time_s=1)
    assert SessionRequest().for_one_image("x", own).limits == own
    assert SessionRequest(limits=Limits()).for_one_image("x", own).limits == Limits()


class _Opened(VerificationFactory):
    def __init__(self) -> None:
        self.requests: list[SessionRequest] = []

    def open(self, request: SessionRequest) -> None:  # type: ignore[override]
        self.requests.append(request)


def test_a_factory_defines_open_and_inherits_the_rest() -> None:
    """``create`` and ``verification_session`` are the protocols' own: a factory that subclasses
    them is a ``VerificationFactory`` by defining ``open`` alone."""
    factory = _Opened()
    factory.create(files={"a.py": ""}, environment="e")
    factory.verification_session(b"tar", ("m",), Limits())
    assert factory.requests == [
        SessionRequest(files={"a.py": ""}, environment="e"),
        SessionRequest(tarball=b"tar", limits=Limits(), verification=True, preload=("m",)),
    ]
    assert isinstance(factory, VerificationFactory)
    with pytest.raises(SandboxError, match="not both"):
        factory.create(files={}, tarball=b"")
    assert len(factory.requests) == 2
