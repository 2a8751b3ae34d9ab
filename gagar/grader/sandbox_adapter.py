"""Adapter from a ``gagar.sandbox`` session factory to the grader's ``SandboxFactory``.

``gagar.sandbox`` sessions are created from a files mapping (the workspace is copied into the
jail), run commands at the workspace root and return an ``ExecResult`` (exit code, stdout,
stderr, timed out, truncated, infra error); ``read_file`` returns bytes. This module reaches them
by duck typing, so ``gagar.grader`` does not depend on the sandbox package at import time:

    from gagar.sandbox.local import LocalFactory
    from gagar.sandbox.types import SandboxError
    grader = AgenticGrader(config, adapt_factory(LocalFactory(), refused=(SandboxError,)))

An ``infra_error`` becomes an exception (the agentic grader then falls back with
``grader_error``); a refused request (bad path, missing file) becomes ``ValueError``, which the
grader's tools turn into an error observation for the model.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gagar.grader.protocol import ExecOutcome, SandboxFactory
from gagar.grader.workspace import SKIP_DIRS


class SandboxInfrastructureError(RuntimeError):
    """The sandbox failed to run a grader tool (not the candidate's code failing)."""


def _workspace_bytes(root: Path) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and not path.is_symlink() and not SKIP_DIRS & set(rel.parts):
            files[rel.as_posix()] = path.read_bytes()
    return files


class SessionAdapter:
    """A ``GraderSandbox`` over one ``gagar.sandbox`` session."""

    def __init__(self, session: Any, refused: tuple[type[BaseException], ...] = ()) -> None:
        self.session = session
        self.refused = refused

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


def adapt_factory(factory: Any, refused: tuple[type[BaseException], ...] = ()) -> SandboxFactory:
    """A grader ``SandboxFactory`` that copies the workspace into a new session of ``factory``."""

    def open_session(root: Path) -> SessionAdapter:
        return SessionAdapter(factory.create(files=_workspace_bytes(Path(root))), refused)

    return open_session
