"""The HF ⇄ Megatron-Core weight mapping, written once as a table, and its tensor transforms.

Pure torch (no Megatron, no torch.distributed): everything here maps tensors to tensors, so the
offline converter, the live loader and the weight gather for vLLM share one definition.

Conventions. Megatron names use *global* layer indices and *local* expert indices (the expert
``e`` of expert-parallel rank ``r`` is HF expert ``r * experts_per_rank + e``); the caller
re-bases layer indices for pipeline stages. Layouts:

- ``linear_qkv`` fuses q, k, v per query group: ``[q_g (heads/groups·d), k_g (d), v_g (d)]`` for
  each group ``g``; tensor parallelism splits whole groups, so it is a plain split on dim 0.
- ``linear_fc1`` is ``[gate; up]``; under tensor parallelism each rank holds
  ``[gate_r; up_r]``, so sharding splits each half separately.
- column-parallel weights split on dim 0, row-parallel on dim 1, norms and the router replicate.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from gagar.trainer.model.arch import Arch

Kind = Literal["copy", "qkv", "gate_up"]
Scope = Literal["first", "last", "layer", "expert"]


@dataclass(frozen=True)
class Rule:
    megatron: str  # template over {layer} and {expert}
    hf: tuple[str, ...]  # templates; several when Megatron fuses tensors
    kind: Kind
    split: int | None  # tensor-parallel dim, None = replicated
    scope: Scope
    needs: str = ""  # Arch feature that must hold: "qkv_bias", "qk_norm", "untied", "dense", "moe"


_L = "decoder.layers.{layer}."
_H = "model.layers.{layer}."
_ATTN, _MLP = _H + "self_attn.", _H + "mlp."
_EXP = _L + "mlp.experts.local_experts.{expert}."
_HEXP = _MLP + "experts.{expert}."

RULES: tuple[Rule, ...] = (
    Rule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "copy", 0, "first"),
    Rule("decoder.final_layernorm.weight", ("model.norm.weight",), "copy", None, "last"),
    Rule("output_layer.weight", ("lm_head.weight",), "copy", 0, "last", "untied"),
    Rule(_L + "input_layernorm.weight", (_H + "input_layernorm.weight",), "copy", None, "layer"),
    Rule(
        _L + "self_attention.linear_qkv.weight",
        tuple(_ATTN + f"{p}_proj.weight" for p in "qkv"),
        "qkv", 0, "layer",
    ),
    Rule(
        _L + "self_attention.linear_qkv.bias",
        tuple(_ATTN + f"{p}_proj.bias" for p in "qkv"),
        "qkv", 0, "layer", "qkv_bias",
    ),
    Rule(_L + "self_attention.linear_proj.weight", (_ATTN + "o_proj.weight",), "copy", 1, "layer"),
    Rule(
        _L + "self_attention.q_layernorm.weight",
        (_ATTN + "q_norm.weight",), "copy", None, "layer", "qk_norm",
    ),
    Rule(
        _L + "self_attention.k_layernorm.weight",
        (_ATTN + "k_norm.weight",), "copy", None, "layer", "qk_norm",
    ),
    Rule(
        _L + "pre_mlp_layernorm.weight",
        (_H + "post_attention_layernorm.weight",), "copy", None, "layer",
    ),
    Rule(
        _L + "mlp.linear_fc1.weight",
        (_MLP + "gate_proj.weight", _MLP + "up_proj.weight"), "gate_up", 0, "layer", "dense",
    ),
    Rule(_L + "mlp.linear_fc2.weight", (_MLP + "down_proj.weight",), "copy", 1, "layer", "dense"),
    Rule(_L + "mlp.router.weight", (_MLP + "gate.weight",), "copy", None, "layer", "moe"),
    Rule(
        _EXP + "linear_fc1.weight",
        (_HEXP + "gate_proj.weight", _HEXP + "up_proj.weight"), "gate_up", 0, "expert", "moe",
    ),
    Rule(_EXP + "linear_fc2.weight", (_HEXP + "down_proj.weight",), "copy", 1, "expert", "moe"),
)  # fmt: skip


def rule_applies(rule: Rule, arch: Arch) -> bool:
    """Whether this family/config has the tensor the rule describes."""
    return {
        "": True,
        "qkv_bias": arch.qkv_bias,
        "qk_norm": arch.qk_norm,
        "untied": not arch.tie_embeddings,
        "dense": not arch.is_moe,
        "moe": arch.is_moe,
    }[rule.needs]


def rules_for(arch: Arch) -> list[Rule]:
    return [r for r in RULES if rule_applies(r, arch)]


def _template_regex(template: str) -> re.Pattern[str]:
    pattern = re.escape(template).replace(r"\{layer\}", r"(?P<layer>\d+)")
    return re.compile("^" + pattern.replace(r"\{expert\}", r"(?P<expert>\d+)") + "$")


_MEGATRON_RE = [(rule, _template_regex(rule.megatron)) for rule in RULES]


def match_megatron(name: str) -> tuple[Rule, int, int]:
    """Megatron parameter name -> (rule, layer, local expert); -1 where absent."""
    for rule, regex in _MEGATRON_RE:
        m = regex.match(name)
        if m:
            groups = m.groupdict()
            return rule, int(groups.get("layer") or -1), int(groups.get("expert") or -1)
    raise KeyError(f"Megatron parameter {name!r} has no HF mapping")


def fill(template: str, layer: int = -1, expert: int = -1) -> str:
    return template.format(layer=layer, expert=expert)


# ---------------------------------------------------------------- HF tensors <-> full Megatron


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arch: Arch) -> torch.Tensor:
    """HF q/k/v (weights (out, in) or biases (out,)) -> Megatron's per-group [q_g; k_g; v_g]."""
    g, d = arch.num_kv_heads, arch.head_dim
    rest = q.shape[1:]
    parts = (q.reshape(g, -1, *rest), k.reshape(g, d, *rest), v.reshape(g, d, *rest))
    return torch.cat(parts, dim=1).reshape(-1, *rest)


