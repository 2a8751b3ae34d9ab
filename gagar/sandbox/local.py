"""The local backend: sessions on this machine, each command jailed by bubblewrap.

``LocalFactory(...).create(files=...)`` makes a ``LocalSession``: a private directory holding the
workspace, a ``/tmp`` and generated ``/etc`` files, plus (when the executor is root) a private uid
leased for the session's lifetime. Every ``exec`` builds a fresh jail (``bwrap.py``), runs it
(``runner.py``) inside fresh cgroups when the hierarchy is writable (``cgroup.py``), then kills
whatever is left (the cgroups' members, or else every process of the session uid) and turns the
observations into an ``ExecResult`` (``classify.py``). A non-root executor (a sandbox pod running
as non-root) has no uid to lease: bubblewrap then runs unprivileged in a user namespace, and
``RLIMIT_NPROC`` counts the executor's own processes too (one session per pod is the intended
shape). ``isolation="none"`` exists for development only and says so loudly.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import math
import os
import random
import resource
import shutil
import signal
import sys
import tempfile
import time
import warnings
import weakref
from collections.abc import Mapping
from pathlib import Path

from gagar.sandbox import bwrap, podjail, quota, runner, station, warm, workspace
from gagar.sandbox.cgroup import Cgroup, destroy_tagged, sweep_stale
from gagar.sandbox.classify import classify
from gagar.sandbox.seccomp import filter_bpf
from gagar.sandbox.types import (
    MAX_WALL_S,
    Command,
    ExecResult,
    FileData,
    Isolation,
    Limits,
    SandboxError,
    SandboxUnavailable,
)

log = logging.getLogger(__name__)
UID_BASE, UID_SLOTS = 1_500_000, 4096
# Uids are host-wide, so their locks are too: not under $TMPDIR, which differs between processes
# (only a root executor leases uids, and root can always write /tmp).
LOCK_DIR = Path("/tmp/gagar-sandbox-uids")
SESSION_PREFIX = "gagar-sbx-"
OWNER_LOCK = ".owner.lock"  # flocked while the session lives: a free lock means its process died
UNSAFE_WARNING = (
    "WARNING: sandbox isolation is OFF (--unsafe-no-isolation): untrusted code runs directly on "
    "this host with only rlimits. Use this for development on trusted code only."
)


class UidLease:
    """A uid no other session (in any process on this host) uses, held by an ``flock``."""

    def __init__(self) -> None:
        LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
        for slot in random.sample(range(UID_SLOTS), 64):
            fd = os.open(LOCK_DIR / f"{slot}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid, self._fd = UID_BASE + slot, fd
            return
        raise SandboxUnavailable("no free sandbox uid (4096 sessions at once?)")

    def release(self) -> None:
        runner.kill_uid(self.uid)
        os.close(self._fd)

    @classmethod
    def take(cls, uid: int) -> UidLease | None:
        """The lease of ``uid`` if nobody holds it (a dead session's), else None."""
        if not UID_BASE <= uid < UID_BASE + UID_SLOTS:
            return None
        try:
            fd = os.open(LOCK_DIR / f"{uid - UID_BASE}.lock", os.O_RDWR)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        lease = cls.__new__(cls)
        lease.uid, lease._fd = uid, fd
        return lease


def sweep_stale_sessions(root: str | None = None, min_age_s: float = 60.0) -> int:
    """Reclaim what the sessions under ``root`` whose process died without ``close`` (SIGKILL,
    OOM kill) left: processes of their uid, cgroups, tmpfs, directory. A live session's
    ``OWNER_LOCK`` is ``flock``ed from the moment the file exists, so a free one is a dead
    session, reclaimed at once; a directory without it may be one being set up right now and
    is left alone until ``min_age_s`` old."""
    removed = 0
    for d in Path(root or tempfile.gettempdir()).glob(f"{SESSION_PREFIX}*"):
        try:
            young = time.time() - d.stat().st_mtime < min_age_s
            if (young and not (d / OWNER_LOCK).exists()) or _owner_alive(d):
                continue
            _reclaim(d)
        except OSError:
            continue  # another sweeper got there first, or it cannot go: never fail a caller
        removed += 1
    return removed


def _reclaim(d: Path) -> None:
    lease = UidLease.take(_recorded_uid(d))  # None once a live session leased the uid again
    if lease is not None:
        lease.release()  # kills whatever still runs as that uid
    destroy_tagged(_cgroup_tag(d))
    remove_session_dir(d)


def _recorded_uid(d: Path) -> int:
    try:
        return int((d / OWNER_LOCK).read_text() or -1)
    except (OSError, ValueError):
        return -1


def _cgroup_tag(d: Path) -> str:
    """The prefix of the names of a session's cgroups (``Cgroup.create``)."""
    return d.name.removeprefix(SESSION_PREFIX) + "-"


def remove_session_dir(d: Path) -> None:
    """Unmount its quota tmpfs (if any), then remove what is left, however deep."""
    quota.unmount(d)
    workspace.remove_tree(d)


RLIMIT_OF = {  # Limits field -> the rlimit ``prlimit`` sets from it
    "memory_bytes": resource.RLIMIT_AS,
    "processes": resource.RLIMIT_NPROC,
    "open_files": resource.RLIMIT_NOFILE,
    "file_size_bytes": resource.RLIMIT_FSIZE,
    "cpu_time_s": resource.RLIMIT_CPU,
}


def within_inherited(limits: Limits) -> Limits:
    """``limits`` lowered to the hard rlimits this executor inherited: the jail runs unprivileged
    and cannot raise them, so asking for more would fail every command."""
    lower = {}
    for name, res in RLIMIT_OF.items():
        hard = resource.getrlimit(res)[1]
        slack = 1 if name == "cpu_time_s" else 0  # prlimit's hard CPU limit is one second above
        if hard != resource.RLIM_INFINITY and getattr(limits, name) + slack > hard:
            lower[name] = max(hard - slack, 1)
    return limits.model_copy(update=lower) if lower else limits


def _owner_alive(session_dir: Path) -> bool:
    try:
        fd = os.open(session_dir / OWNER_LOCK, os.O_RDWR)
    except FileNotFoundError:
        return False  # no owner ever took it (or a gagar from before the lock existed)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _take_ownership(session_dir: Path, uid: int | None) -> int:
    """The session's ``OWNER_LOCK``, ``flock``ed (released by the kernel when this process dies)
    and holding its uid (for the sweep). Made under another name and renamed: a sweeper never
    sees the lock file before it is locked."""
    new = session_dir / f"{OWNER_LOCK}.new"
    fd = os.open(new, os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, str(uid if uid is not None else "").encode())
    os.rename(new, session_dir / OWNER_LOCK)
    return fd


def python_paths() -> tuple[str, ...]:
    """The Python installation(s) this executor runs, to be visible read-only inside: its own
    environment first (a jailed ``python`` is the first on the jail's PATH), then the base
    installation(s) the environment is made from."""
    own = os.path.realpath(sys.prefix)
    paths = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}
    paths.add(os.path.realpath(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))))
    return (own, *sorted(paths - {own}))


