"""How much of a candidate's repository the host reads and analyses, and what it leaves out.

A candidate's files are written by the policy, so the host side of grading treats them as hostile:
any number of files, of any size, with any name. Everything that brings candidate content into the
host (the driver building a ``GradingGroup``, ``load_workspace``, the sandbox adapter) and the
heuristic grader itself passes it through ``admit``, which keeps at most

- ``files`` files per repository (the base's paths first, so a flood of new files cannot push
  an edited test file out of sight),
- ``file_bytes`` bytes of one file and ``total_bytes`` of one repository: a file past either is
  kept as a one-line *marker* naming its size and SHA-256 instead of its text, so a diff still sees
  that it changed (a test file grown past the limit is still an edited test file), and two equal
  files still compare equal,

and drops names ``check_relative_path`` refuses. A file that is not UTF-8 text is kept as a marker too,
naming what its bytes are where they would import (``sniff``: bytecode, a native object, a zip
archive): a grader must see that a candidate added a binary, never lose it. ``ast`` parses
at most ``parse_file_bytes`` of one file, ``base_parse_bytes`` of the base and ``parse_bytes`` of
what each candidate changed or added (``ParseBudget``; files equal to the base's are analysed once,
on the base's budget): a parse tree costs up to ~500 bytes of memory and ~20 µs of analysis per
byte of source, so these bound both the memory (one tree at a time) and the time a group takes. Nothing is left out silently:
each repository's omissions are ``Skipped`` entries (at most ``reported`` of them, the rest counted
in the last), which reach ``GradingGroup.skipped`` and the ``Ranking``.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

from gagar.wire import Skipped, SkipReason, check_relative_path

MARKER_PREFIX = "<gagar: not graded:"
HASH_BYTES = 64 << 20  # a marker's digest covers this much of the file (with its size)


@dataclass(frozen=True)
class Oversize:
    """What a reader returns instead of a file past ``file_bytes``: its size and digest."""

    size: int
    digest: str


@dataclass(frozen=True)
class Bounds:
    """Per repository (the base, or one candidate); see the module docstring."""

    files: int = 5_000
    file_bytes: int = 1 << 20
    total_bytes: int = 32 << 20
    parse_file_bytes: int = 256 << 10
    parse_bytes: int = 512 << 10  # a candidate's files that differ from the base
    base_parse_bytes: int = 16 << 20  # the task's own repository
    reported: int = 50


BOUNDS = Bounds()


def text_bytes(text: str) -> int:
    """UTF-8 size of ``text`` (no copy for ASCII, the common case)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def shown_path(path: str) -> str:
    """A name fit for a report: any string (lone surrogates escaped), at most 300 characters."""
    return path.encode("utf-8", "backslashreplace").decode("utf-8")[:300]


def digest(data: str | bytes) -> str:
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    return hashlib.sha256(raw[:HASH_BYTES]).hexdigest()


def marker(data: str | bytes | Oversize, size: int, why: str) -> str:
    """The text that stands for a file the host does not keep (equal for equal contents)."""
    sha = data.digest if isinstance(data, Oversize) else digest(data)
    return f"{MARKER_PREFIX} {size} bytes, sha256 {sha}; {why}>\n"


def _safe(path: str) -> str | None:
    """Why ``path`` may not enter a repository, or None."""
    try:
        path.encode("utf-8")
        check_relative_path(path)
    except (UnicodeEncodeError, ValueError) as err:
        return str(err)[:200] if isinstance(err, ValueError) else "the name is not UTF-8"
    return None


def _size(data: str | bytes | Oversize) -> int:
    if isinstance(data, Oversize):
        return data.size
    return len(data) if isinstance(data, bytes) else text_bytes(data)


