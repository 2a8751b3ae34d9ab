"""Policies created offline: a small random Llama with a real BPE tokenizer trained on text.

``create_preset("tiny", out)`` writes an HF folder (safetensors, config.json, tokenizer.json,
tokenizer_config.json with the tool-calling chat template, generation_config.json) that
transformers, vLLM and ``gagar model convert`` load. The tokenizer is a byte-level BPE trained
on ``texts`` when given (e.g. the synthetic task family, later), otherwise on a generic corpus
of real Python source and its English docstrings from this interpreter's standard library,
plus chat-formatted tool-calling examples. Sizes are vLLM-servable (head_dim 64).
``random_llama(preset, tokenizer)`` is the one initializer: the vLLM tests' tiny Llama
(``tests/support/tiny_llama.py``) is a smaller ``Preset`` through the same path.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gagar.trainer.model.chat_template import CHAT_TEMPLATE, chatml

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
    tie_word_embeddings: bool = True  # the tests' vLLM fixture serves untied weights too


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
            chatml("system", "You fix bugs in Python repositories.")
            + chatml("user", "The tests in tests/test_app.py fail. Fix the bug.")
            + chatml("assistant", f"<tool_call>\n{call}\n</tool_call>")
            + chatml("user", "<tool_response>\nok\n</tool_response>")
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


def fast_tokenizer(texts: Iterable[str] | None = None, vocab_size: int = 4096) -> Any:
    """The presets' tokenizer as transformers loads it: ``train_tokenizer`` with the chat
    template and the special tokens named."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(texts, vocab_size),
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
        tie_word_embeddings=preset.tie_word_embeddings,
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS),
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
        dtype="float32",  # transformers 5's name (torch_dtype is deprecated)
    )


def random_llama(preset: Preset, tokenizer: Any, seed: int = 0) -> Any:
    """A freshly initialized float32 ``LlamaForCausalLM`` of ``preset`` for ``tokenizer``."""
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    if len(tokenizer) != preset.vocab_size:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens, expected {preset.vocab_size}")
    config = llama_config(preset, tokenizer)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float()
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )  # fmt: skip
    return model


@dataclass(frozen=True)
class Curriculum:
    """The copying curriculum a fresh preset is trained on before it is written (``steps`` > 0):
    ``autocast`` its compute dtype (a torch dtype; None: float32), ``on_step(i, nll)`` progress."""

    steps: int
    autocast: Any = None
    on_step: Any = None


