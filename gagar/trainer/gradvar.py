"""Gradient variance across independent units of a step's batch (docs/design.md §1.9), from
running sums.

With a step's loss written as a sum of micro-batch contributions (global normalization), the
accumulated gradient after a micro-batch minus the one before is that micro-batch's contribution.
A *unit* is a run of consecutive micro-batches that closes at a group boundary (``closes``: no
group of the unit has rollouts in a later micro-batch); with whole groups per micro-batch every
micro-batch is a unit. Units, not micro-batches, are the independent draws: the rollouts of one
group share a task and their advantages are normalized together, so two halves of a group are
correlated. The unit's contribution ``c_m`` is the accumulated gradient at its close minus the one
at its start. With ``M`` units, ``g_m = M·c_m`` and ``ḡ = Σ_m c_m``,

    tr Cov = Σ_m ‖g_m − ḡ‖² / (M − 1) = (M² Σ_m ‖c_m‖² − M ‖ḡ‖²) / (M − 1)

so two running quantities suffice: ``S2 = Σ_m ‖c_m‖²`` (a scalar) and the accumulated gradient
itself (which the optimizer needs anyway). The tracker keeps one copy of the gradient (the value
at the current unit's start), never M copies.

Sharded parameters (tensor/expert parallel) contribute partial squared norms that the caller sums
across ranks with ``reduce`` (an all-reduce of a small tensor); parameters replicated across
tensor-parallel ranks must be counted once (``count`` predicate). Data-parallel ranks each see
their own micro-batches: M and S2 are summed across them, and ‖ḡ‖² is taken after the gradient
all-reduce. A group whose micro-batches fall on two data-parallel ranks makes units on different
ranks dependent: the caller says so (``dependent``) and the noise scale is then undefined.

Gradient noise scale (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training",
appendix A), for any of the loss's aggregations. Each unit has a *share* ``s_m = W_m / Σ_k W_k``,
``W_m`` the unit's aggregation weight (``loss.aggregation_weight``: what its loss would be if every
token's loss were 1; its token share under ``token-mean`` and ``seq-mean-token-sum-norm``, its
sequence share under ``seq-mean-token-mean``, its prompt share under ``prompt-mean``). If the units
are independent and ``E c_m = s_m·G`` with ``G = E ḡ`` (the aggregated quantity has the same mean
whatever a unit's token counts), then ``E ⟨c_m, c_k⟩ = s_m s_k ‖G‖²`` for ``m ≠ k`` and

    ‖G‖²   = (‖ḡ‖² − S2) / (1 − Σ_m s_m²)          unbiased: the distinct units' inner products
    noise  = ‖ḡ‖² − ‖G‖²                            unbiased for tr Cov(ḡ), the step gradient's noise
    tr Σ   = N · noise                              per token (N: the step's loss tokens)
    B      = tr Σ / ‖G‖²                            tokens: where noise and signal are equal

unbiased whatever the units' sizes and variances (neither needs to be equal or known). Under
``token-mean`` with tokens drawn independently, tr Cov(ḡ) = tr Σ_token / N and these are
McCandlish's per-token quantities; under the other aggregations ``tr Σ`` is the step's noise
scaled to one token of a batch of this composition (``B`` the batch, in tokens, at which a batch of
this composition has as much noise as signal, noise taken ∝ 1/size). Not unbiased when units are
dependent (a group split over units or over ranks) or when a unit's expected gradient depends on
its size beyond the share (e.g. under ``token-mean``, long trajectories whose per-token gradient
differs on average from short ones'). A ratio of two unbiased estimates is not unbiased: ``‖G‖²``
can come out ≤ 0 from one step's noise, ``B`` is then undefined (None), and McCandlish's remedy
applies: average ``tr Σ`` and ``‖G‖²`` over steps before dividing. (Until issue 50 the estimator
rescaled each micro-batch by ``N / n_m`` tokens, which is unbiased only under ``token-mean`` with
independent tokens: under the default ``prompt-mean`` it inflated tr Σ and biased ‖G‖² down.)

Against a common target (``target_moments``; issue 50). B divides each arm's noise by its own
expected gradient, so two arms with the same noise get different B when one surrogate has a larger
mean. The variance of an *estimate of one quantity* compares arms at fixed weights on the same
groups instead. With the group as the unit (independent draws; under ``prompt-mean`` with whole
groups a batch's update is the mean of its P groups' gradients ``u_j``) and a target ``T = E t``
estimated by per-group vectors ``t_j`` of the same groups, from inner products only:

    ⟨E u, E v⟩ = mean_{j≠k} ⟨u_j, v_k⟩           unbiased: distinct groups are independent
    tr Cov(u)  = mean_j ‖u_j‖² − ⟨E u, E u⟩        the estimate's variance per group (= ddof 1)
    bias²      = ‖E u − T‖² = ⟨Eu,Eu⟩ − 2⟨Eu,T⟩ + ⟨T,T⟩
    MSE(P)     = E‖ū_P − T‖² = tr Cov(u) / P + bias²

each unbiased (the cosine between two means, a ratio, is not), whatever the groups' sizes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

Reduce = Callable[[torch.Tensor], torch.Tensor]


def trace_covariance(
    sum_sq_contrib: float, mean_grad_sq_norm: float, num_micro: int
) -> float | None:
    """``(M² S2 − M ‖ḡ‖²) / (M − 1)``; None (undefined, not 0) below two units."""
    if num_micro < 2:
        return None
    m = float(num_micro)
    value = (m * m * sum_sq_contrib - m * mean_grad_sq_norm) / (m - 1.0)
    return max(value, 0.0)  # rounding can make a zero variance slightly negative


def noise_scale(
    sum_sq_contrib: float, big_sq: float, sum_sq_share: float, tokens: float
) -> tuple[float, float, float | None]:
    """``(tr Σ, ‖G‖², B)`` from ``S2 = Σ_m ‖c_m‖²``, ``‖ḡ‖²``, ``Σ_m s_m²`` and ``N`` (module
    docstring); B is None when ‖G‖² ≤ 0 or there is one unit (``Σ s² = 1``)."""
    gap = 1.0 - sum_sq_share
    if not gap > 1e-12:
        return math.nan, big_sq, None
    signal = (big_sq - sum_sq_contrib) / gap
    trace = tokens * (big_sq - signal)
    return trace, signal, trace / signal if signal > 0 else None


class GradVarianceTracker:
    """Call ``after_micro_batch()`` after each backward; ``result()`` after the last one."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        count: Callable[[torch.nn.Parameter], bool] | None = None,
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.count = count or (lambda p: True)
        self._start = [torch.zeros_like(p, dtype=torch.float32) for p in self.params]
        self.sum_sq = 0.0  # Σ_m ‖c_m‖² over closed units
        self.num_micro = 0  # closed units (micro-batches when each closes one)
        self.micro_batches = 0  # every call, closing or not
        self.sum_weight = 0.0  # Σ_m W_m
        self.sum_sq_weight = 0.0  # Σ_m W_m²
        self._open_weight: float | None = 0.0  # W of the unit being accumulated; None: unknown
        self.dependent = False  # units on different ranks share a group: no noise scale

    @staticmethod
    def _grad(p: torch.nn.Parameter) -> torch.Tensor:
        g = getattr(p, "main_grad", None)  # Megatron DDP accumulates into main_grad
        if g is None:
            g = p.grad
        return torch.zeros_like(p, dtype=torch.float32) if g is None else g.detach().float()

    def after_micro_batch(self, weight: float | None = None, closes: bool = True) -> None:
        """``weight``: the micro-batch's aggregation weight ``W`` (``loss.aggregation_weight``;
        needed for the noise scale); ``closes``: whether it ends a unit (module docstring)."""
        if weight is None or self._open_weight is None:
            self._open_weight = None
        else:
            self._open_weight += weight
        self.micro_batches += 1
        if not closes:
            return
        grads = [self._grad(p) for p in self.params]
        counted = [i for i, p in enumerate(self.params) if self.count(p)]
        # One fused pass per operation over all tensors (torch's foreach kernels), not four
        # small ops per parameter: this runs after every unit.
        diffs = torch._foreach_sub([grads[i] for i in counted], [self._start[i] for i in counted])
        norms = torch._foreach_norm(diffs) if diffs else []
        self.sum_sq += float(torch.stack(list(norms)).double().pow(2).sum()) if norms else 0.0
        if self._open_weight is not None:
            self.sum_weight += self._open_weight
            self.sum_sq_weight += self._open_weight**2
            self._open_weight = 0.0
        else:
            self.sum_weight = math.nan  # a unit without its weight: no noise scale this step
        torch._foreach_copy_(self._start, grads)
        self.num_micro += 1

    def _grad_sq(self) -> float:
        return sum(float(self._grad(p).pow(2).sum()) for p in self.params if self.count(p))

    def result(self, reduce: Reduce | None = None) -> tuple[float | None, float]:
        """Return ``(tr Cov or None below two units, ‖ḡ‖)``; ``reduce`` all-reduces ``[S2, M, ‖ḡ‖²-partial]`` across ranks."""
        stats = torch.tensor(
            [self.sum_sq, float(self.num_micro), self._grad_sq()], dtype=torch.float64
        )
        if reduce is not None:
            stats = reduce(stats)
        s2, m, g2 = (float(x) for x in stats)
        return trace_covariance(s2, g2, round(m)), g2**0.5

    def noise(
        self, tokens: float, reduce: Reduce | None = None
    ) -> tuple[float, float, float | None]:
        """``(tr Σ, ‖G‖², B)`` per token over the step's ``tokens`` loss tokens (all ranks). Call
        after every micro-batch was given its weight, before the optimizer step; every rank calls
        it (the reduce is a collective). The stats go through ``reduce`` as ``[S2, M, ‖ḡ‖²-partial,
        ΣW, ΣW², M]``: the last entry is summed like the fourth and fifth, not divided back like
        the second, so their ratio undoes the repeats of a replica's ranks whatever the reduce
        divides."""
        m = float(self.num_micro)
        stats = torch.tensor(
            [self.sum_sq, m, self._grad_sq(), self.sum_weight, self.sum_sq_weight, m],
            dtype=torch.float64,
        )
        if reduce is not None:
            stats = reduce(stats)
        s2, units, g2, w, w2, raw = (float(x) for x in stats)
        if self.dependent or units < 2 or raw <= 0 or not math.isfinite(w) or w <= 0:
            return math.nan, g2, None
        repeats = raw / units  # each unit counted this many times in w and w2
        return noise_scale(s2, g2, (w2 / repeats) / (w / repeats) ** 2, tokens)


