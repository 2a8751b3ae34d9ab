"""Pure per-file diffs between a base repository and a candidate's final repository.

Graders compare *files*, not the candidate's own patch text: the patch is what the agent says it
changed, the files are what it changed. Both graders and the workspace use these helpers.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Literal

from gagar.gitpath import file_line

FileStatus = Literal["added", "removed", "modified"]


@dataclass(frozen=True)
class FileDiff:
    """How one file changed: added lines with their new line numbers, removed count, hunks."""

    path: str
    status: FileStatus
    added: list[tuple[int, str]] = field(default_factory=list)  # (1-based line in final, text)
    removed: list[tuple[int, str]] = field(default_factory=list)  # (1-based line in base, text)
    hunks: int = 0

    @property
    def changed_lines(self) -> int:
        return len(self.added) + len(self.removed)

    def first_line(self) -> int:
        """Line to point evidence at: the first added line, else the first removed one."""
        if self.added:
            return self.added[0][0]
        return self.removed[0][0] if self.removed else 1


def _lines(text: str) -> list[str]:
    return text.splitlines()


def diff_file(path: str, old: str | None, new: str | None) -> FileDiff | None:
    """Diff one file; None when unchanged. ``None`` text means the file does not exist."""
    if old == new:
        return None
    status: FileStatus = "added" if old is None else "removed" if new is None else "modified"
    a, b = _lines(old or ""), _lines(new or "")
    added: list[tuple[int, str]] = []
    removed: list[tuple[int, str]] = []
    hunks = 0
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        hunks += 1
        removed += [(i + 1, a[i]) for i in range(i1, i2)]
        added += [(j + 1, b[j]) for j in range(j1, j2)]
    return FileDiff(path, status, added, removed, max(hunks, 1))


def diff_repos(base: dict[str, str], final: dict[str, str]) -> list[FileDiff]:
    """All changed files, sorted by path (deterministic)."""
    out = []
    for path in sorted(set(base) | set(final)):
        d = diff_file(path, base.get(path), final.get(path))
        if d is not None:
            out.append(d)
    return out


def unified_patch(base: dict[str, str], final: dict[str, str]) -> str:
    """A ``git diff``-style unified patch (a/ and b/ prefixes) of final against base."""
    chunks: list[str] = []
    for path in sorted(set(base) | set(final)):
        old, new = base.get(path), final.get(path)
        if old == new:
            continue
        chunks += difflib.unified_diff(
            (old or "").splitlines(keepends=True),
            (new or "").splitlines(keepends=True),
            fromfile=file_line("a/", None if old is None else path),  # quoted as git does
            tofile=file_line("b/", None if new is None else path),
        )
        if chunks and not chunks[-1].endswith("\n"):
            chunks.append("\n\\ No newline at end of file\n")
    return "".join(chunks)
