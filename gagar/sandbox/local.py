"""The local backend: sessions on this machine, each in the jail of the isolation it was made for.

``LocalFactory(...).create(files=...)`` makes a ``LocalSession``: a private directory holding the
workspace, a ``/tmp`` and generated ``/etc`` files, plus (when the executor is root) a private uid
leased for the session's lifetime (``host.py``: the leases, owner locks and the sweep of dead
sessions). The session picks its jail once, when it is created, from the isolation the factory
resolved (``JAILS``; the ``Jail`` protocol and what every mode shares are in ``jail.py``):
``bwrap`` a bubblewrap jail per command (``bwrapjail.py``), behind the warm test runner where the
factory runs warm (``warm.py``); ``pod`` the pod as the boundary (``podjail.py``); ``none`` rlimits
only (``nojail.py``: for development only, and it says so loudly). Every ``exec`` hands the jail a
``jail.View`` of the session and the command; the jail runs it, kills what is left and classifies
the result. A non-root executor (a sandbox pod running as non-root) has no uid to lease:
bubblewrap then runs unprivileged in a user namespace, and ``RLIMIT_NPROC`` counts the executor's
own processes too (one session per pod is the intended shape). Verification's stations
(``station.py``) are sessions kept between candidates.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import sys
import tempfile
import warnings
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path

from gagar.sandbox import bwrap, podjail, quota, station, warm, workspace
from gagar.sandbox.bwrapjail import BwrapJail
from gagar.sandbox.cgroup import sweep_stale
from gagar.sandbox.host import (
    SESSION_PREFIX,
    UidLease,
    cgroup_tag,
    remove_session_dir,
    sweep_stale_sessions,
    take_ownership,
)
from gagar.sandbox.jail import Jail, View
from gagar.sandbox.nojail import NoJail
from gagar.sandbox.types import (
    MAX_WALL_S,
    Command,
    ExecResult,
    FileData,
    Isolation,
    Limits,
    SandboxError,
    SandboxUnavailable,
    SessionRequest,
    VerificationFactory,
)

UNSAFE_WARNING = (
    "WARNING: sandbox isolation is OFF (--unsafe-no-isolation): untrusted code runs directly on "
    "this host with only rlimits. Use this for development on trusted code only."
)


# The cold jail of each isolation a factory resolves (``isolation.py``); ``warm.WarmRunner`` goes
# in front of the bubblewrap one where the factory runs warm.
JAILS: dict[Isolation, Callable[[], Jail]] = {
    "bwrap": BwrapJail,
    "pod": podjail.PodJail,
    "none": NoJail,
}


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


class LocalFactory(VerificationFactory):
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
        environments: Mapping[str, str | os.PathLike[str]] | None = None,
    ) -> None:
        if isolation == "bwrap" and check:
            check_isolation()  # refuse here, once, rather than fail every command later
        elif isolation == "pod":
            podjail.check_root(root)
            if check:
                podjail.check()
        self.limits, self.isolation, self.root = limits or Limits(), isolation, root
        self.ro_paths, self.use_cgroup = python_paths() + ro_paths, use_cgroup
        # Task environments (``venvs.py``): name -> a virtual environment a session of that
        # environment mounts read-only, first on its PATH.
        self.environments = {n: os.path.realpath(p) for n, p in (environments or {}).items()}
        for env, path in self.environments.items() if isolation == "pod" else ():
            podjail.check_reachable(path, f"environment {env!r} ({path})", "an environment cache")
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

    def venv(self, environment: str | None) -> str | None:
        """The virtual environment of ``environment`` (None: the executor's own Python)."""
        if environment is None:
            return None
        try:
            return self.environments[environment]
        except KeyError:
            have = ", ".join(sorted(self.environments)) or "none"
            raise SandboxError(f"no environment {environment!r} here (there are: {have})") from None

    def open(self, request: SessionRequest) -> LocalSession | station.Station:
        """A new session; for a verification, where sessions run warm, a station (``station.py``)
        kept for the request's preload, limits and environment. A task image is refused: it
        names a container, which only sandbox pods run."""
        if request.image is not None:
            raise SandboxError(
                f"the task image {request.image!r} runs on sandbox pods only (backend: pods); "
                "on this backend name a task environment of its packages instead"
            )
        limits, venv = request.limits or self.limits, self.venv(request.environment)
        tarball = request.tarball  # a verification's is never None (``SessionRequest``)
        if not (request.verification and self.warm and tarball is not None):
            return LocalSession(self, request.files or {}, tarball, limits, venv=venv)
        make = functools.partial(
            LocalSession, self, {}, tarball, limits, preload=request.preload, venv=venv
        )
        key = (request.preload, limits.model_dump_json(), venv or "")
        return self.stations.take(tarball, key, make)


class LocalSession:
    """One workspace and its jail. Use as a context manager, or call ``close``. ``venv``: the
    task environment's virtual environment (``venvs.py``), mounted read-only and first on the
    jail's PATH; None: the executor's own Python."""

    def __init__(
        self,
        factory: LocalFactory,
        files: Mapping[str, FileData],
        tarball: bytes | None,
        limits: Limits,
        preload: tuple[str, ...] | None = None,
        venv: str | None = None,
    ) -> None:
        self.limits, self._factory, self._closed, self.venv = limits, factory, False, venv
        jailed = factory.isolation in ("bwrap", "pod")
        self._lease = UidLease() if jailed and os.geteuid() == 0 else None
        self.dir = Path(tempfile.mkdtemp(prefix=SESSION_PREFIX, dir=factory.root))
        self.quota = jailed and quota.try_mount(self.dir, limits.disk_bytes, limits.inodes)
        self._owner = take_ownership(self.dir, self.uid)
        self.workspace = self.dir / "workspace"
        self.ro_paths = (venv, *factory.ro_paths) if venv else factory.ro_paths
        self.jail = JAILS[factory.isolation]()  # once: the isolation the factory resolved
        if factory.warm:
            preload = factory.warm_preload if preload is None else preload
            self.jail = warm.WarmRunner(self.jail, self._view(), preload)
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
        return cgroup_tag(self.dir)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def _warm(self) -> warm.WarmRunner | None:
        """The warm runner, where this session has one (tests and benchmarks look inside)."""
        return self.jail if isinstance(self.jail, warm.WarmRunner) else None

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
            podjail.seal(self.dir)

    def _jail(self) -> bwrap.Jail:
        """The bubblewrap jail's mounts, environment and waiter (``bwrap.py``)."""
        links, etc = host_layout()
        python_bins = [os.path.join(p, "bin") for p in self.ro_paths]  # first on the jail's PATH
        return bwrap.Jail(
            workspace=str(self.workspace),
            tmp=str(self.dir / "tmp"),
            etc=str(self.dir / "etc"),
            uid=self.uid,
            ro_paths=self.ro_paths,
            env=bwrap.sandbox_env(python_bins, self.uid, self.venv),
            host_links=links,
            host_etc=etc,
            waiter=bwrap.waiter_argv(os.path.realpath(sys.executable), _perl()),
        )

    def _view(self) -> View:
        """The session as its jail sees it for one run."""
        cgroups = self._factory.use_cgroup and self.uid is not None
        tag = self.cgroup_tag if cgroups else None
        return View(self.dir, self.uid, self.limits, self._jail(), tag, self.quota, self.venv)

    def exec(self, cmd: Command, timeout: float | None = None) -> ExecResult:
        self._check_open()
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise SandboxError("command must be a non-empty string or list of strings")
        wall = float(timeout) if timeout is not None else self.limits.wall_time_s
        if not (math.isfinite(wall) and 0 < wall <= MAX_WALL_S):
            raise SandboxError(f"timeout must be a number in (0, {MAX_WALL_S:g}], got {timeout}")
        return self.jail.run(self._view(), argv, wall)

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
        self.jail.stop()  # a fork server's jail holds the directories removed here
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
        self.jail.stop()
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


__all__ = [
    "JAILS",
    "SESSION_PREFIX",
    "LocalFactory",
    "LocalSession",
    "check_isolation",
    "sweep_stale_sessions",
]