@functools.cache
def _perl() -> str | None:
    """Perl under /usr (visible inside the jail), for the jail's waiter; None: use Python."""
    found = shutil.which("perl", path="/usr/bin")
    return found if found and found.startswith("/usr/") else None


def host_layout() -> tuple[dict[str, str], tuple[str, ...]]:
    links = {n: os.readlink(f"/{n}") for n in bwrap.TOP_LINKS if os.path.islink(f"/{n}")}
    etc = tuple(n for n in bwrap.ETC_FILES if os.path.exists(f"/etc/{n}"))
    return links, etc


@functools.cache
def check_isolation() -> None:
    """Raise ``SandboxUnavailable`` unless a trivial jailed command runs here (checked once)."""
    missing = [t for t in ("bwrap", "prlimit", "setpriv") if shutil.which(t) is None]
    if missing:
        raise SandboxUnavailable(
            f"refusing to run untrusted code: {', '.join(missing)} not found "
            "(install Debian packages bubblewrap and util-linux: scripts/install.sh)"
        )
    with LocalFactory(limits=Limits(wall_time_s=20), check=False).create(files={}) as s:
        result = s.exec(["true"])
    if not result.ok:
        raise SandboxUnavailable(
            "refusing to run untrusted code: bubblewrap cannot create its namespaces here "
            f"({result.describe()}; {result.stderr.strip()[-300:]}). Unprivileged user namespaces "
            "or root are required."
        )


