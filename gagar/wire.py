"""Wire types shared by rollout, grader and trainer (they meet here and in ``spec``, never directly).

These are the objects that cross component and process boundaries (HTTP between trainer and grader
pools, JSON on disk in run directories), so they are pydantic models with ``extra="forbid"``:
malformed input is rejected where it enters, with the field path in the message.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Tier = Literal["T1", "T2", "T3"]
GraderKind = Literal["agentic", "heuristic", "none"]
FallbackReason = Literal["unusable_ranking", "timeout", "grader_error", "nonpositive_mass"]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Finding(_Wire):
    """One piece of evidence about a candidate: where and why."""

    member: int = Field(ge=0, description="Index of the candidate within its group.")
    kind: str = Field(description="Short machine-readable category, e.g. 'out_of_scope_edit'.")
    reason: str = Field(description="Human-readable explanation.")
    file: str | None = Field(default=None, description="File the finding refers to, if any.")
    line: int | None = Field(default=None, ge=0, description="Line number in that file, if any.")


class TiedGroup(_Wire):
    """A set of passing candidates the grader considers equally good, with its tier."""

    tier: Tier
    members: list[int] = Field(min_length=1)


class Hack(_Wire):
    """A pass the grader confirms as a hack (leaked answer, tampered tests, test detection, ...)."""

    member: int = Field(ge=0)
    evidence: list[Finding] = Field(min_length=1)


class Usage(_Wire):
    """Token usage of an LLM-backed grader (zero for the heuristic grader)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0


class Ranking(_Wire):
    """The grader's verdict on one group: ordered tied groups of passes, confirmed hacks, findings.

    ``tied_groups`` is ordered best first. Every valid pass must appear exactly once across
    ``tied_groups`` and ``hacks`` for the ranking to be usable (``check_complete``).
    """

    tied_groups: list[TiedGroup] = Field(default_factory=list)
    hacks: list[Hack] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    grader: GraderKind = Field(description="Which grader produced this ranking.")
    latency_seconds: float = Field(default=0.0, ge=0)
    usage: Usage = Field(default_factory=Usage)
    fallback: FallbackReason | None = Field(
        default=None, description="Set when this ranking is a fallback, with the reason."
    )

    @model_validator(mode="after")
    def _no_duplicates(self) -> Ranking:
        seen: list[int] = [m for g in self.tied_groups for m in g.members]
        seen += [h.member for h in self.hacks]
        if len(seen) != len(set(seen)):
            raise ValueError(f"a candidate appears more than once in the ranking: {sorted(seen)}")
        return self

    def check_complete(self, passes: list[int]) -> str | None:
        """Return why the ranking is unusable for these passing members, or None if usable."""
        ranked = sorted(
            [m for g in self.tied_groups for m in g.members] + [h.member for h in self.hacks]
        )
        if ranked != sorted(passes):
            return f"ranking covers {ranked} but the passes are {sorted(passes)}"
        return None
