"""The agent loop with a scripted engine, a character-level chat format and in-memory tools."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gagar.rollout.agent import (
    Agent,
    AgentLimits,
    Generation,
    Observation,
    SamplingParams,
    SandboxInfraError,
    ToolCall,
)


class CharFormat:
    """Token id = ord(char); assistant turns are raw JSON tool calls."""

    def initial_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        return [
            ord(c)
            for c in "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
        ]

    def observation_ids(self, message: dict[str, Any]) -> list[int]:
        return [ord(c) for c in f"<tool>{message['content']}<assistant>"]

    def parse_tool_call(self, text: str) -> ToolCall:
        try:
            obj = json.loads(text)
        except ValueError as err:
            raise ValueError(f"not JSON: {err}") from err
        if not isinstance(obj, dict) or "name" not in obj:
            raise ValueError("expected {name, arguments}")
        return ToolCall(obj["name"], obj.get("arguments", {}))


class ScriptedEngine:
    def __init__(
        self, texts: list[str], fail_at: int | None = None, truncate_at: int | None = None
    ) -> None:
        self.texts, self.fail_at, self.truncate_at, self.calls = texts, fail_at, truncate_at, 0
        self.prompts: list[list[int]] = []

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        self.prompts.append(prompt_ids)
        i = self.calls
        self.calls += 1
        if i == self.fail_at:
            raise ConnectionError("engine went away")
        text = self.texts[i % len(self.texts)]
        finish = "stop"
        if len(text) > params.max_tokens or i == self.truncate_at:
            text, finish = text[: min(params.max_tokens, len(text) - 1)], "length"
        ids = [ord(c) for c in text]
        return Generation(ids, [-0.5] * len(ids), text, finish)  # type: ignore[arg-type]


class MemoryTools:
    def __init__(self, infra_fail: bool = False) -> None:
        self.files: dict[str, str] = {"a.py": "x = 1\n"}
        self.infra_fail = infra_fail

    def definitions(self) -> list[dict[str, Any]]:
        return []

    async def execute(self, call: ToolCall) -> Observation:
        if self.infra_fail:
            raise SandboxInfraError("bwrap died")
        args = call.arguments
        if call.name == "view":
            return Observation(self.files.get(args["path"], "missing"))
        if call.name == "edit":
            text = self.files.get(args["path"], "")
            if args["old"] not in text:
                return Observation("old text not found", error=True)
            self.files[args["path"]] = text.replace(args["old"], args["new"], 1)
            return Observation("edited", changed_state=True)
        if call.name == "submit":
            return Observation("submitted", done=True)
        return Observation(f"unknown tool {call.name}", error=True)


def call(name: str, **arguments: Any) -> str:
    return json.dumps({"name": name, "arguments": arguments})


LIMITS = AgentLimits(max_turns=8, max_tokens_per_turn=200, max_context_tokens=4000)
TASK = [{"role": "user", "content": "fix a.py"}]


def run(engine: ScriptedEngine, tools: MemoryTools | None = None, limits: AgentLimits = LIMITS):
    return asyncio.run(Agent(engine, CharFormat(), tools or MemoryTools(), limits).run(TASK))


def test_tokens_logprobs_and_mask_are_exact() -> None:
    script = [
        call("view", path="a.py"),
        call("edit", path="a.py", old="1", new="2"),
        call("submit"),
    ]
    engine = ScriptedEngine(script)
    traj = run(engine)
    assert traj.exit_reason == "submitted" and traj.valid and traj.num_turns == 3
    generated = [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m]
    assert "".join(map(chr, generated)) == "".join(script)
    assert all(lp == -0.5 for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if m)
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if not m)
    # each generation saw exactly the trajectory so far (no re-tokenization)
    assert engine.prompts[2] == traj.token_ids[: traj.turns[2].start]
    assert traj.prompt_len == len(CharFormat().initial_ids(TASK))


def test_redundant_and_tool_error_flags() -> None:
    script = [
        call("view", path="a.py"),
        call("view", path="a.py"),  # redundant: nothing changed since
        "not json",  # tool_error
        call("edit", path="a.py", old="1", new="2"),
        call("view", path="a.py"),  # not redundant: the state changed
        call("submit"),
    ]
    traj = run(ScriptedEngine(script))
    assert [sorted(t.flags) for t in traj.turns] == [[], ["redundant"], ["tool_error"], [], [], []]
    mask = traj.flagged_mask()
    flagged = [i for i, f in enumerate(mask) if f]
    assert flagged == list(range(traj.turns[1].start, traj.turns[1].end)) + list(
        range(traj.turns[2].start, traj.turns[2].end)
    )
    assert traj.flag_counts() == {"redundant": 1, "tool_error": 1, "churn": 0}


def test_churn_flags_the_overwritten_edit() -> None:
    script = [
        call("edit", path="a.py", old="x = 1", new="x = 100  # hack"),
        call("edit", path="a.py", old="x = 100  # hack", new="x = 2"),
        call("submit"),
    ]
    traj = run(ScriptedEngine(script))
    assert "churn" in traj.turns[0].flags and "churn" not in traj.turns[1].flags


@pytest.mark.parametrize(
    ("engine", "tools", "limits", "reason", "valid"),
    [
        (ScriptedEngine([call("view", path="a.py")]), None, LIMITS, "max_turns", True),
        (
            ScriptedEngine([call("view", path="a.py")]),
            None,
            AgentLimits(10, 200, 120),
            "context_overflow",
            True,
        ),
        (
            ScriptedEngine([call("view", path="a.py")]),
            None,
            AgentLimits(10, 200, 4000, max_response_tokens=60),
            "max_tokens",
            True,
        ),
        (
            ScriptedEngine([call("view", path="a.py")], fail_at=1),
            None,
            LIMITS,
            "engine_error",
            False,
        ),
        (
            ScriptedEngine([call("view", path="a.py")]),
            MemoryTools(infra_fail=True),
            LIMITS,
            "sandbox_error",
            False,
        ),
    ],
)
def test_every_exit_has_its_reason(engine, tools, limits, reason, valid) -> None:
    traj = run(engine, tools, limits)
    assert traj.exit_reason == reason and traj.valid == valid
    assert len(traj.token_ids) == len(traj.logprobs) == len(traj.loss_mask)


def test_truncated_turn_is_a_tool_error_not_a_crash() -> None:
    traj = run(ScriptedEngine([call("view", path="a.py"), call("submit")], truncate_at=0))
    assert "tool_error" in traj.turns[0].flags and traj.exit_reason == "submitted"
