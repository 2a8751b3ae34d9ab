"""Grading episodes: each graded group as one JSONL record, the data the grader's SFT reads.

A record holds where the group was graded (step, task), the workspace index the grader opened
with (its ``README.md``), the grader's messages and tools (tool calls and observations are in the
messages), its ranking and, where it fell back, why; and, from the trainer (``held_back``), what
each pass scored on its task's held-back tests, which neither the reward nor the grader ran or
saw (``{"<member>": passed}``; null for a task that holds none back). The agentic grader hands its transcript to
whoever is ``capture``-ing in the calling context (a ``ContextVar``: ``asyncio.wait_for`` and
``gather`` run the grading in a task that inherits it, so concurrent groups never mix); the
caller writes the record. A grader in another process (the grader service behind
``GraderClient``) reports no transcript here: its record has the ranking alone
(``messages: null``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gagar.wire import GradingGroup, Ranking

EPISODES_FILE = "grading_episodes.jsonl"


@dataclass(frozen=True)
class Transcript:
    """What the agentic grader saw and said for one group."""

    index: str  # the workspace's README.md
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]


_SINK: ContextVar[list[Transcript] | None] = ContextVar("gagar_grader_transcripts", default=None)


@contextmanager
def capture() -> Iterator[list[Transcript]]:
    """Collect the transcripts of the gradings run in this context (and tasks it starts)."""
    sink: list[Transcript] = []
    token = _SINK.set(sink)
    try:
        yield sink
    finally:
        _SINK.reset(token)


def report(transcript: Transcript) -> None:
    """Hand a transcript to the capturing caller, if any (a no-op otherwise)."""
    sink = _SINK.get()
    if sink is not None:
        sink.append(transcript)


def record(
    group: GradingGroup, ranking: Ranking, transcripts: list[Transcript], **where: Any
) -> dict[str, Any]:
    """One episode as a JSON-ready dict (the last transcript: a retried grading's final try)."""
    t = transcripts[-1] if transcripts else None
    return {
        **where,
        "task_id": group.task_id,
        "members": len(group.candidates),
        "passes": group.passes(),
        "grader": ranking.grader,
        "fallback": ranking.fallback,
        "detail": ranking.detail,
        "workspace_index": t.index if t else None,
        "messages": t.messages if t else None,
        "tools": t.tools if t else None,
        "ranking": ranking.model_dump(mode="json", exclude={"skipped"}),
    }


def append(path: Path, episode: dict[str, Any]) -> None:
    """Append one record to a JSONL file (folders made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(episode) + "\n")
