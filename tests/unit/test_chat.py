"""Token-level chat formatting: incremental ids equal the template's rendering of the whole chat."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from gagar.rollout.chat import HFChatFormat, format_tool_call, parse_tool_call
from gagar.trainer.model.presets import fast_tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    """The presets' tokenizer and chat template (the one ChatML the policies use)."""
    corpus = [
        "def add(a, b):\n    return a + b\n",
        "fix the bug in calc.py",
        '{"name": "view", "arguments": {}}',
    ] * 20
    return fast_tokenizer(corpus, vocab_size=512)


def test_incremental_ids_match_full_rendering(tokenizer: PreTrainedTokenizerFast) -> None:
    fmt = HFChatFormat(tokenizer)
    task = [
        {"role": "system", "content": "you fix bugs"},
        {"role": "user", "content": "fix calc.py"},
    ]
    ids = fmt.initial_ids(task)
    turns = [format_tool_call("view", {"path": "calc.py"}), format_tool_call("submit", {})]
    observation = {"role": "tool", "content": "def add(a, b):\n    return a - b\n"}
    ids += fmt.encode(turns[0]) + [
        tokenizer.convert_tokens_to_ids("<|im_end|>")
    ]  # what the policy generates
    ids += fmt.observation_ids(observation)
    ids += fmt.encode(turns[1]) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    full = task + [
        {"role": "assistant", "content": turns[0]},
        observation,
        {"role": "assistant", "content": turns[1]},
    ]
    rendered = tokenizer.apply_chat_template(full, tokenize=False)
    assert tokenizer.decode(ids) == rendered.rstrip("\n")


def test_template_without_end_of_turn_is_rejected(tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(ValueError, match="does not end assistant turns"):
        HFChatFormat(tokenizer, end_of_turn="<|never|>")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("I will just think", "no <tool_call>"),
        ("<tool_call>{bad json}</tool_call>", "not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'string "name"'),
        ('<tool_call>{"name": "x", "arguments": [1]}</tool_call>', "must be an object"),
        (
            '<tool_call>{"name": "a"}</tool_call><tool_call>{"name": "b"}</tool_call>',
            "2 tool calls",
        ),
    ],
)
def test_parse_errors_are_actionable(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_tool_call(text)


def test_parse_roundtrip() -> None:
    call = parse_tool_call(
        "thinking...\n" + format_tool_call("edit", {"path": "a.py", "old": "-", "new": "+"})
    )
    assert call.name == "edit" and call.arguments == {"path": "a.py", "old": "-", "new": "+"}


def test_a_task_prompt_is_rendered_once_and_handed_out_as_a_copy(
    tokenizer: PreTrainedTokenizerFast, monkeypatch: pytest.MonkeyPatch
) -> None:
    fmt = HFChatFormat(tokenizer)
    renders = []
    render = fmt._render
    monkeypatch.setattr(fmt, "_render", lambda m, **kw: renders.append(m) or render(m, **kw))
    task = [{"role": "system", "content": "you fix bugs"}, {"role": "user", "content": "fix a.py"}]
    first = fmt.initial_ids(task)
    first.append(7)  # the agent grows its trajectory from the prompt's ids
    second = fmt.initial_ids([dict(m) for m in task])
    assert second == first[:-1] == fmt.encode(render(task, add_generation_prompt=True))
    assert len(renders) == 1
    other = fmt.initial_ids([*task[:1], {"role": "user", "content": "fix b.py"}])
    assert other != second and len(renders) == 2
