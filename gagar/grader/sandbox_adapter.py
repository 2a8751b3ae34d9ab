"""Adapter from a ``gagar.sandbox`` session factory to the grader's ``SandboxFactory``.

``gagar.sandbox`` sessions are created from a files mapping (the workspace is copied into the
jail), run commands at the workspace root and return an ``ExecResult`` (exit code, stdout,
stderr, timed out, truncated, infra error); ``read_file`` returns bytes. This module reaches them
by duck typing, so ``gagar.grader`` does not depend on the sandbox package at import time:

    from gagar.sandbox.local import LocalFactory
    from gagar.sandbox.types import SandboxError
    grader = AgenticGrader(config, adapt_factory(LocalFactory(), refused=(SandboxError,)))

The workspace is copied in within ``WORKSPACE_BOUNDS`` (the files of a whole group: base, every
candidate and the evidence), read as ``gagar.grader.workspace`` reads: links and special files are
left out, a file past the size bound is copied as its marker; what was left out is the adapter's
``skipped``, which the agentic grader adds to its ranking.

An ``infra_error`` becomes an exception (the agentic grader then falls back with
``grader_error``); a refused request (bad path, missing file) becomes ``ValueError``, which the
grader's tools turn into an error observation for the model.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gagar.grader.bounds import Bounds, Oversize, marker
from gagar.grader.protocol import ExecOutcome, SandboxFactory
from gagar.grader.workspace import read_bytes, walk
from gagar.wire import Skipped, SkipReason

WORKSPACE_BOUNDS = Bounds(files=100_000, file_bytes=8 << 20, total_bytes=1 << 30)


class SandboxInfrastructureError(RuntimeError):
    """The sandbox failed to run a grader tool (not the candidate's code failing)."""


def _workspace_bytes(
    root: Path, bounds: Bounds = WORKSPACE_BOUNDS
) -> tuple[dict[str, bytes], list[Skipped]]:
    """The workspace's files as bytes (binary ones too: tests may need them), within ``bounds``."""
    files: dict[str, bytes] = {}
    skipped: list[Skipped] = []
    total = 0
    for rel in walk(root, bounds.files):
        if len(files) >= bounds.files:
            skipped.append(Skipped(path=rel, reason="too_many_files", detail="walk stopped"))
            break
        try:
            data = read_bytes(root / rel, bounds.file_bytes)
        except OSError as err:
            skipped.append(Skipped(path=rel, reason="unreadable", detail=str(err)[:200]))
            continue
        size = data.size if isinstance(data, Oversize) else len(data)
        if isinstance(data, Oversize) or total + size > bounds.total_bytes:
            reason: SkipReason = (
                "file_too_large" if isinstance(data, Oversize) else "total_too_large"
            )
            skipped.append(Skipped(path=rel, reason=reason, detail=f"{size} bytes"))
            data = marker(data, size, reason.replace("_", " ")).encode()
        files[rel] = data
        total += min(size, len(data))
    return files, skipped


class SessionAdapter:
    """A ``GraderSandbox`` over one ``gagar.sandbox`` session."""

    def __init__(
        self,
        session: Any,
        refused: tuple[type[BaseException], ...] = (),
        skipped: list[Skipped] | None = None,
    ) -> None:
        self.session = session
        self.refused = refused
        self.skipped = skipped or []  # what the copy into the session left out

    def exec(self, cmd: Sequence[str], timeout: float, cwd: str = ".") -> ExecOutcome:
        argv = list(cmd)
        if cwd not in (".", ""):
            argv = ["/bin/sh", "-c", f'cd -- {shlex.quote(cwd)} && exec "$@"', "sh", *argv]
        try:
            res = self.session.exec(argv, timeout=timeout)
        except self.refused as err:
            raise ValueError(str(err)) from None
        if res.infra_error:
            raise SandboxInfrastructureError(res.infra_error)
        output = res.stdout + (res.stderr if res.stderr else "")
        return ExecOutcome(res.exit_code, output, bool(res.timed_out), bool(res.truncated))

    def read_file(self, path: str) -> str:
        try:
            data = self.session.read_file(path)
        except self.refused as err:
            raise ValueError(str(err)) from None
        return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)

    def close(self) -> None:
        self.session.close()


def sandbox_refusals() -> tuple[type[BaseException], ...]:
    """``gagar.sandbox``'s refusal (bad path, missing file, link), where that package is here."""
    try:
        from gagar.sandbox.types import SandboxError
    except ImportError:  # a grader-only install: the caller names its own refusals
        return ()
    return (SandboxError,)


def adapt_factory(
    factory: Any, refused: tuple[type[BaseException], ...] | None = None
) -> SandboxFactory:
    """A grader ``SandboxFactory`` that copies the workspace into a new session of ``factory``.
    ``refused``: what the session raises for a request it refuses (default: the sandbox's own
    ``SandboxError``), which a tool turns into an error the model can correct; without it, a
    model reading a missing file would end the grading with ``grader_error``."""
    refused = sandbox_refusals() if refused is None else refused

    def open_session(root: Path, environment: str | None = None) -> SessionAdapter:
        files, skipped = _workspace_bytes(Path(root))
        session = factory.create(files=files, environment=environment)
        return SessionAdapter(session, refused, skipped)

    return open_session
