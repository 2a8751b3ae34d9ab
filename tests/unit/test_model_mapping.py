"""The HF <-> Megatron mapping table and its tensor transforms (pure, no Megatron)."""

from __future__ import annotations

import pytest
import torch

from gagar.trainer.model.arch import UnsupportedModel, arch_from_hf
from gagar.trainer.model.hf_io import hf_shape
from gagar.trainer.model.mapping import (
    RULES,
    RankView,
    fuse_qkv,
    hf_names,
    hf_to_megatron_rank,
    match_megatron,
    megatron_to_hf,
    shard,
    unfuse_qkv,
    unshard,
)

LLAMA = {
    "model_type": "llama",
    "vocab_size": 16,
    "hidden_size": 8,
    "intermediate_size": 12,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
MOE = {**LLAMA, "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2,
       "moe_intermediate_size": 6, "head_dim": 2}  # fmt: skip


def test_qkv_fusion_groups_heads_by_kv_group_and_round_trips() -> None:
    arch = arch_from_hf(LLAMA)  # 4 heads, 2 groups, head_dim 2
    q = torch.arange(4).repeat_interleave(2)[:, None].expand(8, 8).float()  # row i: head i//2
    k, v = torch.full((4, 8), 100.0), torch.full((4, 8), 200.0)
    fused = fuse_qkv(q, k, v, arch)
    # group 0: q heads 0,1 (rows 0-3), k0 (2 rows), v0 (2 rows); then group 1
    assert fused[:, 0].tolist() == [0, 0, 1, 1, 100, 100, 200, 200, 2, 2, 3, 3, 100, 100, 200, 200]
    back = unfuse_qkv(fused, arch)
    assert all(torch.equal(a, b) for a, b in zip(back, (q, k, v), strict=True))
    bias = fuse_qkv(q[:, 0], k[:, 0], v[:, 0], arch)
    assert torch.equal(bias, fused[:, 0])


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.megatron.split(".{")[-1])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_shard_unshard_round_trip(rule, tp: int) -> None:  # type: ignore[no-untyped-def]
    full = torch.randn(8, 12)
    shards = [shard(rule, full, tp, r) for r in range(tp)]
    assert torch.equal(unshard(rule, shards), full)
    if rule.kind == "gate_up" and tp == 2:  # each rank holds [gate_r; up_r]
        gate, up = full.chunk(2)
        assert torch.equal(shards[1], torch.cat([gate[2:], up[2:]]))


def test_indivisible_shard_names_the_tensor() -> None:
    rule = next(r for r in RULES if r.megatron.endswith("linear_proj.weight"))
    with pytest.raises(ValueError, match=r"linear_proj.weight.*not divisible"):
        shard(rule, torch.zeros(4, 6), 4, 0)


def test_rank_views_cover_every_hf_tensor_once() -> None:
    arch = arch_from_hf(MOE)
    tensors = {n: torch.randn(hf_shape(n, arch)) for n in hf_names(arch)}
    seen: list[str] = []
    for ep_rank in range(2):
        state = hf_to_megatron_rank(tensors.__getitem__, arch, RankView(ep=2, ep_rank=ep_rank))
        for name, t in state.items():
            if ep_rank == 0 or ".experts." in name:
                for n, back in megatron_to_hf(name, [t], arch, ep_rank, 2):
                    assert torch.equal(back, tensors[n]), n
                    seen.append(n)
    assert sorted(seen) == sorted(tensors)
    assert "model.layers.1.mlp.experts.3.up_proj.weight" in seen


def test_unknown_megatron_name_is_refused() -> None:
    with pytest.raises(KeyError, match=r"decoder.layers.0.mystery.weight"):
        match_megatron("decoder.layers.0.mystery.weight")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "gpt2"}, "model_type='gpt2'"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type='yarn'"),
        ({"attention_bias": True}, "attention_bias"),
        ({"num_attention_heads": None}, "num_attention_heads"),
    ],
)
def test_unsupported_configs_name_the_key(change: dict, message: str) -> None:
    cfg = {**LLAMA, **change}
    cfg = {k: v for k, v in cfg.items() if v is not None}
    with pytest.raises(UnsupportedModel, match=message):
        arch_from_hf(cfg)


def test_families_differ_only_by_their_features() -> None:
    assert not arch_from_hf(LLAMA).qkv_bias
    assert arch_from_hf({**LLAMA, "model_type": "qwen2"}).qkv_bias
    assert arch_from_hf({**LLAMA, "model_type": "qwen3"}).qk_norm
    moe = arch_from_hf({**MOE, "num_local_experts": 4, "num_experts": None})
    assert moe.num_experts == 4 and not moe.norm_topk_prob
    theta = arch_from_hf({**LLAMA, "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}})
    assert theta.rope_theta == 1e6
