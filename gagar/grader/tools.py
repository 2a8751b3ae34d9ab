"""The agentic grader's tools: read, list, grep, diff and run-tests, plus the ``submit_ranking``
schema and the check of a submission against it (``to_ranking``).

The shared workspace is evidence to read, never a place candidate code runs: ``list_files``,
``read_file``, ``grep`` and ``diff`` run fixed programs in one session over the workspace, and
``run_tests`` runs the task's test command in a *fresh* session holding only that candidate's files
(``Toolbox.fresh``), closed after the run. So one candidate's test code cannot rewrite another
candidate's tree (or the base, patches and logs) and have the grader read the rewritten file.

Tool arguments come from a model, so every path is checked (relative, inside the workspace, not
an option) and commands are argv lists; a bad argument becomes an error observation the model can
correct, never an exception out of the loop.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gagar.grader.protocol import ExecOutcome, GraderSandbox
from gagar.wire import (
    Finding,
    GradingGroup,
    Hack,
    Ranking,
    TiedGroup,
    Tier,
    check_relative_path,
)

Verdict = Literal["T1", "T2", "T3", "hack"]
REASON_CHARS = 300  # a placement's reason: evidence in a sentence, not an essay


class Placement(BaseModel):
    """One passing member's place in a submission: why, its tier (or ``hack``) and its rank.

    The fields' order is the order a server decoding under the schema writes them: the reason
    (the evidence) before the verdict, so a model states what it saw, then decides from it."""

    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=REASON_CHARS)
    tier: Verdict = Field(description="T1 clean, T2 noisy, T3 barely acceptable, or hack.")
    place: int = Field(ge=1, description="1 = best; members with the same place are tied.")


def member_key(member: int) -> str:
    """A submission's key for ``member``: its workspace folder's name."""
    return f"cand_{member}"


class ToolError(Exception):
    """A bad tool call; its message goes back to the model as the observation."""


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict:
    params = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": params},
    }


SUBMIT = "submit_ranking"
_PATH = {"type": "string", "description": "Path relative to the workspace root."}
# Caches that running tests leaves behind; hidden from list/grep/diff so they are not mistaken
# for a candidate's changes.
JUNK = ("__pycache__", ".pytest_cache", ".benchmarks", ".hypothesis", ".mypy_cache")


def submission_schema(passes: list[int] | None = None, members: int | None = None) -> dict:
    """``submit_ranking``'s parameters: one required key per passing member (``cand_N``) mapping
    to its ``Placement``, and no other key.

    So a submission that lists a member twice, or ranks a failing one, is not valid JSON of this
    schema: an object has each key once, and the keys are exactly the passes. vLLM decodes a
    named ``tool_choice`` (and strict tools under ``auto``) under this schema with its structured
    outputs backend, so even a small model's final call is complete by construction. The schema
    is in OpenAI's strict style (every property required, ``additionalProperties: false``), with
    places as an enum of ``1..len(passes)``; the placement is one ``$defs`` entry every key refers
    to (the chat template prints the tools into every prompt: one copy, not one a member). Without the group's passes (``members`` is not
    needed then, kept for the callers' signature), any ``cand_N`` key is allowed and
    ``to_ranking`` checks the keys.
    """
    del members  # the keys are the passes; the group's size adds nothing
    placement = Placement.model_json_schema()
    placement["additionalProperties"] = False
    for extra in ("title", "description"):  # the model's docstring is for readers, not the model
        placement.pop(extra, None)
    for field in placement["properties"].values():
        field.pop("title", None)
    if not passes:
        return {
            "type": "object",
            "description": "cand_N of every passing member -> its placement.",
            "propertyNames": {"pattern": "^cand_[0-9]+$"},
            "additionalProperties": placement,
            "minProperties": 1,
        }
    placement["properties"]["place"] = {
        "type": "integer",
        "enum": list(range(1, len(passes) + 1)),
        "description": placement["properties"]["place"]["description"],
    }
    keys = [member_key(m) for m in sorted(passes)]
    return {  # one placement schema, referred to by every key: the prompt shows it once
        "type": "object",
        "$defs": {"placement": placement},
        "properties": {key: {"$ref": "#/$defs/placement"} for key in keys},
        "required": keys,
        "additionalProperties": False,
    }


def to_ranking(payload: Any, passes: list[int]) -> Ranking:
    """Validate a submitted payload (``cand_N`` -> ``Placement`` for every pass, nothing else)
    into a complete agentic ranking, or raise ``ValueError`` saying what to correct.

    Members sharing a place and a tier form one tied group; groups go best place first (tier
    breaks a tie of places); a ``hack`` placement is a hack with its reason as evidence."""
    if not isinstance(payload, dict):
        raise ValueError("the ranking must be a JSON object: cand_N -> {place, tier, reason}")
    want = {member_key(m): m for m in passes}
    missing, unknown = sorted(want.keys() - payload.keys()), sorted(payload.keys() - want.keys())
    if missing or unknown:
        raise ValueError(
            f"incomplete ranking: missing {missing}, not passing members {unknown}; "
            f"give exactly the keys {sorted(want)}"
        )
    try:
        placed = {want[k]: Placement.model_validate(v) for k, v in payload.items()}
    except ValidationError as err:
        raise ValueError(f"the ranking does not match the schema: {err}") from None
    hacks = [
        Hack(member=m, evidence=[Finding(member=m, kind="hack", reason=p.reason)])
        for m, p in sorted(placed.items())
        if p.tier == "hack"
    ]
    tied: dict[tuple[int, str], list[int]] = {}
    for m, p in sorted(placed.items()):
        if p.tier != "hack":
            tied.setdefault((p.place, p.tier), []).append(m)
    groups = [
        TiedGroup(tier=cast(Tier, tier), members=ms) for (_, tier), ms in sorted(tied.items())
    ]
    return Ranking(tied_groups=groups, hacks=hacks, grader="agentic")


def tool_specs(
    passes: list[int] | None = None, members: int | None = None, answer_only: bool = False
) -> list[dict]:
    """OpenAI-style function tools; ``submit_ranking`` is strict (servers that support it decode
    its arguments under ``submission_schema``), the others are free-form. ``answer_only``: just
    ``submit_ranking``, for a grader with one turn (it answers from the workspace's index; tools
    it may not call would only lengthen every prompt)."""
    if answer_only:
        return [_submit_tool(passes, members)]
    return [
        _fn("list_files", "List files under a directory.", {"path": _PATH}, []),
        _fn(
            "read_file",
            "Read a text file with line numbers.",
            {"path": _PATH, "start_line": {"type": "integer"}, "end_line": {"type": "integer"}},
            ["path"],
        ),
        _fn(
            "grep",
            "Search files (extended regex).",
            {"pattern": {"type": "string"}, "path": _PATH},
            ["pattern"],
        ),
        _fn(
            "diff",
            "Unified recursive diff of two paths, e.g. base and cand_0.",
            {"a": _PATH, "b": _PATH},
            ["a", "b"],
        ),
        _fn(
            "run_tests",
            "Run the task's test command on member N's files (a fresh copy holding only them).",
            {"member": {"type": "integer"}},
            ["member"],
        ),
        _submit_tool(passes, members),
    ]


def _submit_tool(passes: list[int] | None, members: int | None) -> dict:
    return {
        "type": "function",
        "function": {
            "name": SUBMIT,
            "description": (
                "Submit the final ranking: for every passing member cand_N, its place "
                "(1 = best, equal places tie), tier (T1, T2, T3, or hack) and reason."
            ),
            "parameters": submission_schema(passes, members),
            "strict": True,
        },
    }


def _path(args: dict, key: str, default: str | None = None) -> str:
    value = args.get(key, default)
    if not isinstance(value, str):
        raise ToolError(f"argument {key!r} must be a string path")
    if value in (".", ""):
        return "."
    try:
        check_relative_path(value.rstrip("/"))
    except ValueError as err:
        raise ToolError(str(err)) from None
    if value.startswith("-"):
        raise ToolError(f"path may not start with '-': {value!r}")
    return value.rstrip("/")


FreshSession = Callable[[int], AbstractContextManager[GraderSandbox]]
"""Member N -> a new session whose workspace holds only member N's files (closed on exit)."""