def create_preset(
    name: str,
    out: str | Path,
    seed: int = 0,
    texts: Iterable[str] | None = None,
    curriculum: Curriculum | None = None,
) -> Path:
    """Write the preset policy ``name`` as an HF folder; returns the folder.

    With a ``curriculum`` the fresh model is trained on ``copy_curriculum`` first, with spans
    drawn from the tokens of ``texts`` (or of the generic corpus)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    preset = PRESETS[name]
    texts = list(texts) if texts is not None else None
    tokenizer = fast_tokenizer(texts, preset.vocab_size)
    model = random_llama(preset, tokenizer, seed)
    out = Path(out)
    if curriculum is not None and curriculum.steps:
        c = curriculum
        seen = {i for text in (texts or default_corpus()) for i in tokenizer.encode(text)}
        losses = copy_curriculum(model, sorted(seen), c.steps, seed, c.on_step, c.autocast)
        out.mkdir(parents=True, exist_ok=True)
        dtype = str(c.autocast).removeprefix("torch.") if c.autocast is not None else "float32"
        summary = {"steps": c.steps, "nll_first": losses[0], "nll_last": losses[-1], "dtype": dtype}
        (out / COPY_SUMMARY).write_text(json.dumps(summary) + "\n")
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


COPY_SUMMARY = "copy_curriculum.json"  # beside the weights: steps and first/last NLL
COPY_LR = 1e-3  # measured: 3e-3 never leaves the plateau and spoils the SFT that follows
COPY_BATCH = 32
COPY_MICRO = 4  # micro-batches per step, of rows of similar length (less padding, same gradient)
# Span and filler lengths (inclusive ranges). Short rows make the induction circuit form sooner:
# on the tiny preset in float32 (seed 0, mean NLL over 50 steps) spans of 4-10 tokens after 0-4
# of filler leave the plateau at 350-550 steps (4.28 at 300, 2.38 at 500, 1.94 at 550), where
# spans of 4-24 after 0-16 took 700-850 (4.86 at 650, 1.87 at 850) at twice the tokens a step;
# 4-7 after 0-2 never made the jump (2.74 at 700). The circuit carries over to the distances
# the agent copies across (the problem statement's path into `view`, the buggy line into `edit`).
COPY_SPAN = (4, 10)
COPY_FILLER = (0, 4)


def copy_rows(
    rng: Any,
    token_ids: list[int],
    span: tuple[int, int] = COPY_SPAN,
    filler: tuple[int, int] = COPY_FILLER,
) -> list[tuple[list[int], int]]:
    """One step's sequences: (span + filler + span, span length), ``COPY_BATCH`` of them; the
    lengths drawn uniformly from the inclusive ranges ``span`` and ``filler``."""
    rows = []
    for _ in range(COPY_BATCH):
        span_ids = rng.choices(token_ids, k=rng.randint(*span))
        filler_ids = rng.choices(token_ids, k=rng.randint(*filler))
        rows.append((span_ids + filler_ids + span_ids, len(span_ids)))
    return rows


def copy_loss_sum(model: Any, rows: list[tuple[list[int], int]], autocast: Any) -> Any:
    """Summed NLL of the repeats of ``rows`` (right-padded to their longest: causal attention
    keeps the padding out of every real position). Logits are computed at the target positions
    only: the output layer and its softmax over the vocabulary are a fifth of the step, and most
    positions carry no loss."""
    import torch

    width = max(len(row) for row, _ in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    target = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, (row, n) in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        target[i, len(row) - n + 1 : len(row)] = True  # the repeat's first token is unguessable
    at = target[:, 1:]  # (B, T-1): positions whose next token is a target
    with torch.autocast("cpu", dtype=autocast) if autocast else contextlib.nullcontext():
        hidden = model.model(ids).last_hidden_state[:, :-1][at]  # (M, H)
        logits = model.lm_head(hidden).float()  # (M, V)
    return torch.nn.functional.cross_entropy(logits, ids[:, 1:][at], reduction="sum")


def copy_curriculum(  # noqa: PLR0913 - the row shape is the bench's to vary
    model: Any,
    token_ids: list[int],
    steps: int,
    seed: int = 0,
    on_step: Any = None,
    autocast: Any = None,
    span: tuple[int, int] = COPY_SPAN,
    filler: tuple[int, int] = COPY_FILLER,
) -> list[float]:
    """Train a fresh model to continue a repeated span of random tokens; returns the NLL per step.

    An agent must copy from its context (the path the problem statement names, the buggy line
    a ``view`` printed), and a policy trained from scratch finds no such circuit in a short SFT:
    it writes the most frequent path instead. Each sequence here is a random span drawn from
    ``token_ids`` (the vocabulary of the text the policy will read), random filler, then the span
    again; the loss is on the repetition only, where predicting a token means finding its earlier
    occurrence and reading what followed (the induction circuit). Plain PyTorch on the HF model,
    before it is saved: this is how the preset is initialized, not the trainer's job.
    ``autocast``: the forward's compute dtype (None: float32), as ``spec.model.dtype`` resolves
    on the CPU (``gagar.trainer.precision``). ``span``, ``filler``: the rows' length ranges
    (``COPY_SPAN``, ``COPY_FILLER``; ``bench/copy_curriculum.py`` compares others).

    One step is one optimizer step on ``COPY_BATCH`` rows, token-mean over their targets; its
    rows run as ``COPY_MICRO`` micro-batches of similar length (the gradient is the same sum),
    measured 1.4x faster in float32 on AVX2 than one batch padded to the longest.
    """
    import random

    import torch

    if not token_ids:
        raise ValueError("copy_curriculum: no token ids to draw spans from")
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=COPY_LR, weight_decay=0.0)
    model.train()
    losses = []
    for step in range(steps):
        rows = sorted(copy_rows(rng, token_ids, span, filler), key=lambda r: len(r[0]))
        targets = sum(n - 1 for _, n in rows)
        size = -(-len(rows) // COPY_MICRO)
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for i in range(0, len(rows), size):
            loss = copy_loss_sum(model, rows[i : i + size], autocast) / targets
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(total)
        if on_step is not None:
            on_step(step + 1, losses[-1])
    model.eval()
    return losses
