"""Gradient variance across micro-batches (docs/design.md §1.9), from running sums.

With a step's loss written as a sum of micro-batch contributions (global normalization), the
accumulated gradient after micro-batch ``m`` minus the one before is that micro-batch's contribution
``c_m``. Each ``g_m = M·c_m`` is an unbiased estimate of the full-batch gradient ``ḡ = Σ_m c_m``, and

    tr Cov = Σ_m ‖g_m − ḡ‖² / (M − 1) = (M² Σ_m ‖c_m‖² − M ‖ḡ‖²) / (M − 1)

so two running quantities suffice: ``S2 = Σ_m ‖c_m‖²`` (a scalar) and the accumulated gradient
itself (which the optimizer needs anyway). The tracker keeps one copy of the gradient (the value
before the current micro-batch), never M copies.

Sharded parameters (tensor/expert parallel) contribute partial squared norms that the caller sums
across ranks with ``reduce`` (an all-reduce of a small tensor); parameters replicated across
tensor-parallel ranks must be counted once (``count`` predicate). Data-parallel ranks each see
their own micro-batches: M and S2 are summed across them, and ‖ḡ‖² is taken after the gradient
all-reduce.

Gradient noise scale (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training",
appendix A). With ``G`` the true per-token gradient and ``Σ`` the per-token covariance, a batch
of ``b`` tokens gives ``E‖G_b‖² = ‖G‖² + tr Σ / b``. Micro-batch ``m`` with ``n_m`` loss tokens
estimates ``G`` by ``G_m = (N / n_m)·c_m`` (``N`` the step's tokens) and the full batch by ``ḡ``;
from ``mean_m ‖G_m‖²`` and ``‖ḡ‖²``, two batch sizes, the unbiased estimates are

    tr Σ  = (mean_m ‖G_m‖² − ‖ḡ‖²) / (mean_m 1/n_m − 1/N)
    ‖G‖²  = ‖ḡ‖² − tr Σ / N
    B     = tr Σ / ‖G‖²      (tokens: the batch at which noise and signal are equal)

Unlike ``tr Cov / ‖ḡ‖²`` (≈ M − 1 whenever the micro-batch gradients are nearly orthogonal,
whatever the algorithm) ``B`` does not depend on M or on the advantages' scale. It treats tokens
as independent draws and the loss as a token mean; tokens of one sequence are correlated and
other aggregations weight tokens unequally, so read it as a relative measure between runs of one
setting. ``‖G‖²`` can come out ≤ 0 from one step's noise: ``B`` is then undefined (None), and
McCandlish's remedy applies: average ``tr Σ`` and ``‖G‖²`` over steps before dividing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch

Reduce = Callable[[torch.Tensor], torch.Tensor]


def trace_covariance(
    sum_sq_contrib: float, mean_grad_sq_norm: float, num_micro: int
) -> float | None:
    """``(M² S2 − M ‖ḡ‖²) / (M − 1)``; None (undefined, not 0) below two micro-batches."""
    if num_micro < 2:
        return None
    m = float(num_micro)
    value = (m * m * sum_sq_contrib - m * mean_grad_sq_norm) / (m - 1.0)
    return max(value, 0.0)  # rounding can make a zero variance slightly negative


def noise_scale(
    mean_small_sq: float, big_sq: float, mean_inv_tokens: float, tokens: float
) -> tuple[float, float, float | None]:
    """``(tr Σ, ‖G‖², B)`` from ``mean_m ‖G_m‖²``, ``‖ḡ‖²``, ``mean_m 1/n_m`` and ``N`` (module
    docstring); B is None when ‖G‖² ≤ 0 or the two batch sizes coincide (one micro-batch)."""
    gap = mean_inv_tokens - 1.0 / tokens
    if not gap > 0:
        return math.nan, big_sq, None
    trace = (mean_small_sq - big_sq) / gap
    signal = big_sq - trace / tokens
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
        self._prev = [torch.zeros_like(p, dtype=torch.float32) for p in self.params]
        self.sum_sq = 0.0
        self.num_micro = 0
        self.sum_sq_per_token = 0.0  # Σ_m ‖c_m‖² / n_m²
        self.sum_inv_tokens = 0.0  # Σ_m 1 / n_m

    @staticmethod
    def _grad(p: torch.nn.Parameter) -> torch.Tensor:
        g = getattr(p, "main_grad", None)  # Megatron DDP accumulates into main_grad
        if g is None:
            g = p.grad
        return torch.zeros_like(p, dtype=torch.float32) if g is None else g.detach().float()

    def after_micro_batch(self, tokens: float | None = None) -> None:
        """``tokens``: the micro-batch's loss tokens ``n_m`` (needed for the noise scale)."""
        grads = [self._grad(p) for p in self.params]
        counted = [i for i, p in enumerate(self.params) if self.count(p)]
        # One fused pass per operation over all tensors (torch's foreach kernels), not four
        # small ops per parameter: this runs after every micro-batch.
        diffs = torch._foreach_sub([grads[i] for i in counted], [self._prev[i] for i in counted])
        norms = torch._foreach_norm(diffs) if diffs else []
        sq = float(torch.stack(list(norms)).double().pow(2).sum()) if norms else 0.0
        self.sum_sq += sq
        if tokens:
            self.sum_sq_per_token += sq / tokens**2
            self.sum_inv_tokens += 1.0 / tokens
        torch._foreach_copy_(self._prev, grads)
        self.num_micro += 1

    def result(self, reduce: Reduce | None = None) -> tuple[float | None, float]:
        """Return ``(tr Cov or None below two micro-batches, ‖ḡ‖)``; ``reduce`` all-reduces ``[S2, M, ‖ḡ‖²-partial]`` across ranks."""
        grad_sq = sum(float(self._grad(p).pow(2).sum()) for p in self.params if self.count(p))
        stats = torch.tensor([self.sum_sq, float(self.num_micro), grad_sq], dtype=torch.float64)
        if reduce is not None:
            stats = reduce(stats)
        s2, m, g2 = (float(x) for x in stats)
        return trace_covariance(s2, g2, round(m)), g2**0.5

    def noise(
        self, tokens: float, reduce: Reduce | None = None
    ) -> tuple[float, float, float | None]:
        """``(tr Σ, ‖G‖², B)`` per token over the step's ``tokens`` loss tokens (all ranks). Call
        after every micro-batch was given its ``tokens``, before the optimizer step. The stats go
        through ``reduce`` as ``[S2/n², M, ‖ḡ‖²-partial, Σ1/n, M]``: the last entry is summed like
        the fourth, not divided back like the second, so their ratio is the mean of 1/n_m over the
        job's micro-batches whatever the reduce divides."""
        grad_sq = sum(float(self._grad(p).pow(2).sum()) for p in self.params if self.count(p))
        m = float(self.num_micro)
        stats = torch.tensor(
            [self.sum_sq_per_token, m, grad_sq, self.sum_inv_tokens, m], dtype=torch.float64
        )
        if reduce is not None:
            stats = reduce(stats)
        s2n, micro, g2, inv, micro_raw = (float(x) for x in stats)
        if micro < 2 or micro_raw <= 0:
            return math.nan, g2, None
        mean_small_sq = tokens**2 * s2n / micro  # s2n: every micro-batch once, shards summed
        return noise_scale(mean_small_sq, g2, inv / micro_raw, tokens)
