"""The learner as a PPO trainer: mini-batches and epochs over the behaviour policy's log-probs,
the clips, truncated IS, the frozen reference for KL, the learning-rate schedule and an exact
resume."""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import replace

import pytest
import torch

from gagar.trainer.checkpoint import CheckpointManager
from gagar.trainer.distributed import RankState
from gagar.trainer.learner import Learner, LearnerConfig, Sample
from gagar.trainer.loss import (
    LossConfig,
    PolicyBatch,
    global_counts,
    policy_loss,
    prompt_token_counts,
)
from gagar.trainer.schedule import LRSchedule
from tests.unit.test_learner import TinyLM, _samples


def _learner(model: TinyLM, lr=0.05, reference=None, **cfg) -> Learner:
    """AdamW at ``lr`` (a number, or an ``LRSchedule`` the learner applies per RL step)."""
    loss = cfg.pop("loss", LossConfig())
    schedule = lr if isinstance(lr, LRSchedule) else None
    opt = torch.optim.AdamW(model.parameters(), lr=schedule.lr if schedule else lr)
    cfg = LearnerConfig(2, 1.0, loss, lr=schedule, **cfg)
    return Learner(model, opt, cfg, reference=reference)


def _params(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _todays_update(model: TinyLM, samples: list[Sample], mb: int, lr: float) -> None:
    """The learner's single-update path as it was before mini-batches: one optimizer step, the
    ratio's old log-prob the same forward's, detached; micro-batches padded to their longest."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    width = max(len(s.token_ids) for s in samples)

    def pad(rows, dtype):
        out = torch.zeros(len(rows), width, dtype=dtype)
        for i, r in enumerate(rows):
            out[i, : len(r)] = torch.tensor(r, dtype=dtype)
        return out

    mask = pad([s.loss_mask for s in samples], torch.long).bool()
    groups = torch.tensor([s.group for s in samples])
    counts, prompt = global_counts(mask, groups), prompt_token_counts(mask, groups)
    opt.zero_grad(set_to_none=True)
    for start in range(0, len(samples), mb):
        part = samples[start : start + mb]
        w = max(len(s.token_ids) for s in part)
        ids = pad([s.token_ids for s in part], torch.long)[:, :w]
        logp, _ = model.token_logprobs(ids, None)
        batch = PolicyBatch(
            logp=logp,
            old_logp=logp.detach(),
            adv=pad([s.advantages for s in part], torch.float32)[:, :w],
            mask=pad([s.loss_mask for s in part], torch.long).bool()[:, :w],
            prompt_tokens=prompt[start : start + mb],
            rollout_logp=pad([s.rollout_logprobs for s in part], torch.float32)[:, :w],
        )
        loss, _ = policy_loss(batch, counts, LossConfig())
        loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norm = float(
        torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    )
    if 1.0 / (norm + 1e-6) < 1.0:
        for g in grads:
            g.mul_(1.0 / (norm + 1e-6))
    opt.step()


def test_one_mini_batch_one_epoch_is_bit_identical_to_the_single_update() -> None:
    torch.manual_seed(0)
    base = TinyLM()
    mine, today = copy.deepcopy(base), copy.deepcopy(base)
    metrics = _learner(mine).update(_samples())
    _todays_update(today, _samples(), 2, 0.05)
    for p, q in zip(mine.parameters(), today.parameters(), strict=True):
        assert torch.equal(p, q)
    assert metrics["ratio_max"] == 1.0 and metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["pg_clipfrac"] == 0.0
    assert metrics["optimizer_steps"] == 1


def test_second_mini_batch_sees_the_moved_policy() -> None:
    torch.manual_seed(0)
    base = TinyLM()
    single = _learner(copy.deepcopy(base)).update(_samples())
    two = _learner(copy.deepcopy(base), mini_batches=2).update(_samples())
    assert single["ratio_max"] == 1.0
    assert two["optimizer_steps"] == 2
    assert two["ratio_max"] != 1.0 and two["ratio_mean"] != 1.0
    epochs = _learner(copy.deepcopy(base), mini_batches=2, epochs=3).update(_samples())
    assert epochs["optimizer_steps"] == 6 and epochs["micro_batches"] == 3 * 4
    assert epochs["tokens_trained"] == single["tokens_trained"]


class Spy(TinyLM):
    """Records, per forward, whether it built a graph and how many optimizer steps preceded it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[bool, int]] = []
        self.steps = 0

    def token_logprobs(self, input_ids, attention_mask):
        self.calls.append((torch.is_grad_enabled(), self.steps))
        return super().token_logprobs(input_ids, attention_mask)


