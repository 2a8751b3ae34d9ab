"""A scripted policy that submits at once, and the chat format it needs: for tests that run the
loop's rollouts over real sandboxes without a model (each trajectory ends on the untouched
repository)."""

from __future__ import annotations

import asyncio
from typing import Any

from gagar.engine.base import Generation, SamplingParams
from gagar.rollout.chat import parse_tool_call

SUBMIT = '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'


class Fmt:
    """Fixed ids for every prompt and observation; tool calls parsed as the real format does."""

    def initial_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        return [1, 2, 3]

    def observation_ids(self, message: dict[str, Any]) -> list[int]:
        return [4]

    def parse_tool_call(self, text: str) -> Any:
        return parse_tool_call(text)


class Submits:
    """An engine whose every answer is ``submit``, after a short wait."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        await asyncio.sleep(0.01)
        return Generation([5, 6], [-0.1, -0.2], SUBMIT, "stop", list(prompt_ids))
