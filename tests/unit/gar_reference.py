"""Slow per-group pure-Python reference of the GAGAR math (docs/design.md §1), written straight from the
formulas, one group at a time, with no torch in the per-group code. Tests compare the vectorized
``gagar.trainer.gar`` against it; ``bench/advantages.py`` times it (loaded by path, so both use
this one copy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

INELIGIBLE, UNUSABLE, NONPOSITIVE, NONE = 1, 2, 3, 0


def grpo_group(
    rewards: list[float], valid: list[bool], std_normalize: bool = False, eps: float = 1e-6
) -> list[float]:
    """A_i = R_i − mean(R) [/ (std + eps)] over valid members; 0 elsewhere."""
    vals = [r for r, v in zip(rewards, valid, strict=True) if v]
    if not vals:
        return [0.0] * len(rewards)
    mean = sum(vals) / len(vals)
    std = 0.0
    if len(vals) > 1:
        std = math.sqrt(sum((r - mean) ** 2 for r in vals) / (len(vals) - 1))
    out = []
    for r, v in zip(rewards, valid, strict=True):
        a = (r - mean) if v else 0.0
        if v and std_normalize:
            a = a / (std + eps)
        out.append(a)
    return out


@dataclass
class GroupResult:
    adv: list[float]
    lam: float
    reason: int


def gar_group(
    rewards: list[float],
    passed: list[bool],
    valid: list[bool],
    factors: list[float],
    usable: bool,
    hacks: list[bool],
    lambda_max: float = 1.5,
    std_normalize: bool = False,
    eps: float = 1e-6,
    rescale: bool = True,
) -> GroupResult:
    """One group: hack zeroing, eligibility, GRPO, sum-preserving redistribution."""
    n = len(rewards)
    rewards = [0.0 if hacks[i] else rewards[i] for i in range(n)]
    n_valid = sum(valid)
    n_pass = sum(1 for i in range(n) if valid[i] and passed[i])
    adv = grpo_group(rewards, valid, std_normalize, eps)
    if not (n_valid >= 2 and 1 <= n_pass < n_valid):
        return GroupResult(adv, 1.0, INELIGIBLE)
    if not usable:
        return GroupResult(adv, 1.0, UNUSABLE)
    members = [i for i in range(n) if valid[i] and passed[i] and not hacks[i]]
    pass_sum = sum(adv[i] for i in members)
    mass = sum(factors[i] * adv[i] for i in members)
    if mass <= 0 or pass_sum <= 0:
        return GroupResult(adv, 1.0, NONPOSITIVE)
    lam = min(pass_sum / mass, lambda_max) if rescale else 1.0
    scaled = [lam * factors[i] * adv[i] if i in members else adv[i] for i in range(n)]
    mean = sum(scaled[i] for i in range(n) if valid[i]) / n_valid
    return GroupResult([scaled[i] - mean if valid[i] else 0.0 for i in range(n)], lam, NONE)


def gar_reference(
    rewards: torch.Tensor,
    passed: torch.Tensor,
    valid: torch.Tensor,
    factors: torch.Tensor,
    usable: torch.Tensor,
    hacks: torch.Tensor,
    **kwargs: float | bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Loop over groups; returns (adv (G, n), lam (G,), reason (G,)) as float64/int64 tensors."""
    rows = [
        gar_group(r, p, v, f, u, h, **kwargs)  # type: ignore[arg-type]
        for r, p, v, f, u, h in zip(
            rewards.tolist(),
            passed.tolist(),
            valid.tolist(),
            factors.tolist(),
            usable.tolist(),
            hacks.tolist(),
            strict=True,
        )
    ]
    adv = torch.tensor([g.adv for g in rows], dtype=torch.float64).reshape(rewards.shape)
    lam = torch.tensor([g.lam for g in rows], dtype=torch.float64)
    reason = torch.tensor([g.reason for g in rows], dtype=torch.int64)
    return adv, lam, reason


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def length_penalty_group(
    rewards: list[float],
    passed: list[bool],
    valid: list[bool],
    lengths: list[list[float]],
    x: float = 0.2,
    a: float = 0.5,
    delta: float = 0.0,
    s: float = 1.0,
    gamma: float = 1.5,
    b: float = 30.0,
) -> list[float]:
    """One group of the length penalty; ``lengths[i]`` lists member i's K length measures."""
    members = [i for i in range(len(rewards)) if valid[i] and passed[i]]
    if not members or len(members) / sum(valid) <= a:
        return list(rewards)
    k = len(lengths[0])
    refs = [max(1.0, percentile([lengths[i][j] for i in members], b)) for j in range(k)]
    out = list(rewards)
    for i in members:
        ratio = max(lengths[i][j] / refs[j] for j in range(k))
        z = min(1.0, max(0.0, (ratio - 1 - delta) / (s - delta)))
        out[i] = rewards[i] - x * z**gamma
    return out


def segment_group(
    adv: list[list[float]],
    mask: list[list[bool]],
    flagged: list[list[bool]],
    kappa: float = 2.0,
    alpha_max: float = 2.0,
    beta_min: float = 0.5,
) -> list[list[float]]:
    """One group (its trajectories' per-token advantages) of the segment shaping."""
    cells = [
        (i, t) for i in range(len(adv)) for t in range(len(adv[i])) if mask[i][t] and adv[i][t] != 0
    ]
    h_pos = sum(adv[i][t] for i, t in cells if adv[i][t] > 0 and flagged[i][t])
    c_pos = sum(adv[i][t] for i, t in cells if adv[i][t] > 0 and not flagged[i][t])
    h_neg = sum(-adv[i][t] for i, t in cells if adv[i][t] < 0 and flagged[i][t])
    c_neg = sum(-adv[i][t] for i, t in cells if adv[i][t] < 0 and not flagged[i][t])
    alpha = min(alpha_max, 1 + h_pos / c_pos) if c_pos > 0 else 1.0
    beta = max(beta_min, 1 - (kappa - 1) * h_neg / c_neg) if c_neg > 0 else 1.0
    out = [[0.0] * len(row) for row in adv]
    for i, t in cells:
        a, f = adv[i][t], flagged[i][t]
        if a > 0:
            out[i][t] = a * ((0.0 if f else alpha) if c_pos > 0 else 1.0)
        else:
            out[i][t] = a * ((kappa if f else beta) if c_neg > 0 else 1.0)
    return out
