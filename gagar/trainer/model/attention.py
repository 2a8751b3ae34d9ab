"""Core attention through ``torch.nn.functional.scaled_dot_product_attention``.

Megatron-Core's local (Transformer-Engine-free) ``DotProductAttention`` materialises the
``[b, heads, s, s]`` scores, copies them for the mask, runs an unfused float32 softmax and keeps
the probabilities for backward: measured with ``bench/train_step.py`` on the tiny policy (8 × 512
tokens) that was about a sixth of the learner's step on the CPU, and the main part of its gap to a
plain ``transformers`` step, which uses SDPA. ``SdpaAttention`` computes the same function with
PyTorch's fused kernel (flash attention on the CPU and on CUDA) for the case the trainer uses:
causal self-attention, no explicit mask or bias, no learnable softmax offset, no sliding window,
no attention dropout, no packed sequences. Anything else falls back to Megatron's own forward.
Grouped-query heads map as Megatron's ``repeat_interleave`` does (``enable_gqa``).
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from torch import Tensor


class SdpaAttention(DotProductAttention):
    def _fused(self, attention_mask: Any, attention_bias: Any, packed: Any) -> bool:
        c = self.config
        return (
            attention_mask is None
            and attention_bias is None
            and packed is None
            and self.attn_mask_type == AttnMaskType.causal
            and self.softmax_offset is None
            and c.window_size is None
            and (c.attention_dropout == 0.0 or not self.training)
        )

    def forward(  # noqa: PLR0913 (Megatron's signature)
        self,
        query: Tensor,  # [sq, b, np, hn]
        key: Tensor,  # [sk, b, ng, hn]
        value: Tensor,  # [sk, b, ng, hn]
        attention_mask: Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> Tensor:
        if not self._fused(attention_mask, attention_bias, packed_seq_params):
            return super().forward(
                query, key, value, attention_mask, attn_mask_type, attention_bias,
                packed_seq_params,
            )  # fmt: skip
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))  # [b, heads, s, hn]
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.softmax_scale, enable_gqa=q.shape[1] != k.shape[1]
        )  # [b, np, sq, hn]
        sq, b = query.shape[:2]
        return out.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)
