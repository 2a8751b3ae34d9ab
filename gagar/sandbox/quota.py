"""A disk quota for one session: its directory (workspace, ``/tmp``) on a tmpfs of bounded size.

The kernel enforces ``size`` and ``nr_inodes`` on every write, so the code under test gets
``ENOSPC`` at the limit instead of filling the host's disk, and removing the session is one
(lazy) unmount however many files or levels the code made. Mounting needs ``CAP_SYS_ADMIN`` in
the host's mount namespace: an executor running as root has it; a non-root executor (a sandbox
pod) does not, and its sessions live on the pod's ``emptyDir``, bounded by its ``sizeLimit``.
tmpfs pages are memory (swappable): ``diskBytes`` of every open session count against the host's
memory when they are used.
"""

from __future__ import annotations

import ctypes
import os
import warnings
from functools import cache
from pathlib import Path

_MS_NOSUID, _MS_NODEV = 0x2, 0x4
_MNT_DETACH = 0x2


@cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


_CAP_SYS_ADMIN = 21


def can_mount() -> bool:
    """Whether this process holds ``CAP_SYS_ADMIN`` (needed to mount; root in a pod lacks it)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> _CAP_SYS_ADMIN & 1)
    return False


def try_mount(path: Path, size_bytes: int, inodes: int) -> bool:
    """Mount the quota tmpfs when this process may; warn once when it may but the mount fails."""
    if not can_mount():
        return False
    try:
        mount_tmpfs(path, size_bytes, inodes)
    except OSError as e:
        _warn_once(str(e))
        return False
    return True


@cache
def _warn_once(message: str) -> None:
    warnings.warn(f"sandbox disk quota unavailable: {message}", stacklevel=3)


def mount_tmpfs(path: Path, size_bytes: int, inodes: int) -> None:
    """Mount a ``size_bytes``/``inodes`` tmpfs on ``path`` (mode 0700, nosuid, nodev)."""
    opts = f"size={size_bytes},nr_inodes={inodes},mode=0700".encode()
    rc = _libc().mount(b"tmpfs", os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot mount a tmpfs on {path}: {os.strerror(err)}")


def unmount(path: Path) -> None:
    """Detach the tmpfs on ``path`` (lazy: gone once nothing uses it); no error if none is there."""
    if os.path.ismount(path):
        if _libc().umount2(os.fsencode(path), _MNT_DETACH) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot unmount {path}: {os.strerror(err)}")


def full(path: Path, slack_bytes: int = 16 << 10) -> bool:
    """Whether the filesystem holding ``path`` is out of space or inodes (a write just failed)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < slack_bytes or st.f_favail == 0
