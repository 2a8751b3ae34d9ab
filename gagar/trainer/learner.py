"""One policy update from a step's trajectories: micro-batches, global normalization, variance.

The learner sees token-level samples (token ids, loss mask, rollout log-probs, per-token
advantages, group ids) and a ``PolicyModel`` that returns next-token log-probs; it does not know
about rollouts, graders or Megatron (the Megatron adapter implements ``PolicyModel``).

One optimizer step per training step: the loss is a sum of micro-batch contributions, each
normalized by counts over the *global* batch (``loss.global_counts``), so the gradient does not
depend on the micro-batch size or the data-parallel size.

Data parallelism (``DataParallel``): every replica is handed the *whole* step batch (the driver
broadcasts it), so counts and per-prompt token numbers are computed on the full batch, and
replica ``r`` of ``R`` runs micro-batches ``r, r + R, ...``. Gradients are then summed over the
replicas (each is already a global-normalized partial sum), so the update equals the one a single
process would make on the whole batch. When collectives run inside the forward pass (expert
parallelism's token dispatch), every replica must run the same number of equally shaped
micro-batches: ``equal_shapes`` pads them and gives the replicas short of work a zero-weight
micro-batch. ``old_logp`` is the current policy's
log-prob detached (the data is used for exactly one update, so the PPO ratio starts at 1); the
rollout engine's log-probs enter through the optional truncated importance correction.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

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


class DataParallel(Protocol):
    """This process's place among data-parallel replicas, and the collectives the update needs."""

    rank: int
    size: int
    equal_shapes: bool

    def sync_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Sum gradients over the replicas (in place)."""
        ...

    def grad_norm(self, params: list[torch.nn.Parameter]) -> float:
        """L2 norm of the whole model's (synced) gradient, the same number on every rank."""
        ...

    def counted(self, param: torch.nn.Parameter) -> bool:
        """Whether this rank counts ``param`` in its replica's norms (TP duplicates count once)."""
        ...

    def reduce_variance(self, stats: Tensor) -> Tensor:
        """``[S2, M, ‖ḡ‖²]`` of this rank → the same for the whole job (see ``gradvar``)."""
        ...

    def sum_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        """Sum additive metrics over the replicas."""
        ...


@dataclass(frozen=True)
class LearnerConfig:
    micro_batch_size: int
    grad_clip: float = 1.0
    loss: LossConfig = field(default_factory=LossConfig)
    autocast: torch.dtype | None = None
    """Mixed precision for float32 parameters: forward *and* backward run under
    ``torch.autocast`` (Megatron's linear layers are custom autograd functions whose backward
    matmuls need it too); log-probabilities, the loss and the gradients stay float32."""


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

    def to(self, device: torch.device) -> _MicroBatch:
        return _MicroBatch(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


def _collate(
    samples: list[Sample], prompt_tokens: Tensor, shape: tuple[int, int] | None = None
) -> _MicroBatch:
    """Pad to the longest sample, or to ``shape`` (rows, width) with zero-weight rows."""
    rows, width = shape or (len(samples), max(len(s.token_ids) for s in samples))
    filler = Sample([0], [0], [0.0], [0.0], -1)  # no loss token: contributes nothing
    samples = samples + [filler] * (rows - len(samples))
    # A padded row's prompt has no loss tokens; 1 keeps prompt-mean's division finite.
    prompt_tokens = torch.cat([prompt_tokens, torch.ones(rows - len(prompt_tokens))])
    return _MicroBatch(
        input_ids=_pad([s.token_ids for s in samples], width, torch.long),
        attention=_pad([[1] * len(s.token_ids) for s in samples], width, torch.long).bool(),
        mask=_pad([s.loss_mask for s in samples], width, torch.long).bool(),
        rollout_logp=_pad([s.rollout_logprobs for s in samples], width, torch.float32),
        adv=_pad([s.advantages for s in samples], width, torch.float32),
        prompt_tokens=prompt_tokens,
    )


def _zero_weight(samples: list[Sample]) -> list[Sample]:
    """The same shapes with no loss token: a micro-batch that only joins the collectives."""
    return [replace(s, loss_mask=[0] * len(s.loss_mask)) for s in samples]


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
        parallel: DataParallel | None = None,
    ) -> None:
        self.model, self.optimizer, self.cfg, self.parallel = model, optimizer, cfg, parallel

    def _batches(
        self, samples: list[Sample], prompt_tokens: Tensor, width: int
    ) -> Iterator[tuple[_MicroBatch, bool]]:
        """This replica's micro-batches, each with whether it carries weight (see module doc)."""
        mb, dp = self.cfg.micro_batch_size, self.parallel
        chunks = [range(i, min(i + mb, len(samples))) for i in range(0, len(samples), mb)]
        mine = chunks if dp is None else chunks[dp.rank :: dp.size]
        shape = (mb, width) if dp is not None and dp.equal_shapes else None
        rounds = -(-len(chunks) // dp.size) if shape and dp is not None else len(mine)
        for i in range(rounds):
            real = i < len(mine)
            rows = mine[i] if real else chunks[0]
            part = [samples[j] for j in rows]
            tokens = prompt_tokens[rows.start : rows.stop]
            yield _collate(part if real else _zero_weight(part), tokens, shape), real

    def update(self, samples: list[Sample]) -> dict[str, float]:
        _check(samples)
        width = max(len(s.token_ids) for s in samples)
        mask = _pad([s.loss_mask for s in samples], width, torch.long).bool()
        groups = torch.tensor([s.group for s in samples])
        # Every replica holds the whole batch: the global counts are computed, not reduced.
        counts, prompt_tokens = global_counts(mask, groups), prompt_token_counts(mask, groups)
        params = list(self.model.parameters())
        tracker = GradVarianceTracker(params, self.parallel.counted if self.parallel else None)
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        for batch, real in self._batches(samples, prompt_tokens, width):
            loss, metrics = self._micro_step(batch, counts)
            if real:  # a zero-weight round adds nothing to the gradient or the metrics
                tracker.after_micro_batch()
                for key, value in {"loss": loss.detach(), **metrics}.items():
                    totals[key] = totals.get(key, 0.0) + float(value)
        return self._step(params, tracker, totals, counts)

    def _step(
        self,
        params: list[Any],
        tracker: GradVarianceTracker,
        totals: dict[str, float],
        counts: GlobalCounts,
    ) -> dict[str, float]:
        """Sum over replicas, clip by the global norm, step; returns the step's metrics."""
        dp = self.parallel
        if dp is not None:
            dp.sync_grads(params)
            totals = dp.sum_metrics(totals)
        variance, mean_norm = tracker.result(dp.reduce_variance if dp is not None else None)
        grad_norm = dp.grad_norm(params) if dp is not None else _local_norm(params)
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(f"non-finite gradient norm {grad_norm}: update skipped")
        _clip(params, self.cfg.grad_clip, grad_norm)
        self.optimizer.step()
        totals.update(
            grad_norm=grad_norm,
            gradient_variance=variance,
            gradient_mean_norm=mean_norm,
            tokens_trained=counts.num_tokens,
            micro_batches=float(tracker.num_micro) if dp is None else _global_micro(tracker, dp),
        )
        return totals

    def _precision(self, like: Tensor) -> Any:
        if self.cfg.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(like.device.type, dtype=self.cfg.autocast)

    def _micro_step(
        self, batch: _MicroBatch, counts: GlobalCounts
    ) -> tuple[Tensor, dict[str, Tensor]]:
        device = next(iter(self.model.parameters())).device  # the batch goes where the model is
        batch = batch.to(device)
        with self._precision(batch.input_ids):
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
        with self._precision(batch.input_ids):
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


def _local_norm(params: list[Any]) -> float:
    grads = [p.grad for p in params if p.grad is not None]
    return (
        float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
        if grads
        else 0.0
    )


def _clip(params: list[Any], max_norm: float, norm: float) -> None:
    """Scale gradients by ``max_norm / norm`` when above it (torch's ``clip_grad_norm_`` rule),
    with a norm every rank agrees on, so replicas and tensor-parallel shards stay consistent."""
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)


