"""Hostile sessions that aim past the jail: at the host-side code, the kernel and the disk.

Each test is an adversarial probe, rerun: the host's walks, copies and clean-ups survive any tree
the code leaves; refused system calls stay refused; the disk, ``/dev/shm`` and the host's memory
are bounded; and after the hostile session a fresh one still runs ``echo ok``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import pytest

from gagar.sandbox import podjail, quota, workspace
from gagar.sandbox.local import SESSION_PREFIX, LocalFactory, check_isolation, sweep_stale_sessions
from gagar.sandbox.types import Limits

LIMITS = Limits(
    wall_time_s=30,
    cpu_time_s=20,
    memory_bytes=512 << 20,
    file_size_bytes=32 << 20,
    disk_bytes=256 << 20,
    inodes=20_000,
    shm_bytes=4 << 20,
)
DEEP = "import os\nfor _ in range({n}): os.mkdir({name!r}); os.chdir({name!r})"
pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 syscall numbers")


@pytest.fixture(autouse=True)
def _no_deep_leftovers(tmp_path: Path):
    """pytest's own clean-up of a failed test's tmp_path recurses: remove deep trees ourselves."""
    yield
    for child in tmp_path.iterdir():
        workspace.remove_tree(child)


@pytest.fixture(scope="module", params=["bwrap", "warm", "pod"])  # every promise in each mode
def factory(tmp_path_factory, request: pytest.FixtureRequest):
    """``warm``: bubblewrap, with Python commands forked from the session's fork server."""
    check_isolation() if request.param != "pod" else podjail.check()
    mode = "pod" if request.param == "pod" else "bwrap"
    root = tmp_path_factory.mktemp("sessions")
    if request.param == "pod":  # the sessions' uids pass through it (pytest's tmp dirs are 0700)
        root = Path(tempfile.mkdtemp(prefix="gagar-test-sessions-"))
        root.chmod(0o711)
    yield LocalFactory(limits=LIMITS, root=str(root), isolation=mode, warm=request.param == "warm")
    for child in root.iterdir():
        workspace.remove_tree(child)
    if request.param == "pod":
        root.rmdir()


@pytest.fixture
def session(factory: LocalFactory):
    s = factory.create(files={"pkg/mod.py": "X = 1\n"})
    assert s.exec(["python3", "-c", "pass"]).warm is factory.warm  # the mode is the one asked
    yield s
    s.close()
    assert not s.dir.exists(), "the session directory leaked"
    with factory.create(files={}) as fresh:  # the next session still works
        assert fresh.exec("echo ok").stdout == "ok\n"


# ---------------------------------------------------------------- 1: deep trees
@pytest.mark.parametrize("n,name", [(1500, "d"), (40, "x" * 200)])  # recursion; PATH_MAX
def test_deep_tree_leaves_host_operations_working(session, n: int, name: str) -> None:
    r = session.exec(["python3", "-c", DEEP.format(n=n, name=name)])
    assert r.ok, r.describe()
    diff = session.diff()
    assert diff.startswith("diff --git")  # the top of the tree is there, the rest is a marker
    files = session.list_files()
    assert any(f.startswith(name) for f in files)
    tarball, skipped = workspace.pack_report(session.workspace)  # the deep part left out, said
    assert skipped and ("too deep" in skipped[0] or "not walked" in skipped[0]) and tarball
    session.reset()
    assert session.list_files() == ["pkg/mod.py"]
    assert session.exec(["python3", "-c", DEEP.format(n=n, name=name)]).ok  # again, for close


