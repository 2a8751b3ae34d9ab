"""Host-side file operations on a session's workspace, safe against what the sandboxed code left.

The sandboxed code can leave symlinks pointing anywhere (``ln -s /etc/shadow x``), FIFOs that block
a reader, and odd permissions. The host (often root) must never follow those out of the workspace,
so every path is resolved and checked to stay inside, the final component is opened with
``O_NOFOLLOW``, and only regular files are read. No sandboxed process runs between commands (the
executor kills them all), so these checks cannot race with the code.
"""

from __future__ import annotations

import difflib
import io
import os
import shutil
import stat
import tarfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from gagar.sandbox.types import FileData, SandboxError

# Build and cache products that are not part of a change.
IGNORED_DIRS = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".git"})


def resolve_inside(root: Path, rel: str) -> Path:
    """``root / rel`` after checking it names a path inside ``root`` without leaving it by links."""
    if not rel or "\x00" in rel:
        raise SandboxError(f"invalid path {rel!r}")
    candidate = Path(os.path.normpath(root / rel.lstrip("/")))
    if candidate != root and root not in candidate.parents:
        raise SandboxError(f"path {rel!r} leaves the workspace")
    parent = Path(os.path.realpath(candidate.parent))
    real_root = Path(os.path.realpath(root))
    if parent != real_root and real_root not in parent.parents:
        raise SandboxError(f"path {rel!r} leaves the workspace through a symlink")
    return candidate


def read_file(root: Path, rel: str) -> bytes:
    path = resolve_inside(root, rel)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise SandboxError(f"no such file: {rel}") from None
    except OSError as e:  # ELOOP: the final component is a symlink
        raise SandboxError(f"cannot read {rel}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise SandboxError(f"not a regular file: {rel}")
        return f.read()


def write_file(root: Path, rel: str, data: FileData, owner: int | None = None) -> None:
    path = resolve_inside(root, rel)
    if path.is_symlink():
        path.unlink()  # replace the link itself, never write through it
    elif path.exists() and not path.is_file():
        raise SandboxError(f"not a regular file: {rel}")
    _make_parents(root, path.parent, owner)
    payload = data.encode() if isinstance(data, str) else data
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(payload)
    if owner is not None:
        os.chown(path, owner, owner)


def _make_parents(root: Path, parent: Path, owner: int | None) -> None:
    missing = []
    while not parent.exists() and parent != root:
        missing.append(parent)
        parent = parent.parent
    for d in reversed(missing):
        d.mkdir()
        if owner is not None:
            os.chown(d, owner, owner)


def delete_file(root: Path, rel: str) -> None:
    path = resolve_inside(root, rel)
    if not path.is_symlink() and not path.exists():
        raise SandboxError(f"no such file: {rel}")
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def walk(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Every non-directory entry below ``root`` (relative path, lstat), sorted, links not followed."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_DIRS)
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(Path(dirpath, d))]):
            full = Path(dirpath, name)
            yield str(full.relative_to(root)), os.lstat(full)


def snapshot(root: Path) -> dict[str, bytes]:
    """Content of every entry; a symlink becomes ``b"symlink -> target"``, a special file a marker."""
    out: dict[str, bytes] = {}
    for rel, st in walk(root):
        if stat.S_ISLNK(st.st_mode):
            out[rel] = b"symlink -> " + os.fsencode(os.readlink(root / rel))
        elif stat.S_ISREG(st.st_mode):
            out[rel] = read_file(root, rel)
        else:
            out[rel] = b"<special file>"
    return out


def unified_diff(base: Mapping[str, bytes], new: Mapping[str, bytes]) -> str:
    """A ``git diff``-style patch from ``base`` to ``new`` (binary files are named, not shown)."""
    chunks = []
    for rel in sorted(set(base) | set(new)):
        old, cur = base.get(rel), new.get(rel)
        if old == cur:
            continue
        a = f"a/{rel}" if old is not None else "/dev/null"
        b = f"b/{rel}" if cur is not None else "/dev/null"
        chunks.append(f"diff --git a/{rel} b/{rel}\n")
        if _is_binary(old) or _is_binary(cur):
            chunks.append(f"Binary files {a} and {b} differ\n")
            continue
        old_lines = (old or b"").decode().splitlines(keepends=True)
        new_lines = (cur or b"").decode().splitlines(keepends=True)
        for line in difflib.unified_diff(old_lines, new_lines, a, b):
            chunks.append(
                line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
            )
    return "".join(chunks)


def _is_binary(data: bytes | None) -> bool:
    if data is None:
        return False
    if b"\x00" in data:
        return True
    try:
        data.decode()
    except UnicodeDecodeError:
        return True
    return False


def populate(root: Path, files: Mapping[str, FileData], owner: int | None = None) -> None:
    for rel, data in files.items():
        write_file(root, rel, data, owner)


def pack(root: Path) -> bytes:
    """The workspace as ``.tar.gz`` (symlinks stored as links, special files skipped)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel, st in walk(root):
            if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                tar.add(root / rel, arcname=rel, recursive=False)
    return buf.getvalue()


def files_tarball(files: Mapping[str, FileData]) -> bytes:
    """A ``.tar.gz`` of a files mapping (how binary files travel to a remote executor)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel, data in sorted(files.items()):
            payload = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(rel)
            info.size, info.mode = len(payload), 0o644
            tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def unpack(root: Path, tarball: bytes) -> None:
    """Extract an untrusted archive: the ``data`` filter rejects absolute paths, ``..`` and links out."""
    try:
        with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:*") as tar:
            tar.extractall(root, filter="data")
    except (tarfile.TarError, OSError) as e:
        raise SandboxError(f"bad tarball: {e}") from None


def chown_tree(root: Path, owner: int) -> None:
    """Give the sandbox uid its workspace (links themselves, never their targets)."""
    os.lchown(root, owner, owner)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            os.lchown(Path(dirpath, name), owner, owner)
