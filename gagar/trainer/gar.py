"""GAGAR advantage math (docs/design.md §1, steps 1-7): pure, torch-only, vectorized over groups.

Groups are ``(G, n)`` tensors (G groups of n trajectories) with bool masks; nothing here loops over
groups in Python. For one group with valid members V, raw passes P₀ = V ∧ passed and confirmed
hacks H ⊆ P₀, the passes that take part are P = P₀ \\ H, and:

1. hack zeroing      R_i ← 0 for i ∈ H (before any statistic; i leaves P)
2. eligibility       |V| ≥ 2  ∧  |P₀| ≥ 1  ∧  |V \\ P₀| ≥ 1          (raw test outcome)
3. GRPO              A_i = R_i − mean_V(R)    [ / (std_V(R) + ε), unbiased std, optional ]
5. quality factors   first T1 group 1.0, other T1 0.9, T2 linear 0.85 → 0.4 by rank, T3 0.2
6. redistribution    λ = min(Σ_P A_j / Σ_P f_j·A_j, λ_max),  A'_i = λ·f_i·A_i (i ∈ P) else A_i,
                     A_new = A' − mean_V(A')
7. length penalty    R_i ← R_i − X·clip((ℓ_i/ℓ* − 1 − δ)/(s − δ), 0, 1)^γ  on passes of groups
                     with pass rate > A, ℓ* = B-th percentile of the passing lengths
   segment shaping   positive tokens: flagged → 0, clean × α, α = min(α_max, 1 + Σ_{H+}A/Σ_{C+}A);
                     negative tokens: flagged × κ, clean × β, β = max(β_min, 1 − (κ−1)·Σ_{H−}|A|/Σ_{C−}|A|)

When λ < λ_max the passes keep their total advantage, failures are untouched before recentring and
the recentring is a no-op (mean stays 0): credit only moves from worse passes to better ones.

Departures from the paper and docs/design.md §1, all deliberate:

1. Redistribution is also skipped when Σ_P A ≤ 0 (docs/design.md §1.6 names only Σ_P f·A ≤ 0): λ would be ≤ 0
   and flip the sign of every pass. Counted as ``NONPOSITIVE_MASS``; impossible with 0/1 rewards.
2. A group with exactly one valid member gets A = 0 (verl returns the raw score for singleton
   groups by using mean 0, std 1). Such groups are ineligible anyway.
3. Eligibility counts hacks as passes (raw test outcome, docs/design.md §1.2: the grader only sees
   eligible groups, so hacks are only ever known for eligible groups); P excludes them.
4. Groups that are not redistributed return A itself (bit-identical plain GRPO), not A − mean(A).
5. Positions that take no part are ignored even when NaN: rewards of invalid members, factors
   outside P or in groups that are not redistributed, lengths of non-passes. NaN/inf where a value
   is used raises ``ValueError``; nothing returns NaN silently.
6. Length penalty: ℓ* is floored at 1 (lengths are counts; avoids ℓ* = 0), the percentile is the
   linear-interpolation one (numpy's default), and with K length measures (turns, tokens, ...) the
   largest ratio counts (the penalty is monotone in the ratio).
7. Segment shaping takes the sign per token (for a broadcast trajectory advantage that is the
   trajectory's sign). A side with no clean mass in a group (Σ_C = 0) is left unchanged, since its
   mass could not be conserved.
8. Tied groups must have non-decreasing tiers along the ranking (T1 … T2 … T3); anything else is
   malformed (``ValueError``; the caller treats the ranking as unusable).
9. A confirmed hack must be a valid pass; a hack flag elsewhere is a mapping bug (``ValueError``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from enum import IntEnum
from typing import Any, NamedTuple

import torch
from torch import Tensor

# The parameters are the spec's own objects (defaults and ranges validated there, once).
from gagar.spec import LengthPenalty, QualityFactors, SegmentPenalty

_TIERS = {"T1": 0, "T2": 1, "T3": 2}
_DEFAULT_FACTORS = QualityFactors()
_DEFAULT_LENGTH_PENALTY = LengthPenalty()
_DEFAULT_SEGMENT_PENALTY = SegmentPenalty()


class Fallback(IntEnum):
    """Why a group kept its plain GRPO advantages (``NONE``: it was redistributed)."""

    NONE = 0
    INELIGIBLE = 1
    UNUSABLE = 2
    NONPOSITIVE_MASS = 3


class GarResult(NamedTuple):
    """Advantages with the per-group facts the trainer exports as metrics."""

    adv: Tensor  # (G, n) final advantages, 0 at invalid members
    adv_before: Tensor  # (G, n) plain GRPO advantages (after hack zeroing)
    lam: Tensor  # (G,) λ used; 1.0 where the group was not redistributed
    capped: Tensor  # (G,) bool, λ hit λ_max
    fallback: Tensor  # (G,) int64 Fallback code
    eligible: Tensor  # (G,) bool


# ---------------------------------------------------------------- validation


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _check_mask(name: str, mask: Any, shape: Sequence[int]) -> None:
    _require(isinstance(mask, Tensor), f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    _require(mask.dtype == torch.bool, f"{name} must be a bool tensor, got dtype {mask.dtype}")
    _require(
        tuple(mask.shape) == tuple(shape),
        f"{name} has shape {tuple(mask.shape)}, expected {tuple(shape)}",
    )


def _require_none(bad: Tensor, message: str) -> None:
    """Raise when any entry of ``bad`` is set, naming the first few offending positions (the
    positions are only computed on failure: this check runs on every training step)."""
    if bool(bad.any()):
        raise ValueError(f"{message} at {bad.nonzero().tolist()[:5]}")


def _check_finite(name: str, x: Tensor, where: Tensor) -> None:
    _require_none(where & ~torch.isfinite(x), f"non-finite {name}")


def _check_rewards(rewards: Any, valid: Any) -> None:
    _require(isinstance(rewards, Tensor), "rewards must be a torch.Tensor")
    _require(rewards.is_floating_point(), f"rewards must be floating point, got {rewards.dtype}")
    _require(rewards.dim() == 2, f"rewards must be (G, n), got shape {tuple(rewards.shape)}")
    _check_mask("valid", valid, rewards.shape)
    _check_finite("reward at valid member", rewards, valid)


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:  # (G, n), (G, n) -> (G, 1)
    total = torch.where(mask, x, 0).sum(-1, keepdim=True)
    return total / mask.sum(-1, keepdim=True).clamp(min=1)


# ---------------------------------------------------------------- steps 2-3


def grpo_advantages(
    rewards: Tensor, valid: Tensor, *, std_normalize: bool = False, eps: float = 1e-6
) -> Tensor:
    """A_i = R_i − mean_V(R) [/ (std_V(R) + ε)] over valid members; 0 at invalid members."""
    _check_rewards(rewards, valid)
    _require(eps > 0 and math.isfinite(eps), f"eps must be finite and > 0, got {eps}")
    count = valid.sum(-1, keepdim=True)  # (G, 1)
    adv = torch.where(valid, rewards - _masked_mean(rewards, valid), 0)  # (G, n)
    if std_normalize:  # unbiased, as verl and TRL; one member: A = 0 already
        var = adv.square().sum(-1, keepdim=True) / (count - 1).clamp(min=1)  # (G, 1)
        adv = adv / (var.sqrt() + eps)  # (G, n)
    return adv


def eligible_groups(passed: Tensor, valid: Tensor) -> Tensor:
    """≥ 2 valid members, ≥ 1 valid pass and ≥ 1 valid fail (raw test outcome). Returns (G,)."""
    _require(isinstance(valid, Tensor) and valid.dim() == 2, "valid must be a (G, n) tensor")
    _check_mask("valid", valid, valid.shape)
    _check_mask("passed", passed, valid.shape)
    n_valid = valid.sum(-1)  # (G,)
    n_pass = (passed & valid).sum(-1)  # (G,)
    return (n_valid >= 2) & (n_pass >= 1) & (n_pass < n_valid)


# ---------------------------------------------------------------- step 5


def _as_pair(group: Any) -> tuple[str, list[int]]:
    """Accept ``(tier, members)`` pairs and objects with ``.tier``/``.members`` (wire.TiedGroup)."""
    if hasattr(group, "tier") and hasattr(group, "members"):
        return group.tier, list(group.members)
    _require(
        isinstance(group, tuple | list) and len(group) == 2,
        f"tied group must be (tier, [members]), got {group!r}",
    )
    tier, members = group
    _require(
        isinstance(members, Iterable), f"members of tied group must be a list, got {members!r}"
    )
    return tier, list(members)


def _check_tied_groups(groups: list[tuple[str, list[int]]], n: int) -> None:
    seen: set[int] = set()
    last_tier = 0
    for k, (tier, members) in enumerate(groups):
        _require(tier in _TIERS, f"tied group {k}: unknown tier {tier!r} (expected T1, T2 or T3)")
        _require(
            _TIERS[tier] >= last_tier, f"tied group {k}: tier {tier} ranked below a worse tier"
        )
        last_tier = _TIERS[tier]
        _require(len(members) > 0, f"tied group {k} ({tier}) is empty")
        for m in members:
            ok = isinstance(m, int) and not isinstance(m, bool) and 0 <= m < n
            _require(ok, f"tied group {k}: member {m!r} is not an index in [0, {n})")
            _require(m not in seen, f"tied group {k}: member {m} appears more than once")
            seen.add(m)


def _tier_factors(tiers: list[str], q: QualityFactors) -> list[float]:
    n_t2 = tiers.count("T2")
    out: list[float] = []
    seen_t1, k_t2 = False, 0
    for tier in tiers:
        if tier == "T1":
            out.append(q.t1_other if seen_t1 else q.t1_first)
            seen_t1 = True
        elif tier == "T2":
            frac = k_t2 / (n_t2 - 1) if n_t2 > 1 else 0.0
            out.append(q.t2_high + (q.t2_low - q.t2_high) * frac)
            k_t2 += 1
        else:
            out.append(q.t3)
    return out


def quality_factors(
    tied_groups: Iterable[Any], n: int, q: QualityFactors = _DEFAULT_FACTORS
) -> list[float]:
    """Factor per member from the grader's ordered tied groups; 1.0 for members not listed.

    ``q``: the factor per tier (``spec.algorithm.redistribution.qualityFactors``). Malformed groups
    (unknown tier, out-of-range index, duplicate, empty group, tiers out of order) raise ValueError.
    """
    _require(isinstance(n, int) and n >= 0, f"n must be a non-negative int, got {n!r}")
    groups = [_as_pair(g) for g in tied_groups]
    _check_tied_groups(groups, n)
    out = [1.0] * n
    for factor, (_, members) in zip(_tier_factors([t for t, _ in groups], q), groups, strict=True):
        for m in members:
            out[m] = factor
    return out


# ---------------------------------------------------------------- steps 1, 3, 6


def _check_gar_inputs(
    rewards: Tensor, passed: Tensor, valid: Tensor, factors: Tensor, usable: Tensor, hacks: Tensor
) -> None:
    _check_rewards(rewards, valid)
    _check_mask("passed", passed, rewards.shape)
    _check_mask("hacks", hacks, rewards.shape)
    _check_mask("usable", usable, rewards.shape[:1])
    _require(isinstance(factors, Tensor), "factors must be a torch.Tensor")
    _require(factors.is_floating_point(), f"factors must be floating point, got {factors.dtype}")
    _require(
        factors.shape == rewards.shape,
        f"factors has shape {tuple(factors.shape)}, expected {tuple(rewards.shape)}",
    )
    stray = hacks & ~(valid & passed)
    _require_none(stray, "hack flagged on a non-pass")


def _check_factors(factors: Tensor, used: Tensor) -> None:  # (G, n), (G, n)
    bad = used & ~((factors > 0) & (factors <= 1))  # also catches NaN
    _require_none(bad, "quality factors outside (0, 1]")


def gar_advantages_with_stats(  # noqa: PLR0913 - public API fixed by the issue
    rewards: Tensor,  # (G, n) float
    passed: Tensor,  # (G, n) bool, raw hidden-test outcome
    valid: Tensor,  # (G, n) bool
    factors: Tensor,  # (G, n) float in (0, 1] on passes
    usable: Tensor,  # (G,) bool, the group's ranking is usable
    hacks: Tensor,  # (G, n) bool, confirmed hacks (subset of valid passes)
    *,
    lambda_max: float = 1.5,
    std_normalize: bool = False,
    eps: float = 1e-6,
    rescale: bool = True,
) -> GarResult:
    """Steps 1, 3 and 6 with the per-group facts. ``rescale=False`` is the ablation
    "downweight without rescale" (λ fixed at 1), a known failure mode: keep it off."""
    _check_gar_inputs(rewards, passed, valid, factors, usable, hacks)
    _require(lambda_max > 0 and math.isfinite(lambda_max), f"lambda_max must be > 0: {lambda_max}")
    eligible = eligible_groups(passed, valid)  # (G,)
    in_p = valid & passed & ~hacks  # (G, n)
    adv = grpo_advantages(
        torch.where(hacks, 0, rewards), valid, std_normalize=std_normalize, eps=eps
    )  # (G, n)
    tried = eligible & usable  # (G,)
    _check_factors(factors, in_p & tried[:, None])
    f = torch.where(in_p & tried[:, None], factors, 1)  # (G, n)
    pass_sum = torch.where(in_p, adv, 0).sum(-1)  # (G,)
    mass = torch.where(in_p, f * adv, 0).sum(-1)  # (G,)
    apply = tried & (mass > 0) & (pass_sum > 0)  # (G,)
    ratio = pass_sum / torch.where(apply, mass, 1)  # (G,)
    capped = apply & (ratio > lambda_max) & rescale  # (G,)
    lam = torch.where(apply & rescale, ratio.clamp(max=lambda_max), 1)  # (G,)
    scaled = torch.where(in_p, lam[:, None] * f * adv, adv)  # (G, n)
    recentred = torch.where(valid, scaled - _masked_mean(scaled, valid), 0)  # (G, n)
    fallback = torch.where(
        ~eligible,
        int(Fallback.INELIGIBLE),
        torch.where(
            ~usable,
            int(Fallback.UNUSABLE),
            torch.where(apply, int(Fallback.NONE), int(Fallback.NONPOSITIVE_MASS)),
        ),
    )  # (G,)
    return GarResult(
        adv=torch.where(apply[:, None], recentred, adv),
        adv_before=adv,
        lam=lam,
        capped=capped,
        fallback=fallback.to(torch.int64),
        eligible=eligible,
    )


def gar_advantages(  # noqa: PLR0913 - public API fixed by the issue
    rewards: Tensor,  # (G, n) float
    passed: Tensor,  # (G, n) bool
    valid: Tensor,  # (G, n) bool
    factors: Tensor,  # (G, n) float
    usable: Tensor,  # (G,) bool
    hacks: Tensor,  # (G, n) bool
    *,
    lambda_max: float = 1.5,
    std_normalize: bool = False,
    eps: float = 1e-6,
) -> Tensor:
    """GAGAR advantages (G, n): hack zeroing, GRPO, sum-preserving redistribution; see module."""
    return gar_advantages_with_stats(
        rewards,
        passed,
        valid,
        factors,
        usable,
        hacks,
        lambda_max=lambda_max,
        std_normalize=std_normalize,
        eps=eps,
    ).adv


# ---------------------------------------------------------------- step 7: length penalty


def length_penalty(
    rewards: Tensor,  # (G, n) float
    passed: Tensor,  # (G, n) bool (pass ``passed & ~hacks`` to keep hacks out of ℓ*)
    valid: Tensor,  # (G, n) bool
    lengths: Tensor,  # (G, n, K) e.g. K = 2: turns and output tokens
    params: LengthPenalty = _DEFAULT_LENGTH_PENALTY,
) -> Tensor:
    """Rewards (G, n) with R_i − X·clip((ℓ_i/ℓ* − 1 − δ)/(s − δ), 0, 1)^γ on the passes of groups
    whose pass rate (over valid members) exceeds A; ℓ* per group and length measure. Apply before
    GRPO (step 3); eligibility keeps using the raw test outcome."""
    _check_rewards(rewards, valid)
    _check_mask("passed", passed, rewards.shape)
    _require(isinstance(lengths, Tensor), "lengths must be a torch.Tensor")
    _require(
        lengths.dim() == 3 and lengths.shape[:2] == rewards.shape,
        f"lengths has shape {tuple(lengths.shape)}, expected ({rewards.shape[0]}, {rewards.shape[1]}, K)",
    )
    in_p = passed & valid  # (G, n)
    ell = lengths.to(torch.float64)  # (G, n, K)
    bad = in_p[..., None] & ~(torch.isfinite(ell) & (ell >= 0))
    _require_none(bad, "lengths must be finite and >= 0")
    if rewards.numel() == 0 or lengths.shape[2] == 0:
        return rewards.clone()
    rate = in_p.sum(-1) / valid.sum(-1).clamp(min=1)  # (G,)
    masked = torch.where(in_p[..., None], ell, math.nan)  # (G, n, K)
    ref = torch.nanquantile(masked, params.percentile / 100, dim=1).clamp(min=1)  # (G, K)
    ratio = (ell / ref[:, None, :]).amax(-1)  # (G, n)
    z = ((ratio - 1 - params.delta) / (params.scale - params.delta)).clamp(0, 1)  # (G, n)
    penalty = (params.weight * z.pow(params.gamma)).to(rewards.dtype)  # (G, n)
    apply = in_p & (rate > params.pass_rate_threshold)[:, None]  # (G, n)
    return torch.where(apply, rewards - penalty, rewards)


# ---------------------------------------------------------------- step 7: segment shaping


def _group_sum(x: Tensor, gid: Tensor, num_groups: int) -> Tensor:  # (N, T), (N,) -> (G,)
    return torch.zeros(num_groups, dtype=x.dtype).index_add(0, gid, x.sum(-1))


def _check_shaping_inputs(
    adv: Tensor, token_mask: Tensor, flagged: Tensor, group_ids: Tensor
) -> None:
    _require(isinstance(token_mask, Tensor) and token_mask.dim() == 2, "token_mask must be (N, T)")
    _check_mask("token_mask", token_mask, token_mask.shape)
    _check_mask("flagged", flagged, token_mask.shape)
    _require(isinstance(adv, Tensor) and adv.is_floating_point(), "adv must be a float tensor")
    ok = adv.shape in (token_mask.shape, token_mask.shape[:1])
    _require(
        ok,
        f"adv has shape {tuple(adv.shape)}, expected (N, T) or (N,) for {tuple(token_mask.shape)}",
    )
    _require(isinstance(group_ids, Tensor), "group_ids must be a torch.Tensor")
    ok = group_ids.shape == token_mask.shape[:1] and not group_ids.is_floating_point()
    _require(ok, f"group_ids must be integer (N,), got {group_ids.dtype} {tuple(group_ids.shape)}")


def segment_shaping(
    adv: Tensor,  # (N, T) per-token, or (N,) trajectory advantage broadcast to its tokens
    token_mask: Tensor,  # (N, T) bool, tokens the policy generated
    flagged: Tensor,  # (N, T) bool, tokens of redundant actions, tool/format errors, churn
    group_ids: Tensor,  # (N,) int, the group (task) of each trajectory
    params: SegmentPenalty = _DEFAULT_SEGMENT_PENALTY,
) -> Tensor:
    """Per-token advantages (N, T), 0 outside ``token_mask``. Per group, positive tokens: flagged
    → 0, clean × α; negative tokens: flagged × κ, clean × β (module docstring). Positive and
    negative mass per group are conserved unless α_max or β_min binds."""
    _check_shaping_inputs(adv, token_mask, flagged, group_ids)
    a = adv[:, None].expand_as(token_mask) if adv.dim() == 1 else adv  # (N, T)
    _check_finite("advantage", a, token_mask)
    a = torch.where(token_mask, a, 0)  # (N, T)
    if a.numel() == 0:
        return a.clone()
    flag = flagged & token_mask  # (N, T)
    _, gid = torch.unique(group_ids, return_inverse=True)  # (N,)
    n_groups = int(gid.max()) + 1
    pos, neg = a > 0, a < 0  # (N, T)
    h_pos = _group_sum(torch.where(pos & flag, a, 0), gid, n_groups)  # (G,)
    c_pos = _group_sum(torch.where(pos & ~flag, a, 0), gid, n_groups)  # (G,)
    h_neg = _group_sum(torch.where(neg & flag, -a, 0), gid, n_groups)  # (G,)
    c_neg = _group_sum(torch.where(neg & ~flag, -a, 0), gid, n_groups)  # (G,)
    has_c_pos, has_c_neg = c_pos > 0, c_neg > 0  # (G,)
    alpha = (1 + h_pos / torch.where(has_c_pos, c_pos, 1)).clamp(max=params.alpha_max)  # (G,)
    beta = (1 - (params.kappa - 1) * h_neg / torch.where(has_c_neg, c_neg, 1)).clamp(
        min=params.beta_min
    )  # (G,)
    pos_flag = torch.where(has_c_pos, 0.0, 1.0)[gid, None]  # (N, 1)
    pos_clean = torch.where(has_c_pos, alpha, 1.0)[gid, None]  # (N, 1)
    neg_flag = torch.where(has_c_neg, params.kappa, 1.0)[gid, None]  # (N, 1)
    neg_clean = torch.where(has_c_neg, beta, 1.0)[gid, None]  # (N, 1)
    scale = torch.where(pos, torch.where(flag, pos_flag, pos_clean), 1.0)  # (N, T)
    scale = torch.where(neg, torch.where(flag, neg_flag, neg_clean), scale)  # (N, T)
    return a * scale.to(a.dtype)
