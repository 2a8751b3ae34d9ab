"""Policy loss (docs/design.md §1.8): PPO clip with clip-higher and dual-clip, pure and torch-only.

Per token t of sequence i, with r = exp(logp − old_logp) and advantage A:

    pg   = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))          (clip-higher: ε_high > ε_low)
    pg   = min(pg, −c·A)   where A < 0                             (dual-clip, c > 1)
    pg  *= min(exp(old_logp − rollout_logp), cap)                  (optional truncated IS, no grad)
    ℓ    = pg + β_KL·k(logp, ref_logp)                             (optional KL, k1/k2/k3)

k1 = log r_ref, k2 = ½(log r_ref)², k3 = exp(−log r_ref) + log r_ref − 1 with
log r_ref = logp − ref_logp (clamped to ±20 so exp cannot overflow).

Aggregation (``AggMode``; one registry, one signature). Every denominator is a count over the
GLOBAL batch of the optimizer step, passed in, so the loss is a plain sum of micro-batch (and
data-parallel rank) contributions and does not change with how the batch is split:

- ``token-mean``:               Σ_{i,t} ℓ / num_tokens
- ``seq-mean-token-mean``:      Σ_i (Σ_t ℓ / T_i) / num_seqs          (T_i: the sequence's tokens)
- ``seq-mean-token-sum-norm``:  Σ_{i,t} ℓ / (max_len · num_seqs)       (Dr. GRPO, constant max_len)
- ``prompt-mean`` (default):    Σ_i (Σ_t ℓ / T_{p(i)}) / num_prompts   (T_p: all loss tokens of the
  sequences of prompt p in the global batch) = mean over prompts of each prompt's token mean.

A sequence never spans micro-batches, so T_i is local; T_p is not, which is why ``prompt-mean``
takes ``prompt_tokens`` (N,) computed once over the whole step batch (``prompt_token_counts``).
Sequences and prompts with no loss tokens are not counted (``global_counts``).

Metrics are additive too: each is a masked token sum divided by ``num_tokens``, so summing the
micro-batch metrics gives the global token mean.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "prompt-mean"]
KLEstimator = Literal["k1", "k2", "k3"]

LOG_RATIO_CLAMP = 20.0


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True)
class GlobalCounts:
    """Denominators over the global batch of one optimizer step (all ranks, all micro-batches)."""

    num_tokens: float
    num_seqs: float
    num_prompts: float

    def __post_init__(self) -> None:
        for name in ("num_tokens", "num_seqs", "num_prompts"):
            v = getattr(self, name)
            _require(math.isfinite(v) and v > 0, f"{name} must be finite and > 0, got {v}")


@dataclass(frozen=True)
class LossConfig:
    """Scalars of the policy loss; defaults follow docs/design.md §1.8 (KL and truncated IS off)."""

    eps_low: float = 0.2
    eps_high: float = 0.28
    dual_clip: float | None = 3.0  # c; None disables
    agg_mode: AggMode = "prompt-mean"
    max_len: int | None = None  # required by seq-mean-token-sum-norm
    tis_cap: float | None = None  # truncated importance-sampling cap; None disables
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"

    def __post_init__(self) -> None:
        _require(0 <= self.eps_low < 1, f"eps_low must be in [0, 1): {self.eps_low}")
        _require(0 <= self.eps_high < math.inf, f"eps_high must be finite, >= 0: {self.eps_high}")
        _require(
            self.dual_clip is None or self.dual_clip > 1, f"dual_clip must be > 1: {self.dual_clip}"
        )
        _require(
            self.agg_mode in AGGREGATORS,
            f"unknown agg_mode {self.agg_mode!r}; one of {list(AGGREGATORS)}",
        )
        _require(
            self.kl_estimator in get_args(KLEstimator),
            f"unknown kl_estimator {self.kl_estimator!r}",
        )
        _require(
            math.isfinite(self.kl_coef) and self.kl_coef >= 0,
            f"kl_coef must be >= 0: {self.kl_coef}",
        )
        _require(self.tis_cap is None or self.tis_cap > 0, f"tis_cap must be > 0: {self.tis_cap}")
        if self.agg_mode == "seq-mean-token-sum-norm":
            _require(
                self.max_len is not None and self.max_len > 0,
                "seq-mean-token-sum-norm needs max_len > 0",
            )


@dataclass(frozen=True)
class PolicyBatch:
    """One micro-batch. Shapes: N sequences × T tokens (V vocabulary for ``logits``)."""

    logp: Tensor  # (N, T) current policy log-probs of the taken tokens (with grad)
    old_logp: Tensor  # (N, T) log-probs of the policy that generated the step's data
    adv: Tensor  # (N, T) or (N,) broadcast over the sequence
    mask: Tensor  # (N, T) bool, tokens the policy generated (prompt and tool output excluded)
    prompt_tokens: Tensor | None = None  # (N,) global loss tokens of the sequence's prompt
    rollout_logp: Tensor | None = None  # (N, T) rollout engine log-probs (truncated IS)
    ref_logp: Tensor | None = None  # (N, T) reference policy log-probs (KL)
    logits: Tensor | None = None  # (N, T, V) for the entropy metric only


# ---------------------------------------------------------------- global counts (full batch)


def prompt_token_counts(mask: Tensor, group_ids: Tensor) -> Tensor:
    """(N,) loss tokens of each sequence's prompt over the batch given (call on the full batch)."""
    _, gid = torch.unique(group_ids, return_inverse=True)  # (N,)
    per_seq = mask.sum(-1).to(torch.float64)  # (N,)
    per_group = torch.zeros(int(gid.max()) + 1 if gid.numel() else 0, dtype=torch.float64)
    return per_group.index_add(0, gid, per_seq)[gid]


