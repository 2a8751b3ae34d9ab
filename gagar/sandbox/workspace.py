"""Host-side file operations on a session's workspace, safe against what the sandboxed code left.

The sandboxed code can leave symlinks pointing anywhere (``ln -s /etc/shadow x``), FIFOs that block
a reader, and odd permissions. The host (often root) must never follow those out of the workspace,
so every path is resolved and checked to stay inside, the final component is opened with
``O_NOFOLLOW``, and only regular files are read. No sandboxed process runs between commands (the
executor kills them all), so these checks cannot race with the code.

Walking is iterative (no recursion limit, however deep the tree the code built) and bounded:
at most ``MAX_DEPTH`` levels and ``MAX_ENTRIES`` entries are visited, a snapshot reads at most
``SNAPSHOT_FILE_BYTES`` of one file and ``SNAPSHOT_BYTES`` in all into the host (larger files are
fingerprinted by size and mtime), and an archive leaves out, and lists, what cannot travel
(links an extraction refuses, special or unreadable files, bytes past ``ARCHIVE_BYTES``).
``remove_tree`` deletes with one directory descriptor at a time, relative to it, so neither depth
nor ``PATH_MAX`` can make it fail.
"""

from __future__ import annotations

import difflib
import io
import os
import stat
import tarfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from gagar import gitpath
from gagar.sandbox.types import FileData, SandboxError

# Build and cache products that are not part of a change.
IGNORED_DIRS = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".git"})
MAX_DEPTH = 64  # directory levels walked; deeper entries are reported as one marker
MAX_ENTRIES = 100_000  # entries walked; past it the walk stops with a marker
SNAPSHOT_FILE_BYTES = 1 << 20  # a larger file is diffed by size and mtime, not read
SNAPSHOT_BYTES = 64 << 20  # content read into the host per snapshot, all files together
# The modification time of every unpacked entry (2000-01-01 UTC: after 1980, which zip needs). A
# candidate's own times (which a test can read) never reach verification: equal bytes, equal run.
UNPACKED_MTIME = 946684800
ARCHIVE_BYTES = 256 << 20  # regular-file bytes an archive may hold
# A marker's leading NUL makes the diff call it binary rather than print it as content.
TOO_DEEP = b"\x00<directory too deep: not walked>"
TOO_MANY = b"\x00<too many entries: walk stopped>"


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
        remove_tree(path)
    else:
        path.unlink()


def walk(root: Path, ignored: frozenset[str] = IGNORED_DIRS) -> Iterator[tuple[str, Entry]]:
    """Every non-directory entry below ``root`` as (relative path, lstat), sorted, links never
    followed; iterative and bounded: a directory past ``MAX_DEPTH`` yields ``(rel, TOO_DEEP)``,
    and after ``MAX_ENTRIES`` entries one ``(".", TOO_MANY)`` ends the walk."""
    stack: list[tuple[str, int]] = [("", 0)]
    seen = 0
    while stack:
        rel_dir, depth = stack.pop()
        try:
            with os.scandir(root / rel_dir if rel_dir else root) as it:
                entries = sorted(it, key=lambda e: e.name, reverse=True)
        except OSError as err:  # unreadable, or a path too long for the host to name
            if rel_dir:
                yield rel_dir, f"\x00<directory not walked: {err.strerror}>".encode()
            continue
        subdirs: list[tuple[str, int]] = []
        others: list[tuple[str, Entry]] = []
        for e in entries:
            seen += 1
            if seen > MAX_ENTRIES:
                yield ".", TOO_MANY
                return
            rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
            if e.is_dir(follow_symlinks=False):
                if e.name in ignored:
                    continue
                if depth + 1 >= MAX_DEPTH:
                    others.append((rel, TOO_DEEP))
                else:
                    subdirs.append((rel, depth + 1))
                continue
            try:
                others.append((rel, e.stat(follow_symlinks=False)))
            except OSError:
                continue
        yield from sorted(others)
        stack.extend(subdirs)  # reverse-sorted: popped in name order


Entry = os.stat_result | bytes  # bytes: a marker for what the walk did not enter