def unfuse_qkv(qkv: torch.Tensor, arch: Arch) -> list[torch.Tensor]:
    g, d = arch.num_kv_heads, arch.head_dim
    per_group = arch.num_heads // g * d
    rest = qkv.shape[1:]
    q, k, v = qkv.reshape(g, per_group + 2 * d, *rest).split([per_group, d, d], dim=1)
    return [t.reshape(-1, *rest) for t in (q, k, v)]


def hf_to_full(rule: Rule, tensors: list[torch.Tensor], arch: Arch) -> torch.Tensor:
    """HF tensors of one rule -> the unsharded Megatron tensor."""
    if rule.kind == "qkv":
        q, k, v = tensors
        return fuse_qkv(q, k, v, arch)
    if rule.kind == "gate_up":
        return torch.cat(tensors, dim=0)
    return tensors[0]


def full_to_hf(rule: Rule, full: torch.Tensor, arch: Arch) -> list[torch.Tensor]:
    if rule.kind == "qkv":
        return unfuse_qkv(full, arch)
    if rule.kind == "gate_up":
        return list(full.chunk(2, dim=0))
    return [full]


# ------------------------------------------------------------- full Megatron <-> TP shards


def shard(rule: Rule, full: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """The slice of a full Megatron tensor held by tensor-parallel rank ``rank`` of ``tp``."""
    if rule.split is None or tp == 1:
        return full.clone()
    if full.shape[rule.split] % tp:
        raise ValueError(
            f"{rule.megatron}: dim {rule.split} of shape {tuple(full.shape)} is not divisible "
            f"by tensor-parallel size {tp}"
        )
    if rule.kind == "gate_up":
        return torch.cat([h.chunk(tp, dim=0)[rank] for h in full.chunk(2, dim=0)]).clone()
    return full.chunk(tp, dim=rule.split)[rank].clone()


def unshard(rule: Rule, shards: list[torch.Tensor]) -> torch.Tensor:
    """Inverse of ``shard``: the tensor-parallel shards in rank order -> the full tensor."""
    if rule.split is None or len(shards) == 1:
        return shards[0]
    if rule.kind == "gate_up":
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(shards, dim=rule.split)


# ------------------------------------------------------------------------ whole rank views


@dataclass(frozen=True)
class RankView:
    """Which part of the model one rank holds (global layer indices)."""

    tp: int = 1
    tp_rank: int = 0
    ep: int = 1
    ep_rank: int = 0
    layers: range | None = None  # None: all layers
    first: bool = True  # holds the embedding (first pipeline stage)
    last: bool = True  # holds the final norm and output layer (last pipeline stage)


def _slots(rule: Rule, arch: Arch, view: RankView) -> Iterator[tuple[int, int, int]]:
    """(layer, local expert, HF expert) of each instance of ``rule`` on this rank."""
    if rule.scope in ("first", "last"):
        if view.first if rule.scope == "first" else view.last:
            yield -1, -1, -1
        return
    layers = view.layers if view.layers is not None else range(arch.num_layers)
    per_rank = arch.num_experts // view.ep if rule.scope == "expert" else 1
    for layer in layers:
        if rule.scope == "layer":
            yield layer, -1, -1
            continue
        for local in range(per_rank):
            yield layer, local, view.ep_rank * per_rank + local


def check_layout(arch: Arch, tp: int, ep: int) -> None:
    """Refuse tensor/expert-parallel sizes that would cut a head group, the vocabulary or experts."""
    sizes = {
        "num_key_value_heads": (arch.num_kv_heads, tp),  # qkv shards must hold whole groups
        "vocab_size": (arch.vocab_size, tp),
        "intermediate_size": (arch.ffn_hidden_size, tp),
        "num_experts": (arch.num_experts, ep),
    }
    for key, (value, size) in sizes.items():
        if value % size:
            raise ValueError(f"{key}={value} is not divisible by parallel size {size}")
    if ep > 1 and not arch.is_moe:
        raise ValueError(f"ep={ep} needs a MoE model; {arch.family} is dense")


def hf_to_megatron_rank(
    get_hf: Callable[[str], torch.Tensor], arch: Arch, view: RankView
) -> dict[str, torch.Tensor]:
    """The Megatron state dict (global layer names) of one rank, reading HF tensors by name."""
    check_layout(arch, view.tp, view.ep)
    out = {}
    for rule in rules_for(arch):
        for layer, local, hf_expert in _slots(rule, arch, view):
            tensors = [get_hf(fill(t, layer, hf_expert)) for t in rule.hf]
            full = hf_to_full(rule, tensors, arch)
            out[fill(rule.megatron, layer, local)] = shard(rule, full, view.tp, view.tp_rank)
    return out


def hf_names(arch: Arch) -> list[str]:
    """Every tensor name an HF checkpoint of this architecture must contain."""
    names = []
    for rule in rules_for(arch):
        for layer, _, hf_expert in _slots(rule, arch, RankView()):
            names += [fill(t, layer, hf_expert) for t in rule.hf]
    return names


def megatron_to_hf(
    name: str, shards: list[torch.Tensor], arch: Arch, ep_rank: int, ep: int
) -> list[tuple[str, torch.Tensor]]:
    """One Megatron parameter (global layer name, its TP shards in rank order) -> HF tensors."""
    rule, layer, local = match_megatron(name)
    hf_expert = ep_rank * (arch.num_experts // ep) + local if rule.scope == "expert" else -1
    full = unshard(rule, shards)
    return [
        (fill(t, layer, hf_expert), tensor)
        for t, tensor in zip(rule.hf, full_to_hf(rule, full, arch), strict=True)
    ]
