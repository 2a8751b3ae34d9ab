"""``bench/replay_noise.py``: its batch assembly from a Gram matrix equals the trainer's tracker,
and a replay row round-trips into the trainer's rollouts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bench import replay_noise as rn
from gagar.trainer.gradvar import GradVarianceTracker


@pytest.mark.parametrize("agg", ["prompt-mean", "token-mean"])
def test_gram_assembly_equals_the_trainers_tracker(agg: str) -> None:
    rng = np.random.default_rng(0)
    u = rng.normal(size=(6, 40)) + 0.5  # per-group gradients (the group alone), a common direction
    tokens = rng.integers(20, 200, size=6).astype(float)
    gram = u @ u.T
    ids = np.array([[0, 2, 3, 5], [1, 2, 4, 5]])
    got = rn.noise_parts(gram, tokens, ids, agg)
    for row, batch in zip(got, ids, strict=True):
        p = torch.nn.Parameter(torch.zeros(40, dtype=torch.float64))
        tracker = GradVarianceTracker([p])
        scale = rn.contribution_scale(agg, tokens[batch][None, :], len(batch))[0]
        acc = torch.zeros(40, dtype=torch.float64)
        for j, s in zip(batch, scale, strict=True):  # the trainer: one micro-batch per group
            acc = acc + s * torch.from_numpy(u[j])
            p.grad = acc.clone()
            tracker.after_micro_batch(float(s))  # its share: proportional to its weight
        trace, signal, _ = tracker.noise(float(tokens[batch].sum()))
        assert row == pytest.approx([trace, signal], rel=1e-6)  # the tracker sums in float32


def test_an_unsupported_aggregation_is_refused() -> None:
    with pytest.raises(SystemExit, match="seq-mean-token-sum-norm"):
        rn.contribution_scale("seq-mean-token-sum-norm", np.ones((1, 2)), 2)


def test_a_replay_row_round_trips_into_rollouts_and_a_ranking() -> None:
    from gagar.driver.advantages import Rollout
    from gagar.rollout.agent import Trajectory, Turn
    from gagar.wire import Ranking, TiedGroup

    traj = Trajectory(
        [1, 2, 3, 4, 5],
        [0.0] * 5,
        [0, 0, 1, 1, 1],
        2,
        [],
        [Turn(2, 5, "x", None, None, {"redundant"})],
        "submitted",
    )
    rollouts = [Rollout(traj, True, True), Rollout(traj, False, True, tampered=True)]
    ranking = Ranking(tied_groups=[TiedGroup(members=[0], tier="T1")], grader="heuristic")
    row = rn.to_row("t", ["clean", "wrong"], rollouts, ranking)
    back, rank = rn.from_row(row)
    assert rank == ranking
    assert [(r.passed, r.valid, r.tampered) for r in back] == [
        (True, True, False),
        (False, True, True),
    ]
    t = back[0].trajectory
    assert (t.token_ids, t.loss_mask, t.prompt_len, t.exit_reason) == (
        [1, 2, 3, 4, 5],
        [0, 0, 1, 1, 1],
        2,
        "submitted",
    )
    assert t.flagged_mask(("redundant",)) == traj.flagged_mask(("redundant",))


def test_group_level_signal_and_trace_are_the_unbiased_estimates() -> None:
    rng = np.random.default_rng(1)
    u = rng.normal(size=(7, 30)) + 0.3
    ids = np.array([0, 1, 3, 4, 6])
    gram = np.zeros((14, 14))  # two arms' rows, as the bench's Gram matrix holds them
    gram[:7, :7] = u @ u.T
    signal, trace = rn.group_signal(gram, ids)
    x = u[ids]
    total = x.sum(axis=0)
    assert signal == pytest.approx((total @ total - (x * x).sum()) / (5 * 4))
    assert trace == pytest.approx(x.var(axis=0, ddof=1).sum())
    # a bootstrap resample repeating a group: its repeat is not a second sample of the signal
    again, _ = rn.group_signal(gram, np.array([0, 0, 1, 1]))
    assert again == pytest.approx(gram[0, 1])  # not contaminated by ‖u_0‖² or ‖u_1‖²


def test_common_target_numbers_equal_the_explicit_vectors() -> None:
    """``target_stats`` from the Gram matrix equals the vectors' own formulas: GRPO against its own
    mean has bias 0, and the reinforce target weighs each group's GRPO gradient by n_j / n̄."""
    rng = np.random.default_rng(2)
    n = 6
    grpo = rng.normal(size=(n, 30)) + 0.8
    gagar = grpo + rng.normal(size=(n, 30)) * 0.5 + 0.3
    tokens = rng.integers(100, 600, size=n).astype(float)
    u = np.vstack([grpo, gagar])
    got = rn.target_stats(u @ u.T, np.concatenate([tokens, tokens]), np.arange(n), 4)
    w = tokens / tokens.mean()

    def unbiased_sq(d: np.ndarray) -> float:  # ‖E d‖²: ‖d̄‖² − tr Cov(d) / n
        return float(d.mean(0) @ d.mean(0) - d.var(0, ddof=1).sum() / n)

    for arm, x in (("grpo", grpo), ("gagar", gagar)):
        row = got["arms"][arm]
        trace = x.var(0, ddof=1).sum()
        assert row["trace_cov_group"] == pytest.approx(trace)
        assert row["trace_cov_token"] == pytest.approx(trace * tokens.mean())
        assert row["bias_sq_grpo_expected"] == pytest.approx(unbiased_sq(x - grpo), abs=1e-9)
        assert row["bias_sq_reinforce"] == pytest.approx(unbiased_sq(x - w[:, None] * grpo))
        assert row["mse_reinforce_4_groups"] == pytest.approx(
            trace / 4 + unbiased_sq(x - w[:, None] * grpo)
        )
    assert got["arms"]["grpo"]["bias_sq_grpo_expected"] == pytest.approx(0.0, abs=1e-9)
    ratio = got["gagar_over_grpo"]["trace_cov_group"]
    assert ratio == pytest.approx(gagar.var(0, ddof=1).sum() / grpo.var(0, ddof=1).sum())
    cross = (grpo.sum(0) @ gagar.sum(0) - (grpo * gagar).sum()) / (n * (n - 1))
    want = cross / math.sqrt(unbiased_sq(grpo) * unbiased_sq(gagar))
    assert got["cos_arms"] == pytest.approx(want)
