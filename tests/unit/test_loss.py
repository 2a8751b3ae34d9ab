"""Tests of the policy loss (gagar/trainer/loss.py): hand vectors for PPO clip-higher and dual-clip,
every aggregation mode, truncated IS, KL estimators, micro-batch invariance of loss and gradient."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import get_args

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gagar.trainer.loss import (
    AGGREGATORS,
    AggMode,
    GlobalCounts,
    LossConfig,
    PolicyBatch,
    entropy_from_logits,
    global_counts,
    kl_penalty,
    policy_loss,
    ppo_clip,
    prompt_token_counts,
)

F64 = torch.float64
MODES: tuple[AggMode, ...] = get_args(AggMode)


def t(x: list) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


def test_registry_covers_every_mode() -> None:
    assert set(AGGREGATORS) == set(MODES)
    assert LossConfig().agg_mode == "prompt-mean"


def test_ppo_clip_hand_vectors() -> None:
    adv = t([[1.0, 1.0, -1.0, -1.0, -1.0]])
    ratio = t([[1.5, 0.5, 0.5, 5.0, 2.0]])
    loss, clipped, dual = ppo_clip(adv, ratio.log(), LossConfig())
    # A>0 r=1.5 -> clipped at 1.28; A>0 r=.5 -> unclipped; A<0 r=.5 -> clipped at .8;
    # A<0 r=5 -> dual-clip at c=3; A<0 r=2 -> plain ratio 2 (< c)
    torch.testing.assert_close(loss, t([[-1.28, -0.5, 0.8, 3.0, 2.0]]))
    assert clipped.tolist() == [[True, False, True, False, False]]
    assert dual.tolist() == [[False, False, False, True, False]]
    loss, _, dual = ppo_clip(adv, ratio.log(), LossConfig(dual_clip=None))
    assert loss[0, 3] == pytest.approx(5.0) and not dual.any()


def test_ppo_clip_gradients_vanish_where_clipped() -> None:
    log_ratio = t([[math.log(1.5), math.log(1.1), math.log(5.0)]]).requires_grad_()
    adv = t([[1.0, 1.0, -1.0]])
    loss, _, _ = ppo_clip(adv, log_ratio, LossConfig())
    loss.sum().backward()
    assert log_ratio.grad is not None
    torch.testing.assert_close(log_ratio.grad, t([[0.0, -1.1, 0.0]]))


def _hand_batch() -> tuple[PolicyBatch, torch.Tensor]:
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    gids = torch.tensor([0, 0, 1])
    zeros = torch.zeros(3, 4, dtype=F64)
    batch = PolicyBatch(
        logp=zeros, old_logp=zeros, adv=t([1.0, 2.0, 3.0]), mask=mask,
        prompt_tokens=prompt_token_counts(mask, gids),
    )  # fmt: skip
    return batch, gids


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", -13 / 6),  # (1 + 6 + 6) / 6 tokens
        ("seq-mean-token-mean", -2.0),  # (1 + 2 + 3) / 3 sequences
        ("seq-mean-token-sum-norm", -13 / 12),  # 13 / (max_len 4 · 3 sequences)
        ("prompt-mean", -19 / 8),  # (7/4 + 6/2) / 2 prompts
    ],
)
def test_aggregation_hand_vectors(mode: AggMode, expected: float) -> None:
    batch, gids = _hand_batch()
    loss, metrics = policy_loss(
        batch, global_counts(batch.mask, gids), LossConfig(agg_mode=mode, max_len=4)
    )
    assert loss.item() == pytest.approx(expected)
    assert metrics["pg_loss"].item() == pytest.approx(expected)


def test_global_counts_skip_empty_sequences() -> None:
    mask = torch.tensor([[1, 1], [0, 0], [1, 0], [0, 0]], dtype=torch.bool)
    counts = global_counts(mask, torch.tensor([0, 0, 1, 2]))
    assert (counts.num_tokens, counts.num_seqs, counts.num_prompts) == (3, 2, 2)
    assert prompt_token_counts(mask, torch.tensor([0, 0, 1, 2])).tolist() == [2, 2, 1, 0]


def test_truncated_importance_sampling() -> None:
    mask = torch.ones(1, 2, dtype=torch.bool)
    zeros = torch.zeros(1, 2, dtype=F64)
    rollout = t([[-math.log(3.0), -math.log(1.5)]])  # w = exp(old - rollout) = 3 (capped to 2), 1.5
    batch = PolicyBatch(logp=zeros, old_logp=zeros, adv=t([1.0]), mask=mask, rollout_logp=rollout)
    cfg = LossConfig(agg_mode="token-mean", tis_cap=2.0)
    loss, metrics = policy_loss(batch, GlobalCounts(2, 1, 1), cfg)
    assert loss.item() == pytest.approx(-(2.0 + 1.5) / 2)
    assert metrics["tis_clipfrac"].item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="rollout_logp"):
        policy_loss(replace(batch, rollout_logp=None), GlobalCounts(2, 1, 1), cfg)


def test_kl_estimators_hand_values() -> None:
    logp, ref = t([[math.log(0.5)]]), t([[math.log(0.25)]])  # log r = log 2
    lr = math.log(2.0)
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(lr)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * lr**2)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 + lr - 1)
    assert kl_penalty(ref, logp, "k3").item() >= 0


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_term_added_with_coefficient(estimator: str) -> None:
    mask = torch.ones(2, 3, dtype=torch.bool)
    logp = torch.randn(2, 3, dtype=F64, generator=torch.Generator().manual_seed(0))
    ref = torch.randn(2, 3, dtype=F64, generator=torch.Generator().manual_seed(1))
    batch = PolicyBatch(logp=logp, old_logp=logp, adv=t([1.0, -1.0]), mask=mask, ref_logp=ref)
    counts = GlobalCounts(6, 2, 1)
    base, _ = policy_loss(batch, counts, LossConfig(agg_mode="token-mean"))
    cfg = LossConfig(agg_mode="token-mean", kl_coef=0.1, kl_estimator=estimator)  # type: ignore[arg-type]
    loss, metrics = policy_loss(batch, counts, cfg)
    expected = base + 0.1 * kl_penalty(logp, ref, estimator).mean()  # type: ignore[arg-type]
    torch.testing.assert_close(loss, expected)
    assert "kl" in metrics and "kl_loss" in metrics


def test_entropy_metric() -> None:
    assert entropy_from_logits(torch.zeros(1, 1, 8)).item() == pytest.approx(math.log(8))
    mask = torch.tensor([[True, False]])
    logits = torch.zeros(1, 2, 4)
    logits[0, 1] = torch.tensor([100.0, 0, 0, 0])  # masked, would lower the mean if counted
    zeros = torch.zeros(1, 2)
    batch = PolicyBatch(logp=zeros, old_logp=zeros, adv=torch.ones(1), mask=mask, logits=logits)
    _, metrics = policy_loss(batch, GlobalCounts(1, 1, 1), LossConfig(agg_mode="token-mean"))
    assert metrics["entropy"].item() == pytest.approx(math.log(4))


def test_padding_garbage_does_not_poison_loss_or_grad() -> None:
    mask = torch.tensor([[True, False]])
    logp = torch.tensor([[-1.0, math.inf]], requires_grad=True)
    old = torch.tensor([[-1.0, -math.inf]])
    batch = PolicyBatch(logp=logp, old_logp=old, adv=torch.tensor([[1.0, math.nan]]), mask=mask)
    loss, _ = policy_loss(batch, GlobalCounts(1, 1, 1), LossConfig(agg_mode="token-mean"))
    loss.backward()
    assert torch.isfinite(loss) and logp.grad is not None and torch.isfinite(logp.grad).all()
    assert logp.grad.tolist() == [[-1.0, 0.0]]


def _random_batch(
    seed: int, n: int = 8, T: int = 6
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, T + 1, (n,), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    old = -torch.rand(n, T, generator=gen, dtype=F64) * 3
    fields = {
        "logp": (old + 0.4 * torch.randn(n, T, generator=gen, dtype=F64)).clamp(max=0),
        "old_logp": old,
        "adv": torch.randn(n, generator=gen, dtype=F64),
        "mask": mask,
        "rollout_logp": old + 0.3 * torch.randn(n, T, generator=gen, dtype=F64),
        "ref_logp": old + 0.3 * torch.randn(n, T, generator=gen, dtype=F64),
        "logits": torch.randn(n, T, 5, generator=gen, dtype=F64),
    }
    gids = torch.arange(n) % 3  # interleaved: a prompt's sequences span micro-batches
    return fields, gids


def _loss_and_grad(
    fields: dict[str, torch.Tensor], gids: torch.Tensor, cfg: LossConfig, splits: int
):
    logp = fields["logp"].clone().requires_grad_()
    counts = global_counts(fields["mask"], gids)
    prompt_tokens = prompt_token_counts(fields["mask"], gids)  # on the full batch
    total, metrics_total = torch.zeros((), dtype=F64), {}
    for idx in torch.arange(logp.shape[0]).chunk(splits):
        micro = {k: v[idx] for k, v in fields.items() if k != "logp"}
        batch = PolicyBatch(logp=logp[idx], prompt_tokens=prompt_tokens[idx], **micro)
        loss, metrics = policy_loss(batch, counts, cfg)
        loss.backward()
        total = total + loss.detach()
        for k, v in metrics.items():
            metrics_total[k] = metrics_total.get(k, 0.0) + v
    return total, logp.grad, metrics_total


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("extras", [{}, {"tis_cap": 1.5, "kl_coef": 0.05, "kl_estimator": "k3"}])
def test_micro_batching_does_not_change_loss_or_gradient(mode: AggMode, extras: dict) -> None:
    fields, gids = _random_batch(seed=3)
    cfg = LossConfig(agg_mode=mode, max_len=6, **extras)
    full_loss, full_grad, full_metrics = _loss_and_grad(fields, gids, cfg, 1)
    assert full_grad is not None and full_grad.abs().sum() > 0
    for splits in (2, 4):
        loss, grad, metrics = _loss_and_grad(fields, gids, cfg, splits)
        torch.testing.assert_close(loss, full_loss)
        torch.testing.assert_close(grad, full_grad)
        for k in ("pg_clipfrac", "pg_clipfrac_dual", "ratio_mean", "ppo_kl", "entropy"):
            torch.testing.assert_close(metrics[k], full_metrics[k])


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(MODES), st.sampled_from([2, 3, 5]))
def test_micro_batching_property(seed: int, mode: AggMode, splits: int) -> None:
    fields, gids = _random_batch(seed, n=10)
    if not fields["mask"].any():
        return
    cfg = LossConfig(agg_mode=mode, max_len=6, tis_cap=2.0)
    full_loss, full_grad, _ = _loss_and_grad(fields, gids, cfg, 1)
    loss, grad, _ = _loss_and_grad(fields, gids, cfg, splits)
    torch.testing.assert_close(loss, full_loss)
    torch.testing.assert_close(grad, full_grad)


def test_prompt_mean_weights_prompts_equally() -> None:
    """A prompt with many tokens counts as much as a prompt with few (unlike token-mean)."""
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    gids = torch.tensor([0, 1])
    zeros = torch.zeros(2, 4, dtype=F64)
    batch = PolicyBatch(zeros, zeros, t([1.0, -1.0]), mask, prompt_token_counts(mask, gids))
    counts = global_counts(mask, gids)
    assert policy_loss(batch, counts)[0].item() == pytest.approx(0.0)
    assert policy_loss(batch, counts, LossConfig(agg_mode="token-mean"))[0].item() == pytest.approx(
        -3 / 5
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"agg_mode": "mean"}, "agg_mode"),
        ({"kl_estimator": "k4"}, "kl_estimator"),
        ({"eps_low": 1.0}, "eps_low"),
        ({"eps_high": -0.1}, "eps_high"),
        ({"dual_clip": 1.0}, "dual_clip"),
        ({"kl_coef": -1.0}, "kl_coef"),
        ({"tis_cap": 0.0}, "tis_cap"),
        ({"agg_mode": "seq-mean-token-sum-norm"}, "max_len"),
    ],
)
def test_config_rejects(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LossConfig(**kwargs)


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf])
def test_counts_reject(bad: float) -> None:
    with pytest.raises(ValueError, match="must be finite and > 0"):
        GlobalCounts(bad, 1, 1)


def test_batch_rejects() -> None:
    batch, gids = _hand_batch()
    counts = global_counts(batch.mask, gids)
    cases = [
        (replace(batch, prompt_tokens=None), LossConfig(), "prompt_tokens"),
        (replace(batch, prompt_tokens=torch.ones(3)), LossConfig(), "global batch"),
        (replace(batch, logp=torch.zeros(3, 5)), LossConfig(), "logp has shape"),
        (replace(batch, adv=torch.ones(4)), LossConfig(), "adv has shape"),
        (replace(batch, adv=t([1.0, math.nan, 1.0])), LossConfig(), "adv is not finite"),
        (replace(batch, old_logp=torch.full((3, 4), math.nan)), LossConfig(), "not finite"),
        (replace(batch, mask=batch.mask.float()), LossConfig(), "mask must be bool"),
        (batch, LossConfig(kl_coef=0.1), "ref_logp"),
        (replace(batch, logits=torch.zeros(3, 5, 2)), LossConfig(), "logits"),
    ]
    for b, cfg, match in cases:
        with pytest.raises(ValueError, match=match):
            policy_loss(b, counts, cfg)