def global_counts(mask: Tensor, group_ids: Tensor) -> GlobalCounts:
    """Counts of loss tokens, sequences with ≥ 1 and prompts with ≥ 1 loss token (full batch;
    in data-parallel training all-reduce the three numbers before building ``GlobalCounts``)."""
    has_tokens = mask.any(-1)  # (N,)
    return GlobalCounts(
        num_tokens=float(mask.sum()),
        num_seqs=float(has_tokens.sum()),
        num_prompts=float(torch.unique(group_ids[has_tokens]).numel()),
    )


# ---------------------------------------------------------------- aggregation registry


@dataclass(frozen=True)
class _AggContext:
    counts: GlobalCounts
    max_len: int | None
    prompt_tokens: Tensor | None  # (N,)


Aggregator = Callable[[Tensor, Tensor, _AggContext], Tensor]


def _masked(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, x, 0)


def _token_mean(loss: Tensor, mask: Tensor, ctx: _AggContext) -> Tensor:
    return _masked(loss, mask).sum() / ctx.counts.num_tokens


def _seq_mean_token_mean(loss: Tensor, mask: Tensor, ctx: _AggContext) -> Tensor:
    per_seq = _masked(loss, mask).sum(-1) / mask.sum(-1).clamp(min=1)  # (N,)
    return per_seq.sum() / ctx.counts.num_seqs


def _seq_mean_token_sum_norm(loss: Tensor, mask: Tensor, ctx: _AggContext) -> Tensor:
    assert ctx.max_len is not None  # LossConfig guarantees it
    return _masked(loss, mask).sum() / (ctx.max_len * ctx.counts.num_seqs)


def _prompt_mean(loss: Tensor, mask: Tensor, ctx: _AggContext) -> Tensor:
    _require(ctx.prompt_tokens is not None, "prompt-mean needs batch.prompt_tokens")
    assert ctx.prompt_tokens is not None
    n_tok = mask.sum(-1)  # (N,)
    _require(
        bool((ctx.prompt_tokens >= n_tok).all()),
        "prompt_tokens smaller than a sequence's own token count: compute it on the global batch",
    )
    per_seq = _masked(loss, mask).sum(-1) / ctx.prompt_tokens.clamp(min=1).to(loss.dtype)  # (N,)
    return per_seq.sum() / ctx.counts.num_prompts


AGGREGATORS: dict[AggMode, Aggregator] = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
    "prompt-mean": _prompt_mean,
}
assert set(AGGREGATORS) == set(get_args(AggMode))


def aggregation_weight(
    mask: Tensor, counts: GlobalCounts, cfg: LossConfig, prompt_tokens: Tensor | None = None
) -> float:
    """The micro-batch's weight in the step's loss: its aggregate if every token's loss were 1
    (its token, sequence or prompt share; ``gradvar`` turns it into the noise scale's shares)."""
    ctx = _AggContext(counts, cfg.max_len, prompt_tokens)
    return float(AGGREGATORS[cfg.agg_mode](torch.ones(mask.shape, dtype=torch.float64), mask, ctx))


# ---------------------------------------------------------------- per-token terms