def test_behaviour_logprobs_are_computed_once_before_the_first_update() -> None:
    torch.manual_seed(0)
    model = Spy()
    learner = _learner(model, mini_batches=2, epochs=2)

    def count(*_args) -> None:
        model.steps += 1

    learner.optimizer.register_step_post_hook(count)
    learner.update(_samples())
    scoring = [steps for grad, steps in model.calls if not grad]
    # 8 samples, 2 mini-batches of 2 micro-batches: every micro-batch scored once (epochs > 1
    # needs the first mini-batch's too), all before the first optimizer step
    assert scoring == [0, 0, 0, 0]
    assert len([1 for grad, _ in model.calls if grad]) == 2 * 2 * 2


def test_a_crafted_batch_triggers_each_clip() -> None:
    """Tokens with ratio 0.5 (A < 0: lower clip), 1.5 (A > 0: upper clip), 4 (A < 0: dual-clip)
    and 1 (nothing): each fraction is one token in four."""
    ratio = torch.tensor([[0.5, 1.5, 4.0, 1.0]])
    adv = torch.tensor([[-1.0, 1.0, -1.0, 1.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    old = torch.full((1, 4), -1.0)
    batch = PolicyBatch(
        logp=old + ratio.log(), old_logp=old, adv=adv, mask=mask, prompt_tokens=torch.tensor([4.0])
    )
    counts = global_counts(mask, torch.tensor([0]))
    _, m = policy_loss(batch, counts, LossConfig(eps_low=0.2, eps_high=0.28, dual_clip=3.0))
    assert float(m["pg_clipfrac_low"]) == 0.25
    assert float(m["pg_clipfrac_high"]) == 0.25
    assert float(m["pg_clipfrac_dual"]) == 0.25
    assert float(m["pg_clipfrac"]) == 0.75
    assert float(m["ratio_mean"]) == pytest.approx((0.5 + 1.5 + 4 + 1) / 4)


def test_epochs_with_a_large_step_make_the_clips_act() -> None:
    torch.manual_seed(0)
    metrics = _learner(TinyLM(), lr=0.3, mini_batches=2, epochs=4).update(_samples())
    assert metrics["pg_clipfrac"] > 0 and metrics["ratio_max"] > 1.28


def test_truncated_is_weights_by_the_rollout_engines_logprobs() -> None:
    torch.manual_seed(0)
    base = TinyLM()
    # the engine's log-probs (-4) are far below the trainer's (about -2.4 over 11 tokens), so
    # exp(old − rollout) ≈ 5 is capped at 2 on (nearly) every token
    samples = [replace(s, rollout_logprobs=[-4.0] * len(s.token_ids)) for s in _samples()]
    plain = copy.deepcopy(base)
    _learner(plain).update(samples)
    capped = copy.deepcopy(base)
    metrics = _learner(capped, loss=LossConfig(tis_cap=2.0)).update(samples)
    assert 1.5 < metrics["tis_weight"] <= 2.0 and metrics["tis_clipfrac"] > 0.5
    assert any(
        not torch.equal(p, q) for p, q in zip(plain.parameters(), capped.parameters(), strict=True)
    )


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_to_the_frozen_reference(estimator: str) -> None:
    torch.manual_seed(0)
    model = TinyLM()
    reference = copy.deepcopy(model)
    start = _params(model)
    loss = LossConfig(kl_coef=0.05, kl_estimator=estimator)  # type: ignore[arg-type]
    learner = _learner(model, loss=loss, reference=reference)
    first = learner.update(_samples(), 0)
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)  # one mini-batch: policy = reference
    second = learner.update(_samples(), 1)
    assert second["kl"] != 0.0 and (estimator == "k1" or second["kl"] > 0)
    assert all(not p.requires_grad for p in reference.parameters())
    for p, q in zip(reference.parameters(), start, strict=True):
        assert torch.equal(p, q)  # frozen: the updates never touched it


def test_kl_needs_a_reference() -> None:
    with pytest.raises(ValueError, match="reference"):
        _learner(TinyLM(), loss=LossConfig(kl_coef=0.1))


def test_gradient_variance_is_absent_for_one_micro_batch_and_scale_free_beside() -> None:
    torch.manual_seed(0)
    opt_model = TinyLM()
    one = Learner(opt_model, torch.optim.SGD(opt_model.parameters(), lr=0.1), LearnerConfig(8))
    metrics = one.update(_samples())
    assert "gradient_variance" not in metrics and "gradient_variance_scaled" not in metrics
    assert "gradient_noise_scale" not in metrics  # one batch size: no noise-scale estimate
    many = _learner(TinyLM()).update(_samples())
    var, norm = many["gradient_variance"], many["gradient_mean_norm"]
    assert many["gradient_variance_scaled"] == pytest.approx(var / norm**2)
    # the noise scale is tr Σ / ‖G‖², positive wherever ‖G‖² came out > 0
    assert many.get("gradient_noise_scale", 1.0) > 0


def test_schedule_warms_up_then_holds_or_decays() -> None:
    const = LRSchedule(1.0, warmup_steps=4, schedule="constant", total_steps=10)
    assert [const(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cos = LRSchedule(1.0, warmup_steps=2, schedule="cosine", min_lr=0.1, total_steps=10)
    lrs = [cos(s) for s in range(10)]
    assert lrs[:3] == [0.5, 1.0, 1.0]
    assert all(a > b for a, b in itertools.pairwise(lrs[2:]))
    assert lrs[-1] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 7 / 8)))
    assert cos(100) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        LRSchedule(1.0, min_lr=2.0)


def _rank(tmp, model: TinyLM, reference: TinyLM, schedule: LRSchedule) -> RankState:
    loss = LossConfig(kl_coef=0.05)
    learner = _learner(model, loss=loss, reference=reference, lr=schedule, mini_batches=2)
    return RankState(model, learner, CheckpointManager(tmp))


def test_resume_continues_lr_weights_and_keeps_the_start_policy_as_reference(tmp_path) -> None:
    """Five steps in one go against three, a checkpoint, and two more in a new process-like
    state: the same learning rates, bit-identical weights, and the reference is the start
    policy, not the resumed one."""
    schedule = LRSchedule(0.05, warmup_steps=2, schedule="cosine", min_lr=0.01, total_steps=5)
    torch.manual_seed(0)
    start = TinyLM()
    straight = _rank(tmp_path / "a", copy.deepcopy(start), copy.deepcopy(start), schedule)
    lrs = [straight.update(_samples(), s)["lr"] for s in range(5)]
    assert lrs[0] < lrs[1] and lrs == [schedule(s) for s in range(5)]

    first = _rank(tmp_path / "b", copy.deepcopy(start), copy.deepcopy(start), schedule)
    resumed_lrs = [first.update(_samples(), s)["lr"] for s in range(3)]
    first.save(3, {})
    torch.manual_seed(123)  # a new process: other initial weights, its own "start"
    other = TinyLM()
    again = _rank(tmp_path / "b", copy.deepcopy(other), copy.deepcopy(other), schedule)
    again.restore(3)
    for p, q in zip(again.learner.reference.parameters(), start.parameters(), strict=True):
        assert torch.equal(p, q)
    resumed_lrs += [again.update(_samples(), s)["lr"] for s in range(3, 5)]
    assert resumed_lrs == lrs
    for p, q in zip(again.model.parameters(), straight.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_token_budget_micro_batches_pad_less_and_update_the_same() -> None:
    """Samples of mixed lengths: by count, a micro-batch pads to its longest of a random few; by
    token budget, longest first, so fewer padded positions, and the same update (the loss is a
    sum over micro-batches, normalized by mini-batch counts)."""
    from tests.unit.test_learner import CountingLM

    g = torch.Generator().manual_seed(3)
    samples = []
    for i in range(8):
        n = (4, 20)[i % 2]  # short and long interleaved
        ids = torch.randint(0, 11, (n,), generator=g).tolist()
        samples.append(Sample(ids, [0] + [1] * (n - 1), [-2.0] * n, [(-1.0) ** i] * n, i // 2))
    torch.manual_seed(0)
    base = CountingLM()
    by_count, by_tokens = copy.deepcopy(base), copy.deepcopy(base)
    a = _learner(by_count).update(samples)
    b = _learner(by_tokens, micro_batch_tokens=40).update(samples)
    padded = [sum(r * w for r, w in m.shapes) for m in (by_count, by_tokens)]
    assert by_count.shapes == [(2, 20)] * 4
    assert by_tokens.shapes == [(2, 20), (2, 20), (2, 4), (2, 4)]  # at most 2 rows, 40 tokens
    assert padded == [160, 96]
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    for p, q in zip(by_count.parameters(), by_tokens.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)
