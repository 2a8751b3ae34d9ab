"""From verified, graded groups to per-token advantages (pure glue over ``gagar.trainer.gar``).

GAGAR mode: length penalty on passes (before GRPO), hack zeroing, GRPO, sum-preserving
redistribution with the grader's quality factors, then segment shaping per token. GRPO mode (the
baseline): plain group-relative advantages of the raw test reward, broadcast to tokens, nothing
else — no grader, no shaping.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from gagar.rollout.agent import Trajectory
from gagar.spec import AlgorithmSpec
from gagar.trainer import gar
from gagar.wire import Ranking, Skipped

FALLBACK_NAMES = {int(f): f.name.lower() for f in gar.Fallback}


@dataclass
class Rollout:
    """One trajectory with its verification."""

    trajectory: Trajectory
    passed: bool
    valid: bool
    tampered: bool = False
    # passed the visible tests and failed held-back ones (``Task.held_back``): a label for
    # evaluation and grading, never the reward; False where the task holds none back
    overfit: bool = False
    patch: str = ""
    test_log: str = ""  # the tests' output (the candidate's code wrote it)
    notes: list[str] = field(default_factory=list)  # gagar's own notes on the verification
    skipped: list[Skipped] = field(default_factory=list)  # final files the grader will not see


@dataclass
class GroupBatch:
    """Advantages of G groups of n rollouts, with the facts that go into metrics."""

    adv: Tensor  # (G, n) trajectory advantages after redistribution
    result: gar.GarResult
    factors: Tensor  # (G, n)
    hacks: Tensor  # (G, n) bool
    usable: Tensor  # (G,) bool


def _tensors(groups: list[list[Rollout]]) -> tuple[Tensor, Tensor, Tensor]:
    passed = torch.tensor([[r.passed for r in g] for g in groups], dtype=torch.bool).reshape(
        len(groups), -1
    )
    valid = torch.tensor([[r.valid for r in g] for g in groups], dtype=torch.bool).reshape(
        len(groups), -1
    )
    lengths = torch.tensor(
        [[[r.trajectory.num_turns, r.trajectory.response_tokens] for r in g] for g in groups],
        dtype=torch.float64,
    ).reshape(len(groups), -1, 2)
    return passed, valid, lengths


def _ranking_inputs(
    rankings: list[Ranking | None], passed: Tensor, valid: Tensor, alg: AlgorithmSpec
) -> tuple[Tensor, Tensor, Tensor]:
    """factors (G, n), usable (G,), hacks (G, n) from the graders' rankings."""
    g, n = passed.shape
    factors, usable, hacks = (
        torch.ones(g, n),
        torch.zeros(g, dtype=torch.bool),
        torch.zeros(g, n, dtype=torch.bool),
    )
    for i, ranking in enumerate(rankings):
        if ranking is None:
            continue
        passes = [j for j in range(n) if passed[i, j] and valid[i, j]]
        if ranking.grader == "none":  # the grader gave up (unusable): GRPO, the screen's hacks
            if alg.hack_zeroing:  # zeroed all the same (a fallback is no way around them)
                for member in {h.member for h in ranking.hacks} & set(passes):
                    hacks[i, member] = True
            continue
        if ranking.check_complete(passes) is not None:
            continue  # a ranking that does not cover every pass exactly once is unusable
        try:
            factors[i] = torch.tensor(
                gar.quality_factors(ranking.tied_groups, n, alg.redistribution.quality_factors)
            )
        except ValueError:
            continue
        usable[i] = True
        if alg.hack_zeroing:
            for hack in ranking.hacks:
                hacks[i, hack.member] = True
    return factors, usable, hacks


def ranking_factors(
    groups: list[list[Rollout]], rankings: list[Ranking | None], alg: AlgorithmSpec
) -> Tensor:
    """Quality factors (G, n) the rankings give, in either mode: GRPO's advantages ignore them,
    its metrics (the bloated share of passes) measure with them."""
    passed, valid, _ = _tensors(groups)
    return _ranking_inputs(rankings, passed, valid, alg)[0]


def group_advantages(
    groups: list[list[Rollout]], rankings: list[Ranking | None], alg: AlgorithmSpec
) -> GroupBatch:
    """Trajectory advantages (G, n) for the groups (all of size n) and their rankings."""
    if not groups or len({len(g) for g in groups}) != 1:
        raise ValueError("groups must be non-empty and all of the same size")
    passed, valid, lengths = _tensors(groups)
    rewards = passed.to(torch.float64)
    gagar = alg.mode == "gagar"
    factors, usable, hacks = _ranking_inputs(
        rankings if gagar else [None] * len(groups), passed, valid, alg
    )
    lp = alg.length_penalty
    if gagar and lp.enabled:
        rewards = gar.length_penalty(rewards, passed & ~hacks, valid, lengths, lp)
    red = alg.redistribution
    result = gar.gar_advantages_with_stats(
        rewards, passed, valid, factors.to(torch.float64), usable, hacks,
        lambda_max=red.lambda_max, std_normalize=alg.std_normalize, eps=alg.eps, rescale=red.rescale,
    )  # fmt: skip
    return GroupBatch(result.adv, result, factors, hacks, usable)


def token_advantages(
    groups: list[list[Rollout]], adv: Tensor, alg: AlgorithmSpec
) -> list[list[float]]:
    """Per-token advantages of every rollout (row-major over groups): the trajectory advantage on
    generated tokens, 0 elsewhere, then segment shaping (GAGAR mode, when enabled)."""
    flat = [r for g in groups for r in g]
    width = max(len(r.trajectory.token_ids) for r in flat)
    mask = torch.zeros(len(flat), width, dtype=torch.bool)
    flagged = torch.zeros_like(mask)
    sp = alg.segment_penalty
    kinds = tuple(
        k
        for k, on in (
            ("redundant", sp.redundant_actions),
            ("tool_error", sp.tool_errors),
            ("churn", sp.churn),
        )
        if on
    )
    for i, r in enumerate(flat):
        t = r.trajectory
        mask[i, : len(t.loss_mask)] = torch.tensor(t.loss_mask, dtype=torch.bool)
        flagged[i, : len(t.token_ids)] = torch.tensor(t.flagged_mask(kinds), dtype=torch.bool)
    traj_adv = adv.reshape(-1).to(torch.float64)  # (N,)
    group_ids = torch.arange(len(groups)).repeat_interleave(len(groups[0]))
    if alg.mode == "gagar" and sp.enabled and kinds:
        per_token = gar.segment_shaping(traj_adv, mask, flagged, group_ids, sp)
    else:
        per_token = torch.where(mask, traj_adv[:, None], 0.0)
    return [per_token[i, : len(r.trajectory.token_ids)].tolist() for i, r in enumerate(flat)]
