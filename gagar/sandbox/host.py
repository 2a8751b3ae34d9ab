"""What a session holds on the host besides its processes, and the sweep that reclaims it.

A session directory (``SESSION_PREFIX`` + a random name) holds the workspace, ``/tmp`` and the
generated ``/etc`` files; its ``OWNER_LOCK`` is ``flock``ed while the session lives (the kernel
releases it when the owning process dies) and records the session's uid. A root executor leases
each session a uid of its own (``UidLease``): host-wide, held by an ``flock`` too. When a process
dies without closing its sessions (SIGKILL, OOM kill), ``sweep_stale_sessions`` reclaims what they
left: processes of their uid, cgroups, the quota tmpfs, the directory.
"""

from __future__ import annotations

import fcntl
import os
import random
import tempfile
import time
from pathlib import Path

from gagar.sandbox import quota, runner, workspace
from gagar.sandbox.cgroup import destroy_tagged
from gagar.sandbox.types import SandboxUnavailable

UID_BASE, UID_SLOTS = 1_500_000, 4096
# Uids are host-wide, so their locks are too: not under $TMPDIR, which differs between processes
# (only a root executor leases uids, and root can always write /tmp).
LOCK_DIR = Path("/tmp/gagar-sandbox-uids")
SESSION_PREFIX = "gagar-sbx-"
OWNER_LOCK = ".owner.lock"  # flocked while the session lives: a free lock means its process died


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
    destroy_tagged(cgroup_tag(d))
    remove_session_dir(d)


def _recorded_uid(d: Path) -> int:
    try:
        return int((d / OWNER_LOCK).read_text() or -1)
    except (OSError, ValueError):
        return -1


def cgroup_tag(d: Path) -> str:
    """The prefix of the names of a session's cgroups (``Cgroup.create``)."""
    return d.name.removeprefix(SESSION_PREFIX) + "-"


def remove_session_dir(d: Path) -> None:
    """Unmount its quota tmpfs (if any), then remove what is left, however deep."""
    quota.unmount(d)
    workspace.remove_tree(d)


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


def take_ownership(session_dir: Path, uid: int | None) -> int:
    """The session's ``OWNER_LOCK``, ``flock``ed (released by the kernel when this process dies)
    and holding its uid (for the sweep). Made under another name and renamed: a sweeper never
    sees the lock file before it is locked."""
    new = session_dir / f"{OWNER_LOCK}.new"
    fd = os.open(new, os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, str(uid if uid is not None else "").encode())
    os.rename(new, session_dir / OWNER_LOCK)
    return fd


__all__ = [
    "SESSION_PREFIX",
    "UidLease",
    "cgroup_tag",
    "remove_session_dir",
    "sweep_stale_sessions",
    "take_ownership",
]
