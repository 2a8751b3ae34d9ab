"""Verification stations: sessions whose warm test runner serves one candidate after another.

Verification runs each candidate's tests in a session of its own, made from the candidate's
archive. Made fresh every time, that session starts a fresh interpreter and imports pytest for a
single run (about 0.3 CPU s, a third of a rollout's sandbox CPU at concurrency 32). A *station* is
a ``LocalSession`` kept between verifications, with its warm runner (``warm.py``) started once: its
fork server imported pytest (and ``preload``) isolated (``python -I -B``: nothing of the workspace
or ``/tmp`` read, checked after its imports), and never runs a candidate's code itself; each
verification's test run is a ``fork`` of it, as for an agent's ``python -m pytest`` but ``-I``:
nothing of the workspace on ``sys.path`` until the bootstrap puts it there, as it does cold.

What a candidate leaves, the next never sees:

- its files: the workspace and ``/tmp`` are emptied in place before the station is taken again
  (the server's jail holds them bound), then the next archive is unpacked;
- its processes: every run has its own cgroups, killed when it ends (as an agent's warm run);
- its network (a port in ``TIME_WAIT`` the next candidate's test binds, a listener, an abstract
  socket name): every run has a network namespace of its own (``warm_server.py``); where the
  kernel refuses one, a socket left in the server's namespace gets the server discarded;
- its traces in the jail: changing the server's scheduling or resource limits (the uid is the
  same, so it may; forks inherit them) is refused by the jail's filter; a run that leaves System
  V IPC objects or files in ``/dev/shm``, or changes the server anyway, has its result kept and
  the server discarded (``warm.py``); the station is then retired, and later candidates get a
  new one;
- the uid's own kernel state: the kernel keyring and POSIX message queues are refused by the
  seccomp filter, as in every jail.

A station is kept for its preload, limits and task environment (``Key``): a candidate of one
environment is never verified by a server started in another's interpreter and packages.
A station whose server is gone or discarded, or whose workspace cannot be emptied, is closed rather
than kept; at most ``idle`` stations are kept idle in all, whatever their preload and limits (the
key, which a client of the executor chooses: a bound per key would be none), the least recently
given back closed first. Where the factory runs cold (no bubblewrap, not root, warm runners off),
``LocalFactory.verification_session`` makes a fresh session instead.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from gagar.sandbox import workspace
from gagar.sandbox.jail import Jail
from gagar.sandbox.types import SandboxError

log = logging.getLogger(__name__)
IDLE = 8  # stations kept idle, all keys together (each holds a fork server: ~40 MB, no CPU)
# What the server preloads, the session's limits (as JSON), its task environment ("" none): a
# fork server that imported one environment's pytest never serves another environment's tests.
Key = tuple[tuple[str, ...], str, str]


class Kept(Protocol):
    """What a station needs of the session it keeps (a ``LocalSession``)."""

    dir: Path  # the session directory: workspace/, tmp/
    workspace: Path
    ro_paths: tuple[str, ...]  # bound read-only into its jails (the Python installation)
    roots: dict[Path, tuple[int, list[str]] | None]  # ``dir_state`` of workspace and tmp
    jail: Jail  # a ``warm.WarmRunner`` where the factory runs warm

    @property
    def closed(self) -> bool: ...

    def refill(self, tarball: bytes) -> None: ...

    def close(self) -> None: ...


class Stations:
    """The idle stations of one ``LocalFactory`` (at most ``idle``), each with its preload and
    limits; thread-safe."""

    def __init__(self, idle: int = IDLE) -> None:
        self.idle = idle
        self._lock = threading.Lock()
        self._free: list[tuple[Key, Kept]] = []  # least recently given back first
        self.made = self.reused = self.retired = 0

    def take(self, tarball: bytes, key: Key, make: Callable[[], Kept]) -> Station:
        """A station holding ``tarball``'s repository (an idle one refilled, or ``make()``'s);
        ``close()`` gives it back."""
        session = self._pop_fit(key)
        if session is None:
            session = make()
            with self._lock:
                self.made += 1
            return Station(self, session, key)
        try:
            session.refill(tarball)
        except BaseException:
            self._retire(session, "its workspace could not be refilled")
            raise
        with self._lock:
            self.reused += 1
        return Station(self, session, key)

    def _pop_fit(self, key: Key) -> Kept | None:
        """An idle station fit to serve; those that are not (a server died idle) are retired."""
        while True:
            with self._lock:
                at = next(
                    (i for i in reversed(range(len(self._free))) if self._free[i][0] == key), None
                )
                session = None if at is None else self._free.pop(at)[1]
            if session is None:
                return None
            why = unfit(session)
            if why is None:
                return session
            self._retire(session, why)

    def give_back(self, session: Kept, key: Key) -> None:
        why = unfit(session)
        if why is None:
            try:
                empty(session)
            except (OSError, SandboxError) as e:
                why = f"emptying it failed: {e}"
        if why is not None:
            self._retire(session, why)
            return
        with self._lock:
            self._free.append((key, session))
            excess = [s for _, s in self._free[: max(len(self._free) - self.idle, 0)]]
            del self._free[: len(excess)]
        for old in excess:
            self._retire(old, None)

    def _retire(self, session: Kept, why: str | None) -> None:
        if why is not None:
            log.info("verification station %s retired: %s", session.dir.name, why)
        with self._lock:
            self.retired += 1
        session.close()

    def close(self) -> None:
        """Close every idle station (those taken are closed when given back)."""
        with self._lock:
            idle = [s for _, s in self._free]
            self._free.clear()
        for session in idle:
            session.close()


def dir_state(d: Path) -> tuple[int, list[str]] | None:
    """A directory's permission bits and extended attributes (ACLs among them), or None."""
    try:
        return stat.S_IMODE(os.lstat(d).st_mode), sorted(os.listxattr(d, follow_symlinks=False))
    except OSError:
        return None