class LocalFactory:
    """Makes ``LocalSession``s. ``root`` holds the session directories (default: the temp dir).

    Raises ``SandboxUnavailable`` when ``isolation="bwrap"`` and bubblewrap cannot run here.
    """

    def __init__(  # noqa: PLR0913 - each a switch of the executor, all with defaults
        self,
        limits: Limits | None = None,
        isolation: Isolation = "bwrap",
        root: str | None = None,
        ro_paths: tuple[str, ...] = (),
        use_cgroup: bool = True,
        check: bool = True,
        warm: bool | tuple[str, ...] = True,
    ) -> None:
        if isolation == "bwrap" and check:
            check_isolation()  # refuse here, once, rather than fail every command later
        elif isolation == "pod":
            podjail.check_root(root)
            if check:
                podjail.check()
        self.limits, self.isolation, self.root = limits or Limits(), isolation, root
        self.ro_paths, self.use_cgroup = python_paths() + ro_paths, use_cgroup
        # A warm test runner per session (``warm.py``), bubblewrap only; a tuple names modules
        # (outside the workspace) its fork server imports besides pytest.
        self.warm = bool(warm) and isolation == "bwrap"
        self.warm_preload = warm if isinstance(warm, tuple) else ()
        # Sessions kept for verification, one candidate after another (``station.py``).
        self.stations = station.Stations()
        weakref.finalize(self, self.stations.close)
        if use_cgroup and isolation != "none" and os.geteuid() == 0:
            sweep_stale()
        sweep_stale_sessions(root)
        if isolation == "none":
            warnings.warn(UNSAFE_WARNING, stacklevel=2)
            print(UNSAFE_WARNING, file=sys.stderr)

    def create(
        self,
        files: Mapping[str, FileData] | None = None,
        tarball: bytes | None = None,
        limits: Limits | None = None,
    ) -> LocalSession:
        if files is not None and tarball is not None:
            raise SandboxError("give files or a tarball, not both")
        return LocalSession(self, files or {}, tarball, limits or self.limits)

    def verification_session(
        self, tarball: bytes, preload: tuple[str, ...] = (), limits: Limits | None = None
    ) -> LocalSession | station.Station:
        """A session on ``tarball`` for one verification: a station (``station.py``) whose fork
        server imported pytest and ``preload`` once, or, where sessions run cold, a fresh one."""
        limits = limits or self.limits
        if not self.warm:
            return self.create(tarball=tarball, limits=limits)
        make = functools.partial(LocalSession, self, {}, tarball, limits, preload=preload)
        return self.stations.take(tarball, (preload, limits.model_dump_json()), make)


