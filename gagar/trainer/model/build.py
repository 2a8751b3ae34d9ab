"""Build a Megatron-Core ``GPTModel`` from a Hugging Face config.

The layer spec is Megatron-Core's local (Transformer-Engine-free) spec, so the same model builds
on a GPU machine without TE and on the CPU. The ``TransformerConfig`` is chosen to compute what
the HF model computes: RMSNorm, non-interleaved RoPE, SwiGLU, GQA, optional q/k-norm and q/k/v
bias, no dropout, and for MoE a softmax router whose top-k weights are renormalized exactly when
the HF config says ``norm_topk_prob`` (Megatron's ``moe_router_pre_softmax=False`` takes the
softmax over the top-k logits, which equals renormalizing the top-k probabilities).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from gagar.trainer.model.arch import Arch, arch_from_hf
from gagar.trainer.model.mapping import check_layout
from gagar.trainer.model.parallel import Parallel, current_parallel


def as_config_dict(hf_config: Mapping[str, Any] | Any) -> dict[str, Any]:
    """Accept a config.json dict or a ``transformers.PretrainedConfig``."""
    if isinstance(hf_config, Mapping):
        return dict(hf_config)
    return dict(hf_config.to_dict())


def _moe_kwargs(arch: Arch) -> dict[str, Any]:
    if not arch.is_moe:
        return {}
    return {
        "num_moe_experts": arch.num_experts,
        "moe_router_topk": arch.moe_topk,
        "moe_ffn_hidden_size": arch.moe_ffn_hidden_size,
        "moe_router_pre_softmax": not arch.norm_topk_prob,
        "moe_router_score_function": "softmax",
        # allgather: the alltoall dispatcher needs CUDA streams (see cpu_compat).
        "moe_token_dispatcher_type": "allgather",
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        "moe_grouped_gemm": False,
        "moe_router_dtype": "fp32",
    }


def transformer_config(arch: Arch, parallel: Parallel, dtype: torch.dtype = torch.float32) -> Any:
    """The Megatron ``TransformerConfig`` equivalent to ``arch``."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    if arch.num_layers % parallel.pp:
        raise ValueError(
            f"{arch.num_layers} layers do not divide over {parallel.pp} pipeline stages"
        )
    return TransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim,
        ffn_hidden_size=arch.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=arch.rms_eps,
        qk_layernorm=arch.qk_norm,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=parallel.tp,
        pipeline_model_parallel_size=parallel.pp,
        expert_model_parallel_size=parallel.ep,
        sequence_parallel=False,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        use_cpu_initialization=not torch.cuda.is_available(),
        perform_initialization=True,
        **_moe_kwargs(arch),
    )


def build_model(
    hf_config: Mapping[str, Any] | Any,
    parallel: Parallel | None = None,
    dtype: torch.dtype = torch.float32,
    parallel_output: bool = True,
    fused_attention: bool = True,
) -> Any:
    """A ``GPTModel`` for this rank (its TP/EP shard and pipeline stage), randomly initialized.

    Needs ``init_distributed`` first. ``parallel`` defaults to the initialized groups' sizes.
    With ``parallel_output`` the logits stay split over the vocabulary across tensor-parallel
    ranks (what ``vocab_parallel_cross_entropy`` wants); pass False to gather full logits.
    Load weights with ``load_hf_into_megatron`` or ``load_megatron_checkpoint``.
    ``fused_attention``: core attention through SDPA (``model.attention``); False keeps
    Megatron's unfused ``DotProductAttention`` (the bench compares the two).
    """
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    arch = arch_from_hf(as_config_dict(hf_config))
    parallel = parallel or current_parallel()
    check_layout(arch, parallel.tp, parallel.ep)
    if arch.is_moe and parallel.tp > 1:
        raise ValueError("MoE with tp>1 needs sequence parallelism, which the local spec lacks")
    config = transformer_config(arch, parallel, dtype)
    spec = get_gpt_layer_local_spec(
        num_experts=arch.num_experts or None, normalization="RMSNorm", qk_layernorm=arch.qk_norm
    )
    if fused_attention:
        from gagar.trainer.model.attention import SdpaAttention

        spec.submodules.self_attention.submodules.core_attention = SdpaAttention
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=arch.vocab_size,
        max_sequence_length=arch.max_positions,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        parallel_output=parallel_output,
        share_embeddings_and_output_weights=arch.tie_embeddings,
        position_embedding_type="rope",
        rotary_base=int(arch.rope_theta),
    )
    model.gagar_arch = arch  # the mapping reads it; GPTModel has no HF view of itself
    return model