def ppo_clip(adv: Tensor, log_ratio: Tensor, cfg: LossConfig) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token clipped loss (N, T) with clip-higher and dual-clip, plus where the upper/lower
    PPO clip and the dual clip were active (bool (N, T) each)."""
    ratio = torch.exp(log_ratio)  # (N, T)
    pg1 = -adv * ratio  # (N, T)
    pg2 = -adv * ratio.clamp(1 - cfg.eps_low, 1 + cfg.eps_high)  # (N, T)
    clip1 = torch.maximum(pg1, pg2)  # (N, T)
    clipped = pg2 > pg1  # (N, T)
    if cfg.dual_clip is None:
        return clip1, clipped, torch.zeros_like(clipped)
    pg3 = -adv * cfg.dual_clip  # (N, T)
    dual = (adv < 0) & (clip1 > pg3)  # (N, T)
    return torch.where(dual, pg3, clip1), clipped, dual


def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: KLEstimator) -> Tensor:
    """Per-token KL(π‖π_ref) estimate (N, T) from sampled tokens: k1, k2 or k3 (Schulman).

    As a loss only the expected gradient matters: k1's is zero (E_π ∇log π = 0), k2's is that of
    KL(π‖π_ref), k3's that of KL(π_ref‖π) (docs/trainer.md)."""
    log_r = (logp - ref_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (N, T)
    if estimator == "k1":
        return log_r
    if estimator == "k2":
        return 0.5 * log_r.square()
    return torch.exp(-log_r) + log_r - 1


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Per-token entropy (N, T) of the categorical distribution given by logits (N, T, V)."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # (N, T, V)
    return -(logp.exp() * logp).sum(-1)


# ---------------------------------------------------------------- the loss


def _check_batch(batch: PolicyBatch) -> None:
    mask = batch.mask
    _require(
        isinstance(mask, Tensor) and mask.dtype == torch.bool and mask.dim() == 2,
        "mask must be bool (N, T)",
    )
    for name in ("logp", "old_logp", "rollout_logp", "ref_logp"):
        x = getattr(batch, name)
        if x is None:
            continue
        _require(
            x.shape == mask.shape,
            f"{name} has shape {tuple(x.shape)}, expected {tuple(mask.shape)}",
        )
        _require(
            bool(torch.isfinite(x.detach()[mask]).all()), f"{name} is not finite at a loss token"
        )
    _require(
        batch.adv.shape in (mask.shape, mask.shape[:1]), f"adv has shape {tuple(batch.adv.shape)}"
    )
    adv = batch.adv[:, None].expand_as(mask) if batch.adv.dim() == 1 else batch.adv
    _require(bool(torch.isfinite(adv[mask]).all()), "adv is not finite at a loss token")
    if batch.prompt_tokens is not None:
        _require(batch.prompt_tokens.shape == mask.shape[:1], "prompt_tokens must be (N,)")
    if batch.logits is not None:
        _require(batch.logits.shape[:2] == mask.shape, "logits must be (N, T, V)")


def _sum_metric(x: Tensor, mask: Tensor, counts: GlobalCounts) -> Tensor:
    return _masked(x.detach().float(), mask).sum() / counts.num_tokens


def policy_loss(
    batch: PolicyBatch,
    counts: GlobalCounts,
    cfg: LossConfig = LossConfig(),
) -> tuple[Tensor, dict[str, Tensor]]:
    """Micro-batch contribution to the step's policy loss (scalar) and additive metrics."""
    _check_batch(batch)
    mask = batch.mask
    adv = batch.adv[:, None].expand_as(mask) if batch.adv.dim() == 1 else batch.adv  # (N, T)
    adv = _masked(adv, mask).to(batch.logp.dtype)  # (N, T)
    # Zero the log-ratio outside the mask: exp of padding garbage would give NaN gradients.
    log_ratio = _masked(batch.logp - batch.old_logp, mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    pg, clipped, dual = ppo_clip(adv, log_ratio, cfg)  # (N, T) each
    metrics: dict[str, Tensor] = {}
    if cfg.tis_cap is not None:
        _require(batch.rollout_logp is not None, "tis_cap is set but batch.rollout_logp is None")
        assert batch.rollout_logp is not None
        w = torch.exp(_masked(batch.old_logp - batch.rollout_logp, mask).clamp(max=LOG_RATIO_CLAMP))
        pg = pg * w.clamp(max=cfg.tis_cap).detach()  # (N, T)
        metrics["tis_clipfrac"] = _sum_metric(w > cfg.tis_cap, mask, counts)
        metrics["tis_weight"] = _sum_metric(w.clamp(max=cfg.tis_cap), mask, counts)
    ctx = _AggContext(counts, cfg.max_len, batch.prompt_tokens)
    aggregate = AGGREGATORS[cfg.agg_mode]
    pg_loss = aggregate(pg, mask, ctx)
    loss = pg_loss
    if cfg.kl_coef > 0:
        _require(batch.ref_logp is not None, "kl_coef > 0 but batch.ref_logp is None")
        assert batch.ref_logp is not None
        kl = kl_penalty(batch.logp, batch.ref_logp, cfg.kl_estimator)  # (N, T)
        kl_loss = aggregate(kl, mask, ctx)
        loss = loss + cfg.kl_coef * kl_loss
        metrics["kl_loss"] = kl_loss.detach()
        metrics["kl"] = _sum_metric(kl, mask, counts)
    ratio = torch.exp(log_ratio.detach())  # (N, T)
    metrics["pg_loss"] = pg_loss.detach()
    metrics["pg_clipfrac"] = _sum_metric(clipped | dual, mask, counts)
    metrics["pg_clipfrac_low"] = _sum_metric(clipped & (ratio < 1), mask, counts)
    metrics["pg_clipfrac_high"] = _sum_metric(clipped & (ratio > 1), mask, counts)
    metrics["pg_clipfrac_dual"] = _sum_metric(dual, mask, counts)
    metrics["ratio_mean"] = _sum_metric(ratio, mask, counts)
    metrics["ppo_kl"] = _sum_metric(-log_ratio, mask, counts)
    if batch.logits is not None:
        metrics["entropy"] = _sum_metric(entropy_from_logits(batch.logits.detach()), mask, counts)
    return loss, metrics
