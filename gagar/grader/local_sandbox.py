"""``UnsafeLocalSandbox``: runs grader tool commands with ``subprocess`` in the workspace.

**NOT ISOLATED.** Commands run as the current user with full access to the host's files and
network. It exists for deterministic tests of the agentic grader and for development only; the
real grader runs its tools in a ``gagar.sandbox`` session (bubblewrap or a sandbox pod), plugged
in through ``gagar.grader.protocol.GraderSandbox``. What it does guard: paths given to
``read_file`` and ``cwd`` must stay inside the workspace (symlinks resolved), commands are argv
lists (no shell unless asked), the whole process group is killed on timeout, output is capped.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from gagar.grader.protocol import ExecOutcome

OUTPUT_CAP = 256 * 1024
READ_CAP = 1024 * 1024


class UnsafeLocalSandbox:
    """A non-isolated ``GraderSandbox`` over a workspace directory (tests and development only)."""

    def __init__(self, root: Path, output_cap: int = OUTPUT_CAP) -> None:
        self.root = Path(root).resolve()
        self.output_cap = output_cap

    def _inside(self, rel: str) -> Path:
        path = (self.root / rel).resolve()
        if path != self.root and self.root not in path.parents:
            raise ValueError(f"path leaves the workspace: {rel!r}")
        return path

    def exec(self, cmd: Sequence[str], timeout: float, cwd: str = ".") -> ExecOutcome:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root)}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        proc = subprocess.Popen(
            list(cmd),
            cwd=self._inside(cwd),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, _ = proc.communicate()
            timed_out = True
        text = out.decode("utf-8", "replace")
        truncated = len(text) > self.output_cap
        code = None if timed_out or proc.returncode < 0 else proc.returncode
        return ExecOutcome(code, text[: self.output_cap], timed_out, truncated)

    def read_file(self, path: str) -> str:
        target = self._inside(path)
        if not target.is_file():
            raise FileNotFoundError(f"no such file in the workspace: {path}")
        with target.open("rb") as fh:
            return fh.read(READ_CAP).decode("utf-8", "replace")

    def close(self) -> None:
        """Nothing to release: the caller owns the workspace directory."""


def unsafe_local_factory(root: Path, environment: str | None = None) -> UnsafeLocalSandbox:
    """No jail and no environments: a test's stand-in for the sandbox."""
    if environment is not None:
        raise ValueError(f"the unsafe local sandbox has no environment {environment!r}")
    return UnsafeLocalSandbox(root)
