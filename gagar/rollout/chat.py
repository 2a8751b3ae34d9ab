"""Chat formatting for token-level rollouts with a Hugging Face tokenizer and its chat template.

``initial_ids`` renders the task messages with the tokenizer's chat template (and the tool
definitions) up to the assistant generation prompt. ``observation_ids`` renders only what follows
an assistant turn: the template's text for a tool message plus the next generation prompt,
computed as the difference between two renderings. The difference starts right after the
end-of-turn token the policy generated itself, so the trajectory is exactly "what the template
would produce" without ever re-tokenizing generated text (BPE merges never cross special tokens).

Tool calls use the Hermes/Qwen convention: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gagar.rollout.agent import ToolCall

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_BASE = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
INITIAL_CACHE = 4096  # distinct task prompts kept tokenized


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """How an assistant turn spells a tool call (used for SFT data and scripted policies)."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def parse_tool_call(text: str) -> ToolCall:
    """The single tool call in ``text``; ``ValueError`` with a message the model can act on."""
    found = TOOL_CALL.findall(text)
    if not found:
        raise ValueError(
            'no <tool_call>{"name": ..., "arguments": {...}}</tool_call> in the message'
        )
    if len(found) > 1:
        raise ValueError(f"{len(found)} tool calls in one message; make exactly one")
    try:
        obj = json.loads(found[0])
    except ValueError as err:
        raise ValueError(f"tool call is not valid JSON: {err}") from err
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError('tool call must be an object with a string "name"')
    arguments = obj.get("arguments", {})
    if not isinstance(arguments, dict):
        raise ValueError('"arguments" must be an object')
    return ToolCall(obj["name"], arguments)


class HFChatFormat:
    """``ChatFormat`` over a ``transformers`` tokenizer with a chat template."""

    def __init__(
        self,
        tokenizer: Any,
        tools: list[dict[str, Any]] | None = None,
        end_of_turn: str | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.end_of_turn = end_of_turn or tokenizer.eos_token
        if not self.end_of_turn:
            raise ValueError("the tokenizer has no eos token: pass end_of_turn")
        base = self._render(_BASE, add_generation_prompt=False)
        cut = base.rfind(self.end_of_turn)
        if cut < 0:
            raise ValueError(
                f"the chat template does not end assistant turns with {self.end_of_turn!r}"
            )
        self._base_prefix = base[: cut + len(self.end_of_turn)]
        self._initial: dict[str, list[int]] = {}

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(
            messages, tools=self.tools, add_generation_prompt=add_generation_prompt, tokenize=False
        )
        return str(text)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def initial_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """The rendered and tokenized task prompt, once per distinct prompt (every member of a
        group, and every later draw of the task, starts from the same one)."""
        key = json.dumps(messages, sort_keys=True)
        ids = self._initial.get(key)
        if ids is None:
            if len(self._initial) >= INITIAL_CACHE:
                self._initial.clear()
            ids = self._initial[key] = self.encode(
                self._render(messages, add_generation_prompt=True)
            )
        return list(ids)

    def observation_text(self, message: dict[str, Any]) -> str:
        full = self._render([*_BASE, message], add_generation_prompt=True)
        if not full.startswith(self._base_prefix):
            raise ValueError(
                "the chat template renders earlier turns differently once a tool message follows"
            )
        return full[len(self._base_prefix) :]

    def observation_ids(self, message: dict[str, Any]) -> list[int]:
        return self.encode(self.observation_text(message))

    def parse_tool_call(self, text: str) -> ToolCall:
        return parse_tool_call(text)