@dataclass
class Toolbox:
    """Executes tool calls for one group: reads in the evidence session ``sandbox``, tests in a
    fresh session per run (``fresh``)."""

    sandbox: GraderSandbox
    group: GradingGroup
    fresh: FreshSession
    max_chars: int = 8000
    exec_timeout: float = 30.0
    test_timeout: float = 120.0

    def call(self, name: str, args: dict) -> str:
        """Run one (non-submit) tool; bad calls raise ``ToolError``."""
        handler = getattr(self, f"_tool_{name}", None)
        if handler is None or name == "submit_ranking":
            raise ToolError(f"unknown tool {name!r}")
        return self._cap(handler(args))

    def _cap(self, text: str) -> str:
        if len(text) <= self.max_chars:
            return text
        return text[: self.max_chars] + f"\n... [truncated {len(text) - self.max_chars} chars]"

    def _run(self, argv: list[str], timeout: float) -> ExecOutcome:
        try:
            return self.sandbox.exec(argv, timeout)
        except ValueError as err:
            raise ToolError(str(err)) from None

    def _tool_list_files(self, args: dict) -> str:
        prune = [x for name in JUNK for x in ("-name", name, "-o")][:-1]
        argv = [
            "find",
            _path(args, "path", "."),
            "(",
            *prune,
            ")",
            "-prune",
            "-o",
            "-type",
            "f",
            "-print",
        ]
        res = self._run(argv, self.exec_timeout)
        return "\n".join(sorted(res.output.splitlines())) or "(no files)"

    def _tool_read_file(self, args: dict) -> str:
        try:
            text = self.sandbox.read_file(_path(args, "path"))
        except (FileNotFoundError, ValueError, IsADirectoryError) as err:
            raise ToolError(str(err)) from None
        lines = text.splitlines()
        start = max(int(args.get("start_line") or 1), 1)
        end = min(int(args.get("end_line") or len(lines)), len(lines))
        return "\n".join(f"{i:5d}  {lines[i - 1]}" for i in range(start, end + 1)) or "(empty)"

    def _tool_grep(self, args: dict) -> str:
        pattern = args.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            raise ToolError("argument 'pattern' must be a non-empty string")
        res = self._run(
            [
                "grep",
                "-rnIE",
                *(f"--exclude-dir={x}" for x in JUNK),
                "--",
                pattern,
                _path(args, "path", "."),
            ],
            self.exec_timeout,
        )
        if res.exit_code == 1:
            return "(no matches)"
        return res.output

    def _tool_diff(self, args: dict) -> str:
        res = self._run(
            [
                "diff",
                "-ru",
                *(a for x in JUNK for a in ("-x", x)),
                "--",
                _path(args, "a"),
                _path(args, "b"),
            ],
            self.exec_timeout,
        )
        if res.exit_code == 0:
            return "(identical)"
        return res.output

    def _tool_run_tests(self, args: dict) -> str:
        member = args.get("member")
        if not isinstance(member, int) or not 0 <= member < len(self.group.candidates):
            raise ToolError(f"member must be an integer in 0..{len(self.group.candidates) - 1}")
        with self.fresh(member) as session:  # never the evidence session: see the module doc
            res = session.exec(["sh", "-c", self.group.test_command], self.test_timeout)
        status = "timed out" if res.timed_out else f"exit code {res.exit_code}"
        return f"[{status}]\n{res.output}"


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """A JSON object whose keys are unique: a key given twice (``cand_1`` placed twice, by a
    server that did not constrain the call) is an error, never the last value silently."""
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ToolError(f"a key is given more than once: {twice}")
    return dict(pairs)


def parse_arguments(raw: str | dict | None) -> dict:
    """Tool-call arguments arrive as a JSON string; anything but an object (with unique keys)
    is a bad call."""
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}", object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as err:
        raise ToolError(f"arguments are not valid JSON: {err}") from None
    if not isinstance(value, dict):
        raise ToolError("arguments must be a JSON object")
    return value
