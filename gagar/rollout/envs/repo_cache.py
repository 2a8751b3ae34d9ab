"""Repository snapshots of SWE-bench-style rows (``repo`` + ``base_commit``) from a local cache.

A SWE-bench row names its repository and commit, not its files. The cache is a directory with
one entry per repository, named as SWE-bench names instances (``owner__name``):

- ``<cache>/owner__name/<commit>.tar.gz`` (or ``.tar``): the tree at that commit, one tarball
  per commit (``git archive --format=tar.gz <commit>``); looked up first;
- ``<cache>/owner__name``: a git checkout or bare clone holding the commit; its tree at the
  commit is read with ``git archive`` (the checkout's working tree is never used).

A row's snapshot then is the tarball's path, or ``git+<dir>@<commit>`` for a clone, which
``read_git`` reads. What is not found is a ``RepoCacheError`` naming the repository, the commit
and the places looked at.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

GIT_PREFIX = "git+"
GIT_TIMEOUT_S = 120


class RepoCacheError(ValueError):
    """The repository at the commit is not in the cache."""


def cache_name(repo: str) -> str:
    """``owner/name`` as SWE-bench spells it in instance ids: ``owner__name``."""
    return repo.replace("/", "__")


def resolve(repo: str, commit: str, cache: Path) -> str:
    """The snapshot of ``repo`` at ``commit``: a tarball path or a ``git+<dir>@<commit>`` ref."""
    if not cache.is_dir():
        raise RepoCacheError(f"repository cache {str(cache)!r} is not a directory")
    entry = cache / cache_name(repo)
    for suffix in (".tar.gz", ".tgz", ".tar"):
        if (entry / f"{commit}{suffix}").is_file():
            return str((entry / f"{commit}{suffix}").resolve())
    if not entry.is_dir():
        raise RepoCacheError(f"repository {repo!r} is not in the cache ({entry} does not exist)")
    if not _has_commit(entry, commit):
        raise RepoCacheError(
            f"commit {commit} of {repo!r} is in the cache neither as {entry}/{commit}.tar.gz "
            f"nor in a git repository at {entry}"
        )
    return f"{GIT_PREFIX}{entry.resolve()}@{commit}"


def _git(repo_dir: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    # safe.directory: a cache written by another user (a volume) is still readable
    return subprocess.run(
        ["git", "-c", f"safe.directory={repo_dir}", "-C", str(repo_dir), *args],
        capture_output=True,
        timeout=GIT_TIMEOUT_S,
        check=False,
    )


def _has_commit(repo_dir: Path, commit: str) -> bool:
    try:
        done = _git(repo_dir, "cat-file", "-e", f"{commit}^{{commit}}")
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def is_git_ref(snapshot: str) -> bool:
    return snapshot.startswith(GIT_PREFIX)


def read_git(snapshot: str) -> dict[str, bytes]:
    """The files of a ``git+<dir>@<commit>`` snapshot (regular files only, no links)."""
    repo_dir, _, commit = snapshot.removeprefix(GIT_PREFIX).rpartition("@")
    done = _git(Path(repo_dir), "archive", "--format=tar", commit)
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip().splitlines()
        raise RepoCacheError(f"git archive {commit} in {repo_dir}: {err[-1] if err else '?'}")
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        return {
            m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile() and not m.name.startswith("/") and ".." not in Path(m.name).parts
        }
