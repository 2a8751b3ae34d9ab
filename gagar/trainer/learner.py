"""One policy update from a step's trajectories: micro-batches, global normalization, variance.

The learner sees token-level samples (token ids, loss mask, rollout log-probs, per-token
advantages, group ids) and a ``PolicyModel`` that returns next-token log-probs; it does not know
about rollouts, graders or Megatron (the Megatron adapter implements ``PolicyModel``).

One optimizer step per training step: the loss is a sum of micro-batch contributions, each
normalized by counts over the *global* batch (``loss.global_counts``), so the gradient does not
depend on the micro-batch size or the data-parallel size. ``old_logp`` is the current policy's
log-prob detached (the data is used for exactly one update, so the PPO ratio starts at 1); the
rollout engine's log-probs enter through the optional truncated importance correction.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from gagar.trainer.gradvar import GradVarianceTracker
from gagar.trainer.loss import (
    GlobalCounts,
    LossConfig,
    PolicyBatch,
    global_counts,
    policy_loss,
    prompt_token_counts,
)


@dataclass(frozen=True)
class Sample:
    """One trajectory as the trainer sees it (lists of equal length)."""

    token_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    advantages: list[float]
    group: int


class PolicyModel(Protocol):
    def parameters(self) -> Iterator[torch.nn.Parameter]: ...

    def token_logprobs(
        self, input_ids: Tensor, attention_mask: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        """``(logp, entropy)``, both (B, T): ``logp[:, t] = log π(x_t | x_<t)`` (0 at t = 0);
        entropy of the predictive distribution at t, or None when not available (e.g. TP > 1)."""
        ...


@dataclass(frozen=True)
class LearnerConfig:
    micro_batch_size: int
    grad_clip: float = 1.0
    loss: LossConfig = field(default_factory=LossConfig)


def _pad(rows: list[list[float]] | list[list[int]], width: int, dtype: torch.dtype) -> Tensor:
    out = torch.zeros(len(rows), width, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


@dataclass
class _MicroBatch:
    input_ids: Tensor  # (B, T)
    attention: Tensor  # (B, T) bool
    mask: Tensor  # (B, T) bool
    rollout_logp: Tensor  # (B, T)
    adv: Tensor  # (B, T)
    prompt_tokens: Tensor  # (B,)


def _collate(samples: list[Sample], prompt_tokens: Tensor) -> _MicroBatch:
    width = max(len(s.token_ids) for s in samples)
    return _MicroBatch(
        input_ids=_pad([s.token_ids for s in samples], width, torch.long),
        attention=_pad([[1] * len(s.token_ids) for s in samples], width, torch.long).bool(),
        mask=_pad([s.loss_mask for s in samples], width, torch.long).bool(),
        rollout_logp=_pad([s.rollout_logprobs for s in samples], width, torch.float32),
        adv=_pad([s.advantages for s in samples], width, torch.float32),
        prompt_tokens=prompt_tokens,
    )


def _check(samples: list[Sample]) -> None:
    if not samples:
        raise ValueError("no samples to train on")
    for i, s in enumerate(samples):
        lengths = {len(s.token_ids), len(s.loss_mask), len(s.rollout_logprobs), len(s.advantages)}
        if len(lengths) != 1:
            raise ValueError(
                f"sample {i}: token_ids, loss_mask, rollout_logprobs and advantages differ in length"
            )
        if s.loss_mask and s.loss_mask[0]:
            raise ValueError(f"sample {i}: the first token has no context and cannot be trained")
        if not all(math.isfinite(a) for a in s.advantages):
            raise ValueError(f"sample {i}: non-finite advantage")


class Learner:
    """Owns the optimizer; ``update(samples)`` runs one optimizer step and returns metrics."""

    def __init__(
        self,
        model: PolicyModel,
        optimizer: torch.optim.Optimizer,
        cfg: LearnerConfig,
        reduce: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        self.model, self.optimizer, self.cfg, self.reduce = model, optimizer, cfg, reduce

    def _counts(self, samples: list[Sample]) -> tuple[GlobalCounts, Tensor]:
        width = max(len(s.token_ids) for s in samples)
        mask = _pad([s.loss_mask for s in samples], width, torch.long).bool()
        groups = torch.tensor([s.group for s in samples])
        counts = global_counts(mask, groups)
        if self.reduce is not None:  # data parallel: every rank normalizes by the global numbers
            total = self.reduce(
                torch.tensor(
                    [counts.num_tokens, counts.num_seqs, counts.num_prompts], dtype=torch.float64
                )
            )
            counts = GlobalCounts(*(float(x) for x in total))
        return counts, prompt_token_counts(mask, groups)

    def update(self, samples: list[Sample]) -> dict[str, float]:
        _check(samples)
        counts, prompt_tokens = self._counts(samples)
        params = list(self.model.parameters())
        tracker = GradVarianceTracker(params)
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        mb = self.cfg.micro_batch_size
        for start in range(0, len(samples), mb):
            batch = _collate(samples[start : start + mb], prompt_tokens[start : start + mb])
            loss, metrics = self._micro_step(batch, counts)
            tracker.after_micro_batch()
            for key, value in {"loss": loss.detach(), **metrics}.items():
                totals[key] = totals.get(key, 0.0) + float(value)
        variance, mean_norm = tracker.result(self.reduce)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip))
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(f"non-finite gradient norm {grad_norm}: update skipped")
        self.optimizer.step()
        totals.update(
            grad_norm=grad_norm,
            gradient_variance=variance,
            gradient_mean_norm=mean_norm,
            tokens_trained=counts.num_tokens,
            micro_batches=float(tracker.num_micro),
        )
        return totals

    def _micro_step(
        self, batch: _MicroBatch, counts: GlobalCounts
    ) -> tuple[Tensor, dict[str, Tensor]]:
        logp, entropy = self.model.token_logprobs(batch.input_ids, batch.attention)
        policy = PolicyBatch(
            logp=logp,
            old_logp=logp.detach(),
            adv=batch.adv,
            mask=batch.mask,
            prompt_tokens=batch.prompt_tokens,
            rollout_logp=batch.rollout_logp,
        )
        loss, metrics = policy_loss(policy, counts, self.cfg.loss)
        loss.backward()
        metrics["nll"] = -torch.where(batch.mask, logp.detach(), 0).sum() / counts.num_tokens
        # Trainer vs rollout engine on the same tokens: ~0 when conversion, serving and weight sync
        # agree (the policy's sampled tokens are scored by both with the weights that sampled them).
        gap = (logp.detach() - batch.rollout_logp).abs()
        metrics["rollout_logp_abs_diff"] = torch.where(batch.mask, gap, 0).sum() / counts.num_tokens
        if entropy is not None:
            metrics["entropy"] = (
                torch.where(batch.mask, entropy.detach(), 0).sum() / counts.num_tokens
            )
        return loss, metrics


def causal_lm_logprobs(logits: Tensor, input_ids: Tensor) -> tuple[Tensor, Tensor]:
    """From (B, T, V) next-token logits: ``logp`` (B, T) of each token given its prefix (0 at t=0)
    and the entropy (B, T) of the distribution that produced it."""
    logsm = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, T-1, V)
    taken = logsm.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
    ent = -(logsm.exp() * logsm).sum(-1)  # (B, T-1)
    zero = torch.zeros_like(taken[:, :1])
    return torch.cat([zero, taken], 1), torch.cat([zero, ent.detach()], 1)