def _global_micro(tracker: GradVarianceTracker, dp: DataParallel) -> float:
    stats = torch.tensor([0.0, float(tracker.num_micro), 0.0], dtype=torch.float64)
    return float(dp.reduce_variance(stats)[1])


ROWS_PER_CHUNK = 1024  # positions whose full-vocabulary float32 row is materialised at once


class _TokenLogprob(torch.autograd.Function):
    """``log softmax(logits)[target]`` per position without a (B, T, V) float32 log-softmax.

    The plain form keeps the float32 log-softmax for backward and makes more full-vocabulary
    temporaries: with a 49152-token vocabulary, 4 sequences of 4096 tokens are 3.2 GB each. Here the
    forward keeps only the log-sum-exp per position, and the backward forms ``onehot - softmax``
    a chunk of positions at a time, straight into the logits' gradient (in the logits' dtype).
    """

    @staticmethod
    def forward(ctx: Any, logits: Tensor, targets: Tensor) -> Tensor:
        b, t, _ = logits.shape
        lse = torch.empty(b, t, dtype=torch.float32, device=logits.device)
        for i in range(b):
            for j in range(0, t, ROWS_PER_CHUNK):
                lse[i, j : j + ROWS_PER_CHUNK] = torch.logsumexp(
                    logits[i, j : j + ROWS_PER_CHUNK].float(), -1
                )
        ctx.save_for_backward(logits, targets, lse)
        return logits.gather(-1, targets[..., None]).squeeze(-1).float() - lse

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        logits, targets, lse = ctx.saved_tensors
        out = torch.empty_like(logits)
        g = grad.float()
        for i in range(logits.shape[0]):
            for j in range(0, logits.shape[1], ROWS_PER_CHUNK):
                k = slice(j, j + ROWS_PER_CHUNK)
                d = torch.exp(logits[i, k].float() - lse[i, k, None]).mul_(-g[i, k, None])
                d.scatter_add_(-1, targets[i, k, None], g[i, k, None])
                out[i, k] = d
        return out, None


def causal_lm_logprobs(logits: Tensor, input_ids: Tensor) -> tuple[Tensor, Tensor]:
    """From (B, T, V) next-token logits: ``logp`` (B, T) of each token given its prefix (0 at t=0)
    and the entropy (B, T) of the distribution that produced it (a metric: no gradient).

    Memory-lean: no full-vocabulary float32 tensor of all positions is kept or made at once."""
    # The last position predicts nothing; scoring it against any token keeps the logits unsliced
    # (a slice of a transposed [s, b, v] output would be copied whole).
    targets = torch.cat([input_ids[:, 1:], input_ids[:, -1:]], 1)
    taken = _TokenLogprob.apply(logits, targets)  # (B, T): position t scores token t + 1
    ent = torch.empty_like(taken)
    with torch.no_grad():
        for i in range(logits.shape[0]):
            for j in range(0, logits.shape[1], ROWS_PER_CHUNK):
                ls = torch.log_softmax(logits[i, j : j + ROWS_PER_CHUNK].float(), -1)
                ent[i, j : j + ROWS_PER_CHUNK] = -(ls.exp() * ls).sum(-1)
    zero = torch.zeros_like(taken[:, :1])
    return torch.cat([zero, taken[:, :-1]], 1), torch.cat([zero, ent[:, :-1]], 1)
