"""Apply a unified diff (``git diff`` or ``diff -u`` output) to a files mapping, strictly.

Used for a task's ``test_patch`` (SWE-bench's diff of the tests that decide the task): every hunk
must match its context exactly where its header says (no fuzz, no offset), so a patch written for
another version of the repository fails with the file and hunk named instead of producing wrong
tests. Files may be modified or created; deleting or renaming is refused (the tests of a task are
files to write, ``Task.test_files``).
"""

from __future__ import annotations

import re

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_NO_NEWLINE = "\\ No newline at end of file"


class PatchError(ValueError):
    """The patch is malformed or does not apply; the message names the file and hunk."""


def _path(header: str, prefix: str) -> str | None:
    name = header[4:].split("\t")[0].strip()
    if name == "/dev/null":
        return None
    return name[len(prefix) :] if name.startswith(prefix) else name


def apply_patch(files: dict[str, str], patch: str) -> dict[str, str]:
    """The files ``patch`` changes or creates, with their new text (the rest is left out)."""
    lines = patch.splitlines(keepends=True)
    out: dict[str, str] = {}
    i = 0
    while i < len(lines):
        if not lines[i].startswith("--- "):
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
            raise PatchError(f"line {i + 1}: '---' without '+++'")
        old, new = _path(lines[i], "a/"), _path(lines[i + 1], "b/")
        if new is None:
            raise PatchError(f"{old}: deleting files is not supported")
        if old is not None and old != new:
            raise PatchError(f"{old} -> {new}: renaming files is not supported")
        if old is not None and new not in files and new not in out:
            raise PatchError(f"{new}: the patch changes a file the repository does not have")
        base = out.get(new, files.get(new, "") if old is not None else "")
        text, i = _apply_file(new, base, lines, i + 2)
        out[new] = text
    if not out:
        raise PatchError("no file changes found (expected '--- a/...' and '+++ b/...' headers)")
    return out


def _apply_file(path: str, base: str, lines: list[str], i: int) -> tuple[str, int]:
    src = base.splitlines(keepends=True)
    result: list[str] = []
    pos = 0  # next line of src not yet copied
    while i < len(lines) and lines[i].startswith("@@"):
        m = _HUNK.match(lines[i])
        if not m:
            raise PatchError(f"{path}: malformed hunk header {lines[i].strip()!r}")
        old_n, new_n = int(m.group(2) or 1), int(m.group(4) or 1)
        start = int(m.group(1)) - (1 if old_n else 0)
        old, new, i = _hunk(f"{path}: hunk {m.group(0)}", lines, i + 1, old_n, new_n)
        if start < pos or src[start : start + len(old)] != old:
            raise PatchError(f"{path}: hunk {m.group(0)} does not apply (its context differs)")
        result += src[pos:start] + new
        pos = start + len(old)
    return "".join(result + src[pos:]), i


def _hunk(
    where: str, lines: list[str], i: int, old_n: int, new_n: int
) -> tuple[list[str], list[str], int]:
    """The old and new lines of one hunk starting at ``lines[i]``, and the line after it."""
    old: list[str] = []
    new: list[str] = []
    last: str | None = None
    while i < len(lines) and (len(old) < old_n or len(new) < new_n or lines[i].startswith("\\")):
        line = lines[i]
        if line.startswith("\\"):
            if line.strip() != _NO_NEWLINE or last is None:
                raise PatchError(f"{where}: unexpected line {line.strip()!r}")
            for side in (old, new):  # the line before had no newline on its side(s)
                if side and side[-1] is last:
                    side[-1] = last.removesuffix("\n")
        elif line[:1] in (" ", "-", "+", "\n"):
            last = line[1:] if len(line) > 1 and line.endswith("\n") else line[1:] + "\n"
            if line[:1] != "+":
                old.append(last)
            if line[:1] != "-":
                new.append(last)
        else:
            raise PatchError(f"{where} ends early at {line.strip()!r}")
        i += 1
    if (len(old), len(new)) != (old_n, new_n):
        raise PatchError(f"{where} is cut short")
    return old, new, i
