"""Policies created offline: a small random Llama with a real BPE tokenizer trained on text.

``create_preset("tiny", out)`` writes an HF folder (safetensors, config.json, tokenizer.json,
tokenizer_config.json with the tool-calling chat template, generation_config.json) that
transformers, vLLM and ``gagar model convert`` load. The tokenizer is a byte-level BPE trained
on ``texts`` when given (e.g. the synthetic task family, later), otherwise on a generic corpus
of real Python source and its English docstrings from this interpreter's standard library,
plus chat-formatted tool-calling examples. Sizes are vLLM-servable (head_dim 64).
"""

from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gagar.trainer.model.chat_template import CHAT_TEMPLATE

BOS, EOS, PAD = "<|endoftext|>", "<|im_end|>", "<|pad|>"
SPECIAL = [BOS, "<|im_start|>", EOS, PAD]
# Not "special": they must survive skip_special_tokens so vLLM's hermes parser sees them.
TOOL_MARKERS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


@dataclass(frozen=True)
class Preset:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    max_positions: int


PRESETS = {
    "tiny": Preset(
        vocab_size=4096,
        hidden_size=256,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        ffn_hidden_size=768,
        max_positions=4096,
    ),
}

CORPUS_MODULES = (
    "argparse", "collections", "dataclasses", "difflib", "functools", "json.decoder",
    "pathlib", "shutil", "string", "subprocess", "textwrap", "typing", "unittest.case",
    "logging", "heapq", "bisect", "fractions", "statistics", "csv", "configparser",
)  # fmt: skip


def _chat_examples() -> Iterator[str]:
    """ChatML/tool-call text so the markers and JSON around them get compact tokens."""
    for tool, arg in (("read_file", "path"), ("run_tests", "pattern"), ("edit", "patch")):
        call = json.dumps({"name": tool, "arguments": {arg: "src/app.py"}})
        yield (
            f"<|im_start|>system\nYou fix bugs in Python repositories.{EOS}\n"
            f"<|im_start|>user\nThe tests in tests/test_app.py fail. Fix the bug.{EOS}\n"
            f"<|im_start|>assistant\n<tool_call>\n{call}\n</tool_call>{EOS}\n"
            f"<|im_start|>user\n<tool_response>\nok\n</tool_response>{EOS}\n"
        )


def default_corpus() -> Iterator[str]:
    """Python source (code + English docstrings) of standard-library modules, then chat text."""
    for name in CORPUS_MODULES:
        yield inspect.getsource(importlib.import_module(name))
    for _ in range(50):
        yield from _chat_examples()


def train_tokenizer(texts: Iterable[str] | None = None, vocab_size: int = 4096) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` with the chat and tool markers as tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TOOL_MARKERS),
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts if texts is not None else default_corpus(), trainer)
    tok.add_tokens([AddedToken(m, special=False, normalized=False) for m in TOOL_MARKERS])
    # A small corpus yields fewer merges than asked: pad with reserved tokens so the vocabulary
    # (and the model's embedding) has exactly ``vocab_size`` rows, divisible for tensor parallelism.
    reserved = range(vocab_size - tok.get_vocab_size())
    tok.add_special_tokens([AddedToken(f"<|reserved_{i}|>", special=True) for i in reserved])
    return tok


def _fast_tokenizer(tok: Any) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=PRESETS["tiny"].max_positions,
    )


def llama_config(preset: Preset, tokenizer: Any) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=preset.vocab_size,
        hidden_size=preset.hidden_size,
        intermediate_size=preset.ffn_hidden_size,
        num_hidden_layers=preset.num_layers,
        num_attention_heads=preset.num_heads,
        num_key_value_heads=preset.num_kv_heads,
        max_position_embeddings=preset.max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS),
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
        torch_dtype="float32",
    )


def create_preset(
    name: str, out: str | Path, seed: int = 0, texts: Iterable[str] | None = None
) -> Path:
    """Write the preset policy ``name`` as an HF folder; returns the folder."""
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    preset = PRESETS[name]
    tokenizer = _fast_tokenizer(train_tokenizer(texts, preset.vocab_size))
    if len(tokenizer) != preset.vocab_size:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens, expected {preset.vocab_size}")
    config = llama_config(preset, tokenizer)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float()
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )  # fmt: skip
    out = Path(out)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out
