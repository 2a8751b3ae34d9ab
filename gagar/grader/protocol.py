"""What the graders need from the outside world, as Protocols, plus the heuristic grader's shell.

``gagar.grader`` must not import ``gagar.rollout`` and is written before ``gagar.sandbox``, so the
sandbox is reached through ``GraderSandbox``: the agentic grader asks a ``SandboxFactory`` for a
session over the shared workspace directory and only ever calls ``exec``, ``read_file`` and
``close``. The real bubblewrap / sandbox-pod session plugs in with a small adapter; the
``UnsafeLocalSandbox`` in ``local_sandbox`` is a non-isolated stand-in for deterministic tests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from gagar.grader.heuristic import HeuristicConfig, rank
from gagar.wire import FallbackReason, GradingGroup, Ranking, Usage


@dataclass(frozen=True)
class ExecOutcome:
    """Result of one command in a grader sandbox (stdout and stderr interleaved in ``output``)."""

    exit_code: int | None  # None when killed (timeout, limit)
    output: str
    timed_out: bool = False
    truncated: bool = False


@runtime_checkable
class GraderSandbox(Protocol):
    """A session whose working directory is the shared workspace (paths are relative to it)."""

    def exec(self, cmd: Sequence[str], timeout: float, cwd: str = ".") -> ExecOutcome:
        """Run ``cmd`` (argv, no shell unless the argv is one) in ``cwd`` under the workspace."""
        ...

    def read_file(self, path: str) -> str:
        """Text of a workspace file; raises ``FileNotFoundError``/``ValueError`` for bad paths."""
        ...

    def close(self) -> None: ...


class SandboxFactory(Protocol):
    """Opens a session over a workspace directory that ``write_workspace`` has laid out, in the
    task environment its tests need (``GradingGroup.environment``; None: the executor's own
    Python), so the grader's ``run_tests`` runs them as verification does."""

    def __call__(self, root: Path, environment: str | None = None) -> GraderSandbox: ...


class Grader(Protocol):
    """One protocol for both graders: a group in, a ranking out; never raises for bad output."""

    async def grade(self, group: GradingGroup) -> Ranking: ...


class HeuristicGrader:
    """The pure heuristic ranking, timed (the service runs it in a worker thread)."""

    def __init__(self, config: HeuristicConfig | None = None) -> None:
        self.config = config or HeuristicConfig()

    def grade_sync(self, group: GradingGroup) -> Ranking:
        start = time.perf_counter()
        ranking = rank(group, self.config)
        return ranking.model_copy(update={"latency_seconds": time.perf_counter() - start})

    async def grade(self, group: GradingGroup) -> Ranking:
        return await asyncio.to_thread(self.grade_sync, group)  # keep the event loop responsive


def unusable(reason: FallbackReason, detail: str, usage: Usage, latency: float) -> Ranking:
    """The ranking that tells the trainer to skip redistribution for this group (plain GRPO)."""
    return Ranking(
        grader="none", fallback=reason, detail=detail, usage=usage, latency_seconds=latency
    )
