"""Wire types shared by rollout, grader and trainer (they meet here and in ``spec``, never directly).

These are the objects that cross component and process boundaries (HTTP between trainer and grader
pools, JSON on disk in run directories), so they are pydantic models with ``extra="forbid"``:
malformed input is rejected where it enters, with the field path in the message.
"""

from __future__ import annotations

import posixpath
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

# The files of an HF model folder that travel with its weights (what vLLM and transformers need
# beside them): the trainer writes them with each checkpoint, the rollout side with each version.
HF_SIDE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)

Tier = Literal["T1", "T2", "T3"]
GraderKind = Literal["agentic", "heuristic", "none"]
FallbackReason = Literal["unusable_ranking", "timeout", "grader_error", "nonpositive_mass"]
SkipReason = Literal[
    "unsafe_path",
    "unreadable",
    "not_text",
    "file_too_large",
    "total_too_large",
    "too_many_files",
    "not_parsed",
]


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


class Skipped(_Wire):
    """A file of a repository a grader left out or did not read whole (``gagar.grader.bounds``)."""

    member: int | None = Field(default=None, ge=0, description="Candidate; None: the base.")
    path: str = Field(description="The file's name as found (escaped, cut to 300 characters).")
    reason: SkipReason
    detail: str = ""


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
    detail: str = Field(default="", description="Why the fallback happened, for logs and metrics.")
    skipped: list[Skipped] = Field(
        default_factory=list, description="Files left out of grading or not read whole, and why."
    )

    @model_validator(mode="after")
    def _no_duplicates(self) -> Ranking:
        seen: list[int] = [m for g in self.tied_groups for m in g.members]
        seen += [h.member for h in self.hacks]
        if len(seen) != len(set(seen)):
            raise ValueError(f"a candidate appears more than once in the ranking: {sorted(seen)}")
        return self

    def below_t1(self, member: int) -> bool | None:
        """Whether ``member`` is bloated: a confirmed hack, or in a tied group below T1; None when
        the ranking does not place it."""
        if any(h.member == member for h in self.hacks):
            return True
        tiers = [g.tier for g in self.tied_groups if member in g.members]
        return tiers[0] != "T1" if tiers else None

    def check_complete(self, passes: list[int]) -> str | None:
        """Return why the ranking is unusable for these passing members, or None if usable."""
        ranked = sorted(
            [m for g in self.tied_groups for m in g.members] + [h.member for h in self.hacks]
        )
        if ranked != sorted(passes):
            return f"ranking covers {ranked} but the passes are {sorted(passes)}"
        return None


# ---------------------------------------------------------------- grading input (rollout → grader)


def check_relative_path(path: str) -> str:
    """Reject paths that could leave a workspace when written to disk (absolute, ``..``, empty)."""
    norm = posixpath.normpath(path)
    if not path or path.startswith("/") or norm == "." or norm.startswith("..") or "\\" in path:
        raise ValueError(f"not a safe relative path: {path!r}")
    if norm != path:
        raise ValueError(f"path is not normalized: {path!r} (expected {norm!r})")
    return path


def _safe_paths(files: dict[str, str]) -> dict[str, str]:
    for path in files:
        check_relative_path(path)
    return files


RepoFiles = Annotated[dict[str, str], AfterValidator(_safe_paths)]
"""A repository as relative path -> text; every path checked by ``check_relative_path``."""


class Action(_Wire):
    """One tool call of a trajectory and what the environment answered."""

    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    observation: str = ""
    error: bool = Field(default=False, description="The call was malformed or the tool failed.")


class ToolStats(_Wire):
    """Behaviour counts of a trajectory (rollout computes them; the heuristic can recompute)."""

    actions: int = Field(default=0, ge=0)
    redundant: int = Field(
        default=0, ge=0, description="Identical calls repeated with no state change."
    )
    errors: int = Field(default=0, ge=0, description="Tool or format errors.")
    churn: int = Field(default=0, ge=0, description="Edits later reverted or overwritten.")


class Candidate(_Wire):
    """One member of a group as the grader sees it: final repository, patch, trajectory, test log."""

    member: int = Field(ge=0, description="Index within the group.")
    passed: bool = Field(description="Hidden tests passed against pristine test files.")
    valid: bool = Field(default=True, description="False after an infrastructure failure.")
    files: RepoFiles = Field(description="Final repository: relative path -> text.")
    patch: str = Field(
        default="", description="Unified diff of the final repository against the base."
    )
    trajectory: list[Action] = Field(default_factory=list)
    test_log: str = Field(default="", description="The hidden tests' output: the candidate's text.")
    notes: list[str] = Field(
        default_factory=list,
        description="gagar's own notes on the verification (tampering found, files not carried "
        "over), kept apart from the test output the candidate's code wrote.",
    )
    stats: ToolStats | None = Field(default=None, description="None: derive from the trajectory.")


class GradingGroup(_Wire):
    """Everything a grader needs about one eligible group; members are ``0..n-1`` in order."""

    task_id: str = Field(min_length=1)
    statement: str = Field(description="The task statement the agent was given.")
    base_files: RepoFiles = Field(description="Base repository: relative path -> text.")
    candidates: list[Candidate] = Field(min_length=1)
    relevant_files: list[str] = Field(
        default_factory=list,
        description="Files the failing tests exercise (or the reference fix touches); empty: infer.",
    )
    protected_files: list[str] = Field(
        default_factory=list, description="Harness files beyond the usual test patterns."
    )
    test_command: str = Field(default="python -m pytest -q", description="Run inside a candidate.")
    environment: str | None = Field(
        default=None, description="Task environment the tests need; None: the sandbox's Python."
    )
    skipped: list[Skipped] = Field(
        default_factory=list,
        description="Files left out of base_files/candidates' files when the group was built.",
    )

    @model_validator(mode="after")
    def _members_in_order(self) -> GradingGroup:
        members = [c.member for c in self.candidates]
        if members != list(range(len(members))):
            raise ValueError(f"candidate members must be 0..n-1 in order, got {members}")
        return self

    def passes(self) -> list[int]:
        """Members that must appear exactly once in a usable ranking (valid passes)."""
        return [c.member for c in self.candidates if c.valid and c.passed]