def usage(root: Path) -> tuple[int, int]:
    """(bytes allocated, entries) below ``root``, ignored directories included (bounded walk;
    a walk cut short counts what it saw)."""
    used = entries = 0
    for _, st in walk(root, ignored=frozenset()):
        entries += 1
        if not isinstance(st, bytes):
            used += st.st_blocks * 512
    return used, entries


def snapshot(root: Path) -> dict[str, bytes]:
    """Content of every entry; a symlink becomes ``b"symlink -> target"``, a special file, a file
    too large and anything past the read budget a marker (bounded host memory)."""
    out: dict[str, bytes] = {}
    budget = SNAPSHOT_BYTES
    for rel, st in walk(root):
        if isinstance(st, bytes):
            out[rel] = st
        elif stat.S_ISLNK(st.st_mode):
            out[rel] = b"symlink -> " + os.fsencode(_readlink(root, rel))
        elif not stat.S_ISREG(st.st_mode):
            out[rel] = b"\x00<special file>"
        elif st.st_size > min(SNAPSHOT_FILE_BYTES, budget):
            out[rel] = f"\x00<{st.st_size} bytes, mtime {st.st_mtime_ns}>".encode()
        else:
            out[rel] = _read_bounded(root, rel, st.st_size)
            budget -= len(out[rel])
    return out


def _readlink(root: Path, rel: str) -> str:
    try:
        return os.readlink(root / rel)
    except OSError:
        return "?"


def _read_bounded(root: Path, rel: str, size: int) -> bytes:
    try:
        path = resolve_inside(root, rel)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (SandboxError, OSError):
        return b"\x00<unreadable>"
    with os.fdopen(fd, "rb") as f:
        return f.read(size + 1)[: size + 1]  # a file grown since the stat is cut, not trusted


def unified_diff(base: Mapping[str, bytes], new: Mapping[str, bytes]) -> str:
    """A ``git diff``-style patch from ``base`` to ``new`` (binary files are named, not shown)."""
    chunks = []
    for rel in sorted(set(base) | set(new)):
        old, cur = base.get(rel), new.get(rel)
        if old == cur:
            continue
        # names quoted as git does: a newline in a name must not start a line of the patch
        a = gitpath.side("a/", rel if old is not None else None)
        b = gitpath.side("b/", rel if cur is not None else None)
        chunks.append(f"diff --git {gitpath.side('a/', rel)} {gitpath.side('b/', rel)}\n")
        marker = next((m for m in (cur, old) if m and m.startswith(b"\x00<")), None)
        if marker is not None:  # what the walk did not read: say why, not "binary"
            chunks.append(f"Not compared: {a} and {b}: {marker[2:-1].decode(errors='replace')}\n")
            continue
        if _is_binary(old) or _is_binary(cur):
            chunks.append(f"Binary files {a} and {b} differ\n")
            continue
        old_lines = (old or b"").decode().splitlines(keepends=True)
        new_lines = (cur or b"").decode().splitlines(keepends=True)
        names = (
            gitpath.file_line("a/", rel if old is not None else None),
            gitpath.file_line("b/", rel if cur is not None else None),
        )
        for line in difflib.unified_diff(old_lines, new_lines, *names):
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
    """The workspace as ``.tar.gz``; what cannot travel is left out (``pack_report``)."""
    return pack_report(root)[0]


def pack_report(root: Path) -> tuple[bytes, list[str]]:
    """The workspace as ``.tar.gz`` and what was left out, with why: special files, links an
    extraction would refuse (absolute, or leading out of the workspace), unreadable files,
    directories not walked (too deep, unreadable, past ``MAX_ENTRIES``) and regular files past
    ``ARCHIVE_BYTES`` in all. Never raises for what the code left in the workspace."""
    buf, total, skipped = io.BytesIO(), 0, []
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel, st in walk(root):
            if isinstance(st, bytes):
                skipped.append(f"{rel}: {st[2:-1].decode(errors='replace')}")
                continue
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                skipped.append(f"{rel}: special file")
                continue
            if stat.S_ISREG(st.st_mode) and total + st.st_size > ARCHIVE_BYTES:
                skipped.append(f"{rel}: {st.st_size} bytes past the archive's {ARCHIVE_BYTES}")
                continue
            why = _add(tar, root, rel)
            if why:
                skipped.append(f"{rel}: {why}")
            elif stat.S_ISREG(st.st_mode):
                total += st.st_size
    return buf.getvalue(), skipped