def test_remove_tree_survives_depth_and_long_paths(tmp_path: Path) -> None:
    top = tmp_path / "t"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY)
    for _ in range(3000):  # 3000 levels of 100 characters: far past recursion and PATH_MAX
        os.mkdir("y" * 100, dir_fd=fd)
        os.close(os.open("f", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
        os.symlink("/etc", "link", dir_fd=fd)
        new = os.open("y" * 100, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = new
    os.chmod(".", 0, dir_fd=fd)  # an unreadable bottom
    os.close(fd)
    entries = list(workspace.walk(top))  # two per level, then a marker where it stops
    assert len(entries) < workspace.MAX_DEPTH * 2 and isinstance(entries[-1][1], bytes)
    workspace.remove_tree(top)
    assert not top.exists() and Path("/etc/passwd").exists()


def test_sweep_never_raises_and_removes_a_deep_stale_session(tmp_path: Path) -> None:
    stale = tmp_path / f"{SESSION_PREFIX}dead"
    stale.mkdir()
    fd = os.open(stale, os.O_RDONLY)
    for _ in range(1500):
        os.mkdir("d", dir_fd=fd)
        new = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = new
    os.close(fd)
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    assert sweep_stale_sessions(str(tmp_path)) == 1
    assert not stale.exists()


def test_cli_after_a_deep_tree_session(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    gagar = [sys.executable, "-m", "gagar.cli", "sandbox", "exec", "--"]
    deep = subprocess.run(
        [*gagar, "python3", "-c", DEEP.format(n=1500, name="d")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert deep.returncode == 0, deep.stderr
    assert json.loads(deep.stdout)["exit_code"] == 0
    assert not list(tmp_path.glob(f"{SESSION_PREFIX}*"))
    ok = subprocess.run([*gagar, "echo", "ok"], env=env, capture_output=True, text=True)
    assert json.loads(ok.stdout)["stdout"] == "ok\n", ok.stderr


# ---------------------------------------------------------------- 2 and 5: seccomp
SYSCALLS = {  # x86-64 numbers; arguments that would succeed without the filter
    "unshare(CLONE_NEWUSER)": (272, (0x10000000,)),
    "setns": (308, (0, 0)),
    "add_key": (248, (b"user", b"gagar", b"secret", 6, -3)),  # -3: the session keyring
    "keyctl(GET_KEYRING_ID)": (250, (0, -3, 1)),
    "request_key": (249, (b"user", b"gagar", None, 0)),
    "io_uring_setup": (425, (1, None)),
    "perf_event_open": (298, (None, 0, -1, -1, 0)),
    "bpf": (321, (0, None, 0)),
    "userfaultfd": (323, (0,)),
    "mount": (165, (b"none", b"/tmp", b"tmpfs", 0, None)),
    "fsopen": (430, (b"tmpfs", 0)),
    "open_tree": (428, (-100, b"/tmp", 1)),
    "clone(CLONE_NEWNET)": (56, (0x40000000 | 17, None, None, None, 0)),
}
PROBE = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
out = {}
for name, (nr, args) in json.loads(os.environ["PROBES"]).items():
    args = [a.encode() if isinstance(a, str) else a for a in args]
    rc = libc.syscall(nr, *args)
    if rc == 0 and name.startswith("clone"):
        os._exit(0)  # the child of a clone that was allowed
    out[name] = (rc, ctypes.get_errno())
print(json.dumps(out))
"""


def test_seccomp_refuses_namespaces_keys_and_kernel_surfaces(session) -> None:
    probes = {
        k: (nr, [a.decode() if isinstance(a, bytes) else a for a in args])
        for k, (nr, args) in SYSCALLS.items()
    }
    r = session.exec(["env", f"PROBES={json.dumps(probes)}", "python3", "-c", PROBE])
    assert r.ok, r.describe() + r.stderr
    results = json.loads(r.stdout)
    allowed = {k: v for k, v in results.items() if v != [-1, 1]}  # 1: EPERM
    assert allowed == {}, f"reachable inside the sandbox: {allowed}"


def test_other_abis_cannot_go_around_the_filter(session) -> None:
    """The x32 number of unshare (bit 30 set) is another ABI's call: the process is killed."""
    code = "import ctypes; ctypes.CDLL(None).syscall(0x40000000 | 272, 0x10000000); print('ran')"
    r = session.exec(["python3", "-c", code])
    assert r.signal == 31 and r.stdout == ""  # SIGSYS, as the jail's waiter saw it


def test_nested_user_namespace_is_refused(session) -> None:
    r = session.exec("unshare -Urn id -u")
    assert r.exit_code != 0 and "Operation not permitted" in r.stderr


def test_ordinary_process_creation_still_works(session) -> None:
    code = (
        "import multiprocessing as mp, subprocess, threading\n"
        "print(subprocess.run(['echo', 'spawned'], capture_output=True, text=True).stdout, end='')\n"
        "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
        "with mp.get_context('fork').Pool(2) as p: print(sum(p.map(abs, [-1, -2])))\n"
    )
    r = session.exec(["python3", "-c", code])
    assert r.ok, r.stderr
    assert r.stdout == "spawned\nthread\n3\n"


def test_keys_do_not_cross_sessions(factory: LocalFactory) -> None:
    add = "import ctypes; l = ctypes.CDLL(None, use_errno=True); " + (
        "print(l.syscall(248, b'user', b'gagar', b'secret', 6, -2), ctypes.get_errno())"
    )
    find = "grep -c gagar /proc/keys || true"
    with factory.create(files={}) as a:
        assert a.exec(["python3", "-c", add]).stdout.split() == ["-1", "1"]
    with factory.create(files={}) as b:
        assert b.exec(find).stdout.strip() == "0"


# ---------------------------------------------------------------- 3: host memory
def test_snapshot_reads_a_bounded_amount_into_the_host(session) -> None:
    r = session.exec(
        "for i in $(seq 8); do head -c 16777216 /dev/urandom > big$i; done; "
        "python3 -c \"open('small.txt', 'w').write('changed\\n')\""
    )
    assert r.ok, r.stderr
    tracemalloc.start()
    try:
        diff = session.diff()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"diff held {peak >> 20} MiB of a 128 MiB workspace"
    assert "Not compared: /dev/null and b/big1: 16777216 bytes, mtime" in diff
    assert "+changed" in diff


def test_walk_is_bounded_in_entries(session, monkeypatch) -> None:
    assert session.exec("mkdir m && cd m && touch $(seq 3000)").ok
    monkeypatch.setattr(workspace, "MAX_ENTRIES", 1000)
    files = session.list_files()
    assert len(files) <= 1001 and files[-1] == "."
    assert "too many entries" in session.diff()


# ---------------------------------------------------------------- 4: disk quota
needs_quota = pytest.mark.skipif(not quota.can_mount(), reason="the quota needs CAP_SYS_ADMIN")


@needs_quota
def test_disk_quota_stops_a_disk_filler(session) -> None:
    # a folder of its own: the jail's /tmp also holds the mount points down to the interpreter's
    # environment, which a glob like "$TMPDIR"/f* matched when the clone lived in /tmp/f...
    r = session.exec(
        'd=$(mktemp -d -p "$TMPDIR") && echo "$d" > "$TMPDIR/.filler" && for i in $(seq 20); '
        'do head -c 16777216 /dev/zero > "$d/f$i" || exit 1; done'
    )
    assert r.exit_code == 1 and "No space left" in r.stderr
    assert r.limit_hit == "disk"
    freed = session.exec('rm -r "$(cat "$TMPDIR/.filler")" && echo freed')
    assert freed.stdout == "freed\n", freed.stderr


@needs_quota
def test_inode_quota_stops_a_file_flood(session) -> None:
    r = session.exec(["python3", "-c", "[open(f'f{i}', 'w').close() for i in range(50000)]"])
    assert r.exit_code == 1 and "No space left" in r.stderr
    assert r.limit_hit == "disk"


@needs_quota
def test_workspace_sits_on_the_quota_filesystem(session) -> None:
    r = session.exec("stat -f -c '%T %b %S' . \"$TMPDIR\"")
    for line in r.stdout.splitlines():
        fs, blocks, size = line.split()
        assert fs == "tmpfs" and int(blocks) * int(size) == LIMITS.disk_bytes


def test_without_a_mount_the_quota_is_reported(factory: LocalFactory, monkeypatch) -> None:
    """A non-root executor (a sandbox pod) cannot mount the tmpfs: going over is still reported."""
    monkeypatch.setattr(quota, "can_mount", lambda: False)
    small = LIMITS.model_copy(update={"disk_bytes": 2 << 20, "inodes": 100})
    with factory.create(files={}, limits=small) as s:
        assert not s.quota
        r = s.exec('head -c 3145728 /dev/zero > "$TMPDIR/big"')
        assert r.ok and r.limit_hit == "disk"
        assert s.exec('rm "$TMPDIR/big" && touch a').limit_hit is None
        assert s.exec("mkdir m && cd m && touch $(seq 200)").limit_hit == "disk"


# ---------------------------------------------------------------- 9: /dev/shm
def test_dev_shm_is_writable_and_bounded(session) -> None:
    if session._factory.isolation == "pod":
        pytest.skip("pod mode: /dev/shm is the pod's (bounded by the runtime, 64 MiB by default)")
    r = session.exec(["python3", "-c", "import multiprocessing as mp; mp.Lock(); print('lock')"])
    assert r.stdout == "lock\n", r.stderr
    r = session.exec("head -c 8388608 /dev/zero > /dev/shm/x")
    assert r.exit_code != 0 and "No space left" in r.stderr


# ---------------------------------------------------------------- 10: inherited hard rlimits
def test_inherited_hard_address_space_limit_is_respected(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    r = subprocess.run(  # 3 GiB hard: below the jail's default 2 GiB x4 with a memory cgroup
        ["prlimit", "--as=3221225472", sys.executable, "-m", "gagar.cli"]
        + ["sandbox", "exec", "--", "echo", "ok"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["stdout"] == "ok\n"
