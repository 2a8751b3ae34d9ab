"""The Megatron-Core policy as the learner's ``PolicyModel``.

Megatron's ``GPTModel`` returns vocab-parallel logits under tensor parallelism; with ``labels`` it
computes the vocab-parallel cross entropy itself, which is ``-log π(label)`` gathered correctly
across tensor-parallel ranks. With TP = 1 we take the full logits instead, so that the entropy
metric is available too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from gagar.trainer.learner import causal_lm_logprobs


class MegatronPolicy:
    """``token_logprobs(input_ids, attention_mask)`` over a (possibly sharded) ``GPTModel``."""

    def __init__(self, model: Any, tensor_parallel: int = 1) -> None:
        self.model = model
        self.tensor_parallel = tensor_parallel

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.model.parameters()

    def train(self) -> None:
        self.model.train()

    def token_logprobs(
        self, input_ids: Tensor, attention_mask: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        b, t = input_ids.shape
        position_ids = torch.arange(t, device=input_ids.device).expand(b, t)
        if self.tensor_parallel == 1:
            logits = self.model(input_ids, position_ids, None)  # (B, T, V); causal mask by default
            return causal_lm_logprobs(logits, input_ids)
        labels = torch.cat([input_ids[:, 1:], input_ids[:, -1:]], 1)  # next token at each position
        nll = self.model(input_ids, position_ids, None, labels=labels)  # (B, T) = -log π(labels)
        logp = torch.cat([torch.zeros_like(nll[:, :1]), -nll[:, :-1]], 1).float()  # (B, T)
        return logp, None
