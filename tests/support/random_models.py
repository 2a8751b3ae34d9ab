"""Small randomly initialized ``transformers`` models of every supported family.

They are the ground truth the conversion is checked against (logits, gradients, round trips),
for this package's tests, the weight-sync tests and the benchmarks. Norm weights and biases are
randomized too (``transformers`` initializes them to 1 and 0), so a mapping that mixes them up
cannot pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

SMALL = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}
FAMILY_EXTRAS: dict[str, dict[str, Any]] = {
    "llama": {"tie_word_embeddings": False},
    "llama-tied": {"tie_word_embeddings": True},
    "qwen2": {"tie_word_embeddings": False},
    "qwen3": {"head_dim": 32, "tie_word_embeddings": False},
    "qwen3_moe": {
        "head_dim": 16,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
    },
}


def hf_classes(family: str) -> tuple[Any, Any]:
    import transformers as tf

    return {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
        "qwen3_moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM),
    }[family.split("-")[0]]


def random_hf_model(family: str, seed: int = 0, **overrides: Any) -> Any:
    """A float32 eval-mode model of ``family`` (a key of ``FAMILY_EXTRAS``)."""
    config_cls, model_cls = hf_classes(family)
    torch.manual_seed(seed)
    config = config_cls(**{**SMALL, **FAMILY_EXTRAS[family], **overrides})
    model = model_cls(config).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1:
                param.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.2)
    return model


def save_random_hf_model(family: str, folder: str | Path, seed: int = 0, **overrides: Any) -> Any:
    """Save ``random_hf_model`` as safetensors + config.json; returns the model."""
    model = random_hf_model(family, seed, **overrides)
    model.save_pretrained(str(folder))
    return model