class LocalSession:
    """One workspace and its jail. Use as a context manager, or call ``close``."""

    def __init__(
        self,
        factory: LocalFactory,
        files: Mapping[str, FileData],
        tarball: bytes | None,
        limits: Limits,
        preload: tuple[str, ...] | None = None,
    ) -> None:
        self.limits, self._factory, self._closed = limits, factory, False
        jailed = factory.isolation in ("bwrap", "pod")
        self._lease = UidLease() if jailed and os.geteuid() == 0 else None
        self.dir = Path(tempfile.mkdtemp(prefix=SESSION_PREFIX, dir=factory.root))
        self.quota = jailed and quota.try_mount(self.dir, limits.disk_bytes, limits.inodes)
        self._owner = _take_ownership(self.dir, self.uid)
        self.workspace = self.dir / "workspace"
        preload = factory.warm_preload if preload is None else preload
        self._warm = warm.WarmRunner(self, preload) if factory.warm else None
        try:
            self._layout(files, tarball)
        except BaseException:
            self.close()
            raise

    @property
    def uid(self) -> int | None:
        return self._lease.uid if self._lease else None

    @property
    def cgroup_tag(self) -> str:
        return _cgroup_tag(self.dir)

    def _layout(self, files: Mapping[str, FileData], tarball: bytes | None) -> None:
        for name in ("workspace", "tmp", "etc"):
            (self.dir / name).mkdir()
        self.roots = {d: station.dir_state(d) for d in (self.workspace, self.dir / "tmp")}
        for name, text in bwrap.etc_files(self.uid or os.getuid()).items():
            (self.dir / "etc" / name).write_text(text)
        if tarball is not None:
            workspace.unpack(self.workspace, tarball)
        workspace.populate(self.workspace, files)
        self._base_tar = workspace.pack(self.workspace)
        self._base = workspace.snapshot(self.workspace)
        self._give_to_uid()

    def _give_to_uid(self) -> None:
        if self.uid is not None:
            workspace.chown_tree(self.workspace, self.uid)
            workspace.chown_tree(self.dir / "tmp", self.uid)
        if self._factory.isolation == "pod":
            podjail.seal(self)

    def python_bins(self) -> list[str]:
        """The ``bin`` directories of the Python installations, first on the jail's PATH."""
        return [os.path.join(p, "bin") for p in self._factory.ro_paths]

    def _jail(self) -> bwrap.Jail:
        links, etc = host_layout()
        python_bins = self.python_bins()
        return bwrap.Jail(
            workspace=str(self.workspace),
            tmp=str(self.dir / "tmp"),
            etc=str(self.dir / "etc"),
            uid=self.uid,
            ro_paths=self._factory.ro_paths,
            env=bwrap.sandbox_env(python_bins, self.uid),
            host_links=links,
            host_etc=etc,
            waiter=bwrap.waiter_argv(os.path.realpath(sys.executable), _perl()),
        )

    def exec(self, cmd: Command, timeout: float | None = None) -> ExecResult:
        self._check_open()
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise SandboxError("command must be a non-empty string or list of strings")
        wall = float(timeout) if timeout is not None else self.limits.wall_time_s
        if not (math.isfinite(wall) and 0 < wall <= MAX_WALL_S):
            raise SandboxError(f"timeout must be a number in (0, {MAX_WALL_S:g}], got {timeout}")
        if self._factory.isolation == "none":
            return self._exec_unsafe(argv, wall)
        if self._factory.isolation == "pod":
            return podjail.exec_pod(self, argv, wall)
        request = warm.parse(cmd) if self._warm is not None else None
        if request is None or self._warm is None:
            return self._exec_jailed(argv, wall)
        done = self._warm.run(request, wall)
        if isinstance(done, ExecResult):
            return done
        log.info("session %s: a Python command runs cold: %s", self.dir.name, done)
        return self._exec_jailed(argv, wall).model_copy(update={"warm_fallback": done})

    def jail_limits(self, cgroup: bool) -> Limits:
        """The rlimits of a jailed process. With the cgroups as the exact bounds, the rlimits are
        backstops: the address-space one only stops absurd reservations, and RLIMIT_NPROC (which
        counts every process of the uid, a dying one of the last command too) must not fire
        before ``pids.max`` does, or a fork bomb ends with EAGAIN that no counter of the
        executor's own saw."""
        limits = (
            self.limits.model_copy(
                update={
                    "memory_bytes": self.limits.memory_bytes * 4,
                    "processes": self.limits.processes * 2,
                }
            )
            if cgroup
            else self.limits
        )
        return within_inherited(limits)

    def _exec_jailed(self, argv: list[str], wall: float) -> ExecResult:
        cg = None
        if self._factory.use_cgroup and self.uid is not None:
            cg = Cgroup.create(self.limits.memory_bytes, self.limits.processes, self.cgroup_tag)
        full = bwrap.bwrap_argv(self._jail(), self.jail_limits(cg is not None), argv)
        launch = runner.Launch(
            argv=cg.wrap(full) if cg else full,
            wall_time_s=wall,
            output_bytes=self.limits.output_bytes,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
            status_fd=True,
            seccomp=filter_bpf(),
        )
        try:
            outcome = runner.run(launch)
        except OSError as e:
            return ExecResult(exit_code=None, infra_error=f"cannot start the jail: {e}")
        finally:
            stats = cg.stats() if cg else None
            if cg:
                cg.destroy()  # kills all inside: no process can leave its cgroup unprivileged
            elif self.uid is not None:
                runner.kill_uid(self.uid)
        ended = outcome.signal is not None or (outcome.exit_code or 0) > 128  # only then look
        return classify(
            outcome,
            self.limits,
            stats,
            jailed=True,
            disk_full=self._disk_full(),
            file_at_limit=ended and self._file_at_limit(),
        )

    def _file_at_limit(self) -> bool:
        """A file of the session at the size limit: what ``RLIMIT_FSIZE`` leaves when it fires
        (bubblewrap's status cannot tell its SIGXFSZ from an ``exit 153``)."""
        return any(
            not isinstance(st, bytes) and st.st_size >= self.limits.file_size_bytes
            for _, st in workspace.walk(self.dir, ignored=frozenset())
        )

    def _disk_full(self) -> bool:
        """Out of quota: the tmpfs is full or, without one (a non-root executor cannot mount),
        the workspace and ``/tmp`` hold more than the limits (measured after the fact: reported,
        not prevented; the pod's emptyDir ``sizeLimit`` is the bound there)."""
        if self.quota:
            return quota.full(self.dir)
        used, entries = workspace.usage(self.dir)
        return used > self.limits.disk_bytes or entries > self.limits.inodes

    def _exec_unsafe(self, argv: list[str], wall: float) -> ExecResult:
        env = bwrap.sandbox_env([os.path.dirname(sys.executable)], None)
        env["HOME"] = env["TMPDIR"] = str(self.dir / "tmp")
        launch = runner.Launch(
            argv=bwrap.rlimit_argv(within_inherited(self.limits)) + argv,
            wall_time_s=wall,
            output_bytes=self.limits.output_bytes,
            env=env,
            cwd=str(self.workspace),
        )
        try:
            outcome = runner.run(launch)
        except OSError as e:
            return ExecResult(exit_code=None, infra_error=f"cannot start the command: {e}")
        xfsz = outcome.signal == signal.SIGXFSZ  # the wait status, observed here directly
        return classify(outcome, self.limits, None, jailed=False, file_at_limit=xfsz)

    def read_file(self, path: str) -> bytes:
        self._check_open()
        return workspace.read_file(self.workspace, path)

    def write_file(self, path: str, data: FileData) -> None:
        self._check_open()
        workspace.write_file(self.workspace, path, data, self.uid)

    def delete_file(self, path: str) -> None:
        self._check_open()
        workspace.delete_file(self.workspace, path)

    def list_files(self) -> list[str]:
        self._check_open()
        return [rel for rel, _ in workspace.walk(self.workspace)]

    def diff(self) -> str:
        self._check_open()
        return workspace.unified_diff(self._base, workspace.snapshot(self.workspace))

    def archive(self) -> bytes:
        self._check_open()
        return workspace.pack(self.workspace)

    def reset(self) -> None:
        """Back to the base snapshot (files the code created are gone, edits undone)."""
        self._check_open()
        if self._warm is not None:
            self._warm.stop()  # its jail holds the directories removed here
        workspace.remove_tree(self.workspace)
        workspace.remove_tree(self.dir / "tmp")
        self.workspace.mkdir()
        (self.dir / "tmp").mkdir()
        workspace.unpack(self.workspace, self._base_tar)
        self._give_to_uid()

    def refill(self, tarball: bytes) -> None:
        """Another repository in the same jail (a verification station's next candidate): the
        workspace and ``/tmp`` emptied in place, ``tarball`` unpacked; the warm runner kept."""
        self._check_open()
        station.empty(self)
        workspace.unpack(self.workspace, tarball)
        self._base_tar, self._base = tarball, workspace.snapshot(self.workspace)
        if self.uid is not None:  # not /tmp: what is left there is bubblewrap's, root's
            workspace.chown_tree(self.workspace, self.uid)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._warm is not None:
            self._warm.stop()
        if self._lease is not None:
            self._lease.release()
        os.close(self._owner)  # the tmpfs holds the lock file: close before unmounting
        try:
            remove_session_dir(self.dir)
        except OSError:
            pass  # left for sweep_stale_sessions (its owner lock is free now)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("session is closed")

    def __enter__(self) -> LocalSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["LocalFactory", "LocalSession", "check_isolation"]
