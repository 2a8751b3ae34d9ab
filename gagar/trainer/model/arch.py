"""What the policy looks like, read once from a Hugging Face ``config.json``.

``Arch`` is the single description of a supported model that the Megatron builder, the weight
mapping and the checks share. Unsupported features are refused here with the config key named,
so a model that cannot be represented never reaches the builder.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Family = Literal["llama", "qwen2", "qwen3", "qwen3_moe"]

# model_type -> what the family has beyond a plain Llama block (the per-family table).
FAMILIES: dict[str, dict[str, bool]] = {
    "llama": {"qkv_bias": False, "qk_norm": False, "moe": False},
    "qwen2": {"qkv_bias": True, "qk_norm": False, "moe": False},
    "qwen3": {"qkv_bias": False, "qk_norm": True, "moe": False},
    "qwen3_moe": {"qkv_bias": False, "qk_norm": True, "moe": True},
}


class UnsupportedModel(ValueError):
    """The config describes a model gagar cannot represent in Megatron-Core."""


@dataclass(frozen=True)
class Arch:
    family: Family
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    rms_eps: float
    rope_theta: float
    max_positions: int
    tie_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    num_experts: int = 0  # 0: dense
    moe_topk: int = 0
    moe_ffn_hidden_size: int = 0
    norm_topk_prob: bool = False

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


def _rope_theta(cfg: Mapping[str, Any]) -> float:
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or params
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ("default", None):
        raise UnsupportedModel(f"config key rope_scaling/rope_type={rope_type!r} is not supported")
    return float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def _check_plain(cfg: Mapping[str, Any], family: str) -> None:
    if cfg.get("hidden_act", "silu") != "silu":
        raise UnsupportedModel(f"config key hidden_act={cfg['hidden_act']!r}: only silu (SwiGLU)")
    if cfg.get("mlp_bias"):
        raise UnsupportedModel("config key mlp_bias=true is not supported")
    if family in ("llama", "qwen3", "qwen3_moe") and cfg.get("attention_bias"):
        raise UnsupportedModel(f"config key attention_bias=true is not supported for {family}")
    if cfg.get("use_sliding_window"):
        raise UnsupportedModel("config key use_sliding_window=true is not supported")


def _moe_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
        raise UnsupportedModel(
            "config keys mlp_only_layers/decoder_sparse_step: all layers must be MoE"
        )
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    if not experts:
        raise UnsupportedModel("config key num_experts (num_local_experts) is missing")
    return {
        "num_experts": int(experts),
        "moe_topk": int(cfg["num_experts_per_tok"]),
        "moe_ffn_hidden_size": int(cfg["moe_intermediate_size"]),
        "norm_topk_prob": bool(cfg.get("norm_topk_prob", False)),
    }


def arch_from_hf(cfg: Mapping[str, Any]) -> Arch:
    """Parse a Hugging Face ``config.json`` dict (or ``PretrainedConfig.to_dict()``)."""
    family = cfg.get("model_type")
    if family not in FAMILIES:
        raise UnsupportedModel(f"config key model_type={family!r} is not one of {sorted(FAMILIES)}")
    _check_plain(cfg, family)
    try:
        return _arch(cfg, family)
    except KeyError as exc:
        raise UnsupportedModel(f"config key {exc.args[0]!r} is missing") from exc


def _arch(cfg: Mapping[str, Any], family: Family) -> Arch:
    heads = int(cfg["num_attention_heads"])
    features = FAMILIES[family]
    return Arch(
        family=family,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
        ffn_hidden_size=int(cfg["intermediate_size"]),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(cfg),
        max_positions=int(cfg.get("max_position_embeddings", 4096)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=features["qkv_bias"],
        qk_norm=features["qk_norm"],
        **(_moe_fields(cfg) if features["moe"] else {}),
    )