PYC_MAGIC = importlib.util.MAGIC_NUMBER
NATIVE = (b"\x7fELF", b"MZ", b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe", b"\xca\xfe\xba\xbe")


def sniff(data: bytes) -> str:
    """What binary ``data`` is, where the import system could load it (``gagar.grader.screen``
    reads these words off the marker), else ``"binary"``."""
    if data[:2] == PYC_MAGIC[:2] and data[2:4] == b"\r\n":
        return "compiled Python bytecode"
    if data.startswith(NATIVE):
        return "a native object"
    if data.startswith(b"PK\x03\x04") or b"PK\x05\x06" in data[-(1 << 16) - 22 :]:
        return "a zip archive"
    return "binary"


def _text(data: str | bytes) -> str | None:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


@dataclass
class _Admission:
    member: int | None
    bounds: Bounds
    files: dict[str, str] = field(default_factory=dict)
    skipped: list[Skipped] = field(default_factory=list)
    total: int = 0

    def skip(self, path: str, reason: SkipReason, detail: str) -> None:
        self.skipped.append(
            Skipped(member=self.member, path=shown_path(path), reason=reason, detail=detail)
        )

    def room(self, path: str) -> bool:
        """Whether ``path`` may be read at all (a safe name, under the file count)."""
        why = _safe(path)
        if why is not None:
            self.skip(path, "unsafe_path", why)
        elif len(self.files) >= self.bounds.files:
            self.skip(path, "too_many_files", f"past {self.bounds.files} files")
        return why is None and len(self.files) < self.bounds.files

    def add(self, path: str, data: str | bytes | Oversize) -> None:
        """Keep ``data`` as ``path``'s text, as a marker, or not at all (``room`` said yes)."""
        size = _size(data)
        if size > self.bounds.file_bytes:
            why = f"past {self.bounds.file_bytes} bytes per file"
            self.files[path] = marker(data, size, why)
            return self.skip(path, "file_too_large", f"{size} bytes, {why}")
        if self.total + size > self.bounds.total_bytes:
            why = f"past {self.bounds.total_bytes} bytes per repository"
            self.files[path] = marker(data, size, why)
            return self.skip(path, "total_too_large", f"{size} bytes, {why}")
        text = _text(data) if not isinstance(data, Oversize) else None
        if text is None:
            why = f"not UTF-8 text: {sniff(data) if isinstance(data, bytes) else 'binary'}"
            self.files[path] = marker(data, size, why)
            return self.skip(path, "not_text", f"{size} bytes, {why}")
        self.files[path] = text
        self.total += size
        return None


def _order(paths: Iterable[str], prefer: Collection[str]) -> list[str]:
    return sorted(paths, key=lambda p: (p not in prefer, p))


def admit(
    files: Mapping[str, str | bytes],
    member: int | None = None,
    prefer: Collection[str] = (),
    bounds: Bounds = BOUNDS,
) -> tuple[dict[str, str], list[Skipped]]:
    """``files`` within ``bounds`` (paths in ``prefer`` first), and what was left out or replaced
    by a marker. ``member`` None: the base repository. Idempotent on its own output."""
    return admit_read(files, files.__getitem__, member, prefer, bounds)


def admit_read(
    paths: Iterable[str],
    read: Callable[[str], str | bytes | Oversize],
    member: int | None = None,
    prefer: Collection[str] = (),
    bounds: Bounds = BOUNDS,
    reraise: tuple[type[Exception], ...] = (),
) -> tuple[dict[str, str], list[Skipped]]:
    """``admit`` for files read one at a time by ``read`` (e.g. from a sandbox session): a name
    refused or past the file count is never read, a large file is dropped for its marker as soon
    as it is read, and a file ``read`` cannot read (``OSError``, ``ValueError`` and their kin: a
    link, a FIFO) is skipped as ``unreadable``, except the ``reraise`` errors (the reader's own
    failure, not the file's)."""
    adm = _Admission(member, bounds)
    for path in _order(paths, prefer):
        if not adm.room(path):
            continue
        try:
            data = read(path)
        except reraise:
            raise
        except Exception as err:  # what a hostile file does to a reader is not ours to list
            adm.skip(path, "unreadable", f"{type(err).__name__}: {err}"[:200])
            continue
        adm.add(path, data)
    return adm.files, cap(adm.skipped, bounds.reported)


def cap(skipped: list[Skipped], reported: int) -> list[Skipped]:
    """At most ``reported`` entries; the last one counts the ones left out."""
    if len(skipped) <= reported:
        return skipped
    last = skipped[reported - 1]
    more = f"{last.detail}; and {len(skipped) - reported} more skipped files not listed"
    return [*skipped[: reported - 1], last.model_copy(update={"detail": more})]


class ParseBudget:
    """The bytes of source one repository may still have parsed (see the module docstring)."""

    def __init__(self, member: int | None, bounds: Bounds = BOUNDS) -> None:
        self.member, self.bounds = member, bounds
        self.total = bounds.base_parse_bytes if member is None else bounds.parse_bytes
        self.left = self.total
        self.skipped: list[Skipped] = []
        self.refused: set[str] = set()  # paths not analysed as modules

    def allow(self, path: str, text: str) -> bool:
        """Charge ``text`` to the budget if it may be parsed; else record why not."""
        size = text_bytes(text)
        if size > self.bounds.parse_file_bytes:
            why = f"{size} bytes, past {self.bounds.parse_file_bytes} parsed per file"
        elif size > self.left:
            why = f"{size} bytes, past {self.total} parsed per repository"
        else:
            self.left -= size
            return True
        self.note(path, why)
        return False

    def note(self, path: str, why: str) -> None:
        """Record a file that was not analysed as a module (too large, or too deep to parse)."""
        if path in self.refused:
            return
        self.refused.add(path)
        self.skipped.append(
            Skipped(member=self.member, path=shown_path(path), reason="not_parsed", detail=why)
        )
