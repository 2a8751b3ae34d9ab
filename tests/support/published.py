"""A base model folder and random tensors for the weight-publishing tests (sync and HTTP)."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def write_base_model(root: Path) -> Path:
    """``root/base``: the config and tokenizer files a replica boots from (no weights)."""
    d = root / "base"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (d / "tokenizer.json").write_text("{}")
    return d


def random_weights(scale: float = 1.0, lm_head: bool = True) -> dict[str, torch.Tensor]:
    """Seeded HF-named tensors; ``scale`` makes a version that differs from the last."""
    g = torch.Generator().manual_seed(0)
    out = {
        "model.embed_tokens.weight": scale * torch.randn(10, 4, generator=g),
        "model.layers.0.mlp.up_proj.weight": scale * torch.randn(8, 4, generator=g),
    }
    if lm_head:
        out["lm_head.weight"] = scale * torch.randn(10, 4, generator=g)
    return out