# ------------------------------------------------------------------ a common target
def pair_mean(cross: torch.Tensor, groups: torch.Tensor) -> float:
    """Mean of ``cross[j, k] = ⟨u_j, v_k⟩`` (n, n) over pairs of distinct groups (``groups`` (n,):
    a bootstrap resample's repeat of a group is no second draw): unbiased for ⟨E u, E v⟩."""
    distinct = groups[:, None] != groups[None, :]  # (n, n)
    return float(cross[distinct].double().mean())


@dataclass(frozen=True)
class TargetMoments:
    """One arm's per-group update ``u`` against a target ``T`` (module docstring)."""

    trace: float  # tr Cov(u) = E‖u − E u‖², per group: the estimate's variance
    signal: float  # ‖E u‖²
    bias: float  # ‖E u − T‖²
    target: float  # ‖T‖²
    cross: float  # ⟨E u, T⟩

    def mse(self, groups: int) -> float:
        """E‖ū − T‖² of the mean ū of ``groups`` independent groups' updates."""
        return self.trace / groups + self.bias

    def noise_scale(self) -> float | None:
        """B with the group as the unit (tr Cov / ‖E u‖², in groups); None when ‖E u‖² ≤ 0."""
        return self.trace / self.signal if self.signal > 0 else None

    def cosine(self) -> float | None:
        """cos(E u, T), from the unbiased parts; None when either squared norm is ≤ 0."""
        return cosine(self.cross, self.signal, self.target)


def cosine(ab: float, aa: float, bb: float) -> float | None:
    """``ab / sqrt(aa·bb)``; None when ``aa`` or ``bb`` is ≤ 0 (an estimate can be)."""
    return ab / math.sqrt(aa * bb) if aa > 0 and bb > 0 else None


def target_moments(
    uu: torch.Tensor, ut: torch.Tensor, tt: torch.Tensor, groups: torch.Tensor
) -> TargetMoments:
    """``TargetMoments`` from the inner products ``uu[j, k] = ⟨u_j, u_k⟩``, ``ut[j, k] = ⟨u_j,
    t_k⟩`` and ``tt[j, k] = ⟨t_j, t_k⟩`` (each (n, n), rows and columns the same n groups, whose
    ids are ``groups`` (n,))."""
    signal, cross, target = (pair_mean(x, groups) for x in (uu, ut, tt))
    trace = float(torch.diagonal(uu).double().mean()) - signal
    return TargetMoments(trace, signal, signal - 2 * cross + target, target, cross)
