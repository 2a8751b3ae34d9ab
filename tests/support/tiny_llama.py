"""A tiny random Llama in Hugging Face format, for the vLLM engine tests.

It is the ``tiny`` preset's policy at a smaller size, written through the same package path
(``gagar.trainer.model.presets``): the preset's BPE tokenizer and chat template (ChatML with
Hermes tool calls), ``llama_config`` and ``random_llama``. What differs is only what the tests
need: sizes with the head size vLLM's CPU attention backend supports (64), untied embeddings by
default (``replace(TINY, tie_word_embeddings=True)`` gives the preset's and SmolLM2's shape, whose
``lm_head`` is the input embedding; tests/integration/test_vllm_engine.py serves both), and wider
random weights. Generated text is noise, but token ids and log-probs are exact, which is all the
engine tests compare.
"""

from __future__ import annotations

from pathlib import Path

from gagar.trainer.model.presets import Preset, fast_tokenizer, random_llama

TINY = Preset(
    vocab_size=1024,
    hidden_size=128,
    num_layers=2,
    num_heads=2,  # head size 128 / 2 = 64
    num_kv_heads=1,
    ffn_hidden_size=256,
    max_positions=2048,
    tie_word_embeddings=False,
)
WEIGHT_STD = 0.2


def write_tiny_llama(out: Path, preset: Preset = TINY, seed: int = 0) -> Path:
    """Write a random ``preset`` Llama (float32 safetensors + tokenizer) to ``out``; returns it."""
    import torch

    tokenizer = fast_tokenizer(vocab_size=preset.vocab_size)
    model = random_llama(preset, tokenizer, seed)
    # Random init with std 0.02 makes every token nearly equiprobable; a wider spread gives
    # log-probs that differ clearly between weight versions, which is what sync tests look at.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, WEIGHT_STD)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