def _add(tar: tarfile.TarFile, root: Path, rel: str) -> str | None:
    """Add one file or link; the reason it was left out, if it was."""
    try:
        info = tar.gettarinfo(str(root / rel), arcname=rel)
        if info.issym():
            tarfile.data_filter(info, str(root))  # the check an extraction will make
            tar.addfile(info)
            return None
        info.type, info.linkname = tarfile.REGTYPE, ""  # a hard link travels as its own copy
        fd = os.open(root / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except tarfile.FilterError as e:
        return f"link refused ({e})"
    except OSError as e:
        return f"unreadable ({e.strerror})"
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return "not a regular file"
        info.size = os.fstat(f.fileno()).st_size
        tar.addfile(info, _Exact(f, info.size))
    return None


class _Exact(io.RawIOBase):
    """``size`` bytes of ``f``: zeros past a file that shrank, nothing past one that grew."""

    def __init__(self, f: io.BufferedReader, size: int) -> None:
        self.f, self.left = f, size

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self.f.read(n)
        data += b"\0" * (n - len(data))
        self.left -= n
        return data


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


def _unpacked(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """``data``'s checks, and the time every unpacked entry gets (``UNPACKED_MTIME``)."""
    return tarfile.data_filter(member, dest).replace(mtime=UNPACKED_MTIME, deep=False)


def unpack(root: Path, tarball: bytes) -> None:
    """Extract an untrusted archive: the ``data`` filter rejects absolute paths, ``..`` and links
    out. What the workspace becomes depends on the entries' names, kinds, modes, link targets and
    bytes alone (what ``verify.repository_digest`` covers, so that candidates who share a digest
    share a verdict): every entry gets the same time, ``UNPACKED_MTIME``, and they are made in
    name order, not the archive's."""
    try:
        with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:*") as tar:
            members = sorted(tar.getmembers(), key=lambda m: m.name)  # stable: last one wins
            tar.extractall(root, members, filter=_unpacked)
    except tarfile.FilterError as e:  # its message holds the host path it would extract to
        raise SandboxError(f"bad tarball: member {e.tarinfo.name!r}: {type(e).__name__}") from None
    except OSError as e:  # its filename is a host path: say which member, relative
        where = os.path.relpath(e.filename, root) if isinstance(e.filename, str) else ""
        raise SandboxError(f"bad tarball: {where or 'extracting'}: {e.strerror}") from None
    except tarfile.TarError as e:
        raise SandboxError(f"bad tarball: {e}") from None


def chown_tree(root: Path, owner: int) -> None:
    """Give the sandbox uid its workspace (links themselves, never their targets); iterative."""
    os.lchown(root, owner, owner)
    stack = [root]
    while stack:
        d = stack.pop()
        with os.scandir(d) as it:
            for e in it:
                os.lchown(e.path, owner, owner)
                if e.is_dir(follow_symlinks=False):
                    stack.append(Path(e.path))


def remove_tree(path: Path, keep: bool = False) -> None:
    """Delete ``path`` and everything below it without recursion, without following links and
    without long paths: one directory descriptor is held at a time, every call relative to it.
    ``keep``: the directory ``path`` itself stays, empty."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return
    except OSError:  # not a directory (or a link to one): remove the entry itself
        os.unlink(path)
        return
    names: list[str] = []  # the way down from ``path``
    while True:
        child = _clear_dir(fd)
        if child is not None:  # a subdirectory: go down into it
            new = os.open(child, flags, dir_fd=fd)
            os.close(fd)
            fd, names = new, [*names, child]
            continue
        if not names:
            break
        up = os.open("..", flags, dir_fd=fd)  # nothing runs in the sandbox now: ".." stays put
        os.close(fd)
        fd = up
        os.rmdir(names.pop(), dir_fd=fd)
    os.close(fd)
    if not keep:
        os.rmdir(path)


def _clear_dir(fd: int) -> str | None:
    """Unlink every non-directory in the directory ``fd``; return a subdirectory, if any."""
    with os.scandir(fd) as it:
        for e in it:
            if e.is_dir(follow_symlinks=False):
                os.chmod(e.name, 0o700, dir_fd=fd)  # the code may have made it unreadable
                return e.name
            os.unlink(e.name, dir_fd=fd)
    return None