def _tmp_mount_points(session: Kept) -> set[str]:
    """The directories (relative to ``/tmp``) on the way to where bubblewrap binds a Python
    installation under ``/tmp`` (a clone's environment), the mount points included."""
    return {
        str(d.relative_to("/tmp"))
        for p in session.ro_paths
        if p.startswith("/tmp/")
        for d in (PurePosixPath(p), *PurePosixPath(p).parents)
        if str(d).startswith("/tmp/")
    }


def empty(session: Kept) -> None:
    """The session's workspace and ``/tmp`` emptied in place (the warm runner's jail holds them),
    but for the mount points bubblewrap made in ``/tmp`` for a Python installation under it (a
    clone's environment): removing one here would unmount it in the server's jail. Those are
    root's directories, which the code cannot write into; what it made inside one is removed all
    the same."""
    workspace.remove_tree(session.workspace, keep=True)
    chain = _tmp_mount_points(session)
    todo = [(session.dir / "tmp", "")]
    while todo:
        where, rel = todo.pop()
        with os.scandir(where) as it:
            entries = [(e.name, e.stat(follow_symlinks=False)) for e in it]
        for name, st in entries:
            sub = f"{rel}/{name}" if rel else name
            if sub in chain and stat.S_ISDIR(st.st_mode) and st.st_uid == 0:
                todo.append((where / name, sub))  # a mount point's way: kept, emptied
            else:
                workspace.remove_tree(where / name)


def unfit(session: Kept) -> str | None:
    """Why ``session`` must not serve another verification, or None. Besides its warm runner's
    state: the code owns ``/workspace`` and ``/tmp`` themselves, which stay while their contents
    are emptied: it may change their modes or ACLs (``chmod 000`` would fail the next candidate's
    tests), or rename a directory in ``/tmp`` on the way to a mount point, which moves the mount
    in the server's jail (its later imports would fail; without a server, the next jail makes the
    way again)."""
    if session.closed:
        return "closed"
    jail = session.jail
    for d, state in session.roots.items():
        if dir_state(d) != state:
            return f"/{d.name} had its mode or extended attributes changed"
    for rel in _tmp_mount_points(session) if jail.serving else ():
        try:
            st = os.lstat(session.dir / "tmp" / rel)
        except OSError:
            return f"/tmp/{rel}, a mount point's way, is gone"
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
            return f"/tmp/{rel}, a mount point's way, was replaced"
    return jail.unfit()


class Station:
    """One verification's use of a station: a ``Session`` until ``close()`` gives it back."""

    def __init__(self, pool: Stations, session: Kept, key: Key) -> None:
        self._pool, self._key = pool, key
        self._session: Kept | None = session

    def __getattr__(self, name: str) -> Any:  # the Session methods, while taken
        session = self.__dict__.get("_session")
        if session is None:
            raise SandboxError("session is closed")
        return getattr(session, name)

    def unfit(self) -> str | None:
        """Why this station could not serve the next candidate as it stands (``unfit``)."""
        return unfit(self._session) if self._session is not None else "given back"

    def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            self._pool.give_back(session, self._key)

    def __enter__(self) -> Station:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["IDLE", "Station", "Stations", "dir_state", "empty", "unfit"]
